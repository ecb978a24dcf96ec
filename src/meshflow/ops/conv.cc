// 2-D convolution, as torch.nn.functional.conv2d (cross-correlation, NCHW).
//   conv2d             (x [N, C, H, W], w [O, C/groups, KH, KW]) -> y [N, O, OH, OW]
//                      OH = (H + 2 pad_h - dil_h (KH - 1) - 1) / stride_h + 1 (floor), OW alike
//   conv2d_grad_input  (dy [N, O, OH, OW], w) -> dx [N, C, H, W]     (attrs.shape: x's shape)
//   conv2d_grad_weight (dy [N, O, OH, OW], x) -> dw [O, C/groups, KH, KW] (attrs.shape: w's)
// attrs: stride, padding (zeros, both sides), dilation (each {height, width}),
// groups (C and O divisible by it; group g maps input channels
// [g C/groups, (g+1) C/groups) to output channels [g O/groups, (g+1) O/groups)).
// Dim names: y = [x's batch, w's out dim, x's height, x's width].
// attrs.halo_axis (set by the partitioner on a spatially split node): x is one
// block of the height / width, and the kernel exchanges the rows its windows
// read from the neighbouring blocks (ops/window.h, kernels/cpu/halo.h).
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

Status expect_rank4(const Graph& g, const Node& n, int i, const char* what) {
  const Shape& v = g.shape(n.inputs[i]);
  if (v.rank() != 4)
    return Status::invalid(node_label(n) + ": " + what + v.to_string() + " must have 4 dims (" +
                           (std::string(what) == "w" ? "out_channels, channels / groups, kh, kw"
                                                     : "batch, channels, height, width") +
                           ")");
  return expect_dtype(g, n, i, DType::F32);
}

Status check_attrs(const Node& n) {
  const Attrs& a = n.attrs;
  for (int d = 0; d < 2; ++d)
    if (a.stride[d] < 1 || a.dilation[d] < 1 || a.padding[d] < 0)
      return Status::invalid(node_label(n) + ": stride " + s(a.stride[0]) + "x" + s(a.stride[1]) +
                             ", dilation " + s(a.dilation[0]) + "x" + s(a.dilation[1]) +
                             ", padding " + s(a.padding[0]) + "x" + s(a.padding[1]) +
                             ": stride and dilation must be >= 1, padding >= 0");
  if (a.groups < 1)
    return Status::invalid(node_label(n) + ": groups=" + s(a.groups) + " must be >= 1");
  return Status::ok();
}

// The output size along spatial dim d (0: height, 1: width) of an input of
// `in` with kernel `k`; an error when the kernel is larger than the padded input.
Result<int64_t> out_size(const Node& n, int d, int64_t in, int64_t k) {
  const Attrs& a = n.attrs;
  const int64_t span = a.dilation[d] * (k - 1) + 1;
  const WindowHalo h = window_halo(a, d, k);
  // A block of a split dim: the halo rows its neighbours send stand in for the padding.
  const int64_t padded = a.halo_axis[d] >= 0 ? in + h.lo + h.hi : in + 2 * a.padding[d];
  if (span > padded)
    return Status::invalid(node_label(n) + ": the kernel spans " + s(span) + " " +
                           (d == 0 ? "rows" : "columns") + " (size " + s(k) + ", dilation " +
                           s(a.dilation[d]) + ") but the padded input has " + s(padded) + " (" +
                           s(in) + " + 2 x padding " + s(a.padding[d]) +
                           "); use a smaller kernel or more padding");
  return (padded - span) / a.stride[d] + 1;
}

// x and w agree (channels, groups); *y: the output shape.
Status conv_shapes(const Graph& g, const Node& n, const Shape& x, const Shape& w, Shape* y) {
  MF_RETURN_IF_ERROR(check_attrs(n));
  const int64_t groups = n.attrs.groups;
  if (x.size(1) % groups != 0 || w.size(0) % groups != 0)
    return Status::invalid(node_label(n) + ": groups=" + s(groups) + " must divide the " +
                           s(x.size(1)) + " input channels of x" + x.to_string() + " and the " +
                           s(w.size(0)) + " output channels of w" + w.to_string());
  if (w.size(1) * groups != x.size(1))
    return Status::invalid(node_label(n) + ": w" + w.to_string() + " takes " + s(w.size(1)) +
                           " channels per group x " + s(groups) +
                           " groups = " + s(w.size(1) * groups) + ", but x" + x.to_string() +
                           " has " + s(x.size(1)) + " channels");
  (void)g;
  MF_ASSIGN_OR_RETURN(const int64_t oh, out_size(n, 0, x.size(2), w.size(2)));
  MF_ASSIGN_OR_RETURN(const int64_t ow, out_size(n, 1, x.size(3), w.size(3)));
  *y = Shape{{x.name(0), x.size(0)}, {w.name(0), w.size(0)}, {x.name(2), oh}, {x.name(3), ow}};
  return Status::ok();
}

