// Activations: element-wise, f32, output shape (and dim names) = x's.
//   relu(x)               max(x, 0)
//   gelu(x)               0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//                         (PyTorch gelu(x, approximate='tanh'))
//   silu(x)               x * sigmoid(x)
// and their gradients, emitted by the rules below (they have no gradient of their own):
//   relu_grad(x, dy)      dy * (x > 0)
//   gelu_grad(x, dy)      dy * gelu'(x)
//   silu_grad(x, dy)      dy * silu'(x)
// No attrs.
#include "meshflow/ops/grad_context.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/ops/sharding_rule.h"

namespace meshflow {

namespace {

Status infer_activation(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(expect_inputs(g, n, 1));
  MF_RETURN_IF_ERROR(expect_dtype(g, n, 0, DType::F32));
  outs->push_back(out_value(g.shape(n.inputs[0])));
  return Status::ok();
}

// (x, dy) -> dx: dy must have x's sizes.
Status infer_activation_grad(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(expect_inputs(g, n, 2));
  MF_RETURN_IF_ERROR(expect_dtype(g, n, 0, DType::F32));
  MF_RETURN_IF_ERROR(expect_dtype(g, n, 1, DType::F32));
  const Shape& x = g.shape(n.inputs[0]);
  const Shape& dy = g.shape(n.inputs[1]);
  if (!x.same_sizes(dy))
    return Status::invalid(node_label(n) + ": dy" + dy.to_string() + " must have the sizes of x" +
                           x.to_string());
  outs->push_back(out_value(x));
  return Status::ok();
}

template <OpKind kGradKind>
void grad_activation(GradContext& c, const Node& n) {
  if (c.needs(0)) c.accumulate(0, c.b().op1(kGradKind, {n.inputs[0], c.dout(0)}, {}, "dx"));
}

// Flops per element, counting exp/tanh and a division as a few flops each.
double flops_per_element(OpKind k) {
  switch (k) {
    case OpKind::kGelu:
      return 16;
    case OpKind::kGeluGrad:
      return 24;
    case OpKind::kSilu:
      return 8;
    case OpKind::kSiluGrad:
      return 12;
    default:
      return 1;
  }
}

OpCost cost_activation(const Graph& g, const Node& n) {
  const double e = static_cast<double>(g.shape(n.outputs[0]).numel());
  OpCost c;
  c.flops = flops_per_element(n.kind) * e;
  c.bytes = 4.0 * e * static_cast<double>(n.inputs.size() + 1);
  return c;
}

}  // namespace

// Sharding: element-wise, every dim passes through; the gradients are linear in dy.
namespace {
ShardingRule sharding_activation(const Graph& g, const Node& n) {
  return broadcast_rule(g, n, g.shape(n.outputs[0]));
}
ShardingRule sharding_activation_grad(const Graph& g, const Node& n) {
  ShardingRule r = broadcast_rule(g, n, g.shape(n.outputs[0]));
  r.partial_inputs = {{1}};
  return r;
}
}  // namespace

void register_activation_ops(OpTable& t) {
  add_op(t, OpKind::kRelu, 1, infer_activation, grad_activation<OpKind::kReluGrad>,
         cost_activation);
  add_op(t, OpKind::kGelu, 1, infer_activation, grad_activation<OpKind::kGeluGrad>,
         cost_activation);
  add_op(t, OpKind::kSilu, 1, infer_activation, grad_activation<OpKind::kSiluGrad>,
         cost_activation);
  add_op(t, OpKind::kReluGrad, 2, infer_activation_grad, nullptr, cost_activation);
  add_op(t, OpKind::kGeluGrad, 2, infer_activation_grad, nullptr, cost_activation);
  add_op(t, OpKind::kSiluGrad, 2, infer_activation_grad, nullptr, cost_activation);
  for (OpKind k : {OpKind::kRelu, OpKind::kGelu, OpKind::kSilu})
    set_sharding(t, k, sharding_activation);
  for (OpKind k : {OpKind::kReluGrad, OpKind::kGeluGrad, OpKind::kSiluGrad})
    set_sharding(t, k, sharding_activation_grad);
}

}  // namespace meshflow
