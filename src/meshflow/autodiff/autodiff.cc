#include "meshflow/autodiff/autodiff.h"

#include "meshflow/core/check.h"
#include "meshflow/ops/grad_context.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/ops/verify.h"

namespace meshflow {

void append_backward(Graph& g) {
  MF_CHECK(g.loss != kNoValue) << "append_backward: graph has no loss";
  const int num_forward_nodes = g.num_nodes();

  // Forward reachability from parameters through differentiable ops.
  std::vector<char> from_param(g.num_values(), 0);
  for (NodeId id = 0; id < num_forward_nodes; ++id) {
    const Node& n = g.node(id);
    bool any = n.kind == OpKind::kParameter;
    if (op_def(n.kind).grad != nullptr)
      for (ValueId v : n.inputs) any = any || from_param[v];
    if (any)
      for (ValueId v : n.outputs) from_param[v] = 1;
  }
  // Backward reachability to the loss.
  std::vector<char> to_loss(g.num_values(), 0);
  to_loss[g.loss] = 1;
  for (NodeId id = num_forward_nodes - 1; id >= 0; --id) {
    const Node& n = g.node(id);
    bool any = false;
    for (ValueId v : n.outputs) any = any || to_loss[v];
    if (any && op_def(n.kind).grad != nullptr)
      for (ValueId v : n.inputs) to_loss[v] = 1;
  }
  std::vector<char> needs(g.num_values(), 0);
  for (ValueId v = 0; v < g.num_values(); ++v) needs[v] = from_param[v] && to_loss[v];

  Builder b(g);
  b.set_phase(Phase::kBackward);
  std::vector<ValueId> grads(g.num_values(), kNoValue);
  ValueId seed = b.input("loss_scale", Shape{}, DType::F32);
  grads.resize(g.num_values(), kNoValue);
  needs.resize(g.num_values(), 0);
  grads[g.loss] = seed;

  GradContext ctx(b, grads, needs);
  for (NodeId id = num_forward_nodes - 1; id >= 0; --id) {
    // Copy: building nodes may reallocate the node vector.
    const Node n = g.node(id);
    const OpDef& def = op_def(n.kind);
    if (def.grad == nullptr) continue;
    bool has_dout = false;
    for (ValueId v : n.outputs) has_dout = has_dout || grads[v] != kNoValue;
    bool wants = false;
    for (ValueId v : n.inputs) wants = wants || needs[v];
    if (!has_dout || !wants) continue;
    auto scope = b.scope(n.name + ".grad", n.layer);
    ctx.set_node(&n);
    def.grad(ctx, n);
    grads.resize(g.num_values(), kNoValue);
    needs.resize(g.num_values(), 0);
  }
  for (ValueId p : g.parameters())
    if (grads[p] != kNoValue) g.grad_of_param[p] = grads[p];
  debug_verify(g, "autodiff");
}

}  // namespace meshflow
