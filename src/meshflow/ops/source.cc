// Source ops: no inputs, persistent storage owned by the executor.
//   parameter  attrs.shape, attrs.init      a trainable weight (f32)
//   input      attrs.shape                  fed before each run (tokens, targets, lr, ...)
//   state      attrs.shape                  optimizer state (momentum, Adam moments), zero-init
#include "meshflow/ops/op_def.h"
#include "meshflow/ops/sharding_rule.h"

namespace meshflow {

namespace {
Status infer_source(const Graph& g, const Node& n, std::vector<Value>* outs) {
  DType dt = n.outputs.empty() ? DType::F32 : g.value(n.outputs[0]).dtype;
  outs->push_back(out_value(n.attrs.shape, dt));
  return Status::ok();
}
OpCost no_cost(const Graph&, const Node&) {
  return {};
}
}  // namespace

// Sharding: a source can be stored in any layout: one pass-through factor per dim.
namespace {
ShardingRule sharding_source(const Graph& g, const Node& n) {
  return broadcast_rule(g, n, g.shape(n.outputs[0]));
}
}  // namespace

void register_source_ops(OpTable& t) {
  for (OpKind k : {OpKind::kParameter, OpKind::kInput, OpKind::kState})
    add_op(t, k, 0, infer_source, nullptr, no_cost);
  for (OpKind k : {OpKind::kParameter, OpKind::kInput, OpKind::kState})
    set_sharding(t, k, sharding_source);
}

}  // namespace meshflow
