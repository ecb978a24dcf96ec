// The SPMD partitioner: a training graph (forward + backward + optimizer) and
// a layout for every value -> one local Program per rank, with the
// redistributions between ops inserted as collective nodes (ops/collective.cc).
//
// Two steps, as in GSPMD and MindSpore's auto-parallel:
//   1. annotate(): a ShardingStrategy for every node (the layouts its inputs
//      are read in and its outputs come out in). From the user's split tuples
//      where given, else the Mesh-TF rules' layouts where they are a valid
//      strategy, else the enumerated strategy with the least reshard cost from
//      the inputs' current layouts (+ to the rules' wishes for the outputs).
//   2. lower(): node by node in graph order; an input whose current layout is
//      not the one its consumer reads gets the reshard planner's cheapest plan
//      (parallel/reshard.h) as a run of collective nodes; the node is emitted
//      with local shapes. A reshape whose layouts no per-rank reshape connects
//      runs inside plan_reshape's cheapest route (parallel/reshape_layout.h).
//      Sources get local storage with shard-aware init.
//
// Data parallel is the plan "batch sharded on dp": a weight's gradient comes
// out Partial on dp and the optimizer reads it Replicate, so the planner
// inserts the all_reduce. Sequence-parallel norm weights get theirs the same way.
// ZeRO is a layout of the optimizer's values; weights grouping (stage 1 by
// whole parameters) is an owner per parameter (parallel/weight_groups.h).
//
//   Mesh mesh = value_or_throw(Mesh::parse("dp=2,tp=2"));
//   PartitionOptions o;  o.rules = value_or_throw(DimRules::parse("batch: dp, heads: tp, ffn:
//   tp")); Annotation a = value_or_throw(annotate(g, mesh, o)); LocalProgram p =
//   value_or_throw(lower(g, a, rank)); Executor ex(p.graph);  ex.set_mesh_comms(&comms);   // then
//   feed local shards and run
//
// Every rank must run the same program (same nodes, same order): collectives
// match by order. lower() is deterministic, so each rank lowers its own.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "meshflow/core/layout.h"
#include "meshflow/core/mesh.h"
#include "meshflow/core/status.h"
#include "meshflow/core/tensor.h"
#include "meshflow/ir/graph.h"
#include "meshflow/ops/builder.h"
#include "meshflow/ops/sharding_rule.h"
#include "meshflow/parallel/reshard.h"
#include "meshflow/parallel/strategy.h"
#include "meshflow/parallel/weight_groups.h"

