// matmul: a general contraction, the one op behind linear layers, attention
// projections with [hidden, heads, head_dim] weights, weight gradients that
// contract over (batch, seq), and batched matmuls.
//
//   a: [batch.., M.., K..]   (trans_a: [batch.., K.., M..])
//   b: [batch.., K.., N..]   (trans_b: [batch.., N.., K..])
//   y: [batch.., M.., N..]
// attrs: contract = number of K dims, batch_dims = number of shared leading dims.
// It is one GEMM (per batch element) of sizes M=prod(M..), K=prod(K..), N=prod(N..).
#include "meshflow/ops/grad_context.h"
#include "meshflow/ops/matmul_dims.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/ops/sharding_rule.h"

namespace meshflow {

Result<MatMulDims> matmul_dims(const Graph& g, const Node& n) {
  const Shape& a = g.shape(n.inputs[0]);
  const Shape& b = g.shape(n.inputs[1]);
  const Attrs& at = n.attrs;
  const int bd = at.batch_dims, c = at.contract;
  if (bd < 0 || c < 0 || a.rank() < bd + c || b.rank() < bd + c)
    return Status::invalid(node_label(n) + ": a" + a.to_string() + " and b" + b.to_string() +
                           " have too few dims for batch_dims=" + std::to_string(bd) +
                           " and contract=" + std::to_string(c));
  MatMulDims d;
  d.batch = a.slice(0, bd);
  Shape ak = at.trans_a ? a.slice(bd, bd + c) : a.slice(a.rank() - c, a.rank());
  Shape am = at.trans_a ? a.slice(bd + c, a.rank()) : a.slice(bd, a.rank() - c);
  Shape bk = at.trans_b ? b.slice(b.rank() - c, b.rank()) : b.slice(bd, bd + c);
  Shape bn = at.trans_b ? b.slice(bd, b.rank() - c) : b.slice(bd + c, b.rank());
  for (int i = 0; i < bd; ++i)
    if (a.size(i) != b.size(i))
      return Status::invalid(node_label(n) + ": batch dim " + std::to_string(i) + " is " +
                             std::to_string(a.size(i)) + " in a" + a.to_string() + " but " +
                             std::to_string(b.size(i)) + " in b" + b.to_string());
  if (!ak.same_sizes(bk))
    return Status::invalid(node_label(n) + ": contracted dims differ: a" + a.to_string() +
                           " contracts " + ak.to_string() + ", b" + b.to_string() + " contracts " +
                           bk.to_string());
  d.m = am;
  d.k = ak;
  d.n = bn;
  d.B = d.batch.numel();
  d.M = am.numel();
  d.K = ak.numel();
  d.N = bn.numel();
  return d;
}

namespace {

Status infer_matmul(const Graph& g, const Node& n, std::vector<Value>* outs) {
  MF_RETURN_IF_ERROR(expect_inputs(g, n, 2));
  MF_ASSIGN_OR_RETURN(MatMulDims d, matmul_dims(g, n));
  outs->push_back(out_value(d.batch.concat(d.m).concat(d.n)));
  return Status::ok();
}

void grad_matmul(GradContext& c, const Node& n) {
  ValueId dy = c.dout(0);
  ValueId a = n.inputs[0], b = n.inputs[1];
  const Attrs& at = n.attrs;
  MatMulDims d = value_or_throw(matmul_dims(c.graph(), n));
  const int nm = d.m.rank(), nn = d.n.rank(), bd = at.batch_dims;
  Builder& bl = c.b();
  auto mm = [&](ValueId x, ValueId y, bool ta, bool tb, int contract, const char* name) {
    return bl.matmul(x, y, {ta, tb, contract, bd}, name);
  };
  if (c.needs(0)) {
    ValueId da;
    if (!at.trans_a && !at.trans_b)
      da = mm(dy, b, false, true, nn, "da");
    else if (at.trans_a && !at.trans_b)
      da = mm(b, dy, false, true, nn, "da");
    else if (!at.trans_a && at.trans_b)
      da = mm(dy, b, false, false, nn, "da");
    else
      da = mm(b, dy, true, true, nn, "da");
    c.accumulate(0, da);
  }
  if (c.needs(1)) {
    ValueId db;
    if (!at.trans_a && !at.trans_b)
      db = mm(a, dy, true, false, nm, "db");
    else if (at.trans_a && !at.trans_b)
      db = mm(a, dy, false, false, nm, "db");
    else if (!at.trans_a && at.trans_b)
      db = mm(dy, a, true, false, nm, "db");
    else
      db = mm(dy, a, true, true, nm, "db");
    c.accumulate(1, db);
  }
}

OpCost cost_matmul(const Graph& g, const Node& n) {
  MatMulDims d = value_or_throw(matmul_dims(g, n));
  OpCost c;
  c.flops = 2.0 * d.B * d.M * d.N * d.K;
  c.bytes = 4.0 * d.B * (d.M * d.K + d.K * d.N + d.M * d.N);
  return c;
}

}  // namespace

// Sharding: batch, M and N dims pass through; K dims are reductions (sharding
// K leaves y Partial). y is linear in a and in b: either may be Partial.
namespace {
ShardingRule sharding_matmul(const Graph& g, const Node& n) {
  MatMulDims d = value_or_throw(matmul_dims(g, n));
  const Attrs& at = n.attrs;
  const int bd = at.batch_dims, nm = d.m.rank(), nk = d.k.rank(), nn = d.n.rank();
  ShardingRule r(2, 1);
  for (int i = 0; i < bd; ++i) {
    int f = r.add(d.batch.name(i), d.batch.size(i));
    r.in(f, 0, i).in(f, 1, i).out(f, 0, i);
  }
  for (int i = 0; i < nm; ++i) {
    int f = r.add(d.m.name(i), d.m.size(i));
    r.in(f, 0, at.trans_a ? bd + nk + i : bd + i).out(f, 0, bd + i);
  }
  for (int i = 0; i < nn; ++i) {
    int f = r.add(d.n.name(i), d.n.size(i));
    r.in(f, 1, at.trans_b ? bd + i : bd + nk + i).out(f, 0, bd + nm + i);
  }
  for (int i = 0; i < nk; ++i) {
    int f = r.add(d.k.name(i), d.k.size(i), ShardingRule::Factor::kReduction);
    r.in(f, 0, at.trans_a ? bd + i : bd + nm + i).in(f, 1, at.trans_b ? bd + nn + i : bd + i);
  }
  r.partial_inputs = {{0}, {1}};
  return r;
}
}  // namespace

void register_matmul_ops(OpTable& t) {
  add_op(t, OpKind::kMatMul, 2, infer_matmul, grad_matmul, cost_matmul);
  set_sharding(t, OpKind::kMatMul, sharding_matmul);
}

}  // namespace meshflow
