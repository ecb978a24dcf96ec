#include <sstream>

#include "meshflow/core/check.h"
#include "meshflow/ops/op_def.h"

namespace meshflow {

namespace {
OpTable build_table() {
  OpTable t(kNumOpKinds);
  register_source_ops(t);
  register_matmul_ops(t);
  register_elementwise_ops(t);
  register_activation_ops(t);
  register_softmax_ops(t);
  register_norm_ops(t);
  register_embedding_ops(t);
  register_shape_ops(t);
  register_reduce_ops(t);
  register_conv_ops(t);
  register_pool_ops(t);
  register_batch_norm_ops(t);
  register_attention_ops(t);
  register_optimizer_ops(t);
  register_collective_ops(t);
  return t;
}
}  // namespace

// Completeness (every OpKind has a shape rule and a CPU kernel) is asserted by
// tests/ops_registry_test.cc; using an unregistered op is an internal error.
const OpDef& op_def(OpKind kind) {
  static const OpTable table = build_table();
  const OpDef& d = table[static_cast<int>(kind)];
  MF_CHECK(d.kind == kind && d.infer != nullptr)
      << "op '" << op_name(kind) << "' has no OpDef registered";
  return d;
}

bool op_registered(OpKind kind) {
  static const OpTable table = build_table();
  return table[static_cast<int>(kind)].infer != nullptr;
}

OpCost op_cost(const Graph& g, const Node& n) {
  const OpDef& d = op_def(n.kind);
  if (d.cost) return d.cost(g, n);
  OpCost c;
  for (ValueId v : n.inputs) c.bytes += g.shape(v).numel() * dtype_size(g.value(v).dtype);
  for (ValueId v : n.outputs) {
    double e = g.shape(v).numel();
    c.bytes += e * dtype_size(g.value(v).dtype);
    c.flops += e;
  }
  return c;
}

void add_op(OpTable& t, OpKind kind, int num_inputs, InferFn infer, GradFn grad, CostFn cost,
            uint32_t mutates, bool stateful_rng) {
  OpDef& d = t[static_cast<int>(kind)];
  d.kind = kind;
  d.num_inputs = num_inputs;
  d.infer = infer;
  d.grad = grad;
  d.cost = cost;
  d.mutates = mutates;
  d.stateful_rng = stateful_rng;
}

void set_training_inputs(OpTable& t, OpKind kind, int n) {
  t[static_cast<int>(kind)].training_inputs = n;
}

void set_sharding(OpTable& t, OpKind kind, ShardingRuleFn fn) {
  t[static_cast<int>(kind)].sharding = fn;
}

void set_inner_collectives(OpTable& t, OpKind kind, InnerCollectivesFn fn) {
  t[static_cast<int>(kind)].inner_collectives = fn;
}

void set_local_attrs(OpTable& t, OpKind kind, LocalAttrsFn fn) {
  t[static_cast<int>(kind)].local_attrs = fn;
}

std::vector<InnerCollective> inner_collectives(const Graph& g, const Node& n) {
  const OpDef& d = op_def(n.kind);
  return d.inner_collectives ? d.inner_collectives(g, n) : std::vector<InnerCollective>{};
}

bool is_source(OpKind k) {
  return k == OpKind::kParameter || k == OpKind::kInput || k == OpKind::kState;
}

std::string node_label(const Node& n) {
  return std::string(op_name(n.kind)) + " '" + n.name + "'";
}

Status expect_inputs(const Graph& g, const Node& n, int count) {
  (void)g;
  if (static_cast<int>(n.inputs.size()) != count)
    return Status::invalid(node_label(n) + ": expects " + std::to_string(count) + " inputs, got " +
                           std::to_string(n.inputs.size()));
  return Status::ok();
}

Status expect_dtype(const Graph& g, const Node& n, int input, DType dtype) {
  DType got = g.value(n.inputs[input]).dtype;
  if (got != dtype)
    return Status::invalid(node_label(n) + ": input " + std::to_string(input) + " must be " +
                           std::string(dtype_name(dtype)) + ", got " +
                           std::string(dtype_name(got)));
  return Status::ok();
}

Value out_value(Shape shape, DType dtype) {
  Value v;
  v.shape = std::move(shape);
  v.dtype = dtype;
  return v;
}

Result<Shape> broadcast_shapes(const Shape& a, const Shape& b, const Node& n) {
  const Shape& lo = a.rank() >= b.rank() ? a : b;
  const Shape& sh = a.rank() >= b.rank() ? b : a;
  int off = lo.rank() - sh.rank();
  std::vector<Dim> dims = lo.dims();
  for (int i = 0; i < sh.rank(); ++i) {
    const Dim& x = lo.dim(i + off);
    const Dim& y = sh.dim(i);
    if (x.size == y.size || y.size == 1) continue;
    if (x.size == 1) {
      dims[i + off] = y;
      continue;
    }
    return Status::invalid(node_label(n) + ": cannot broadcast " + a.to_string() + " with " +
                           b.to_string() + " (dim " + std::to_string(i + off) + ": " +
                           std::to_string(x.size) + " vs " + std::to_string(y.size) +
                           "; sizes must match or one must be 1)");
  }
  return Shape(std::move(dims));
}

}  // namespace meshflow