namespace meshflow {

struct PartitionOptions {
  DimRules rules;  // Mesh-TF: dim name -> mesh axis (empty: no wishes, replicate)
  // Semi-auto: node name or glob -> split tuples ("((dp, 1), (1, tp))"), first match wins.
  std::vector<std::pair<std::string, std::string>> strategies;
  // Strategies given directly per node (tests, search); they win over the above.
  std::map<NodeId, ShardingStrategy> fixed;
  // Stored layouts given directly per source value (parameters, inputs).
  std::map<ValueId, Layout> source_layouts;
  // ZeRO (optimizer parallel) over this mesh axis (-1: off): 1 shards the
  // optimizer state, 2 also the gradients (reduce_scatter), 3 also the stored
  // parameters (all_gather before use). Each is a layout of those values.
  int zero_stage = 0;
  int zero_axis = -1;
  // Further axes the ZeRO shards split over after zero_axis: cp, whose ranks
  // hold replicas of every weight the sequence split leaves whole, as
  // Megatron's distributed optimizer shards over its dp x cp group (and as
  // the planner prices ZeRO: over dp * cp).
  std::vector<int> zero_also_axes;
  // Stage 1 by whole parameters (parallel/weight_groups.h, "zero_style":
  // "group"): each parameter's state and update on one coordinate of
  // zero_axis, which broadcasts the updated weight. REQUIRES zero_stage 1.
  bool weight_groups = false;
  ReshardCostModel cost;
};

// How a node's strategy was chosen: the strategy sources annotate() asks, in
// this order; the first that answers decides.
enum class StrategySource : uint8_t {
  kStored,             // a source (parameter, input, state): its stored layout
  kOptimizer,          // an optimizer update: its parameter's layout (ZeRO-sharded from stage 1)
  kFixed,              // PartitionOptions::fixed
  kUser,               // a split tuple for the node ("strategy")
  kUserGradient,       // a gradient node of a configured forward node: the dual strategy
  kUpdateReads,        // optimizer phase: a gradient read where its update reads it
  kDeferredReduction,  // not forward: a Partial input the node is linear in stays Partial
  kRules,              // the dim-name rules ({batch: dp, ...})
  kPropagated,         // the least reshard cost from where the inputs are
};
std::string_view strategy_source_name(StrategySource s);

struct Annotation {
  Mesh mesh = Mesh::line(1);
  int zero_stage = 0;
  // Weights grouping (PartitionOptions::weight_groups): the owners; lower()
  // emits a grouped parameter's update and state on its owner only, then a
  // broadcast from the owner and an assign on every rank.
  WeightGroups groups;
  // lower(): the gradient-norm's Partial sums of squares are added locally and
  // reduced once (one all_reduce per mesh axis), not one all_reduce per
  // parameter. Off for a program split into pipeline chunks afterwards
  // (pipeline/stage_graph.h exchanges the norm per parameter between stages).
  bool one_norm_reduction = true;
  std::vector<ShardingStrategy> node;  // per node; sources: outputs only (their stored layout)
  std::vector<StrategySource> source;  // per node: which source chose its strategy
  // The same in words, with detail where there is some ("user (gradient of
  // h.0.mlp.c_fc)", "user: stored as ... reads it"); explain prints it.
  std::vector<std::string> why;
  // The layout value v is produced (stored) in.
  const Layout& produced(const Graph& g, ValueId v) const {
    return node[g.value(v).producer].outputs[g.value(v).output_index];
  }
};

// Step 1. Errors: an invalid user strategy (names the node, dim and sizes), a
// rule that does not divide, no valid strategy (names the node).
Result<Annotation> annotate(const Graph& g, const Mesh& mesh, const PartitionOptions& o);

// One inserted collective, for `meshflow explain` and the tests.
struct CollectiveRecord {
  NodeId node = -1;  // in the local program
  OpKind kind = OpKind::kAllReduce;
  std::string value;     // the global value it redistributes
  std::string consumer;  // the node that needed it
  Phase phase = Phase::kForward;
  std::string mesh_axis;
  Layout before, after;
  int64_t bytes_per_rank = 0;  // sent by each rank (ring factor applied)
};

// How many times one training step (Trainer::step) runs collective `c`:
// forward and backward ones once per micro-batch (a ZeRO-2 gradient
// reduce_scatter too: it runs in the backward), optimizer ones once per step,
// metric ones never (they run in evaluation only). What `meshflow explain`'s
// per-step totals multiply by, and what `meshflow train --trace` records.
int runs_per_step(const CollectiveRecord& c, int micro_batches);

struct LocalProgram {
  Graph graph;
  Mesh mesh = Mesh::line(1);
  int rank = 0;
  std::vector<ValueId> global_of;  // per local value: the global value (-1: added by lowering)
  std::vector<Layout> layout;      // per local value: its layout of the global value
  std::vector<ValueId> local_of;   // per global value: the local value in its produced layout
  std::vector<CollectiveRecord> collectives;
  // Inputs the lowering added: name -> what to feed ("loss_count": the number of
  // valid targets in the global batch, for a loss whose rows are sharded).
  std::vector<std::string> added_inputs;
};

// Step 2, for one rank. The local graph's loss and named outputs are
// Replicate (reduced where they were Partial); grad_of_param maps each local
// parameter to its local gradient as produced (possibly Partial).
Result<LocalProgram> lower(const Graph& g, const Annotation& a, int rank,
                           const ReshardCostModel& cost = {});

// This rank's block of a whole tensor (inputs the trainer feeds globally).
Tensor local_block(const Tensor& whole, const Mesh& mesh, const Layout& layout, int rank);
// Writes a rank's block into the whole tensor (gathering weights for checks
// and checkpoints). Partial layouts are not blocks: REQUIRES !has_partial().
void place_block(const Tensor& block, const Mesh& mesh, const Layout& layout, int rank,
                 Tensor* whole);

// Hybrid mode (collectives placed by hand): the parameter `name` of global
// shape `whole` of which rank `rank`'s program holds the block `layout` on
// `mesh`. Its initializer draws the whole tensor's numbers and keeps this
// block, so every split of a model starts from the same weights as one device.
// Throws StatusError (as Builder does) when the layout does not divide `whole`.
ValueId shard_parameter(Builder& b, const std::string& name, const Shape& whole, const Mesh& mesh,
                        const Layout& layout, int rank, Init init);

// A random valid strategy for every node and a random valid stored layout for
// every parameter (the property tests: any assignment must train like one device).
PartitionOptions random_strategies(const Graph& g, const Mesh& mesh, uint64_t seed);

}  // namespace meshflow