Status infer_conv2d(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(expect_inputs(g, n, 2));
  MF_RETURN_IF_ERROR(expect_rank4(g, n, 0, "x"));
  MF_RETURN_IF_ERROR(expect_rank4(g, n, 1, "w"));
  Shape y;
  MF_RETURN_IF_ERROR(conv_shapes(g, n, g.shape(n.inputs[0]), g.shape(n.inputs[1]), &y));
  outs->push_back(out_value(y));
  return Status::ok();
}

// dy must be the conv2d output of (x, w).
Status expect_dy(const Graph& g, const Node& n, const Shape& x, const Shape& w) {
  Shape y;
  MF_RETURN_IF_ERROR(conv_shapes(g, n, x, w, &y));
  const Shape& dy = g.shape(n.inputs[0]);
  if (!dy.same_sizes(y))
    return Status::invalid(node_label(n) + ": dy" + dy.to_string() + " must have the sizes " +
                           y.to_string() + " of conv2d(x" + x.to_string() + ", w" + w.to_string() +
                           ")");
  return expect_dtype(g, n, 0, DType::F32);
}

// conv2d_grad_input: inputs dy, w; attrs.shape is x's shape (the output).
// conv2d_grad_weight: inputs dy, x; attrs.shape is w's shape (the output).
Status infer_conv2d_grad(const Graph& g, const Node& n, std::vector<Value>* outs) {
  const bool input = n.kind == OpKind::kConv2dGradInput;
  MF_RETURN_IF_ERROR(expect_inputs(g, n, 2));
  MF_RETURN_IF_ERROR(expect_rank4(g, n, 0, "dy"));
  MF_RETURN_IF_ERROR(expect_rank4(g, n, 1, input ? "w" : "x"));
  const Shape& out = n.attrs.shape;
  if (out.rank() != 4)
    return Status::invalid(node_label(n) + ": attrs.shape (" + (input ? "x" : "w") +
                           "'s shape) must have 4 dims, got " + out.to_string());
  const Shape& other = g.shape(n.inputs[1]);
  MF_RETURN_IF_ERROR(input ? expect_dy(g, n, out, other) : expect_dy(g, n, other, out));
  outs->push_back(out_value(out));
  return Status::ok();
}

Attrs conv_attrs(const Node& n, const Shape& shape) {
  Attrs at;
  at.stride = n.attrs.stride;
  at.padding = n.attrs.padding;
  at.dilation = n.attrs.dilation;
  at.groups = n.attrs.groups;
  at.halo_axis = n.attrs.halo_axis;
  at.shape = shape;
  return at;
}

void grad_conv2d(GradContext& c, const Node& n) {
  const ValueId dy = c.dout(0);
  if (dy == kNoValue) return;
  const Graph& g = c.graph();
  const ValueId x = n.inputs[0], w = n.inputs[1];
  if (c.needs(0))
    c.accumulate(0, c.b().op1(OpKind::kConv2dGradInput, {dy, w}, conv_attrs(n, g.shape(x)), "dx"));
  if (c.needs(1))
    c.accumulate(1, c.b().op1(OpKind::kConv2dGradWeight, {dy, x}, conv_attrs(n, g.shape(w)), "dw"));
}

// All three are the same contraction: 2 N O OH OW (C/groups) KH KW flops.
OpCost cost_conv(const Graph& g, const Node& n) {
  Shape x, w, y;
  switch (n.kind) {
    case OpKind::kConv2d:
      x = g.shape(n.inputs[0]), w = g.shape(n.inputs[1]), y = g.shape(n.outputs[0]);
      break;
    case OpKind::kConv2dGradInput:
      y = g.shape(n.inputs[0]), w = g.shape(n.inputs[1]), x = g.shape(n.outputs[0]);
      break;
    default:
      y = g.shape(n.inputs[0]), x = g.shape(n.inputs[1]), w = g.shape(n.outputs[0]);
      break;
  }
  OpCost c;
  c.flops = 2.0 * double(y.numel()) * double(w.size(1) * w.size(2) * w.size(3));
  c.bytes = 4.0 * double(x.numel() + w.numel() + y.numel());
  return c;
}

