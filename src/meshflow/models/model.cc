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

void add_lm_head(Builder& b, Graph& g, ValueId x, ValueId tied, const Dim& vocab, Init init,
                 ValueId targets) {
  ValueId logits;  // [B,T,V]
  if (tied != kNoValue) {
    logits = b.matmul(x, tied, {.trans_b = true}, "lm_head");
  } else {
    const Dim& hidden = g.shape(x).dim(-1);
    logits = b.matmul(x, b.parameter("lm_head.weight", Shape{hidden, vocab}, init), {}, "lm_head");
  }
  g.loss = b.cross_entropy(logits, targets, "loss");
  g.outputs["logits"] = logits;
  g.outputs["correct"] = b.correct_count(logits, targets, "correct");
}

}  // namespace meshflow
