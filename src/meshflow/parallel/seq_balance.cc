#include "meshflow/parallel/seq_balance.h"

#include <string>
#include <vector>

#include "meshflow/ops/op_def.h"
#include "meshflow/ops/zigzag.h"

namespace meshflow {

namespace {

std::string str(int64_t v) {
  return std::to_string(v);
}

int seq_dim_of(const Shape& s) {
  for (int d = 0; d < s.rank(); ++d)
    if (s.name(d) == "seq") return d;
  return -1;
}

bool elementwise_binary(OpKind k) {
  return k == OpKind::kAdd || k == OpKind::kSub || k == OpKind::kMul || k == OpKind::kDiv;
}

}  // namespace

Result<SeqBalance> balance_sequence(Graph& g, int64_t ranks) {
  SeqBalance sb;
  if (ranks <= 1) return sb;
  if (!g.grad_of_param.empty())
    return Status::failed_precondition(
        "the zigzag sequence order is set on the forward graph, before its backward");
  sb.ranks = ranks;
  const int64_t chunks = 2 * ranks;
  int64_t T = -1;
  Graph out;
  std::vector<ValueId> map(g.num_values(), kNoValue);
  std::vector<char> data(g.num_values(), 0);  // derived from a sequence input
  for (const Node& n : g.nodes()) {
    Node copy = n;
    bool from_data = false;
    for (ValueId& v : copy.inputs) {
      from_data |= data[v] != 0;
      v = map[v];
    }
    if (n.kind == OpKind::kInput) {
      const Shape& s = g.shape(n.outputs[0]);
      const int d = seq_dim_of(s);
      if (d >= 0) {
        if (s.size(d) % chunks != 0 || (T >= 0 && s.size(d) != T))
          return Status::invalid("input '" + g.value(n.outputs[0]).name + "'" + s.to_string() +
                                 ": the seq dim (" + str(s.size(d)) + ") must cut into 2 x " +
                                 str(ranks) +
                                 " chunks for the zigzag order of ring attention over " +
                                 str(ranks) + " ranks: use a multiple of " + str(chunks) + " (" +
                                 str(chunks * std::max<int64_t>(1, s.size(d) / chunks)) + " or " +
                                 str(chunks * (s.size(d) / chunks + 1)) + ")");
        T = s.size(d);
        sb.inputs[g.value(n.outputs[0]).name] = d;
        from_data = true;
      }
    }
    // A value from outside the data meeting the sequence along its seq dim
    // (right-aligned broadcast): reorder it first.
    if (elementwise_binary(n.kind) && n.inputs.size() == 2 &&
        data[n.inputs[0]] != data[n.inputs[1]]) {
      const int di = data[n.inputs[0]] ? 0 : 1;
      const Shape& ds = g.shape(n.inputs[di]);
      const Shape& os = g.shape(n.inputs[1 - di]);
      const int sd = seq_dim_of(ds);
      const int od = sd < 0 ? -1 : os.rank() - (ds.rank() - sd);
      if (od >= 0 && os.size(od) == ds.size(sd) && os.size(od) > 1) {
        Node z;
        z.kind = OpKind::kZigzag;
        z.name = g.value(n.inputs[1 - di]).name + ".zigzag";
        z.inputs = {map[n.inputs[1 - di]]};
        z.attrs.seq_zigzag = ranks;
        z.attrs.seq_dim = od;
        z.phase = n.phase;
        z.layer = n.layer;
        Value v = out.value(z.inputs[0]);
        v.name.clear();
        const NodeId id = out.add_node(std::move(z), {v});
        copy.inputs[1 - di] = out.node(id).outputs[0];
      }
    }
    if (from_data) {
      int d = -1;
      if (n.kind == OpKind::kAttention) d = 2;
      if (n.kind == OpKind::kRope) d = 1;
      if (n.kind == OpKind::kDropout) {
        d = seq_dim_of(g.shape(n.outputs[0]));
        if (d < 0 || d == g.shape(n.outputs[0]).rank() - 1)
          return Status::invalid(node_label(n) + ": its value" + g.shape(n.outputs[0]).to_string() +
                                 " has no leading dim named 'seq', so its mask cannot follow the "
                                 "zigzag order of ring attention");
      }
      if (d >= 0) {
        copy.attrs.seq_zigzag = ranks;
        copy.attrs.seq_dim = d;
      }
    }
    std::vector<Value> types;
    for (ValueId v : n.outputs) types.push_back(g.value(v));
    const NodeId id = out.add_node(std::move(copy), types);
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      map[n.outputs[i]] = out.node(id).outputs[i];
      data[n.outputs[i]] = from_data;
    }
  }
  if (T < 0)
    return Status::invalid("the zigzag sequence order needs an input with a dim named 'seq'");
  out.loss = g.loss == kNoValue ? kNoValue : map[g.loss];
  for (const auto& [name, v] : g.outputs) out.outputs[name] = map[v];
  g = std::move(out);
  return sb;
}

Tensor zigzag_tensor(const Tensor& t, int dim, int64_t ranks) {
  Tensor z(t.shape(), t.dtype());
  const Shape& s = t.shape();
  zigzag_reorder(t.raw(), z.raw(), s.prod(0, dim), s.size(dim), s.prod(dim + 1, s.rank()),
                 dtype_size(t.dtype()), ranks, false);
  return z;
}

}  // namespace meshflow
