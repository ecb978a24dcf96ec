// Softmax family and the classification loss, all over the last dim (V):
//   softmax(x)                         y = exp(x - logsumexp(x))
//   softmax_grad(y, dy)                dx = y * (dy - sum(dy * y))
//   log_softmax(x)                     y = x - logsumexp(x)
//   log_softmax_grad(y, dy)            dx = dy - exp(y) * sum(dy)
//   cross_entropy(logits[.., V] f32, targets[..] i32)
//       -> (0) loss [] = mean over valid positions (target >= 0) of lse - logits[target]
//          (1) lse [..] = per-position logsumexp, saved for the backward
//       Negative targets are ignored (PyTorch ignore_index); with no valid
//       position the loss is 0 (PyTorch gives nan). A target >= V is a run-time
//       MF_CHECK failure in the kernel.
//   cross_entropy_grad(logits, targets, lse, dloss[])
//       -> dlogits = (softmax(logits) - onehot(target)) * dloss / count_valid, 0 on ignored rows
//   correct_count(logits[.., V], targets[..] i32) -> [] number of valid positions whose
//       argmax (first maximum) equals the target; a metric, no gradient.
// No attrs.
#include "meshflow/core/check.h"
#include "meshflow/ops/grad_context.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/ops/sharding_rule.h"

