// Batch normalization over every dim but dim 1 (channels C), as torch's
// BatchNorm1d / BatchNorm2d. M = the elements per channel (N x spatial).
//   batch_norm        (x [N, C, ..], gamma [C], beta [C], running_mean [C], running_var [C],
//                      rng_offset [2]) -> (y [N, C, ..], mean [C], rstd [C])
//                     training (rng_offset[0] >= 0): the batch's mean and biased variance;
//                     evaluation (rng_offset[0] < 0): the running ones.
//                     (x, gamma, beta) alone: training only, the form a recompute clone
//                     takes (OpDef::training_inputs), since it runs after the forward
//                     updated the running statistics.
//                     y = (x - mean) rstd gamma + beta, rstd = 1 / sqrt(var + eps)
//   batch_norm_grad   (dy, x, gamma, mean, rstd) -> (dx, dgamma [C], dbeta [C])
//   batch_norm_update (running_mean, running_var, mean, rstd): updates the first two in
//                     place (forward phase; evaluation never runs it):
//                     running = (1 - momentum) running + momentum batch, the variance
//                     unbiased (x M / (M - 1): attrs.alpha)
// attrs: eps; update: momentum, alpha.
//
// Split over ranks: channels pass through. The batch and spatial dims are
// collective factors: each rank sums its block per channel and the kernel
// all-reduces the sums over the mesh axes that split them (attrs.ints, set by
// the partitioner), so the statistics are the whole batch's (synchronized
// batch norm) and every output is whole.
#include <string>

#include "meshflow/ops/grad_context.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/ops/sharding_rule.h"

