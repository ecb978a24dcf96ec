// Attention and the ops that sit beside it in a transformer block.
//
//   attention       (q [B,H,T,D], k [B,Hkv,S,D], v [B,Hkv,S,D]) -> out [B,H,T,D] (dims named
//                   like q), lse [B,H,T] (log-sum-exp of each query row's scaled scores, saved
//                   for the backward). attrs.causal, attrs.alpha (softmax scale; 0 = 1/sqrt(D)).
//                   Grouped-query attention: Hkv divides H, query head h reads kv head
//                   h / (H / Hkv). Causal: query i sees key j iff j <= i + (S - T), i.e. the
//                   last query is aligned with the last key (a row that sees no key gives
//                   out = 0, lse = -inf). The lse output is not differentiable.
//   attention_grad  (dout, q, k, v, out, lse) -> dq, dk, dv; same attrs (flash-attention backward).
//   dropout         (x, rng_offset) -> x * keep / (1 - p), keep[i] = uniform01(stream, i) >= p,
//                   stream = dropout_stream(attrs.seed, rng_offset) (kernels/cpu/attention.cc).
//                   rng_offset is the graph's i32 scalar input (Builder::rng_offset()): one
//                   offset per step gives a fresh mask per step, and a recomputed forward (or
//                   dropout_grad) with the same offset reproduces the mask exactly.
//                   attrs.p in [0, 1), attrs.seed.
//   dropout_grad    (dy, rng_offset) -> dy * keep / (1 - p); same attrs, same mask.
//   rope            x [B,T,H,D] -> rotary position embedding, Hugging Face LLaMA "rotate_half"
//                   convention: y = x*cos + rotate_half(x)*sin with angle(t, i) =
//                   t * theta^(-2(i mod D/2)/D), t the index along dim 1, rotate_half(x) =
//                   concat(-x[D/2:], x[:D/2]). attrs.theta, attrs.inverse (rotate by -angle: the
//                   op's own gradient). D must be even.
#include <algorithm>
#include <cmath>
#include <string>

#include "meshflow/ops/grad_context.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/ops/sharding_rule.h"

