// OpDef: one table entry per OpKind. Everything meshflow knows about an op is
// here, as data: its shape rule, its gradient rule, its cost, which inputs it
// updates in place, and its sharding rule (ops/sharding_rule.h). The CPU kernel lives
// in kernels/cpu/ under the same OpKind.
//
// Each op family registers its entries in its own file (ops/matmul.cc,
// ops/elementwise.cc, ...), next to the comment that documents its attrs.
//
//   const OpDef& d = op_def(OpKind::kMatMul);
//   std::vector<Value> outs;  MF_RETURN_IF_ERROR(d.infer(graph, node, &outs));
#pragma once

#include <string>
#include <vector>

#include "meshflow/core/status.h"
#include "meshflow/ir/graph.h"

namespace meshflow {

class GradContext;  // ops/grad_context.h

struct OpCost {
  double flops = 0;  // floating-point operations (multiply-add = 2)
  double bytes = 0;  // bytes read + written by the kernel
};

// Fills *outs with the output types of `n` (whose inputs and attrs are set).
// A user-facing error names the node, the dims and what would be valid.
using InferFn = Status (*)(const Graph& g, const Node& n, std::vector<Value>* outs);
// Emits the gradient nodes of `n` through ctx (see ops/grad_context.h).
using GradFn = void (*)(GradContext& ctx, const Node& n);
using CostFn = OpCost (*)(const Graph& g, const Node& n);
// The op's sharding rule (ops/sharding_rule.h), for a node with valid shapes.
struct ShardingRule;
using ShardingRuleFn = ShardingRule (*)(const Graph& g, const Node& n);

// A collective an op's kernel runs inside itself rather than as a node of the
// graph, declared here so that `meshflow explain` (parallel/partition.h
// records it), the planner's cost model and anyone reading the program see
// it. The vocab-parallel cross-entropy is the one today: its kernel
// all-reduces the row maxima, the sums of exp and the target logits over the
// mesh axes that split the vocabulary (attrs.ints), as Megatron-LM's
// vocab_parallel_cross_entropy does.
struct InnerCollective {
  OpKind kind = OpKind::kAllReduce;
  int mesh_axis = -1;    // of the program's mesh
  int64_t elements = 0;  // f32 elements of the buffer
  std::string what;      // "row maxima", ...
  int dim = -1;          // neighbour exchanges: the split dim whose halo moves (-1: a reduction)
  // In flight while the kernel computes (ring attention's shifts): the cost
  // model charges only what the kernel's compute does not hide.
  bool overlapped = false;
};
using InnerCollectivesFn = std::vector<InnerCollective> (*)(const Graph& g, const Node& n);
// Sets the attrs a node needs on one rank once the partitioner has split it
// (ops/sharding_rule.h: LocalAttrsCall): where its shard sits in the global
// value, the mesh axes its kernel reduces over. nullptr: none beyond the
// local shapes.
struct LocalAttrsCall;
using LocalAttrsFn = void (*)(LocalAttrsCall& c);

struct OpDef {
  OpKind kind = OpKind::kCount;
  int num_inputs = -1;  // -1: variadic
  InferFn infer = nullptr;
  GradFn grad = nullptr;      // nullptr: no gradient flows to the inputs
  CostFn cost = nullptr;      // nullptr: element-wise default (bytes of all inputs+outputs)
  uint32_t mutates = 0;       // bit i set: input i is updated in place (optimizer ops)
  bool stateful_rng = false;  // reads the graph's rng offset (dropout)
  // >= 0: a copy of the node that only ever trains (a recompute clone, run in
  // the backward) takes just the first training_inputs inputs; the others are
  // read only in evaluation (batch norm's running statistics, which the
  // forward has updated by then). set_training_inputs().
  int training_inputs = -1;
  ShardingRuleFn sharding = nullptr;               // set beside the op by set_sharding()
  InnerCollectivesFn inner_collectives = nullptr;  // set by set_inner_collectives()
  LocalAttrsFn local_attrs = nullptr;              // set by set_local_attrs()
};

const OpDef& op_def(OpKind kind);
bool op_registered(OpKind kind);
OpCost op_cost(const Graph& g, const Node& n);

// Registration, one function per family (ops/*.cc). Called once by op_def().
using OpTable = std::vector<OpDef>;
void register_source_ops(OpTable& t);
void register_matmul_ops(OpTable& t);
void register_elementwise_ops(OpTable& t);
void register_activation_ops(OpTable& t);
void register_softmax_ops(OpTable& t);
void register_norm_ops(OpTable& t);
void register_embedding_ops(OpTable& t);
void register_shape_ops(OpTable& t);
void register_reduce_ops(OpTable& t);
void register_conv_ops(OpTable& t);
void register_pool_ops(OpTable& t);
void register_batch_norm_ops(OpTable& t);
void register_attention_ops(OpTable& t);
void register_optimizer_ops(OpTable& t);
void register_collective_ops(OpTable& t);

// One table entry: the form every family file registers its ops with.
void add_op(OpTable& t, OpKind kind, int num_inputs, InferFn infer, GradFn grad,
            CostFn cost = nullptr, uint32_t mutates = 0, bool stateful_rng = false);

// Declares the training-only form of kind (OpDef::training_inputs; after its add_op).
void set_training_inputs(OpTable& t, OpKind kind, int n);
// Sets kind's sharding rule (after its add_op).
void set_sharding(OpTable& t, OpKind kind, ShardingRuleFn fn);
// Declares the collectives kind's kernel runs inside itself (after its add_op).
void set_inner_collectives(OpTable& t, OpKind kind, InnerCollectivesFn fn);
// Sets kind's local-attributes hook (after its add_op).
void set_local_attrs(OpTable& t, OpKind kind, LocalAttrsFn fn);
// The collectives node n's kernel runs inside itself (empty for most ops).
std::vector<InnerCollective> inner_collectives(const Graph& g, const Node& n);

// all_gather, reduce_scatter, all_reduce, all_to_all, broadcast: the ops that
// move data between ranks (shard_slice and partial_mask are local).
bool is_collective(OpKind k);
// parameter, input, state: the nodes without inputs, whose values have their
// own storage (outside the executor's arena).
bool is_source(OpKind k);

// Helpers shared by the shape rules.
std::string node_label(const Node& n);  // "matmul 'h.0.mlp.fc1'"
Status expect_inputs(const Graph& g, const Node& n, int count);
Status expect_dtype(const Graph& g, const Node& n, int input, DType dtype);
Value out_value(Shape shape, DType dtype = DType::F32);
// numpy-style broadcast of two named shapes (right-aligned); names from the
// longer (or from a where equal rank and a's size > 1).
Result<Shape> broadcast_shapes(const Shape& a, const Shape& b, const Node& n);

}  // namespace meshflow
