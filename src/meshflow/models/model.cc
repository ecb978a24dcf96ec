#include "meshflow/models/model.h"

#include "meshflow/ops/op_def.h"

namespace meshflow {

int64_t count_parameters(const Graph& g) {
  int64_t n = 0;
  for (ValueId p : g.parameters()) n += g.shape(p).numel();
  return n;
}

double graph_forward_flops(const Graph& g) {
  double f = 0;
  for (const Node& n : g.nodes()) {
    if (n.phase != Phase::kForward) continue;
    if (n.kind == OpKind::kParameter || n.kind == OpKind::kInput || n.kind == OpKind::kState)
      continue;
    f += op_cost(g, n).flops;
  }
  return f;
}

}  // namespace meshflow
