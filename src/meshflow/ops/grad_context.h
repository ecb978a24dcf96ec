// GradContext: what an op's gradient rule (OpDef::grad) sees while autodiff
// walks the graph backwards. The rule reads the gradients flowing into the
// node's outputs and emits nodes, through the builder, that compute the
// gradients of its inputs.
//
//   void matmul_grad(GradContext& c, const Node& n) {
//     ValueId dy = c.dout(0);
//     if (c.needs(0)) c.accumulate(0, c.b().matmul(dy, n.inputs[1], {.trans_b = true}));
//     ...
//   }
#pragma once

#include <vector>

#include "meshflow/ops/builder.h"

namespace meshflow {

class GradContext {
 public:
  GradContext(Builder& b, std::vector<ValueId>& grads, const std::vector<char>& needs_grad)
      : b_(b), grads_(grads), needs_grad_(needs_grad) {}

  Builder& b() { return b_; }
  const Graph& graph() { return b_.graph(); }
  void set_node(const Node* n) { node_ = n; }

  // Gradient flowing into output i of the current node; kNoValue if none.
  ValueId dout(int i) const { return grads_[node_->outputs[i]]; }
  // Whether input i needs a gradient (it depends on a parameter, and the loss on it).
  bool needs(int i) const { return needs_grad_[node_->inputs[i]] != 0; }
  // Adds g to the gradient of input i (summing contributions from several uses).
  void accumulate(int i, ValueId g);

 private:
  Builder& b_;
  std::vector<ValueId>& grads_;
  const std::vector<char>& needs_grad_;
  const Node* node_ = nullptr;
};

}  // namespace meshflow
