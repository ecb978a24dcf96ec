// Reshape across layouts: where a reshape can run on each rank's block alone,
// and the cheapest redistribution around it where it cannot (Mesh-TensorFlow's
// reshape: all_to_all or all_gather a split onto a dim the reshape can keep).
//
// Blocks. A reshape groups dims of equal product ([heads, head_dim] <->
// [hidden]). Read a group major to minor as digits: each dim contributes its
// shard axes (major first) and then its local extent. Each rank's block of the
// input is a block of the output, in the same element order, exactly when the
// output dims can be cut from the same digit string, each output dim taking
// its shard axes before any local extent: hidden split 2 ways is heads split 2
// ways when 2 divides heads; heads split fully on dp (dp = heads) with head_dim
// on tp is hidden over (dp, tp); head_dim split alone is no block of hidden.
// reshape_block_layout gives that output layout, or nullopt. (It accepts every
// strategy ops/sharding_rule.h's reshape_rule does, and the minor splits that
// rule replicates.)
//
// Routes. plan_reshape finds the cheapest src -> dst for y[out] = reshape(x[in]):
// a reshard of x (parallel/reshard.h) to a layout whose blocks reshape
// locally, the local reshape, a reshard of y to dst. One shortest-path search:
// the reshape is a free edge out of every layout of x that reshapes locally,
// priced like every other step by parallel/collective_cost.h, so an all_to_all
// (1/n of the bytes, memory stays split) wins over an all_gather where legal.
//
//   Mesh m = value_or_throw(Mesh::parse("tp=2"));
//   auto L = [](const char* t) { return value_or_throw(Layout::parse(t)); };
//   Shape x{{"b", 2}, {"heads", 4}, {"head_dim", 8}}, y{{"b", 2}, {"hidden", 32}};
//   auto p = value_or_throw(plan_reshape(x, y, m, L("[S(2)]"), L("[S(1)]")));
//   // p.before: all_to_all(tp, dim 2->1); p.local_in [S(1)]; p.after: no steps
#pragma once

#include <optional>
#include <string>

#include "meshflow/core/layout.h"
#include "meshflow/core/mesh.h"
#include "meshflow/core/shape.h"
#include "meshflow/core/status.h"
#include "meshflow/ir/graph.h"
#include "meshflow/ops/sharding_rule.h"
#include "meshflow/parallel/reshard.h"

namespace meshflow {

// The layout of y = reshape(x) (x of shape `in` in layout `l`, y of shape
// `out`) when every rank reshapes its own block, or nullopt when the blocks of
// x are not blocks of y. Partial axes stay Partial. The result is canonical
// (core/layout.h). REQUIRES: l is valid for in; in and out have equal numel.
std::optional<Layout> reshape_block_layout(const Shape& in, const Shape& out, const Mesh& mesh,
                                           const Layout& l);

struct ReshapePlan {
  ReshardPlan before;  // of x: src -> local_in
  Layout local_in;     // the layouts the per-rank reshape reads and writes
  Layout local_out;
  ReshardPlan after;  // of y: local_out -> dst
  double cost_s = 0;
  int64_t bytes_per_rank = 0;
  bool is_local() const { return before.steps.empty() && after.steps.empty(); }
  int num_collectives() const { return before.num_collectives() + after.num_collectives(); }
  std::string to_string(const Mesh& mesh) const;  // the steps, "reshape [S(2)] -> [S(1)]", total
};

// Every route out of one layout of x, to price many targets of y (the
// annotator's candidates) from two searches.
class ReshapeRoutes {
 public:
  // REQUIRES: src valid for in; in and out have equal numel.
  ReshapeRoutes(const Shape& in, const Shape& out, const Mesh& mesh, const Layout& src,
                const ReshardCostModel& model = {});
  // The route's cost (ties between equal costs: fewer steps), +inf when dst
  // does not divide `out`.
  double cost_s(const Layout& dst) const;
  Result<ReshapePlan> plan(const Layout& dst) const;

 private:
  Shape in_, out_;
  Mesh mesh_;
  Layout src_;
  ReshardSearch x_, y_;
  std::vector<Layout> local_in_;  // per start of y_: the layout of x it reshapes from
};

// The cheapest route (above). Errors name the layouts, dims and sizes.
Result<ReshapePlan> plan_reshape(const Shape& in, const Shape& out, const Mesh& mesh,
                                 const Layout& src, const Layout& dst,
                                 const ReshardCostModel& model = {});

// A reshape node's strategy as the partitioner runs it: any input and output
// layouts that divide their shapes (the lowering inserts plan_reshape's route).
// Errors: one line naming the node, the operand, the dim, its size, the reshape
// group it belongs to and the splits the mesh can make of it.
Status validate_reshape_strategy(const Graph& g, const Node& n, const Mesh& mesh,
                                 const ShardingStrategy& st);

}  // namespace meshflow
