// Optimizer ops. Update ops mutate their state inputs in place (OpDef::mutates)
// and have no outputs; they run in Phase::kOptimizer after every read of the
// old values (the verifier checks it).
//   sum_squares(x) -> [] f32                     sum of x^2 (gradient-norm pieces)
//   clip_coef(s_1, ..., s_n) -> (coef [], norm [])  norm = sqrt(sum s_i);
//        coef = min(1, max_norm / (norm + 1e-6)), or 1 when attrs.max_norm <= 0
//   sgd_update(param, grad, momentum_buf, lr [], coef [])       PyTorch SGD semantics
//        attrs: momentum, weight_decay (L2, added to the gradient), nesterov
//   adamw_update(param, grad, m, v, lr [], step [], coef [])     PyTorch AdamW semantics
//        attrs: beta1, beta2, eps, weight_decay (decoupled); step is 1-based
// grad is multiplied by coef first (global-norm clipping).
#include "meshflow/ops/op_def.h"
#include "meshflow/ops/sharding_rule.h"

namespace meshflow {

namespace {

Status expect_scalar(const Graph& g, const Node& n, int i) {
  if (g.shape(n.inputs[i]).numel() != 1)
    return Status::invalid(node_label(n) + ": input " + std::to_string(i) +
                           " must be a scalar, got " + g.shape(n.inputs[i]).to_string());
  return Status::ok();
}

Status expect_same(const Graph& g, const Node& n, int i, int j) {
  if (!g.shape(n.inputs[i]).same_sizes(g.shape(n.inputs[j])))
    return Status::invalid(node_label(n) + ": input " + std::to_string(j) + " " +
                           g.shape(n.inputs[j]).to_string() + " must have the shape of input " +
                           std::to_string(i) + " " + g.shape(n.inputs[i]).to_string());
  return Status::ok();
}

Status infer_sum_squares(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(expect_inputs(g, n, 1));
  outs->push_back(out_value(Shape{}));
  return Status::ok();
}

Status infer_clip_coef(const Graph& g, const Node& n, std::vector<Value>* outs) {
  if (n.inputs.empty()) return Status::invalid(node_label(n) + ": needs at least one input");
  for (size_t i = 0; i < n.inputs.size(); ++i)
    MF_RETURN_IF_ERROR(expect_scalar(g, n, static_cast<int>(i)));
  outs->push_back(out_value(Shape{}));
  outs->push_back(out_value(Shape{}));
  return Status::ok();
}

Status infer_sgd(const Graph& g, const Node& n, std::vector<Value>*) {
  MF_RETURN_IF_ERROR(expect_inputs(g, n, 5));
  MF_RETURN_IF_ERROR(expect_same(g, n, 0, 1));
  MF_RETURN_IF_ERROR(expect_same(g, n, 0, 2));
  MF_RETURN_IF_ERROR(expect_scalar(g, n, 3));
  MF_RETURN_IF_ERROR(expect_scalar(g, n, 4));
  return Status::ok();
}

Status infer_adamw(const Graph& g, const Node& n, std::vector<Value>*) {
  MF_RETURN_IF_ERROR(expect_inputs(g, n, 7));
  for (int i = 1; i <= 3; ++i) MF_RETURN_IF_ERROR(expect_same(g, n, 0, i));
  for (int i = 4; i <= 6; ++i) MF_RETURN_IF_ERROR(expect_scalar(g, n, i));
  return Status::ok();
}

OpCost cost_update(const Graph& g, const Node& n) {
  double e = g.shape(n.inputs[0]).numel();
  int tensors = n.kind == OpKind::kAdamWUpdate ? 4 : 3;
  return {e * (n.kind == OpKind::kAdamWUpdate ? 12 : 5), e * 4 * (2 * tensors - 1)};
}

}  // namespace

// Sharding: sum_squares' dims are all reductions (shard sums of squares add up
// exactly: Partial). clip_coef works on scalars (no factors). The updates are
// element-wise over the parameter's dims (param, grad and states sharded alike;
// lr, step and coef are scalars).
namespace {
ShardingRule sharding_sum_squares(const Graph& g, const Node& n) {
  ShardingRule r = broadcast_rule(g, n, g.shape(n.inputs[0]));
  for (auto& f : r.factors) f.kind = ShardingRule::Factor::kReduction;
  return r;
}
ShardingRule sharding_scalars(const Graph&, const Node& n) {
  return ShardingRule(static_cast<int>(n.inputs.size()), static_cast<int>(n.outputs.size()));
}
ShardingRule sharding_update(const Graph& g, const Node& n) {
  return broadcast_rule(g, n, g.shape(n.inputs[0]));
}
}  // namespace

void register_optimizer_ops(OpTable& t) {
  add_op(t, OpKind::kSumSquares, 1, infer_sum_squares, nullptr);
  add_op(t, OpKind::kClipCoef, -1, infer_clip_coef, nullptr);
  add_op(t, OpKind::kSgdUpdate, 5, infer_sgd, nullptr, cost_update, /*mutates=*/0b101);
  add_op(t, OpKind::kAdamWUpdate, 7, infer_adamw, nullptr, cost_update, /*mutates=*/0b1101);
  set_sharding(t, OpKind::kSumSquares, sharding_sum_squares);
  set_sharding(t, OpKind::kClipCoef, sharding_scalars);
  set_sharding(t, OpKind::kSgdUpdate, sharding_update);
  set_sharding(t, OpKind::kAdamWUpdate, sharding_update);
}

}  // namespace meshflow