namespace meshflow {

namespace {

std::string str(int64_t v) {
  return std::to_string(v);
}

// Validates q, k, v of an attention (inputs qi, qi+1, qi+2 of n).
Status check_qkv(const Graph& g, const Node& n, int qi) {
  const Shape& q = g.shape(n.inputs[qi]);
  const Shape& k = g.shape(n.inputs[qi + 1]);
  const Shape& v = g.shape(n.inputs[qi + 2]);
  for (int i = 0; i < 3; ++i) MF_RETURN_IF_ERROR(expect_dtype(g, n, qi + i, DType::F32));
  const char* names[3] = {"q", "k", "v"};
  const Shape* shapes[3] = {&q, &k, &v};
  for (int i = 0; i < 3; ++i)
    if (shapes[i]->rank() != 4)
      return Status::invalid(node_label(n) + ": " + names[i] + shapes[i]->to_string() +
                             " must be 4-D [batch, heads, seq, head_dim]");
  if (!k.same_sizes(v))
    return Status::invalid(node_label(n) + ": k" + k.to_string() + " and v" + v.to_string() +
                           " must have the same sizes [batch, kv_heads, seq, head_dim]");
  if (q.size(0) != k.size(0))
    return Status::invalid(node_label(n) + ": batch differs: q" + q.to_string() + " has " +
                           str(q.size(0)) + ", k" + k.to_string() + " has " + str(k.size(0)));
  if (q.size(3) != k.size(3))
    return Status::invalid(node_label(n) + ": head_dim differs: q" + q.to_string() + " has " +
                           str(q.size(3)) + ", k" + k.to_string() + " has " + str(k.size(3)));
  if (q.size(1) % k.size(1) != 0)
    return Status::invalid(node_label(n) + ": kv heads (" + str(k.size(1)) + " in k" +
                           k.to_string() + ") must divide query heads (" + str(q.size(1)) +
                           " in q" + q.to_string() + ") for grouped-query attention");
  if (!std::isfinite(n.attrs.alpha))
    return Status::invalid(node_label(n) + ": softmax scale alpha must be finite (0 means " +
                           "1/sqrt(head_dim)), got " + std::to_string(n.attrs.alpha));
  return Status::ok();
}

Status infer_attention(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(expect_inputs(g, n, 3));
  MF_RETURN_IF_ERROR(check_qkv(g, n, 0));
  const Shape& q = g.shape(n.inputs[0]);
  outs->push_back(out_value(q));
  outs->push_back(out_value(q.slice(0, 3)));
  return Status::ok();
}

Status infer_attention_grad(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(expect_inputs(g, n, 6));
  MF_RETURN_IF_ERROR(check_qkv(g, n, 1));
  const Shape& q = g.shape(n.inputs[1]);
  const char* names[2] = {"dout", "out"};
  const int idx[2] = {0, 4};
  for (int i = 0; i < 2; ++i)
    if (!g.shape(n.inputs[idx[i]]).same_sizes(q))
      return Status::invalid(node_label(n) + ": " + names[i] +
                             g.shape(n.inputs[idx[i]]).to_string() + " must have the sizes of q" +
                             q.to_string());
  if (!g.shape(n.inputs[5]).same_sizes(q.slice(0, 3)))
    return Status::invalid(node_label(n) + ": lse" + g.shape(n.inputs[5]).to_string() +
                           " must be [batch, heads, seq] of q" + q.to_string());
  for (int i = 1; i <= 3; ++i) outs->push_back(out_value(g.shape(n.inputs[i])));
  return Status::ok();
}

void grad_attention(GradContext& c, const Node& n) {
  if (c.dout(1) != kNoValue)
    throw StatusError(
        Status::invalid(node_label(n) + ": the lse output (1) is not differentiable; use out (0)"));
  ValueId dout = c.dout(0);
  if (dout == kNoValue) return;
  std::vector<ValueId> d =
      c.b().op(OpKind::kAttentionGrad,
               {dout, n.inputs[0], n.inputs[1], n.inputs[2], n.outputs[0], n.outputs[1]}, n.attrs,
               "attention_grad");
  for (int i = 0; i < 3; ++i)
    if (c.needs(i)) c.accumulate(i, d[i]);
}

// Number of (query, key) pairs that attend: T*S, or fewer under the causal mask.
double attended_pairs(const Shape& q, const Shape& k, bool causal) {
  const int64_t T = q.size(2), S = k.size(2);
  if (!causal) return double(T) * double(S);
  double pairs = 0;
  for (int64_t i = 0; i < T; ++i) pairs += double(std::clamp<int64_t>(i + S - T + 1, 0, S));
  return pairs;
}

// The (query, key) pairs a rank computes. A ring (attrs.mesh_axis set: q and
// k/v split over the axis, ring_attention.h) visits every rank's k/v block:
// the slowest rank's work. Under causal masking with contiguous blocks that
// is the last rank (cp-1 whole blocks and its diagonal one); in zigzag order
// (ops/zigzag.h) every rank computes half of each other block and its own
// two chunks' triangles and square: n*T*S/2 + T/2. All cp blocks without
// the mask.
double rank_pairs(const Node& n, const Shape& q, const Shape& k) {
  const double local = attended_pairs(q, k, n.attrs.causal);
  const int64_t ranks = n.attrs.group_size;
  if (n.attrs.mesh_axis < 0 || ranks <= 1) return local;
  const double whole = double(q.size(2)) * double(k.size(2));
  if (!n.attrs.causal) return double(ranks) * whole;
  if (n.attrs.seq_zigzag == ranks) return double(ranks) * whole / 2 + double(q.size(2)) / 2;
  return double(ranks - 1) * whole + local;
}

OpCost cost_attention(const Graph& g, const Node& n) {
  const Shape& q = g.shape(n.inputs[0]);
  const Shape& k = g.shape(n.inputs[1]);
  const double rows = double(q.size(0)) * double(q.size(1));
  const double pairs = rows * rank_pairs(n, q, k);
  OpCost c;
  c.flops = 4.0 * pairs * double(q.size(3)) + 5.0 * pairs;  // Q K^T, P V, softmax
  c.bytes = 4.0 * (2.0 * q.numel() + 2.0 * k.numel() + rows * q.size(2));
  return c;
}

OpCost cost_attention_grad(const Graph& g, const Node& n) {
  const Shape& q = g.shape(n.inputs[1]);
  const Shape& k = g.shape(n.inputs[2]);
  const double rows = double(q.size(0)) * double(q.size(1));
  const double pairs = rows * rank_pairs(n, q, k);
  OpCost c;
  // Recomputed Q K^T, then dV, dP, dQ, dK: five GEMMs of 2*pairs*D each.
  c.flops = 10.0 * pairs * double(q.size(3)) + 8.0 * pairs;
  // Reads dO, Q, O, K, V, lse; writes dQ, dK, dV.
  c.bytes = 4.0 * (4.0 * q.numel() + 4.0 * k.numel() + rows * q.size(2));
  return c;
}

Status check_dropout(const Graph& g, const Node& n) {
  MF_RETURN_IF_ERROR(expect_inputs(g, n, 2));
  MF_RETURN_IF_ERROR(expect_dtype(g, n, 0, DType::F32));
  MF_RETURN_IF_ERROR(expect_dtype(g, n, 1, DType::I32));
  if (g.shape(n.inputs[1]).numel() != 2)
    return Status::invalid(node_label(n) + ": rng_offset" + g.shape(n.inputs[1]).to_string() +
                           " must be i32 [2]: (stream offset, shard) (Builder::rng_offset())");
  const float p = n.attrs.p;
  if (!(p >= 0.f && p < 1.f))
    return Status::invalid(node_label(n) + ": dropout probability p must be in [0, 1), got " +
                           std::to_string(p));
  return Status::ok();
}

Status infer_dropout(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(check_dropout(g, n));
  outs->push_back(out_value(g.shape(n.inputs[0])));
  return Status::ok();
}

// Also the rule of dropout_grad, which is the same linear map.
void grad_dropout(GradContext& c, const Node& n) {
  if (!c.needs(0)) return;
  c.accumulate(0, c.b().op1(OpKind::kDropoutGrad, {c.dout(0), n.inputs[1]}, n.attrs, "dx"));
}

Status infer_rope(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(expect_inputs(g, n, 1));
  MF_RETURN_IF_ERROR(expect_dtype(g, n, 0, DType::F32));
  const Shape& x = g.shape(n.inputs[0]);
  if (x.rank() != 4)
    return Status::invalid(node_label(n) + ": x" + x.to_string() +
                           " must be 4-D [batch, seq, heads, head_dim]");
  if (x.size(3) % 2 != 0)
    return Status::invalid(node_label(n) + ": head_dim (dim 3 of x" + x.to_string() + ") is " +
                           str(x.size(3)) + "; rotary embedding needs an even head_dim");
  if (!(n.attrs.theta > 0.f) || !std::isfinite(n.attrs.theta))
    return Status::invalid(node_label(n) + ": theta must be a positive finite base, got " +
                           std::to_string(n.attrs.theta));
  outs->push_back(out_value(x));
  return Status::ok();
}

void grad_rope(GradContext& c, const Node& n) {
  if (!c.needs(0)) return;
  Attrs at = n.attrs;
  at.inverse = !at.inverse;
  c.accumulate(0, c.b().op1(OpKind::kRope, {c.dout(0)}, at, "dx"));
}

OpCost cost_rope(const Graph& g, const Node& n) {
  const double e = double(g.shape(n.inputs[0]).numel());
  return OpCost{3.0 * e, 8.0 * e};
}

}  // namespace

// Sharding. attention: batch and heads pass through (with GQA the query
// heads and the kv heads split together: a block of kv heads serves exactly
// the block of query heads that reads it, so the factor's size is kv_heads);
// head_dim must be replicated. Self-attention (as many queries as keys):
// the query and key sequence are one factor, kCollective with `ring`: split
// over one mesh axis, each rank keeps its query block and the k/v blocks go
// round the axis inside the kernel (ring attention,
// kernels/cpu/ring_attention.h); every operand and output keeps its sequence
// split. Otherwise (T != S) the key seq is replicated and the query seq
// passes through only when not causal: the causal mask aligns the last query
// with the last key, which a shard of the queries would not know.
// attention_grad: the same factors over (dout, q, k, v, out, lse) ->
// (dq, dk, dv); a separate query seq is a reduction there (a query shard
// gives dq's rows but Partial dk, dv).
// dropout: element-wise, linear in x; a shard draws the numbers of its global
// element indices (attrs.global_dims/global_offset, set by the partitioner), so
// the mask is the unsharded one.
// rope: batch, seq and heads pass through (a seq shard starts its angles at
// attrs.global_offset[1]); head_dim is replicated (rotate_half pairs its
// halves). Linear in x.
namespace {
ShardingRule sharding_attention(const Graph& g, const Node& n) {
  const bool grad = n.kind == OpKind::kAttentionGrad;
  const int qi = grad ? 1 : 0;
  const Shape& q = g.shape(n.inputs[qi]);
  const Shape& k = g.shape(n.inputs[qi + 1]);
  using F = ShardingRule::Factor;
  ShardingRule r(static_cast<int>(n.inputs.size()), static_cast<int>(n.outputs.size()));
  // Operands: per input / output, 'q' (q-like [B,H,T,D]), 'k' (k-like), 'l' (lse [B,H,T]).
  const char* ins = grad ? "qqkkql" : "qkk";
  const char* outs = grad ? "qkk" : "ql";
  const int fb = r.add(q.name(0), q.size(0));
  const int fh = r.add(q.name(1), k.size(1));
  const bool ring = q.size(2) == k.size(2);
  // attention_grad: every query row adds to dk and dv, which a query shard leaves Partial.
  const int ft = r.add(q.name(2), q.size(2),
                       ring             ? F::kCollective
                       : n.attrs.causal ? F::kNeedReplicate
                       : grad           ? F::kReduction
                                        : F::kPassThrough);
  r.factors[ft].ring = ring;
  const int fs = ring ? ft : r.add(k.name(2), k.size(2), F::kNeedReplicate);
  const int fd = r.add(q.name(3), q.size(3), F::kNeedReplicate);
  auto map = [&](char role, auto&& set) {
    set(fb, 0);
    set(fh, 1);
    set(role == 'k' ? fs : ft, 2);
    if (role != 'l') set(fd, 3);
  };
  for (int i = 0; i < r.num_inputs; ++i) map(ins[i], [&](int f, int d) { r.in(f, i, d); });
  for (int o = 0; o < r.num_outputs; ++o) map(outs[o], [&](int f, int d) { r.out(f, o, d); });
  return r;
}

// On one rank: a sequence split over a mesh axis runs the ring over it.
void attention_local(LocalAttrsCall& c) {
  const int qi = c.n.kind == OpKind::kAttentionGrad ? 1 : 0;
  const Shape& q = c.g.shape(c.n.inputs[qi]);
  if (q.size(2) != c.g.shape(c.n.inputs[qi + 1]).size(2)) return;
  for (int ax : c.inputs[qi].shard_axes(2)) {
    if (c.mesh.size(ax) == 1) continue;
    c.attrs.mesh_axis = ax;
    c.attrs.group_size = static_cast<int>(c.mesh.size(ax));
    c.set_offsets(q, c.inputs[qi]);
  }
}

// Ring attention's traffic per rank (ops/op_def.h): the forward passes its
// k/v block on n - 1 times; the backward passes k/v on n - 1 times and the
// dk/dv accumulator n times (the last brings it home). Each shift overlaps
// a step's compute (kernels/cpu/ring_attention.h) but the accumulator's
// last, which the kernel waits for after its last step.
std::vector<InnerCollective> attention_collectives(const Graph& g, const Node& n) {
  std::vector<InnerCollective> out;
  if (n.attrs.mesh_axis < 0) return out;
  const bool grad = n.kind == OpKind::kAttentionGrad;
  const int64_t kv = 2 * g.shape(n.inputs[grad ? 2 : 1]).numel();
  const int steps = n.attrs.group_size;
  for (int s = 1; s < steps; ++s)
    out.push_back({OpKind::kNeighborExchange, n.attrs.mesh_axis, kv,
                   "ring k/v block, step " + std::to_string(s), 2, true});
  if (grad)
    for (int s = 1; s <= steps; ++s)
      out.push_back({OpKind::kNeighborExchange, n.attrs.mesh_axis, kv,
                     "ring dk/dv accumulator, step " + std::to_string(s), 2, s < steps});
  return out;
}
ShardingRule sharding_dropout(const Graph& g, const Node& n) {
  ShardingRule r = broadcast_rule(g, n, g.shape(n.outputs[0]));
  for (auto& f : r.factors) f.input_dim[1] = -1;  // the rng pair is replicated, never sharded
  r.partial_inputs = {{0}};
  return r;
}
ShardingRule sharding_rope(const Graph& g, const Node& n) {
  ShardingRule r = broadcast_rule(g, n, g.shape(n.outputs[0]));
  set_input_factor_kind(r, 0, 3, ShardingRule::Factor::kNeedReplicate);
  r.partial_inputs = {{0}};
  return r;
}
}  // namespace

void register_attention_ops(OpTable& t) {
  add_op(t, OpKind::kAttention, 3, infer_attention, grad_attention, cost_attention);
  add_op(t, OpKind::kAttentionGrad, 6, infer_attention_grad, nullptr, cost_attention_grad);
  add_op(t, OpKind::kDropout, 2, infer_dropout, grad_dropout, nullptr, 0, true);
  add_op(t, OpKind::kDropoutGrad, 2, infer_dropout, grad_dropout, nullptr, 0,
         true);  // linear: same rule
  add_op(t, OpKind::kRope, 1, infer_rope, grad_rope, cost_rope);
  set_sharding(t, OpKind::kAttention, sharding_attention);
  set_sharding(t, OpKind::kAttentionGrad, sharding_attention);
  for (OpKind k : {OpKind::kAttention, OpKind::kAttentionGrad}) {
    set_local_attrs(t, k, attention_local);
    set_inner_collectives(t, k, attention_collectives);
  }
  // A shard's masks and rotations are those of its block of the global
  // value: the kernels index by global position.
  for (OpKind k : {OpKind::kDropout, OpKind::kDropoutGrad, OpKind::kRope})
    set_local_attrs(
        t, k, [](LocalAttrsCall& c) { c.set_offsets(c.g.shape(c.n.outputs[0]), c.outputs[0]); });
  set_sharding(t, OpKind::kDropout, sharding_dropout);
  set_sharding(t, OpKind::kDropoutGrad, sharding_dropout);
  set_sharding(t, OpKind::kRope, sharding_rope);
}

}  // namespace meshflow
