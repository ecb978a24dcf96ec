// 2-D pooling, as torch.nn.functional.max_pool2d / avg_pool2d (NCHW, floor mode).
//   max_pool2d      (x [N, C, H, W]) -> y [N, C, OH, OW]
//                   OH = (H + 2 pad_h - dil_h (KH - 1) - 1) / stride_h + 1, OW alike;
//                   padding never wins (it is -inf)
//   max_pool2d_grad (dy [N, C, OH, OW], x) -> dx: dy goes to each window's first maximum
//   avg_pool2d      (x) -> y: the window's sum / (KH KW), padding counted as zeros
//                   (count_include_pad, torch's default); no dilation
//   avg_pool2d_grad (dy) -> dx (attrs.shape: x's shape)
// attrs: kernel, stride, padding (each {height, width}; padding at most half
// the kernel, as torch requires), dilation (max only); halo_axis as conv2d's
// (a block of a split height / width, the neighbours' rows exchanged by the
// kernel: -inf at the ends for max, zeros for average).
#include <algorithm>
#include <string>

#include "meshflow/ops/grad_context.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/ops/sharding_rule.h"
#include "meshflow/ops/window.h"

namespace meshflow {

namespace {

std::string s(int64_t x) {
  return std::to_string(x);
}

bool is_max(OpKind k) {
  return k == OpKind::kMaxPool2d || k == OpKind::kMaxPool2dGrad;
}

// The pooled shape of x under n's attrs, or an error naming what is invalid.
Result<Shape> pooled(const Node& n, const Shape& x) {
  if (x.rank() != 4)
    return Status::invalid(node_label(n) + ": x" + x.to_string() +
                           " must have 4 dims (batch, channels, height, width)");
  const Attrs& a = n.attrs;
  int64_t out[2];
  for (int d = 0; d < 2; ++d) {
    const char* dim = d == 0 ? "height" : "width";
    if (a.kernel[d] < 1 || a.stride[d] < 1 || a.dilation[d] < 1 || a.padding[d] < 0)
      return Status::invalid(node_label(n) + ": kernel " + s(a.kernel[d]) + ", stride " +
                             s(a.stride[d]) + ", dilation " + s(a.dilation[d]) + ", padding " +
                             s(a.padding[d]) + " along " + dim +
                             ": kernel, stride and dilation must be >= 1, padding >= 0");
    if (!is_max(n.kind) && a.dilation[d] != 1)
      return Status::invalid(node_label(n) + ": average pooling has no dilation (got " +
                             s(a.dilation[d]) + " along " + dim + ")");
    const int64_t span = a.dilation[d] * (a.kernel[d] - 1) + 1;
    if (2 * a.padding[d] > span)
      return Status::invalid(node_label(n) + ": padding " + s(a.padding[d]) + " along " + dim +
                             " is more than half the window (" + s(span) + "); use at most " +
                             s(span / 2));
    const WindowHalo h = window_halo(a, d, a.kernel[d]);
    const int64_t padded = x.size(2 + d) + (a.halo_axis[d] >= 0 ? h.lo + h.hi : 2 * a.padding[d]);
    if (span > padded)
      return Status::invalid(node_label(n) + ": the window spans " + s(span) + " along " + dim +
                             " but the padded input has " + s(padded) +
                             "; use a smaller window or more padding");
    out[d] = (padded - span) / a.stride[d] + 1;
  }
  return Shape{
      {x.name(0), x.size(0)}, {x.name(1), x.size(1)}, {x.name(2), out[0]}, {x.name(3), out[1]}};
}

Status infer_pool(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(expect_inputs(g, n, 1));
  MF_RETURN_IF_ERROR(expect_dtype(g, n, 0, DType::F32));
  MF_ASSIGN_OR_RETURN(Shape y, pooled(n, g.shape(n.inputs[0])));
  outs->push_back(out_value(y));
  return Status::ok();
}

// max: inputs dy, x; avg: dy, and attrs.shape is x's shape.
Status infer_pool_grad(const Graph& g, const Node& n, std::vector<Value>* outs) {
  const bool max = n.kind == OpKind::kMaxPool2dGrad;
  MF_RETURN_IF_ERROR(expect_inputs(g, n, max ? 2 : 1));
  MF_RETURN_IF_ERROR(expect_dtype(g, n, 0, DType::F32));
  const Shape& x = max ? g.shape(n.inputs[1]) : n.attrs.shape;
  MF_ASSIGN_OR_RETURN(Shape y, pooled(n, x));
  const Shape& dy = g.shape(n.inputs[0]);
  if (!dy.same_sizes(y))
    return Status::invalid(node_label(n) + ": dy" + dy.to_string() + " must have the sizes " +
                           y.to_string() + " of the pooled x" + x.to_string());
  outs->push_back(out_value(x));
  return Status::ok();
}

void grad_pool(GradContext& c, const Node& n) {
  const ValueId dy = c.dout(0);
  if (dy == kNoValue || !c.needs(0)) return;
  Attrs at = n.attrs;
  if (n.kind == OpKind::kMaxPool2d) {
    c.accumulate(0, c.b().op1(OpKind::kMaxPool2dGrad, {dy, n.inputs[0]}, at, "dx"));
  } else {
    at.shape = c.graph().shape(n.inputs[0]);
    c.accumulate(0, c.b().op1(OpKind::kAvgPool2dGrad, {dy}, at, "dx"));
  }
}

// Memory-bound: the inputs and outputs once; a compare or add per window element.
OpCost cost_pool(const Graph& g, const Node& n) {
  const bool fwd = n.kind == OpKind::kMaxPool2d || n.kind == OpKind::kAvgPool2d;
  const Shape& y = fwd ? g.shape(n.outputs[0]) : g.shape(n.inputs[0]);
  OpCost c;
  c.flops = double(y.numel()) * double(n.attrs.kernel[0] * n.attrs.kernel[1]);
  double bytes = 0;
  for (ValueId v : n.inputs) bytes += double(g.shape(v).numel());
  for (ValueId v : n.outputs) bytes += double(g.shape(v).numel());
  c.bytes = 4.0 * bytes;
  return c;
}

// Batch and channels pass through; height and width split with a halo
// exchange (kHalo) where the input has stride x the pooled rows (3x3/2 pad 1
// on an even size, 2x2/2), else they stay whole.
ShardingRule sharding_pool(const Graph& g, const Node& n) {
  using F = ShardingRule::Factor;
  const int ni = static_cast<int>(n.inputs.size());
  ShardingRule r(ni, 1);
  const bool fwd = n.kind == OpKind::kMaxPool2d || n.kind == OpKind::kAvgPool2d;
  // Operands shaped like x (full) and like y (pooled).
  const Shape x = fwd ? g.shape(n.inputs[0]) : g.shape(n.outputs[0]);
  const Shape y = fwd ? g.shape(n.outputs[0]) : g.shape(n.inputs[0]);
  auto is_x_in = [&](int i) { return fwd || i == 1; };  // max grad: (dy, x)
  for (int d = 0; d < 2; ++d) {
    const int f = r.add(x.name(d), x.size(d), F::kPassThrough);
    for (int i = 0; i < ni; ++i) r.in(f, i, d);
    r.out(f, 0, d);
  }
  for (int d = 2; d < 4; ++d) {
    F halo;
    if (make_halo_factor(halo, n.attrs, d - 2, n.attrs.kernel[d - 2], x.size(d), y.size(d))) {
      const int f = r.add(x.name(d), halo.size, F::kHalo);
      r.factors[f].halo = halo.halo;
      r.factors[f].halo_unit = halo.halo_unit;
      for (int i = 0; i < ni; ++i) r.in(f, i, d);
      r.out(f, 0, d);
      continue;
    }
    const int fx = r.add(x.name(d), x.size(d), F::kNeedReplicate);
    const int fy = r.add(y.name(d) + "'", y.size(d), F::kNeedReplicate);
    for (int i = 0; i < ni; ++i) r.in(is_x_in(i) ? fx : fy, i, d);
    r.out(fwd ? fy : fx, 0, d);
  }
  return r;
}

// On one rank: the mesh axis splitting each spatial dim of x (the window's
// input: the forward's input, the gradient's output).
void pool_local(LocalAttrsCall& c) {
  const bool fwd = c.n.kind == OpKind::kMaxPool2d || c.n.kind == OpKind::kAvgPool2d;
  const Layout& x = fwd ? c.inputs[0] : c.outputs[0];
  set_halo_axes(c, x);
}

// The halo rows each split spatial dim exchanges: the forward grows x; the
// gradient folds dx back (and max pooling grows x again to find its maxima).
std::vector<InnerCollective> pool_collectives(const Graph& g, const Node& n) {
  std::vector<InnerCollective> out;
  const bool fwd = n.kind == OpKind::kMaxPool2d || n.kind == OpKind::kAvgPool2d;
  const Shape& x = fwd ? g.shape(n.inputs[0]) : g.shape(n.outputs[0]);
  add_halo_collectives(n.attrs, x, n.attrs.kernel, fwd || n.kind == OpKind::kMaxPool2dGrad, !fwd,
                       &out);
  return out;
}

}  // namespace

void register_pool_ops(OpTable& t) {
  add_op(t, OpKind::kMaxPool2d, 1, infer_pool, grad_pool, cost_pool);
  add_op(t, OpKind::kAvgPool2d, 1, infer_pool, grad_pool, cost_pool);
  add_op(t, OpKind::kMaxPool2dGrad, 2, infer_pool_grad, nullptr, cost_pool);
  add_op(t, OpKind::kAvgPool2dGrad, 1, infer_pool_grad, nullptr, cost_pool);
  for (OpKind k :
       {OpKind::kMaxPool2d, OpKind::kAvgPool2d, OpKind::kMaxPool2dGrad, OpKind::kAvgPool2dGrad}) {
    set_sharding(t, k, sharding_pool);
    set_local_attrs(t, k, pool_local);
    set_inner_collectives(t, k, pool_collectives);
  }
}

}  // namespace meshflow
