// Reductions over attrs.axes (empty = every dim; negative axes count from the
// end), f32:
//   reduce_sum(x), reduce_mean(x), reduce_max(x)
//       y: x's dims without the reduced ones (their names kept), or with the
//          reduced dims set to size 1 when attrs.keepdims.
//   reduce_max_grad(x, y, dy) -> dx   (same attrs as the reduce_max)
//       dx = dy where x equals the max, split evenly among ties (PyTorch amax), else 0.
// Gradients of sum and mean broadcast dy back to x: when keepdims is false and
// a reduced dim is not leading, dy is first reshaped to the keepdims shape.
//
//   b.reduce_mean(x /*[batch=8,seq=16,hidden=64]*/, {-1}, false)  -> [batch=8,seq=16]
#include <algorithm>

#include "meshflow/ops/grad_context.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/ops/sharding_rule.h"

namespace meshflow {

namespace {

std::string axes_string(const std::vector<int64_t>& axes) {
  std::string s = "(";
  for (size_t i = 0; i < axes.size(); ++i) s += (i ? ", " : "") + std::to_string(axes[i]);
  return s + ")";
}

// The reduced axes of `n` for input x, normalized to [0, rank) and sorted.
Result<std::vector<int>> reduced_axes(const Shape& x, const Node& n) {
  std::vector<int> axes;
  if (n.attrs.axes.empty()) {
    for (int i = 0; i < x.rank(); ++i) axes.push_back(i);
    return axes;
  }
  for (int64_t a : n.attrs.axes) {
    if (a < -x.rank() || a >= x.rank()) {
      const std::string valid =
          x.rank() == 0 ? "x is a scalar: pass no axes"
                        : std::to_string(-x.rank()) + ".." + std::to_string(x.rank() - 1);
      return Status::invalid(node_label(n) + ": axis " + std::to_string(a) +
                             " is out of range for x" + x.to_string() + " of rank " +
                             std::to_string(x.rank()) + " (valid: " + valid + ")");
    }
    int na = static_cast<int>(a < 0 ? a + x.rank() : a);
    if (std::find(axes.begin(), axes.end(), na) != axes.end())
      return Status::invalid(node_label(n) + ": axis " + std::to_string(na) + " of x" +
                             x.to_string() + " appears twice in axes " + axes_string(n.attrs.axes));
    axes.push_back(na);
  }
  std::sort(axes.begin(), axes.end());
  return axes;
}

bool contains(const std::vector<int>& axes, int i) {
  return std::find(axes.begin(), axes.end(), i) != axes.end();
}

// x's shape with the reduced dims removed (or set to 1 if keepdims).
Shape reduced_shape(const Shape& x, const std::vector<int>& axes, bool keepdims) {
  std::vector<Dim> dims;
  for (int i = 0; i < x.rank(); ++i) {
    if (!contains(axes, i))
      dims.push_back(x.dim(i));
    else if (keepdims)
      dims.push_back(Dim{x.name(i), 1});
  }
  return Shape(std::move(dims));
}

Status infer_reduce(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(expect_inputs(g, n, 1));
  MF_RETURN_IF_ERROR(expect_dtype(g, n, 0, DType::F32));
  const Shape& x = g.shape(n.inputs[0]);
  MF_ASSIGN_OR_RETURN(std::vector<int> axes, reduced_axes(x, n));
  outs->push_back(out_value(reduced_shape(x, axes, n.attrs.keepdims)));
  return Status::ok();
}

Status infer_reduce_max_grad(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(expect_inputs(g, n, 3));
  for (int i = 0; i < 3; ++i) MF_RETURN_IF_ERROR(expect_dtype(g, n, i, DType::F32));
  const Shape& x = g.shape(n.inputs[0]);
  MF_ASSIGN_OR_RETURN(std::vector<int> axes, reduced_axes(x, n));
  const Shape want = reduced_shape(x, axes, n.attrs.keepdims);
  for (int i = 1; i < 3; ++i) {
    const Shape& s = g.shape(n.inputs[i]);
    if (!s.same_sizes(want))
      return Status::invalid(node_label(n) + ": " + (i == 1 ? "y" : "dy") + s.to_string() +
                             " must be x" + x.to_string() + " reduced over axes " +
                             axes_string(n.attrs.axes) + ", i.e. " + want.to_string());
  }
  outs->push_back(out_value(x));
  return Status::ok();
}

// dy (the reduced shape) broadcast back to x's shape.
ValueId expand_to_input(GradContext& c, const Node& n, ValueId dy) {
  const Shape& x = c.graph().shape(n.inputs[0]);
  const std::vector<int> axes = value_or_throw(reduced_axes(x, n));
  bool leading = true;  // reduced axes are 0..k-1: right-aligned broadcasting does it
  for (size_t i = 0; i < axes.size(); ++i) leading = leading && axes[i] == static_cast<int>(i);
  if (!n.attrs.keepdims && !leading) dy = c.b().reshape(dy, reduced_shape(x, axes, true));
  return c.b().broadcast_to(dy, x, "dx");
}

void grad_reduce_sum(GradContext& c, const Node& n) {
  if (c.needs(0)) c.accumulate(0, expand_to_input(c, n, c.dout(0)));
}

void grad_reduce_mean(GradContext& c, const Node& n) {
  if (!c.needs(0)) return;
  const Shape& x = c.graph().shape(n.inputs[0]);
  const int64_t count = x.numel() / c.graph().shape(n.outputs[0]).numel();
  ValueId dy = c.b().scale(c.dout(0), 1.f / static_cast<float>(count), "dy_over_count");
  c.accumulate(0, expand_to_input(c, n, dy));
}

void grad_reduce_max(GradContext& c, const Node& n) {
  if (!c.needs(0)) return;
  c.accumulate(
      0, c.b().op1(OpKind::kReduceMaxGrad, {n.inputs[0], n.outputs[0], c.dout(0)}, n.attrs, "dx"));
}

// One add/compare per input element.
OpCost cost_reduce(const Graph& g, const Node& n) {
  OpCost c;
  for (ValueId v : n.inputs) c.bytes += 4.0 * static_cast<double>(g.shape(v).numel());
  for (ValueId v : n.outputs) c.bytes += 4.0 * static_cast<double>(g.shape(v).numel());
  c.flops = static_cast<double>(g.shape(n.inputs[0]).numel()) *
            (n.kind == OpKind::kReduceMaxGrad ? 2.0 : 1.0);
  return c;
}

}  // namespace

// Sharding: kept dims pass through. Reduced dims: reductions for reduce_sum
// (a Partial(sum) of shard sums is exact); replicated for reduce_mean (a shard's
// mean is not a part of the mean: summing k shard means gives k * mean) and for
// reduce_max / reduce_max_grad (no Partial(max) yet). sum and mean are linear.
namespace {
ShardingRule sharding_reduce(const Graph& g, const Node& n) {
  const Shape& x = g.shape(n.inputs[0]);
  std::vector<int> axes = value_or_throw(reduced_axes(x, n));
  const int ni = static_cast<int>(n.inputs.size());
  ShardingRule r(ni, 1);
  int kept = 0;
  for (int d = 0; d < x.rank(); ++d) {
    const bool red = contains(axes, d);
    auto kind = !red                           ? ShardingRule::Factor::kPassThrough
                : n.kind == OpKind::kReduceSum ? ShardingRule::Factor::kReduction
                                               : ShardingRule::Factor::kNeedReplicate;
    int f = r.add(x.name(d), x.size(d), kind);
    r.in(f, 0, d);
    // reduce_max_grad: (x, y, dy) -> dx [x's shape]; y and dy have the reduced shape.
    const int yd = n.attrs.keepdims ? d : kept;
    if (n.kind == OpKind::kReduceMaxGrad) {
      r.out(f, 0, d);
      if (!red) r.in(f, 1, yd).in(f, 2, yd);
    } else if (!red) {
      r.out(f, 0, yd);
    }
    if (!red) ++kept;
  }
  if (n.kind == OpKind::kReduceSum || n.kind == OpKind::kReduceMean) r.partial_inputs = {{0}};
  if (n.kind == OpKind::kReduceMaxGrad) r.partial_inputs = {{2}};
  return r;
}
}  // namespace

void register_reduce_ops(OpTable& t) {
  add_op(t, OpKind::kReduceSum, 1, infer_reduce, grad_reduce_sum, cost_reduce);
  add_op(t, OpKind::kReduceMean, 1, infer_reduce, grad_reduce_mean, cost_reduce);
  add_op(t, OpKind::kReduceMax, 1, infer_reduce, grad_reduce_max, cost_reduce);
  add_op(t, OpKind::kReduceMaxGrad, 3, infer_reduce_max_grad, nullptr, cost_reduce);
  for (OpKind k :
       {OpKind::kReduceSum, OpKind::kReduceMean, OpKind::kReduceMax, OpKind::kReduceMaxGrad})
    set_sharding(t, k, sharding_reduce);
}

}  // namespace meshflow
