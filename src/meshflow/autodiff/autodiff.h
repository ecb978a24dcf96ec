// Reverse-mode autodiff on the graph. Appends the backward nodes (Phase::kBackward)
// to the same graph, so later passes see forward and backward as one program.
//
//   Graph g = build_gpt(cfg);               // sets g.loss
//   append_backward(g);                      // fills g.grad_of_param
//   append_optimizer(g, adamw_cfg);          // optim/optimizer.h
//
// The backward pass starts from g.loss with the gradient seed taken from the
// f32 scalar input "loss_scale" (1 normally, 1/m under gradient accumulation
// over m micro-batches), so the seed is data, not a constant baked in.
#pragma once

#include "meshflow/ir/graph.h"

namespace meshflow {

// Differentiates g.loss with respect to every Parameter. Parameters the loss
// does not depend on get no entry in g.grad_of_param.
void append_backward(Graph& g);

}  // namespace meshflow
