// ShardingRule: how an op may be split over a Mesh, declared beside the op's
// definition (OpDef::sharding, like OneFlow's SBP signatures and GSPMD/Shardy
// op sharding rules). The rule names the op's "factors": the independent loop
// dims of the computation. Each factor maps to at most one dim of every
// operand (-1: absent) and has a kind:
//   kPassThrough    sharding it shards every operand that has it (batch, M, N);
//   kReduction      absent from some outputs: sharding it leaves those Partial(sum) (K);
//   kNeedReplicate  must not be sharded (softmax's axis, a norm's channels);
//   kCollective     absent from some outputs, but the op's kernel reduces over
//                   the sharding axes itself (vocab-parallel cross-entropy:
//                   the outputs stay whole; the partitioner tells the kernel
//                   the axes and its offset).
//   kHalo           a spatial dim a window slides along (convolution,
//                   pooling): each block's kernel exchanges the `halo` rows
//                   its windows reach into its neighbours' blocks on the one
//                   mesh axis that splits it; absent from an output (a
//                   weight's gradient), it leaves that output Partial(sum).
//                   The factor counts output rows; operands that are the
//                   window's input have `halo_unit` rows per factor unit
//                   (the stride), and each block must hold at least `halo`.
// On one mesh axis an op is split by at most one factor; a factor may be split
// over several axes (then the same axes, in the same order, on every operand).
// Partial(sum) inputs are accepted only for the sets in partial_inputs (the
// inputs the op is linear in together); the outputs are then Partial.
//
//   ShardingRule r = sharding_rule(g, node);          // op_def(node.kind).sharding
//   auto outs = derive_output_layouts(g, node, mesh, in_layouts);   // Result
//   Status s = validate_strategy(g, node, mesh, in_layouts, out_layouts);
//   for (const ShardingStrategy& st : enumerate_strategies(g, node, mesh)) ...
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshflow/core/layout.h"
#include "meshflow/core/mesh.h"
#include "meshflow/core/status.h"
#include "meshflow/ir/graph.h"

namespace meshflow {

struct ShardingRule {
  struct Factor {
    enum Kind { kPassThrough, kReduction, kNeedReplicate, kCollective, kHalo };
    std::string name;
    int64_t size = 1;
    int64_t halo = 0, halo_unit = 1;  // kHalo (above)
    // kCollective run as a ring on one mesh axis (ring attention's sequence):
    // split over several axes is an error.
    bool ring = false;
    // A factor no input carries (embedding_grad's vocabulary rows) is whole
    // when derived from the inputs; set where the op's kernel can compute one
    // block of it (it learns the block's offset), so a strategy may split it
    // on an axis that splits no input.
    bool output_split = false;
    std::vector<int> input_dim;   // per input: the dim this factor is, -1 if absent
    std::vector<int> output_dim;  // per output
    Kind kind = kPassThrough;
  };
  std::vector<Factor> factors;
  // Sets of inputs that may be Partial(sum) together on a mesh axis (every
  // other input Replicate there); the outputs are then Partial. matmul: {0},{1}.
  std::vector<std::vector<int>> partial_inputs;
  int num_inputs = 0;
  int num_outputs = 0;

  ShardingRule() = default;
  ShardingRule(int inputs, int outputs) : num_inputs(inputs), num_outputs(outputs) {}
  // Adds a factor mapped to no operand yet; returns its index.
  int add(std::string name, int64_t size, Factor::Kind kind = Factor::kPassThrough);
  ShardingRule& in(int factor, int input, int dim);
  ShardingRule& out(int factor, int output, int dim);
  // The factor at dim `dim` of input / output `operand`, or -1.
  int input_factor(int operand, int dim) const;
  int output_factor(int operand, int dim) const;
  std::string to_string() const;  // "b=8 m=16 n=4 k=32(red)"
};

// The layouts of one way to run a node.
struct ShardingStrategy {
  std::vector<Layout> inputs;
  std::vector<Layout> outputs;
  std::string to_string() const;  // "[S(0), R], [R, R] -> [S(0), R]"
};

// The rule of `n` (its OpDef's). REQUIRES: n's shapes are valid.
ShardingRule sharding_rule(const Graph& g, const Node& n);

// The output layouts the inputs' layouts imply, or an error naming the node,
// the dims, the sizes and the valid splits.
Result<std::vector<Layout>> derive_output_layouts(const Graph& g, const Node& n, const Mesh& mesh,
                                                  const std::vector<Layout>& inputs);
// OK iff running `n` with these input layouts gives exactly these outputs.
Status validate_strategy(const Graph& g, const Node& n, const Mesh& mesh,
                         const std::vector<Layout>& inputs, const std::vector<Layout>& outputs);
// Every valid assignment of at most one factor per mesh axis (the
// all-replicated one first). No Partial inputs.
std::vector<ShardingStrategy> enumerate_strategies(const Graph& g, const Node& n, const Mesh& mesh);

// ---- rule builders shared by the op families (ops/*.cc) ----

// One pass-through factor per dim of `ref` (named after it). Inputs and
// outputs are matched right-aligned; a dim of size 1 against a larger one
// (broadcast) is absent. Scalars have no factors.
ShardingRule broadcast_rule(const Graph& g, const Node& n, const Shape& ref);
// Sets every factor that maps to input `input`'s dim `dim` to `kind`.
void set_input_factor_kind(ShardingRule& r, int input, int dim, ShardingRule::Factor::Kind kind);
// A reshape's groups, in order: dims [i0, i1) of `in` and [o0, o1) of `out`,
// the smallest runs with equal products (size-1 dims belong to none).
struct ReshapeGroup {
  int i0, i1, o0, o1;
};
std::vector<ReshapeGroup> reshape_groups(const Shape& in, const Shape& out);
// reshape: dims matched 1:1 where the sizes agree; in a split/merge group only
// the outermost dims share a factor (of size gcd of the two), the rest are
// need-replicate.
ShardingRule reshape_rule(const Shape& in, const Shape& out);

// "1, 2, 4, 8": the split counts `mesh` can make (products of axis subsets)
// that divide `size`; error messages list them as the valid splits.
std::string mesh_splits(int64_t size, const Mesh& mesh);

// attrs.global_dims / global_offset: where `rank`'s block of a value of
// `global` shape in layout `l` starts (left as they are when l splits nothing).
void set_shard_offsets(Attrs& attrs, const Shape& global, const Layout& l, const Mesh& mesh,
                       int rank);

// What an op's local-attributes hook (OpDef::local_attrs) sees when the
// partitioner lowers global node `n` with strategy (inputs, outputs) to
// `rank`: it fills `attrs`, the local node's (whose shapes are already the
// local ones), and may ask for the global count of valid targets as an extra
// last input (a loss whose rows are split over ranks divides by it).
//
//   void embedding_local(LocalAttrsCall& c) {  // vocab-parallel: the row offset
//     c.set_offsets(c.g.shape(c.n.inputs[0]), c.inputs[0]);
//   }
struct LocalAttrsCall {
  const Graph& g;
  const Node& n;
  const std::vector<Layout>& inputs;
  const std::vector<Layout>& outputs;
  const Mesh& mesh;
  int rank = 0;
  Attrs& attrs;
  bool add_loss_count = false;  // out

  // set_shard_offsets on this node's attrs, for this rank.
  void set_offsets(const Shape& global, const Layout& l) {
    set_shard_offsets(attrs, global, l, mesh, rank);
  }
};

// Runs n's local-attributes hook, if its op has one.
void set_local_attrs(LocalAttrsCall& c);

}  // namespace meshflow
