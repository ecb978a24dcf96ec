// Element-wise ops with numpy broadcasting (right-aligned; a dim of size 1
// broadcasts). Output dim names come from the operand that is not broadcast.
//   add, sub, mul, div   (a, b) -> y
//   scale                x -> alpha * x                       attrs.alpha
//   bias_add             x[.., N] + bias[N]
//   sum_to               x -> sum over broadcast dims down to attrs.shape (gradient of
//   broadcasting) broadcast_to         x -> attrs.shape
#include "meshflow/ops/grad_context.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/ops/sharding_rule.h"

namespace meshflow {

// True if `small` broadcasts to `big` (right-aligned, each dim equal or 1).
bool broadcasts_to(const Shape& small, const Shape& big) {
  if (small.rank() > big.rank()) return false;
  int off = big.rank() - small.rank();
  for (int i = 0; i < small.rank(); ++i)
    if (small.size(i) != 1 && small.size(i) != big.size(i + off)) return false;
  return true;
}

namespace {

Status infer_binary(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(expect_inputs(g, n, 2));
  MF_ASSIGN_OR_RETURN(Shape s, broadcast_shapes(g.shape(n.inputs[0]), g.shape(n.inputs[1]), n));
  outs->push_back(out_value(std::move(s)));
  return Status::ok();
}

Status infer_unary_same(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(expect_inputs(g, n, 1));
  outs->push_back(out_value(g.shape(n.inputs[0])));
  return Status::ok();
}

Status infer_bias_add(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(expect_inputs(g, n, 2));
  const Shape& x = g.shape(n.inputs[0]);
  const Shape& b = g.shape(n.inputs[1]);
  if (b.rank() != 1 || x.rank() < 1 || b.size(0) != x.size(-1))
    return Status::invalid(node_label(n) + ": bias" + b.to_string() +
                           " must be 1-D with the size of the last dim of x" + x.to_string());
  outs->push_back(out_value(x));
  return Status::ok();
}

Status infer_sum_to(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(expect_inputs(g, n, 1));
  if (!broadcasts_to(n.attrs.shape, g.shape(n.inputs[0])))
    return Status::invalid(node_label(n) + ": target " + n.attrs.shape.to_string() +
                           " does not broadcast to " + g.shape(n.inputs[0]).to_string());
  outs->push_back(out_value(n.attrs.shape));
  return Status::ok();
}

Status infer_broadcast_to(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(expect_inputs(g, n, 1));
  if (!broadcasts_to(g.shape(n.inputs[0]), n.attrs.shape))
    return Status::invalid(node_label(n) + ": " + g.shape(n.inputs[0]).to_string() +
                           " does not broadcast to " + n.attrs.shape.to_string());
  outs->push_back(out_value(n.attrs.shape));
  return Status::ok();
}

// dY reduced to the shape of input i (identity when shapes already agree).
ValueId reduce_to_input(GradContext& c, const Node& n, ValueId dy, int i) {
  const Shape& target = c.graph().shape(n.inputs[i]);
  if (c.graph().shape(dy).same_sizes(target)) return dy;
  return c.b().sum_to(dy, target);
}

void grad_add(GradContext& c, const Node& n) {
  ValueId dy = c.dout(0);
  for (int i = 0; i < 2; ++i)
    if (c.needs(i)) c.accumulate(i, reduce_to_input(c, n, dy, i));
}

void grad_sub(GradContext& c, const Node& n) {
  ValueId dy = c.dout(0);
  if (c.needs(0)) c.accumulate(0, reduce_to_input(c, n, dy, 0));
  if (c.needs(1)) c.accumulate(1, c.b().scale(reduce_to_input(c, n, dy, 1), -1.f));
}

void grad_mul(GradContext& c, const Node& n) {
  ValueId dy = c.dout(0);
  if (c.needs(0)) c.accumulate(0, reduce_to_input(c, n, c.b().mul(dy, n.inputs[1]), 0));
  if (c.needs(1)) c.accumulate(1, reduce_to_input(c, n, c.b().mul(dy, n.inputs[0]), 1));
}

void grad_div(GradContext& c, const Node& n) {
  ValueId dy = c.dout(0);
  ValueId b = n.inputs[1], y = n.outputs[0];
  if (c.needs(0)) c.accumulate(0, reduce_to_input(c, n, c.b().div(dy, b), 0));
  if (c.needs(1)) {
    ValueId t = c.b().scale(c.b().div(c.b().mul(dy, y), b), -1.f);
    c.accumulate(1, reduce_to_input(c, n, t, 1));
  }
}

void grad_scale(GradContext& c, const Node& n) {
  if (c.needs(0)) c.accumulate(0, c.b().scale(c.dout(0), n.attrs.alpha));
}

void grad_bias_add(GradContext& c, const Node& n) {
  ValueId dy = c.dout(0);
  if (c.needs(0)) c.accumulate(0, dy);
  if (c.needs(1)) c.accumulate(1, c.b().sum_to(dy, c.graph().shape(n.inputs[1])));
}

void grad_sum_to(GradContext& c, const Node& n) {
  if (c.needs(0)) c.accumulate(0, c.b().broadcast_to(c.dout(0), c.graph().shape(n.inputs[0])));
}

void grad_broadcast_to(GradContext& c, const Node& n) {
  if (c.needs(0)) c.accumulate(0, c.b().sum_to(c.dout(0), c.graph().shape(n.inputs[0])));
}

}  // namespace

// Sharding: one factor per output dim; a broadcast (size-1) input dim is
// absent. Partial inputs where the op is linear: add/sub/bias_add in both
// together, mul in either, div in the numerator, the unary ops in x. sum_to's
// summed dims are reductions (sharding them leaves the result Partial).
namespace {
template <int kPartial>  // 0: {0,1}, 1: {0},{1}, 2: {0}
ShardingRule sharding_binary(const Graph& g, const Node& n) {
  ShardingRule r = broadcast_rule(g, n, g.shape(n.outputs[0]));
  if (kPartial == 0) r.partial_inputs = {{0, 1}};
  if (kPartial == 1) r.partial_inputs = {{0}, {1}};
  if (kPartial == 2) r.partial_inputs = {{0}};
  return r;
}
ShardingRule sharding_sum_to(const Graph& g, const Node& n) {
  ShardingRule r = broadcast_rule(g, n, g.shape(n.inputs[0]));
  for (auto& f : r.factors)
    if (f.output_dim[0] < 0) f.kind = ShardingRule::Factor::kReduction;
  r.partial_inputs = {{0}};
  return r;
}
}  // namespace

void register_elementwise_ops(OpTable& t) {
  add_op(t, OpKind::kAdd, 2, infer_binary, grad_add);
  add_op(t, OpKind::kSub, 2, infer_binary, grad_sub);
  add_op(t, OpKind::kMul, 2, infer_binary, grad_mul);
  add_op(t, OpKind::kDiv, 2, infer_binary, grad_div);
  add_op(t, OpKind::kScale, 1, infer_unary_same, grad_scale);
  add_op(t, OpKind::kBiasAdd, 2, infer_bias_add, grad_bias_add);
  add_op(t, OpKind::kSumTo, 1, infer_sum_to, grad_sum_to);
  add_op(t, OpKind::kBroadcastTo, 1, infer_broadcast_to, grad_broadcast_to);
  set_sharding(t, OpKind::kAdd, sharding_binary<0>);
  set_sharding(t, OpKind::kSub, sharding_binary<0>);
  set_sharding(t, OpKind::kMul, sharding_binary<1>);
  set_sharding(t, OpKind::kDiv, sharding_binary<2>);
  set_sharding(t, OpKind::kScale, sharding_binary<2>);
  set_sharding(t, OpKind::kBiasAdd, sharding_binary<0>);
  set_sharding(t, OpKind::kSumTo, sharding_sum_to);
  set_sharding(t, OpKind::kBroadcastTo, sharding_binary<2>);
}

}  // namespace meshflow