namespace meshflow {

namespace {

Status expect_channels(const Graph& g, const Node& n, int i, const char* what, int64_t c) {
  const Shape& v = g.shape(n.inputs[i]);
  if (v.rank() != 1 || v.size(0) != c)
    return Status::invalid(node_label(n) + ": " + what + v.to_string() + " must be 1-D of size " +
                           std::to_string(c) + ", the channels (dim 1) of x");
  return expect_dtype(g, n, i, DType::F32);
}

Status expect_x(const Graph& g, const Node& n, int i) {
  const Shape& x = g.shape(n.inputs[i]);
  if (x.rank() < 2)
    return Status::invalid(node_label(n) + ": x" + x.to_string() +
                           " must have at least 2 dims (batch, channels, ...)");
  return expect_dtype(g, n, i, DType::F32);
}

Status infer_batch_norm(const Graph& g, const Node& n, std::vector<Value>* outs) {
  const bool training_only = n.inputs.size() == 3;
  if (!training_only) MF_RETURN_IF_ERROR(expect_inputs(g, n, 6));
  MF_RETURN_IF_ERROR(expect_x(g, n, 0));
  const Shape& x = g.shape(n.inputs[0]);
  const int64_t c = x.size(1);
  MF_RETURN_IF_ERROR(expect_channels(g, n, 1, "gamma", c));
  MF_RETURN_IF_ERROR(expect_channels(g, n, 2, "beta", c));
  if (!training_only) {
    MF_RETURN_IF_ERROR(expect_channels(g, n, 3, "running_mean", c));
    MF_RETURN_IF_ERROR(expect_channels(g, n, 4, "running_var", c));
    MF_RETURN_IF_ERROR(expect_dtype(g, n, 5, DType::I32));
  }
  const Shape stat{{x.name(1), c}};
  outs->push_back(out_value(x));
  outs->push_back(out_value(stat));
  outs->push_back(out_value(stat));
  return Status::ok();
}

// inputs: dy, x, gamma, mean, rstd
Status infer_batch_norm_grad(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(expect_inputs(g, n, 5));
  MF_RETURN_IF_ERROR(expect_x(g, n, 1));
  const Shape& x = g.shape(n.inputs[1]);
  if (!g.shape(n.inputs[0]).same_sizes(x))
    return Status::invalid(node_label(n) + ": dy" + g.shape(n.inputs[0]).to_string() +
                           " must have the sizes of x" + x.to_string());
  const int64_t c = x.size(1);
  MF_RETURN_IF_ERROR(expect_channels(g, n, 2, "gamma", c));
  MF_RETURN_IF_ERROR(expect_channels(g, n, 3, "mean", c));
  MF_RETURN_IF_ERROR(expect_channels(g, n, 4, "rstd", c));
  outs->push_back(out_value(x));
  outs->push_back(out_value(g.shape(n.inputs[2])));
  outs->push_back(out_value(g.shape(n.inputs[2])));
  return Status::ok();
}

// inputs: running_mean, running_var, mean, rstd (all [C]); no outputs.
Status infer_batch_norm_update(const Graph& g, const Node& n, std::vector<Value>* outs) {
  (void)outs;
  MF_RETURN_IF_ERROR(expect_inputs(g, n, 4));
  const int64_t c = g.shape(n.inputs[0]).numel();
  for (int i = 0; i < 4; ++i)
    MF_RETURN_IF_ERROR(expect_channels(g, n, i,
                                       i == 0   ? "running_mean"
                                       : i == 1 ? "running_var"
                                       : i == 2 ? "mean"
                                                : "rstd",
                                       c));
  if (n.attrs.momentum < 0.f || n.attrs.momentum > 1.f)
    return Status::invalid(node_label(n) + ": momentum " + std::to_string(n.attrs.momentum) +
                           " must be in [0, 1]");
  return Status::ok();
}

void grad_batch_norm(GradContext& c, const Node& n) {
  for (int i = 1; i < 3; ++i)
    if (c.dout(i) != kNoValue)
      throw StatusError(Status::invalid(
          node_label(n) + ": output " + std::to_string(i) +
          " (a saved statistic) is used by the loss; only output 0 (y) is differentiable"));
  const ValueId dy = c.dout(0);
  if (dy == kNoValue) return;
  Attrs at;
  at.eps = n.attrs.eps;
  const std::vector<ValueId> g =
      c.b().op(OpKind::kBatchNormGrad, {dy, n.inputs[0], n.inputs[1], n.outputs[1], n.outputs[2]},
               at, "batch_norm_grad");
  for (int i = 0; i < 3; ++i)
    if (c.needs(i)) c.accumulate(i, g[i]);
}

// Memory-bound: x read twice and y written (forward); dy, x read twice, dx
// written (backward). About 10 flops an element.
OpCost cost_batch_norm(const Graph& g, const Node& n) {
  OpCost c;
  if (n.kind == OpKind::kBatchNormUpdate) {
    c.flops = 8.0 * double(g.shape(n.inputs[0]).numel());
    c.bytes = 4.0 * 6.0 * double(g.shape(n.inputs[0]).numel());
    return c;
  }
  const int xi = n.kind == OpKind::kBatchNorm ? 0 : 1;
  const double e = double(g.shape(n.inputs[xi]).numel());
  c.flops = 10.0 * e;
  c.bytes = 4.0 * e * (n.kind == OpKind::kBatchNorm ? 3.0 : 5.0);
  return c;
}

ShardingRule sharding_batch_norm(const Graph& g, const Node& n) {
  using F = ShardingRule::Factor;
  const int ni = static_cast<int>(n.inputs.size()), no = static_cast<int>(n.outputs.size());
  ShardingRule r(ni, no);
  if (n.kind == OpKind::kBatchNormUpdate) {  // four [C] vectors
    const Shape& v = g.shape(n.inputs[0]);
    const int f = r.add(v.name(0), v.size(0));
    for (int i = 0; i < ni; ++i) r.in(f, i, 0);
    return r;
  }
  const bool fwd = n.kind == OpKind::kBatchNorm;
  const Shape& x = g.shape(n.inputs[fwd ? 0 : 1]);
  // Operand roles: X = x-shaped, C = [C], - = rng_offset.
  const char* ins = fwd ? (ni == 3 ? "XCC" : "XCCCC-") : "XXCCC";
  const char* outs = fwd ? "XCC" : "XCC";
  const int ch = r.add(x.name(1), x.size(1));
  for (int i = 0; i < ni; ++i)
    if (ins[i] != '-') r.in(ch, i, ins[i] == 'X' ? 1 : 0);
  for (int o = 0; o < no; ++o) r.out(ch, o, outs[o] == 'X' ? 1 : 0);
  for (int d = 0; d < x.rank(); ++d) {
    if (d == 1) continue;
    const int f = r.add(x.name(d), x.size(d), F::kCollective);
    for (int i = 0; i < ni; ++i)
      if (ins[i] == 'X') r.in(f, i, d);
    r.out(f, 0, d);
  }
  if (fwd && ni == 6) r.in(r.add("rng", 2, F::kNeedReplicate), 5, 0);
  return r;
}

// On one rank: the kernel all-reduces its per-channel sums over the mesh
// axes that split the batch or spatial dims.
void batch_norm_local(LocalAttrsCall& c) {
  const int xi = c.n.kind == OpKind::kBatchNorm ? 0 : 1;
  const Shape& x = c.g.shape(c.n.inputs[xi]);
  c.attrs.ints.clear();
  for (int d = 0; d < x.rank(); ++d) {
    if (d == 1) continue;
    for (int ax : c.inputs[xi].shard_axes(d))
      if (c.mesh.size(ax) > 1) c.attrs.ints.push_back(ax);
  }
}

std::vector<InnerCollective> batch_norm_collectives(const Graph& g, const Node& n) {
  std::vector<InnerCollective> out;
  const int64_t c = g.shape(n.inputs[n.kind == OpKind::kBatchNorm ? 0 : 1]).size(1);
  for (int64_t axis : n.attrs.ints) {
    if (n.kind == OpKind::kBatchNorm) {
      out.push_back({OpKind::kAllReduce, static_cast<int>(axis), c + 1, "channel sums and count"});
      out.push_back({OpKind::kAllReduce, static_cast<int>(axis), c, "squared deviations"});
    } else {
      out.push_back(
          {OpKind::kAllReduce, static_cast<int>(axis), 2 * c + 1, "gradient sums and count"});
    }
  }
  return out;
}

}  // namespace

void register_batch_norm_ops(OpTable& t) {
  add_op(t, OpKind::kBatchNorm, 6, infer_batch_norm, grad_batch_norm, cost_batch_norm);
  add_op(t, OpKind::kBatchNormGrad, 5, infer_batch_norm_grad, nullptr, cost_batch_norm);
  add_op(t, OpKind::kBatchNormUpdate, 4, infer_batch_norm_update, nullptr, cost_batch_norm,
         /*mutates=*/0b11);
  set_training_inputs(t, OpKind::kBatchNorm, 3);
  for (OpKind k : {OpKind::kBatchNorm, OpKind::kBatchNormGrad, OpKind::kBatchNormUpdate})
    set_sharding(t, k, sharding_batch_norm);
  for (OpKind k : {OpKind::kBatchNorm, OpKind::kBatchNormGrad}) {
    set_local_attrs(t, k, batch_norm_local);
    set_inner_collectives(t, k, batch_norm_collectives);
  }
}

}  // namespace meshflow
