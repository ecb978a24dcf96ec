// Normalization over the last dim (C = channels / hidden).
//   layer_norm     (x [.., C], gamma [C], beta [C]) -> (y [.., C], mean [..], rstd [..])
//                  y = (x - mean) * rstd * gamma + beta,  rstd = 1 / sqrt(var + eps)  (biased var)
//   layer_norm_grad(dy [.., C], x, gamma, mean, rstd) -> (dx [.., C], dgamma [C], dbeta [C])
//   rms_norm       (x [.., C], gamma [C]) -> (y [.., C], rstd [..])
//                  y = x * rstd * gamma,  rstd = 1 / sqrt(mean(x^2) + eps)   (HF LlamaRMSNorm)
//   rms_norm_grad  (dy [.., C], x, gamma, rstd) -> (dx [.., C], dgamma [C])
// attrs: eps. mean and rstd are saved for the backward; no gradient flows
// through them (using them in the loss is an error at autodiff time).
#include "meshflow/ops/grad_context.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/ops/sharding_rule.h"

namespace meshflow {

namespace {

// Checks that input `i` is the 1-D [C] vector matching x's last dim.
Status expect_channel_vector(const Graph& g, const Node& n, int i, const char* what,
                             const Shape& x) {
  const Shape& v = g.shape(n.inputs[i]);
  if (v.rank() != 1 || v.size(0) != x.size(-1))
    return Status::invalid(node_label(n) + ": " + what + v.to_string() + " must be 1-D of size " +
                           std::to_string(x.size(-1)) + ", the last dim of x" + x.to_string());
  return expect_dtype(g, n, i, DType::F32);
}

// Checks that input `i` is a per-row statistic: x's shape without its last dim.
Status expect_row_stat(const Graph& g, const Node& n, int i, const char* what, const Shape& x) {
  const Shape& v = g.shape(n.inputs[i]);
  const Shape rows = x.slice(0, x.rank() - 1);
  if (!v.same_sizes(rows))
    return Status::invalid(node_label(n) + ": " + what + v.to_string() + " must have the sizes " +
                           rows.to_string() + " (x" + x.to_string() + " without its last dim)");
  return expect_dtype(g, n, i, DType::F32);
}

Status expect_normalized_input(const Graph& g, const Node& n, int i) {
  const Shape& x = g.shape(n.inputs[i]);
  if (x.rank() < 1)
    return Status::invalid(node_label(n) +
                           ": x must have at least one dim (the normalized one), got " +
                           x.to_string());
  return expect_dtype(g, n, i, DType::F32);
}

Status expect_same_sizes(const Graph& g, const Node& n, int i, const char* what, const Shape& x) {
  const Shape& v = g.shape(n.inputs[i]);
  if (!v.same_sizes(x))
    return Status::invalid(node_label(n) + ": " + what + v.to_string() +
                           " must have the sizes of x" + x.to_string());
  return expect_dtype(g, n, i, DType::F32);
}

Status infer_layer_norm(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(expect_inputs(g, n, 3));
  MF_RETURN_IF_ERROR(expect_normalized_input(g, n, 0));
  const Shape& x = g.shape(n.inputs[0]);
  MF_RETURN_IF_ERROR(expect_channel_vector(g, n, 1, "gamma", x));
  MF_RETURN_IF_ERROR(expect_channel_vector(g, n, 2, "beta", x));
  outs->push_back(out_value(x));
  outs->push_back(out_value(x.slice(0, x.rank() - 1)));
  outs->push_back(out_value(x.slice(0, x.rank() - 1)));
  return Status::ok();
}

// inputs: dy, x, gamma, mean, rstd
Status infer_layer_norm_grad(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(expect_inputs(g, n, 5));
  MF_RETURN_IF_ERROR(expect_normalized_input(g, n, 1));
  const Shape& x = g.shape(n.inputs[1]);
  MF_RETURN_IF_ERROR(expect_same_sizes(g, n, 0, "dy", x));
  MF_RETURN_IF_ERROR(expect_channel_vector(g, n, 2, "gamma", x));
  MF_RETURN_IF_ERROR(expect_row_stat(g, n, 3, "mean", x));
  MF_RETURN_IF_ERROR(expect_row_stat(g, n, 4, "rstd", x));
  outs->push_back(out_value(x));
  outs->push_back(out_value(g.shape(n.inputs[2])));
  outs->push_back(out_value(g.shape(n.inputs[2])));
  return Status::ok();
}

Status infer_rms_norm(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(expect_inputs(g, n, 2));
  MF_RETURN_IF_ERROR(expect_normalized_input(g, n, 0));
  const Shape& x = g.shape(n.inputs[0]);
  MF_RETURN_IF_ERROR(expect_channel_vector(g, n, 1, "gamma", x));
  outs->push_back(out_value(x));
  outs->push_back(out_value(x.slice(0, x.rank() - 1)));
  return Status::ok();
}

// inputs: dy, x, gamma, rstd
Status infer_rms_norm_grad(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(expect_inputs(g, n, 4));
  MF_RETURN_IF_ERROR(expect_normalized_input(g, n, 1));
  const Shape& x = g.shape(n.inputs[1]);
  MF_RETURN_IF_ERROR(expect_same_sizes(g, n, 0, "dy", x));
  MF_RETURN_IF_ERROR(expect_channel_vector(g, n, 2, "gamma", x));
  MF_RETURN_IF_ERROR(expect_row_stat(g, n, 3, "rstd", x));
  outs->push_back(out_value(x));
  outs->push_back(out_value(g.shape(n.inputs[2])));
  return Status::ok();
}

// The saved statistics are not differentiable outputs.
void reject_stat_gradients(GradContext& c, const Node& n) {
  for (size_t i = 1; i < n.outputs.size(); ++i)
    if (c.dout(static_cast<int>(i)) != kNoValue)
      throw StatusError(Status::invalid(
          node_label(n) + ": output " + std::to_string(i) +
          " (a saved statistic) is used by the loss; only output 0 (y) is differentiable"));
}

void grad_layer_norm(GradContext& c, const Node& n) {
  reject_stat_gradients(c, n);
  ValueId dy = c.dout(0);
  if (dy == kNoValue) return;
  Attrs at;
  at.eps = n.attrs.eps;
  std::vector<ValueId> g =
      c.b().op(OpKind::kLayerNormGrad, {dy, n.inputs[0], n.inputs[1], n.outputs[1], n.outputs[2]},
               at, "layer_norm_grad");
  for (int i = 0; i < 3; ++i)
    if (c.needs(i)) c.accumulate(i, g[i]);
}

void grad_rms_norm(GradContext& c, const Node& n) {
  reject_stat_gradients(c, n);
  ValueId dy = c.dout(0);
  if (dy == kNoValue) return;
  Attrs at;
  at.eps = n.attrs.eps;
  std::vector<ValueId> g = c.b().op(
      OpKind::kRmsNormGrad, {dy, n.inputs[0], n.inputs[1], n.outputs[1]}, at, "rms_norm_grad");
  for (int i = 0; i < 2; ++i)
    if (c.needs(i)) c.accumulate(i, g[i]);
}

// Costs: forward reads x (plus the [C] vectors), writes y and two row stats;
// ~8 flops per element (mean, centre, square, sum, normalize, scale, shift).
OpCost norm_cost(const Graph& g, const Node& n, int x_input, double flops_per_elem, int big_reads,
                 int big_writes) {
  const Shape& x = g.shape(n.inputs[x_input]);
  const double e = static_cast<double>(x.numel());
  const double rows = static_cast<double>(x.prod(0, x.rank() - 1));
  const double ch = static_cast<double>(x.size(-1));
  OpCost c;
  c.flops = flops_per_elem * e;
  c.bytes = 4.0 * (e * (big_reads + big_writes) + 3 * ch + 2 * rows);
  return c;
}

OpCost cost_layer_norm(const Graph& g, const Node& n) {
  return norm_cost(g, n, 0, 8, 1, 1);
}
OpCost cost_layer_norm_grad(const Graph& g, const Node& n) {
  return norm_cost(g, n, 1, 14, 2, 1);
}
OpCost cost_rms_norm(const Graph& g, const Node& n) {
  return norm_cost(g, n, 0, 5, 1, 1);
}
OpCost cost_rms_norm_grad(const Graph& g, const Node& n) {
  return norm_cost(g, n, 1, 10, 2, 1);
}

}  // namespace

// Sharding: C must be replicated (the statistics need the whole row); gamma
// and beta follow it. Row dims pass through; in the gradients they are
// reductions for dgamma/dbeta (Partial). The gradients are linear in dy.
namespace {
ShardingRule sharding_norm(const Graph& g, const Node& n) {
  // Operand roles: F = [.., C] like x, C = [C], R = a row statistic [..].
  const char* ins = "FCC";
  const char* outs = "FRR";
  bool grad = false;
  switch (n.kind) {
    case OpKind::kLayerNormGrad:
      ins = "FFCRR", outs = "FCC", grad = true;
      break;
    case OpKind::kRmsNorm:
      ins = "FC", outs = "FR";
      break;
    case OpKind::kRmsNormGrad:
      ins = "FFCR", outs = "FC", grad = true;
      break;
    default:
      break;
  }
  const Shape& x = g.shape(n.inputs[0]);
  const int ni = static_cast<int>(n.inputs.size()), no = static_cast<int>(n.outputs.size());
  ShardingRule r(ni, no);
  for (int d = 0; d + 1 < x.rank(); ++d) {
    int f = r.add(x.name(d), x.size(d),
                  grad ? ShardingRule::Factor::kReduction : ShardingRule::Factor::kPassThrough);
    for (int i = 0; i < ni; ++i)
      if (ins[i] != 'C') r.in(f, i, d);
    for (int o = 0; o < no; ++o)
      if (outs[o] != 'C') r.out(f, o, d);
  }
  int c = r.add(x.name(-1), x.size(-1), ShardingRule::Factor::kNeedReplicate);
  for (int i = 0; i < ni; ++i)
    if (ins[i] != 'R') r.in(c, i, ins[i] == 'F' ? x.rank() - 1 : 0);
  for (int o = 0; o < no; ++o)
    if (outs[o] != 'R') r.out(c, o, outs[o] == 'F' ? x.rank() - 1 : 0);
  if (grad) r.partial_inputs = {{0}};
  return r;
}
}  // namespace

void register_norm_ops(OpTable& t) {
  add_op(t, OpKind::kLayerNorm, 3, infer_layer_norm, grad_layer_norm, cost_layer_norm);
  add_op(t, OpKind::kLayerNormGrad, 5, infer_layer_norm_grad, nullptr, cost_layer_norm_grad);
  add_op(t, OpKind::kRmsNorm, 2, infer_rms_norm, grad_rms_norm, cost_rms_norm);
  add_op(t, OpKind::kRmsNormGrad, 4, infer_rms_norm_grad, nullptr, cost_rms_norm_grad);
  for (OpKind k :
       {OpKind::kLayerNorm, OpKind::kLayerNormGrad, OpKind::kRmsNorm, OpKind::kRmsNormGrad})
    set_sharding(t, k, sharding_norm);
}

}  // namespace meshflow
