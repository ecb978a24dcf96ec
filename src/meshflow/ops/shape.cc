// Ops that move data without arithmetic. Each keeps its input's dtype (f32 or i32).
//   transpose  x -> dims permuted by attrs.axes: out dim i = x dim axes[i]; names move with
//              the dims
//   reshape    x -> attrs.shape (same element count; names come from the target)
//   slice      x -> the range [ints[0], ints[1]) of dim axes[0] (a negative axis counts from
//              the end)
//   slice_grad dy -> zeros of attrs.shape with dy placed at that range (axes, ints as the slice)
//   concat     (x0, x1, ..) -> joined along dim axes[0]; other dims must match; the joined dim
//              keeps x0's name
//   zigzag     x -> dim attrs.seq_dim in the zigzag order over attrs.seq_zigzag ranks
//              (ops/zigzag.h: out[p] = x[true(p)]); attrs.inverse: back to the natural
//              order. The sequence balance pass (parallel/seq_balance.h) reorders a
//              position table with it.
// Gradients: transpose by the inverse permutation, reshape back, slice <-> slice_grad,
// one slice per concat input, zigzag by the inverse zigzag.
#include "meshflow/ops/grad_context.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/ops/sharding_rule.h"

namespace meshflow {

namespace {

std::string join(const std::vector<int64_t>& v) {
  std::string s = "{";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "}";
}

// attrs.axes[0] normalized against `rank`, or an error naming the valid range.
Result<int> single_axis(const Node& n, int rank) {
  if (n.attrs.axes.size() != 1)
    return Status::invalid(node_label(n) + ": attrs.axes must hold exactly one axis, got " +
                           join(n.attrs.axes));
  const int64_t a = n.attrs.axes[0];
  if (a < -rank || a >= rank)
    return Status::invalid(node_label(n) + ": axis " + std::to_string(a) +
                           " is out of range for rank " + std::to_string(rank) + " (valid: " +
                           std::to_string(-rank) + ".." + std::to_string(rank - 1) + ")");
  return static_cast<int>(a < 0 ? a + rank : a);
}

// ---- transpose ----

// Normalized permutation (negative entries count from the end), or an error.
Result<std::vector<int>> permutation(const Node& n, const Shape& x) {
  const int r = x.rank();
  std::vector<int> perm;
  std::vector<char> seen(r, 0);
  bool ok = static_cast<int>(n.attrs.axes.size()) == r;
  for (size_t i = 0; ok && i < n.attrs.axes.size(); ++i) {
    const int64_t a = n.attrs.axes[i];
    ok = a >= -r && a < r;
    if (!ok) break;
    const int p = static_cast<int>(a < 0 ? a + r : a);
    ok = !seen[p];
    seen[p] = 1;
    perm.push_back(p);
  }
  if (!ok)
    return Status::invalid(node_label(n) + ": axes " + join(n.attrs.axes) +
                           " is not a permutation of the " + std::to_string(r) + " dims of x" +
                           x.to_string() + " (each of 0.." + std::to_string(r - 1) +
                           " exactly once)");
  return perm;
}

Status infer_transpose(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(expect_inputs(g, n, 1));
  const Shape& x = g.shape(n.inputs[0]);
  MF_ASSIGN_OR_RETURN(std::vector<int> perm, permutation(n, x));
  std::vector<Dim> dims;
  for (int p : perm) dims.push_back(x.dim(p));
  outs->push_back(out_value(Shape(std::move(dims)), g.value(n.inputs[0]).dtype));
  return Status::ok();
}

void grad_transpose(GradContext& c, const Node& n) {
  if (!c.needs(0)) return;
  std::vector<int> perm = value_or_throw(permutation(n, c.graph().shape(n.inputs[0])));
  std::vector<int64_t> inv(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inv[perm[i]] = static_cast<int64_t>(i);
  c.accumulate(0, c.b().transpose(c.dout(0), inv, "transpose"));
}

// ---- reshape ----

Status infer_reshape(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(expect_inputs(g, n, 1));
  const Shape& x = g.shape(n.inputs[0]);
  const Shape& t = n.attrs.shape;
  for (int i = 0; i < t.rank(); ++i)
    if (t.size(i) < 1)
      return Status::invalid(node_label(n) + ": target " + t.to_string() + " has dim " +
                             std::to_string(i) + " of size " + std::to_string(t.size(i)) +
                             "; sizes must be >= 1");
  if (t.numel() != x.numel())
    return Status::invalid(node_label(n) + ": cannot reshape x" + x.to_string() + " (" +
                           std::to_string(x.numel()) + " elements) to " + t.to_string() + " (" +
                           std::to_string(t.numel()) + " elements); the counts must match");
  outs->push_back(out_value(t, g.value(n.inputs[0]).dtype));
  return Status::ok();
}

void grad_reshape(GradContext& c, const Node& n) {
  if (c.needs(0))
    c.accumulate(0, c.b().reshape(c.dout(0), c.graph().shape(n.inputs[0]), "reshape"));
}

// ---- slice / slice_grad ----

// Checks axes/ints against the full (un-sliced) shape; returns the axis.
Result<int> slice_axis(const Node& n, const Shape& full) {
  MF_ASSIGN_OR_RETURN(int axis, single_axis(n, full.rank()));
  if (n.attrs.ints.size() != 2)
    return Status::invalid(node_label(n) + ": attrs.ints must be {start, end}, got " +
                           join(n.attrs.ints));
  const int64_t start = n.attrs.ints[0], end = n.attrs.ints[1], size = full.size(axis);
  if (start < 0 || start >= end || end > size)
    return Status::invalid(node_label(n) + ": range [" + std::to_string(start) + ", " +
                           std::to_string(end) + ") is out of bounds for dim " +
                           std::to_string(axis) + " '" + full.name(axis) + "' of size " +
                           std::to_string(size) + " in " + full.to_string() +
                           " (need 0 <= start < end <= " + std::to_string(size) + ")");
  return axis;
}

Status infer_slice(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(expect_inputs(g, n, 1));
  const Shape& x = g.shape(n.inputs[0]);
  MF_ASSIGN_OR_RETURN(int axis, slice_axis(n, x));
  outs->push_back(
      out_value(x.with_size(axis, n.attrs.ints[1] - n.attrs.ints[0]), g.value(n.inputs[0]).dtype));
  return Status::ok();
}

Status infer_slice_grad(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(expect_inputs(g, n, 1));
  const Shape& full = n.attrs.shape;
  MF_ASSIGN_OR_RETURN(int axis, slice_axis(n, full));
  const Shape& dy = g.shape(n.inputs[0]);
  const Shape want = full.with_size(axis, n.attrs.ints[1] - n.attrs.ints[0]);
  if (!dy.same_sizes(want))
    return Status::invalid(node_label(n) + ": dy" + dy.to_string() + " must have the sizes " +
                           want.to_string() + " (the slice of " + full.to_string() + ")");
  outs->push_back(out_value(full, g.value(n.inputs[0]).dtype));
  return Status::ok();
}

void grad_slice(GradContext& c, const Node& n) {
  if (!c.needs(0)) return;
  Attrs at;
  at.shape = c.graph().shape(n.inputs[0]);
  at.axes = n.attrs.axes;
  at.ints = n.attrs.ints;
  c.accumulate(0, c.b().op1(OpKind::kSliceGrad, {c.dout(0)}, at, "slice_grad"));
}

void grad_slice_grad(GradContext& c, const Node& n) {
  if (!c.needs(0)) return;
  c.accumulate(0, c.b().slice(c.dout(0), static_cast<int>(n.attrs.axes[0]), n.attrs.ints[0],
                              n.attrs.ints[1], "slice"));
}

// ---- concat ----

Status infer_concat(const Graph& g, const Node& n, std::vector<Value>* outs) {
  if (n.inputs.empty()) return Status::invalid(node_label(n) + ": needs at least one input");
  const Shape& x0 = g.shape(n.inputs[0]);
  const DType dt = g.value(n.inputs[0]).dtype;
  MF_ASSIGN_OR_RETURN(int axis, single_axis(n, x0.rank()));
  int64_t total = 0;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    const Shape& xi = g.shape(n.inputs[i]);
    const std::string which = "input " + std::to_string(i) + xi.to_string();
    if (xi.rank() != x0.rank())
      return Status::invalid(node_label(n) + ": " + which + " has rank " +
                             std::to_string(xi.rank()) + " but input 0" + x0.to_string() +
                             " has rank " + std::to_string(x0.rank()));
    if (g.value(n.inputs[i]).dtype != dt)
      return Status::invalid(node_label(n) + ": " + which + " is " +
                             std::string(dtype_name(g.value(n.inputs[i]).dtype)) +
                             " but input 0 is " + std::string(dtype_name(dt)));
    for (int d = 0; d < x0.rank(); ++d)
      if (d != axis && xi.size(d) != x0.size(d))
        return Status::invalid(node_label(n) + ": " + which + " has size " +
                               std::to_string(xi.size(d)) + " in dim " + std::to_string(d) +
                               " but input 0" + x0.to_string() + " has " +
                               std::to_string(x0.size(d)) + "; all dims except the concat axis " +
                               std::to_string(axis) + " must match");
    total += xi.size(axis);
  }
  outs->push_back(out_value(x0.with_size(axis, total), dt));
  return Status::ok();
}

void grad_concat(GradContext& c, const Node& n) {
  ValueId dy = c.dout(0);
  const int axis = c.graph().shape(n.inputs[0]).norm(static_cast<int>(n.attrs.axes[0]));
  int64_t offset = 0;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    const int64_t size = c.graph().shape(n.inputs[i]).size(axis);
    if (c.needs(static_cast<int>(i)))
      c.accumulate(static_cast<int>(i),
                   c.b().slice(dy, axis, offset, offset + size, "slice_" + std::to_string(i)));
    offset += size;
  }
}

// ---- zigzag ----

Status infer_zigzag(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(expect_inputs(g, n, 1));
  const Shape& x = g.shape(n.inputs[0]);
  const int d = n.attrs.seq_dim;
  if (d < 0 || d >= x.rank())
    return Status::invalid(node_label(n) + ": seq_dim " + std::to_string(d) + " is not a dim of x" +
                           x.to_string() + " (valid: 0.." + std::to_string(x.rank() - 1) + ")");
  const int64_t n2 = 2 * n.attrs.seq_zigzag;
  if (n.attrs.seq_zigzag < 1 || x.size(d) % n2 != 0)
    return Status::invalid(node_label(n) + ": dim " + std::to_string(d) + " of x" + x.to_string() +
                           " does not cut into 2 x " + std::to_string(n.attrs.seq_zigzag) +
                           " chunks (seq_zigzag must be >= 1 and 2*seq_zigzag divide the dim)");
  outs->push_back(out_value(x, g.value(n.inputs[0]).dtype));
  return Status::ok();
}

void grad_zigzag(GradContext& c, const Node& n) {
  if (!c.needs(0)) return;
  Attrs at = n.attrs;
  at.inverse = !at.inverse;
  c.accumulate(0, c.b().op1(OpKind::kZigzag, {c.dout(0)}, at, "zigzag_grad"));
}

// ---- costs: pure data movement, read the input once and write the output once ----

OpCost cost_move(const Graph& g, const Node& n) {
  OpCost c;
  for (ValueId v : n.inputs) c.bytes += g.shape(v).numel() * dtype_size(g.value(v).dtype);
  for (ValueId v : n.outputs) c.bytes += g.shape(v).numel() * dtype_size(g.value(v).dtype);
  return c;
}

// slice reads only the range it keeps.
OpCost cost_slice(const Graph& g, const Node& n) {
  OpCost c;
  c.bytes = 2.0 * g.shape(n.outputs[0]).numel() * dtype_size(g.value(n.outputs[0]).dtype);
  return c;
}

}  // namespace

