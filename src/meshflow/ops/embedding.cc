// Embedding lookup: a row of the table per id.
//   embedding      (table [V, C], ids [..] i32) -> y [.., C]
//                  (the ids' dims, then the table's last dim)
//   embedding_grad (dy [.., C], ids [..] i32) -> dtable [V, C] (attrs.shape = the table's shape)
//                  dtable[v] = sum of dy at the positions whose id is v (deterministic order).
// An id outside [0, V) at run time stops with a check naming the id and V.
#include "meshflow/ops/grad_context.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/ops/sharding_rule.h"

namespace meshflow {

namespace {

Status expect_table(const Node& n, const Shape& table, const char* what) {
  if (table.rank() != 2)
    return Status::invalid(node_label(n) + ": " + what + table.to_string() +
                           " must be 2-D [vocab, channels]");
  return Status::ok();
}

Status infer_embedding(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(expect_inputs(g, n, 2));
  const Shape& table = g.shape(n.inputs[0]);
  MF_RETURN_IF_ERROR(expect_table(n, table, "table"));
  MF_RETURN_IF_ERROR(expect_dtype(g, n, 0, DType::F32));
  MF_RETURN_IF_ERROR(expect_dtype(g, n, 1, DType::I32));
  outs->push_back(out_value(g.shape(n.inputs[1]).concat(table.slice(1, 2))));
  return Status::ok();
}

// inputs: dy, ids; attrs.shape: the table's shape
Status infer_embedding_grad(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(expect_inputs(g, n, 2));
  const Shape& table = n.attrs.shape;
  MF_RETURN_IF_ERROR(expect_table(n, table, "attrs.shape"));
  MF_RETURN_IF_ERROR(expect_dtype(g, n, 0, DType::F32));
  MF_RETURN_IF_ERROR(expect_dtype(g, n, 1, DType::I32));
  const Shape& dy = g.shape(n.inputs[0]);
  const Shape want = g.shape(n.inputs[1]).concat(table.slice(1, 2));
  if (!dy.same_sizes(want))
    return Status::invalid(node_label(n) + ": dy" + dy.to_string() + " must have the sizes " +
                           want.to_string() + " (the ids' dims, then the table's channels)");
  outs->push_back(out_value(table));
  return Status::ok();
}

void grad_embedding(GradContext& c, const Node& n) {
  if (!c.needs(0)) return;
  Attrs at;
  at.shape = c.graph().shape(n.inputs[0]);
  c.accumulate(0,
               c.b().op1(OpKind::kEmbeddingGrad, {c.dout(0), n.inputs[1]}, at, "embedding_grad"));
}

// embedding_grad is linear in dy; its adjoint is the lookup itself.
void grad_embedding_grad(GradContext& c, const Node& n) {
  if (c.needs(0)) c.accumulate(0, c.b().embedding(c.dout(0), n.inputs[1], "embedding"));
}

OpCost cost_embedding(const Graph& g, const Node& n) {
  const double ids = static_cast<double>(g.shape(n.inputs[1]).numel());
  const double out = static_cast<double>(g.shape(n.outputs[0]).numel());
  OpCost c;
  c.bytes = 4.0 * (ids + 2 * out);  // read ids, read the rows, write them
  return c;
}

OpCost cost_embedding_grad(const Graph& g, const Node& n) {
  const double dy = static_cast<double>(g.shape(n.inputs[0]).numel());
  const double ids = static_cast<double>(g.shape(n.inputs[1]).numel());
  const double table = static_cast<double>(n.attrs.shape.numel());
  OpCost c;
  c.flops = dy;                                 // one add per dy element
  c.bytes = 4.0 * (table + ids + dy + 2 * dy);  // zero the table, read dy, read-modify-write rows
  return c;
}

}  // namespace

// Sharding: the ids' dims pass through to y (and are reductions into
// dtable); C passes through. V (vocab-parallel, Megatron's
// VocabParallelEmbedding): a shard of the table's rows looks up the ids in its
// range and gives zeros for the others, so y is Partial (a reduction factor);
// embedding_grad writes its rows only (pass-through). The kernels learn their
// row offset from attrs.global_offset (set by the partitioner). Linear in the
// table (embedding) and in dy (embedding_grad).
namespace {
ShardingRule sharding_embedding(const Graph& g, const Node& n) {
  const bool grad = n.kind == OpKind::kEmbeddingGrad;
  const Shape& ids = g.shape(n.inputs[1]);
  const Shape& table = grad ? g.shape(n.outputs[0]) : g.shape(n.inputs[0]);
  ShardingRule r(2, 1);
  for (int d = 0; d < ids.rank(); ++d) {
    int f = r.add(ids.name(d), ids.size(d),
                  grad ? ShardingRule::Factor::kReduction : ShardingRule::Factor::kPassThrough);
    r.in(f, 1, d);
    if (grad)
      r.in(f, 0, d);
    else
      r.out(f, 0, d);
  }
  int v = r.add(table.name(0), table.size(0),
                grad ? ShardingRule::Factor::kPassThrough : ShardingRule::Factor::kReduction);
  int c = r.add(table.name(1), table.size(1));
  if (grad) {
    r.factors[static_cast<size_t>(v)].output_split = true;  // a shard writes its rows
    r.out(v, 0, 0).out(c, 0, 1).in(c, 0, ids.rank());
  } else {
    r.in(v, 0, 0).in(c, 0, 1).out(c, 0, ids.rank());
  }
  r.partial_inputs = {{0}};
  return r;
}
}  // namespace

void register_embedding_ops(OpTable& t) {
  add_op(t, OpKind::kEmbedding, 2, infer_embedding, grad_embedding, cost_embedding);
  add_op(t, OpKind::kEmbeddingGrad, 2, infer_embedding_grad, grad_embedding_grad,
         cost_embedding_grad);
  // Vocab-parallel: a shard of the table knows its first row.
  set_local_attrs(t, OpKind::kEmbedding,
                  [](LocalAttrsCall& c) { c.set_offsets(c.g.shape(c.n.inputs[0]), c.inputs[0]); });
  set_local_attrs(t, OpKind::kEmbeddingGrad, [](LocalAttrsCall& c) {
    c.set_offsets(c.g.shape(c.n.outputs[0]), c.outputs[0]);
  });
  set_sharding(t, OpKind::kEmbedding, sharding_embedding);
  set_sharding(t, OpKind::kEmbeddingGrad, sharding_embedding);
}

}  // namespace meshflow