// Sharding, with groups = 1: the batch and the output channels pass through;
// the input channels are a reduction (y Partial, like a row-parallel matmul).
// Height and width split with a halo exchange (kHalo) where the input has
// stride x the output's rows (every "same" convolution: 3x3/1 pad 1, 3x3/2
// and 7x7/2 on even sizes, 1x1/2); otherwise they stay whole. The kernel dims
// are not split. y is linear in x and in w. With groups > 1 the channels stay
// whole.
//   conv2d:             x [b, c, h, w], w [o, c, kh, kw] -> y [b, o, h', w']
//   conv2d_grad_input:  dy [b, o, h', w'], w [o, c, kh, kw] -> dx [b, c, h, w]  (o: reduction)
//   conv2d_grad_weight: dy [b, o, h', w'], x [b, c, h, w] -> dw [o, c, kh, kw]  (b: reduction)
ShardingRule sharding_conv(const Graph& g, const Node& n) {
  using F = ShardingRule::Factor;
  ShardingRule r(2, 1);
  const bool grouped = n.attrs.groups > 1;
  const F::Kind channels = grouped ? F::kNeedReplicate : F::kPassThrough;
  const F::Kind contracted = grouped ? F::kNeedReplicate : F::kReduction;
  Shape x, w, y;
  int xi = -1, wi = -1, yi = -1, xo = -1, wo = -1, yo = -1;  // input / output index of each
  switch (n.kind) {
    case OpKind::kConv2d:
      x = g.shape(n.inputs[0]), w = g.shape(n.inputs[1]), y = g.shape(n.outputs[0]);
      xi = 0, wi = 1, yo = 0;
      break;
    case OpKind::kConv2dGradInput:
      y = g.shape(n.inputs[0]), w = g.shape(n.inputs[1]), x = g.shape(n.outputs[0]);
      yi = 0, wi = 1, xo = 0;
      break;
    default:
      y = g.shape(n.inputs[0]), x = g.shape(n.inputs[1]), w = g.shape(n.outputs[0]);
      yi = 0, xi = 1, wo = 0;
      break;
  }
  // A factor on dim dx of x, dw of w, dy of y (-1: absent), of the given kind.
  auto factor = [&](const std::string& name, int64_t size, F::Kind kind, int dx, int dw, int dy) {
    const int f = r.add(name, size, kind);
    auto map = [&](int in, int out, int dim) {
      if (dim < 0) return;
      if (in >= 0) r.in(f, in, dim);
      if (out >= 0) r.out(f, out, dim);
    };
    map(xi, xo, dx);
    map(wi, wo, dw);
    map(yi, yo, dy);
  };
  const bool grad_weight = n.kind == OpKind::kConv2dGradWeight;
  const bool grad_input = n.kind == OpKind::kConv2dGradInput;
  factor(x.name(0), x.size(0), grad_weight ? F::kReduction : F::kPassThrough, 0, -1, 0);
  factor(w.name(0), w.size(0), grad_input ? contracted : channels, -1, 0, 1);
  if (grouped) {  // x has C channels, w C / groups: two unsplittable factors
    factor(x.name(1), x.size(1), F::kNeedReplicate, 1, -1, -1);
    factor(w.name(1) + "/g", w.size(1), F::kNeedReplicate, -1, 1, -1);
  } else {
    factor(x.name(1), x.size(1), n.kind == OpKind::kConv2d ? contracted : channels, 1, 1, -1);
  }
  for (int d = 0; d < 2; ++d) {
    F halo;
    if (make_halo_factor(halo, n.attrs, d, w.size(2 + d), x.size(2 + d), y.size(2 + d))) {
      factor(x.name(2 + d), halo.size, F::kHalo, 2 + d, -1, 2 + d);
      r.factors.back().halo = halo.halo;
      r.factors.back().halo_unit = halo.halo_unit;
    } else {
      factor(x.name(2 + d), x.size(2 + d), F::kNeedReplicate, 2 + d, -1, -1);
      factor(y.name(2 + d) + "'", y.size(2 + d), F::kNeedReplicate, -1, -1, 2 + d);
    }
  }
  factor(w.name(2), w.size(2), F::kNeedReplicate, -1, 2, -1);
  factor(w.name(3), w.size(3), F::kNeedReplicate, -1, 3, -1);
  r.partial_inputs = {{0}, {1}};
  return r;
}

// On one rank: the mesh axis splitting each spatial dim of x (the window's input).
void conv_local(LocalAttrsCall& c) {
  const Layout& x = c.n.kind == OpKind::kConv2dGradInput ? c.outputs[0]
                    : c.n.kind == OpKind::kConv2d        ? c.inputs[0]
                                                         : c.inputs[1];
  set_halo_axes(c, x);
}

// The halo rows each split spatial dim exchanges (local shapes).
std::vector<InnerCollective> conv_collectives(const Graph& g, const Node& n) {
  std::vector<InnerCollective> out;
  const bool grad_input = n.kind == OpKind::kConv2dGradInput;
  const Shape& x =
      grad_input ? g.shape(n.outputs[0]) : g.shape(n.inputs[n.kind == OpKind::kConv2d ? 0 : 1]);
  const Shape& w =
      n.kind == OpKind::kConv2dGradWeight ? g.shape(n.outputs[0]) : g.shape(n.inputs[1]);
  add_halo_collectives(n.attrs, x, {w.size(2), w.size(3)}, !grad_input, grad_input, &out);
  return out;
}

}  // namespace

void register_conv_ops(OpTable& t) {
  add_op(t, OpKind::kConv2d, 2, infer_conv2d, grad_conv2d, cost_conv);
  add_op(t, OpKind::kConv2dGradInput, 2, infer_conv2d_grad, nullptr, cost_conv);
  add_op(t, OpKind::kConv2dGradWeight, 2, infer_conv2d_grad, nullptr, cost_conv);
  for (OpKind k : {OpKind::kConv2d, OpKind::kConv2dGradInput, OpKind::kConv2dGradWeight}) {
    set_sharding(t, k, sharding_conv);
    set_local_attrs(t, k, conv_local);
    set_inner_collectives(t, k, conv_collectives);
  }
}

}  // namespace meshflow
