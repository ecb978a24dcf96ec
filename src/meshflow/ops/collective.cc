// Collectives: communication as graph nodes, so the memory plan, the executor,
// `--profile`, `meshflow explain` and the cost model all see it. The
// partitioner (parallel/partition.h) lowers each reshard step to one of these;
// a user may also place them by hand in a per-rank (hybrid) program.
// Each runs over the group of one mesh axis (attrs.mesh_axis, attrs.group_size
// = n members, member c = coordinate c on that axis):
//   all_gather(x)      axes {d}: out = concat over members of x along d     (dim d * n)
//   reduce_scatter(x)  axes {d}: member c gets block c of d of the sum      (dim d / n)
//   all_reduce(x)      out = sum over members                               (same shape)
//   all_to_all(x)      axes {i, j}: block c of dim j goes to member c; the
//                      blocks received are concatenated along i             (i * n, j / n)
//   broadcast(x)       ints {root}: x := member root's x, in place (no outputs,
//                      optimizer phase): weights grouping's parameter, sent
//                      updated by its owner to the others
//   shard_slice(x)     axes {d}: keep this member's block of d, no traffic  (dim d / n)
//   partial_mask(x)    member 0 keeps x, the others zero: R -> Partial      (same shape)
//   neighbor_exchange(x)  axes {d}, ints {lo, hi}: x extended along d by the
//                      last lo elements of member c-1's block before it and
//                      the first hi of member c+1's after it; `alpha` at the
//                      ends of the line (no wrap-around)               (dim d + lo + hi)
//   neighbor_exchange_grad(dy)  the reverse: member c's block of dy plus the
//                      border sums its neighbours computed for it     (dim d - lo - hi)
//   assign(dst, src)   dst = src in place (no outputs; optimizer phase): the
//                      write-back of a parameter updated as a shard (ZeRO-1/2)
// Gradients follow "the loss is one replicated value": all_gather <->
// shard_slice, reduce_scatter -> all_gather, all_reduce -> identity (each
// addend's gradient is the replicated cotangent), all_to_all -> all_to_all
// with i and j swapped, partial_mask -> identity; broadcast has none (it only
// runs in the optimizer phase, after the gradients).
#include <algorithm>
#include <cmath>

#include "meshflow/ops/grad_context.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/ops/sharding_rule.h"