// ---- sharding: every op here is linear (Partial passes through) ----
// transpose: dims move with their factors; reshape: ops/sharding_rule.h's
// reshape_rule; slice/slice_grad/concat: the cut or joined dim must be
// replicated, the others pass through.
namespace {
ShardingRule sharding_transpose(const Graph& g, const Node& n) {
  const Shape& x = g.shape(n.inputs[0]);
  std::vector<int> perm = value_or_throw(permutation(n, x));
  ShardingRule r(1, 1);
  for (int i = 0; i < x.rank(); ++i) {
    int f = r.add(x.name(perm[i]), x.size(perm[i]));
    r.in(f, 0, perm[i]).out(f, 0, i);
  }
  r.partial_inputs = {{0}};
  return r;
}
ShardingRule sharding_reshape(const Graph& g, const Node& n) {
  ShardingRule r = reshape_rule(g.shape(n.inputs[0]), g.shape(n.outputs[0]));
  r.partial_inputs = {{0}};
  return r;
}
// zigzag: the reordered dim is replicated, the others pass through.
ShardingRule sharding_zigzag(const Graph& g, const Node& n) {
  const Shape& x = g.shape(n.inputs[0]);
  ShardingRule r(1, 1);
  for (int d = 0; d < x.rank(); ++d) {
    const int f = r.add(x.name(d), x.size(d),
                        d == n.attrs.seq_dim ? ShardingRule::Factor::kNeedReplicate
                                             : ShardingRule::Factor::kPassThrough);
    r.in(f, 0, d).out(f, 0, d);
  }
  r.partial_inputs = {{0}};
  return r;
}
ShardingRule sharding_slice_concat(const Graph& g, const Node& n) {
  const Shape& y = g.shape(n.outputs[0]);
  const int axis = value_or_throw(single_axis(n, y.rank()));
  const int ni = static_cast<int>(n.inputs.size());
  ShardingRule r(ni, 1);
  std::vector<int> all;
  for (int i = 0; i < ni; ++i) all.push_back(i);
  for (int d = 0; d < y.rank(); ++d) {
    int f = r.add(
        y.name(d), y.size(d),
        d == axis ? ShardingRule::Factor::kNeedReplicate : ShardingRule::Factor::kPassThrough);
    r.out(f, 0, d);
    if (d != axis || n.kind != OpKind::kConcat)  // concat inputs differ in size on the axis
      for (int i = 0; i < ni; ++i) r.in(f, i, d);
  }
  r.partial_inputs = {all};
  return r;
}
}  // namespace

void register_shape_ops(OpTable& t) {
  add_op(t, OpKind::kTranspose, 1, infer_transpose, grad_transpose, cost_move);
  add_op(t, OpKind::kReshape, 1, infer_reshape, grad_reshape, cost_move);
  add_op(t, OpKind::kSlice, 1, infer_slice, grad_slice, cost_slice);
  add_op(t, OpKind::kSliceGrad, 1, infer_slice_grad, grad_slice_grad, cost_move);
  add_op(t, OpKind::kConcat, -1, infer_concat, grad_concat, cost_move);
  set_sharding(t, OpKind::kTranspose, sharding_transpose);
  set_sharding(t, OpKind::kReshape, sharding_reshape);
  add_op(t, OpKind::kZigzag, 1, infer_zigzag, grad_zigzag, cost_move);
  set_sharding(t, OpKind::kZigzag, sharding_zigzag);
  for (OpKind k : {OpKind::kSlice, OpKind::kSliceGrad, OpKind::kConcat})
    set_sharding(t, k, sharding_slice_concat);
}

}  // namespace meshflow