namespace meshflow {

namespace {

Status expect_rank_at_least_1(const Graph& g, const Node& n, int input, const char* what) {
  const Shape& s = g.shape(n.inputs[input]);
  if (s.rank() < 1)
    return Status::invalid(node_label(n) + ": " + what + s.to_string() +
                           " must have at least 1 dim (the op runs over the last dim)");
  return Status::ok();
}

Status infer_softmax(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(expect_inputs(g, n, 1));
  MF_RETURN_IF_ERROR(expect_dtype(g, n, 0, DType::F32));
  MF_RETURN_IF_ERROR(expect_rank_at_least_1(g, n, 0, "x"));
  outs->push_back(out_value(g.shape(n.inputs[0])));
  return Status::ok();
}

// (y, dy) -> dx with y's shape.
Status infer_softmax_grad(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(expect_inputs(g, n, 2));
  MF_RETURN_IF_ERROR(expect_dtype(g, n, 0, DType::F32));
  MF_RETURN_IF_ERROR(expect_dtype(g, n, 1, DType::F32));
  MF_RETURN_IF_ERROR(expect_rank_at_least_1(g, n, 0, "y"));
  const Shape& y = g.shape(n.inputs[0]);
  const Shape& dy = g.shape(n.inputs[1]);
  if (!y.same_sizes(dy))
    return Status::invalid(node_label(n) + ": dy" + dy.to_string() + " must have the sizes of y" +
                           y.to_string());
  outs->push_back(out_value(y));
  return Status::ok();
}

// Checks logits [.., V] f32 and targets [..] i32 (inputs 0 and 1).
Status check_logits_targets(const Graph& g, const Node& n) {
  MF_RETURN_IF_ERROR(expect_dtype(g, n, 0, DType::F32));
  MF_RETURN_IF_ERROR(expect_dtype(g, n, 1, DType::I32));
  MF_RETURN_IF_ERROR(expect_rank_at_least_1(g, n, 0, "logits"));
  const Shape& logits = g.shape(n.inputs[0]);
  const Shape& targets = g.shape(n.inputs[1]);
  const Shape rows = logits.slice(0, logits.rank() - 1);
  if (!targets.same_sizes(rows))
    return Status::invalid(node_label(n) + ": targets" + targets.to_string() +
                           " must have the dims of logits" + logits.to_string() +
                           " without the last, i.e. " + rows.to_string());
  return Status::ok();
}

// cross_entropy and its gradient take an optional last input, count [] f32:
// the number of valid positions of the whole batch, added by the partitioner
// when the rows are sharded (a shard's loss is then a part of the mean).
Status expect_count(const Graph& g, const Node& n, int plain) {
  if (static_cast<int>(n.inputs.size()) != plain && static_cast<int>(n.inputs.size()) != plain + 1)
    return Status::invalid(node_label(n) + ": expects " + std::to_string(plain) + " inputs (or " +
                           std::to_string(plain + 1) + " with the global count), got " +
                           std::to_string(n.inputs.size()));
  if (static_cast<int>(n.inputs.size()) == plain + 1 && g.shape(n.inputs[plain]).numel() != 1)
    return Status::invalid(node_label(n) + ": the count input must be a scalar");
  return Status::ok();
}

Status infer_cross_entropy(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(expect_count(g, n, 2));
  MF_RETURN_IF_ERROR(check_logits_targets(g, n));
  const Shape& logits = g.shape(n.inputs[0]);
  outs->push_back(out_value(Shape{}));
  outs->push_back(out_value(logits.slice(0, logits.rank() - 1)));
  return Status::ok();
}

Status infer_cross_entropy_grad(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(expect_count(g, n, 4));
  MF_RETURN_IF_ERROR(check_logits_targets(g, n));
  MF_RETURN_IF_ERROR(expect_dtype(g, n, 2, DType::F32));
  MF_RETURN_IF_ERROR(expect_dtype(g, n, 3, DType::F32));
  const Shape& targets = g.shape(n.inputs[1]);
  const Shape& lse = g.shape(n.inputs[2]);
  const Shape& dloss = g.shape(n.inputs[3]);
  if (!lse.same_sizes(targets))
    return Status::invalid(node_label(n) + ": lse" + lse.to_string() +
                           " must have the sizes of targets" + targets.to_string());
  if (dloss.numel() != 1 || dloss.rank() != 0)
    return Status::invalid(node_label(n) + ": dloss" + dloss.to_string() + " must be a scalar []");
  outs->push_back(out_value(g.shape(n.inputs[0])));
  return Status::ok();
}

Status infer_correct_count(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(expect_inputs(g, n, 2));
  MF_RETURN_IF_ERROR(check_logits_targets(g, n));
  outs->push_back(out_value(Shape{}));
  return Status::ok();
}

void grad_softmax(GradContext& c, const Node& n) {
  if (c.needs(0))
    c.accumulate(0, c.b().op1(OpKind::kSoftmaxGrad, {n.outputs[0], c.dout(0)}, {}, "dx"));
}

void grad_log_softmax(GradContext& c, const Node& n) {
  if (c.needs(0))
    c.accumulate(0, c.b().op1(OpKind::kLogSoftmaxGrad, {n.outputs[0], c.dout(0)}, {}, "dx"));
}

void grad_cross_entropy(GradContext& c, const Node& n) {
  MF_CHECK(c.dout(1) == kNoValue) << node_label(n)
                                  << ": a gradient through the saved lse output is not supported";
  if (!c.needs(0) || c.dout(0) == kNoValue) return;
  c.accumulate(0, c.b().op1(OpKind::kCrossEntropyGrad,
                            {n.inputs[0], n.inputs[1], n.outputs[1], c.dout(0)}, {}, "dlogits"));
}

// Per logit: max, subtract, exp (~a few flops), sum.
OpCost cost_rows(const Graph& g, const Node& n, double flops_per_logit, double logit_passes) {
  const double e = static_cast<double>(g.shape(n.inputs[0]).numel());
  const double rows = e / static_cast<double>(g.shape(n.inputs[0]).size(-1));
  OpCost c;
  c.flops = flops_per_logit * e;
  c.bytes = 4.0 * (logit_passes * e + 2.0 * rows + 1.0);
  return c;
}

OpCost cost_softmax(const Graph& g, const Node& n) {
  // softmax / log_softmax read x, write y; their grads read y, dy and write dx.
  const bool grad = n.kind == OpKind::kSoftmaxGrad || n.kind == OpKind::kLogSoftmaxGrad;
  return cost_rows(g, n, grad ? 4 : 6, grad ? 3 : 2);
}
OpCost cost_cross_entropy(const Graph& g, const Node& n) {
  return cost_rows(g, n, 6, 1);
}
OpCost cost_cross_entropy_grad(const Graph& g, const Node& n) {
  return cost_rows(g, n, 6, 2);
}
OpCost cost_correct_count(const Graph& g, const Node& n) {
  return cost_rows(g, n, 2, 1);
}

}  // namespace

// Sharding: V (the last dim) must be replicated everywhere. Leading dims pass
// through softmax/log_softmax and their gradients (linear in dy). The loss is a
// mean over the valid positions with one global count: with the rows sharded,
// each shard divides its sum by the global count (the count input the
// partitioner adds), so cross_entropy's rows are reductions (loss Partial, lse
// sharded) and pass through its gradient. correct_count sums: its position dims
// are reductions (Partial(sum) of counts is exact).
namespace {
ShardingRule sharding_softmax(const Graph& g, const Node& n) {
  const Shape& x = g.shape(n.inputs[0]);
  ShardingRule r = broadcast_rule(g, n, x);
  set_input_factor_kind(r, 0, x.rank() - 1, ShardingRule::Factor::kNeedReplicate);
  if (n.inputs.size() == 2) r.partial_inputs = {{1}};
  return r;
}
// Logits [.., V]; input 1 (targets) and `rows_out` (-1: none) have the leading dims.
ShardingRule logits_rule(const Graph& g, const Node& n, ShardingRule::Factor::Kind rows,
                         int rows_out) {
  const Shape& x = g.shape(n.inputs[0]);
  ShardingRule r(static_cast<int>(n.inputs.size()), static_cast<int>(n.outputs.size()));
  for (int d = 0; d + 1 < x.rank(); ++d) {
    int f = r.add(x.name(d), x.size(d), rows);
    r.in(f, 0, d).in(f, 1, d);
    if (n.kind == OpKind::kCrossEntropyGrad) r.in(f, 2, d);  // lse
    if (rows_out >= 0) r.out(f, rows_out, d);
  }
  // V: vocab-parallel cross-entropy reduces over its shards in the kernel
  // (loss and lse whole), and its gradient is local; correct_count (an argmax)
  // needs V whole.
  const auto vkind = n.kind == OpKind::kCrossEntropy       ? ShardingRule::Factor::kCollective
                     : n.kind == OpKind::kCrossEntropyGrad ? ShardingRule::Factor::kPassThrough
                                                           : ShardingRule::Factor::kNeedReplicate;
  int v = r.add(x.name(-1), x.size(-1), vkind);
  r.in(v, 0, x.rank() - 1);
  if (n.kind == OpKind::kCrossEntropyGrad) r.out(v, 0, x.rank() - 1);
  if (n.kind == OpKind::kCrossEntropyGrad)
    for (int f = 0; f + 1 < static_cast<int>(r.factors.size()); ++f) r.out(f, 0, f);
  return r;
}
ShardingRule sharding_cross_entropy(const Graph& g, const Node& n) {
  return logits_rule(g, n, ShardingRule::Factor::kReduction, 1);
}
ShardingRule sharding_cross_entropy_grad(const Graph& g, const Node& n) {
  return logits_rule(g, n, ShardingRule::Factor::kPassThrough, -1);
}
ShardingRule sharding_correct_count(const Graph& g, const Node& n) {
  return logits_rule(g, n, ShardingRule::Factor::kReduction, -1);
}
}  // namespace

// Vocab-parallel (the partitioner set attrs.ints: the mesh axes splitting
// the vocabulary): per axis, three all_reduces of one f32 per row (maxima,
// sums of exp, target logits; kernels/cpu/softmax.cc).
namespace {
std::vector<InnerCollective> cross_entropy_collectives(const Graph& g, const Node& n) {
  std::vector<InnerCollective> out;
  const Shape& x = g.shape(n.inputs[0]);
  const int64_t rows = x.numel() / std::max<int64_t>(1, x.size(-1));
  for (int64_t axis : n.attrs.ints)
    for (const char* what : {"row maxima", "row sums of exp", "target logits"})
      out.push_back({OpKind::kAllReduce, static_cast<int>(axis), rows, what});
  return out;
}
}  // namespace

namespace {

// On one rank: rows split over ranks divide by the global count of valid
// targets (an extra input); with the vocabulary split, the kernel reduces over
// the mesh axes that split it (attrs.ints) and knows its block's first column.
// (An axis of size 1 splits nothing; annotate() never gives one, a hand-made
// Annotation might.)
void cross_entropy_local(LocalAttrsCall& c) {
  const Shape& logits = c.g.shape(c.n.inputs[0]);
  for (int d = 0; d + 1 < logits.rank(); ++d)
    c.add_loss_count |= c.inputs[0].shard_count(d, c.mesh) > 1;
  c.attrs.ints.clear();
  for (int ax : c.inputs[0].shard_axes(logits.rank() - 1))
    if (c.mesh.size(ax) > 1) c.attrs.ints.push_back(ax);
  if (!c.attrs.ints.empty()) c.set_offsets(logits, c.inputs[0]);
}

}  // namespace

void register_softmax_ops(OpTable& t) {
  add_op(t, OpKind::kSoftmax, 1, infer_softmax, grad_softmax, cost_softmax);
  add_op(t, OpKind::kSoftmaxGrad, 2, infer_softmax_grad, nullptr, cost_softmax);
  add_op(t, OpKind::kLogSoftmax, 1, infer_softmax, grad_log_softmax, cost_softmax);
  add_op(t, OpKind::kLogSoftmaxGrad, 2, infer_softmax_grad, nullptr, cost_softmax);
  add_op(t, OpKind::kCrossEntropy, -1, infer_cross_entropy, grad_cross_entropy, cost_cross_entropy);
  add_op(t, OpKind::kCrossEntropyGrad, -1, infer_cross_entropy_grad, nullptr,
         cost_cross_entropy_grad);
  add_op(t, OpKind::kCorrectCount, 2, infer_correct_count, nullptr, cost_correct_count);
  for (OpKind k :
       {OpKind::kSoftmax, OpKind::kSoftmaxGrad, OpKind::kLogSoftmax, OpKind::kLogSoftmaxGrad})
    set_sharding(t, k, sharding_softmax);
  set_sharding(t, OpKind::kCrossEntropy, sharding_cross_entropy);
  set_inner_collectives(t, OpKind::kCrossEntropy, cross_entropy_collectives);
  set_local_attrs(t, OpKind::kCrossEntropy, cross_entropy_local);
  set_local_attrs(t, OpKind::kCrossEntropyGrad, cross_entropy_local);
  set_sharding(t, OpKind::kCrossEntropyGrad, sharding_cross_entropy_grad);
  set_sharding(t, OpKind::kCorrectCount, sharding_correct_count);
}

}  // namespace meshflow