namespace meshflow {

namespace {

Status check_group(const Graph& g, const Node& n, int dims_needed) {
  MF_RETURN_IF_ERROR(expect_inputs(g, n, 1));
  // Moves (gather, all_to_all, slice) carry any 4-byte dtype bit for bit
  // (token ids too); reductions need f32.
  const bool moves = n.kind == OpKind::kAllGather || n.kind == OpKind::kAllToAll ||
                     n.kind == OpKind::kShardSlice || n.kind == OpKind::kBroadcast;
  if (!moves || g.value(n.inputs[0]).dtype != DType::I32)
    MF_RETURN_IF_ERROR(expect_dtype(g, n, 0, DType::F32));
  if (n.attrs.mesh_axis < 0 || n.attrs.group_size < 1)
    return Status::invalid(node_label(n) + ": needs a mesh axis and a group size >= 1 (got axis " +
                           std::to_string(n.attrs.mesh_axis) + ", size " +
                           std::to_string(n.attrs.group_size) + ")");
  if (static_cast<int>(n.attrs.axes.size()) != dims_needed)
    return Status::invalid(node_label(n) + ": needs " + std::to_string(dims_needed) +
                           " tensor dim(s) in axes, got " + std::to_string(n.attrs.axes.size()));
  const int rank = g.shape(n.inputs[0]).rank();
  for (int64_t d : n.attrs.axes)
    if (d < 0 || d >= rank)
      return Status::invalid(node_label(n) + ": dim " + std::to_string(d) + " is not a dim of " +
                             g.shape(n.inputs[0]).to_string());
  return Status::ok();
}

Status divisible(const Node& n, const Shape& s, int d) {
  if (s.size(d) % n.attrs.group_size != 0)
    return Status::invalid(node_label(n) + ": dim " + s.name(d) + "=" + std::to_string(s.size(d)) +
                           " of " + s.to_string() + " does not split " +
                           std::to_string(n.attrs.group_size) + " ways");
  return Status::ok();
}

Status infer_all_gather(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(check_group(g, n, 1));
  const Shape& s = g.shape(n.inputs[0]);
  const int d = static_cast<int>(n.attrs.axes[0]);
  outs->push_back(
      out_value(s.with_size(d, s.size(d) * n.attrs.group_size), g.value(n.inputs[0]).dtype));
  return Status::ok();
}

Status infer_split(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(check_group(g, n, 1));
  const Shape& s = g.shape(n.inputs[0]);
  const int d = static_cast<int>(n.attrs.axes[0]);
  MF_RETURN_IF_ERROR(divisible(n, s, d));
  outs->push_back(
      out_value(s.with_size(d, s.size(d) / n.attrs.group_size), g.value(n.inputs[0]).dtype));
  return Status::ok();
}

Status infer_same(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(check_group(g, n, 0));
  outs->push_back(out_value(g.shape(n.inputs[0])));
  return Status::ok();
}

Status infer_broadcast(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(check_group(g, n, 0));
  if (n.attrs.ints.size() != 1 || n.attrs.ints[0] < 0 || n.attrs.ints[0] >= n.attrs.group_size)
    return Status::invalid(
        node_label(n) + ": needs ints {root} with 0 <= root < " +
        std::to_string(n.attrs.group_size) + " (the group's size)" +
        (n.attrs.ints.size() == 1 ? ", got " + std::to_string(n.attrs.ints[0]) : std::string()));
  (void)outs;  // in place
  return Status::ok();
}

Status infer_all_to_all(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(check_group(g, n, 2));
  const Shape& s = g.shape(n.inputs[0]);
  const int i = static_cast<int>(n.attrs.axes[0]), j = static_cast<int>(n.attrs.axes[1]);
  if (i == j) return Status::invalid(node_label(n) + ": the gathered and split dims must differ");
  MF_RETURN_IF_ERROR(divisible(n, s, j));
  Shape out = s.with_size(i, s.size(i) * n.attrs.group_size);
  outs->push_back(
      out_value(out.with_size(j, s.size(j) / n.attrs.group_size), g.value(n.inputs[0]).dtype));
  return Status::ok();
}

// neighbor_exchange (grow) and its gradient (shrink) along axes[0] by ints {lo, hi}.
Status infer_neighbor_exchange(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(check_group(g, n, 1));
  if (n.attrs.ints.size() != 2 || n.attrs.ints[0] < 0 || n.attrs.ints[1] < 0)
    return Status::invalid(node_label(n) + ": needs ints {lo, hi} >= 0, the halo widths");
  const Shape& s = g.shape(n.inputs[0]);
  const int d = static_cast<int>(n.attrs.axes[0]);
  const int64_t lo = n.attrs.ints[0], hi = n.attrs.ints[1];
  const bool grow = n.kind == OpKind::kNeighborExchange;
  const int64_t block = grow ? s.size(d) : s.size(d) - lo - hi;
  if (block < std::max(lo, hi) || block < 1)
    return Status::invalid(node_label(n) + ": a block of " + std::to_string(block) + " along " +
                           s.name(d) + " is smaller than its halo (" + std::to_string(lo) + ", " +
                           std::to_string(hi) + ")");
  outs->push_back(out_value(s.with_size(d, grow ? block + lo + hi : block)));
  return Status::ok();
}

ValueId collective(GradContext& c, OpKind kind, ValueId x, const Node& like,
                   std::vector<int64_t> axes) {
  Attrs at;
  at.mesh_axis = like.attrs.mesh_axis;
  at.group_size = like.attrs.group_size;
  at.axes = std::move(axes);
  return c.b().op1(kind, {x}, at, std::string(op_name(kind)));
}

void grad_neighbor_exchange(GradContext& c, const Node& n) {
  if (!c.needs(0)) return;
  Attrs at = n.attrs;
  c.accumulate(0, c.b().op1(OpKind::kNeighborExchangeGrad, {c.dout(0)}, at, "dx"));
}

void grad_all_gather(GradContext& c, const Node& n) {
  if (c.needs(0)) c.accumulate(0, collective(c, OpKind::kShardSlice, c.dout(0), n, n.attrs.axes));
}
void grad_reduce_scatter(GradContext& c, const Node& n) {
  if (c.needs(0)) c.accumulate(0, collective(c, OpKind::kAllGather, c.dout(0), n, n.attrs.axes));
}
void grad_identity(GradContext& c, const Node&) {
  if (c.needs(0)) c.accumulate(0, c.dout(0));
}
void grad_all_to_all(GradContext& c, const Node& n) {
  if (c.needs(0))
    c.accumulate(
        0, collective(c, OpKind::kAllToAll, c.dout(0), n, {n.attrs.axes[1], n.attrs.axes[0]}));
}
void grad_shard_slice(GradContext& c, const Node& n) {
  if (c.needs(0)) c.accumulate(0, collective(c, OpKind::kAllGather, c.dout(0), n, n.attrs.axes));
}

// Bytes through this rank's links (ring algorithms): what explain and the
// cost model report; no FLOPs but all_reduce's / reduce_scatter's additions.
OpCost cost_collective(const Graph& g, const Node& n) {
  const double in = 4.0 * static_cast<double>(g.shape(n.inputs[0]).numel());
  const double out =
      n.outputs.empty() ? in : 4.0 * static_cast<double>(g.shape(n.outputs[0]).numel());
  const double k = static_cast<double>(n.attrs.group_size);
  OpCost c;
  switch (n.kind) {
    case OpKind::kAllGather:
      c.bytes = out * (k - 1) / k;
      break;
    case OpKind::kReduceScatter:
      c.bytes = in * (k - 1) / k;
      c.flops = in / 4 * (k - 1) / k;
      break;
    case OpKind::kAllReduce:
      c.bytes = 2 * in * (k - 1) / k;
      c.flops = in / 4 * (k - 1) / k;
      break;
    case OpKind::kAllToAll:
      c.bytes = in * (k - 1) / k;
      break;
    case OpKind::kBroadcast:  // pipelined from the root: n-1 of n ranks forward the buffer
      c.bytes = in * (k - 1) / k;
      break;
    case OpKind::kNeighborExchange:
    case OpKind::kNeighborExchangeGrad:
      c.bytes = std::abs(out - in);  // the halo, sent and received once
      break;
    default:
      c.bytes = in + out;  // local copies
      break;
  }
  return c;
}

Status infer_assign(const Graph& g, const Node& n, std::vector<Value>*) {
  MF_RETURN_IF_ERROR(expect_inputs(g, n, 2));
  if (!g.shape(n.inputs[0]).same_sizes(g.shape(n.inputs[1])))
    return Status::invalid(node_label(n) + ": source " + g.shape(n.inputs[1]).to_string() +
                           " must have the destination's shape " +
                           g.shape(n.inputs[0]).to_string());
  return Status::ok();
}

// Sharding: these ops live in per-rank programs, after partitioning (or in a
// hand-written hybrid program); the partitioner never splits them again.
ShardingRule sharding_local(const Graph& g, const Node& n) {
  ShardingRule r = broadcast_rule(g, n, g.shape(n.inputs[0]));
  for (auto& f : r.factors) f.kind = ShardingRule::Factor::kNeedReplicate;
  return r;
}

}  // namespace

bool is_collective(OpKind k) {
  return k == OpKind::kAllGather || k == OpKind::kReduceScatter || k == OpKind::kAllReduce ||
         k == OpKind::kAllToAll || k == OpKind::kBroadcast;
}

void register_collective_ops(OpTable& t) {
  add_op(t, OpKind::kAllGather, 1, infer_all_gather, grad_all_gather, cost_collective);
  add_op(t, OpKind::kReduceScatter, 1, infer_split, grad_reduce_scatter, cost_collective);
  add_op(t, OpKind::kAllReduce, 1, infer_same, grad_identity, cost_collective);
  add_op(t, OpKind::kAllToAll, 1, infer_all_to_all, grad_all_to_all, cost_collective);
  add_op(t, OpKind::kBroadcast, 1, infer_broadcast, nullptr, cost_collective, /*mutates=*/1u);
  add_op(t, OpKind::kShardSlice, 1, infer_split, grad_shard_slice, cost_collective);
  add_op(t, OpKind::kPartialMask, 1, infer_same, grad_identity, cost_collective);
  add_op(t, OpKind::kAssign, 2, infer_assign, nullptr, nullptr, /*mutates=*/1u);
  add_op(t, OpKind::kNeighborExchange, 1, infer_neighbor_exchange, grad_neighbor_exchange,
         cost_collective);
  add_op(t, OpKind::kNeighborExchangeGrad, 1, infer_neighbor_exchange, nullptr, cost_collective);
  for (OpKind k : {OpKind::kAllGather, OpKind::kReduceScatter, OpKind::kAllReduce,
                   OpKind::kAllToAll, OpKind::kBroadcast, OpKind::kShardSlice, OpKind::kPartialMask,
                   OpKind::kAssign, OpKind::kNeighborExchange, OpKind::kNeighborExchangeGrad})
    set_sharding(t, k, sharding_local);
}

}  // namespace meshflow
