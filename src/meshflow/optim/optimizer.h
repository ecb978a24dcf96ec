// Optimizers as graph nodes: append_optimizer adds, after the backward pass,
// the global gradient norm (and clipping coefficient) and one fused update
// node per parameter, with its state (momentum / Adam moments) as State
// values. The optimizer is then part of the training graph, so later passes
// can shard its state like any other value (ZeRO is a layout of these values).
//
//   OptimizerConfig oc;  oc.kind = OptimizerKind::kAdamW;  oc.weight_decay = 0.1f;
//   append_backward(g);  append_optimizer(g, oc);
//   // per step: feed "lr" (LrSchedule::at(step)) and "step" (1-based)
//
// Weight decay applies to weights, not to biases or norm gains (the usual GPT
// recipe), decided from the graph rather than from names or ranks: a parameter
// is exempt when every use reads it as a bias (bias_add, the broadcast operand
// of add) or as a norm's gain/shift.
#pragma once

#include <set>
#include <string>

#include "meshflow/core/status.h"
#include "meshflow/ir/graph.h"

namespace meshflow {

enum class OptimizerKind { kSgd, kAdamW };

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kAdamW;
  float lr = 1e-3f;
  float momentum = 0.f;                             // sgd
  bool nesterov = false;                            // sgd
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;  // adamw
  float weight_decay = 0.f;
  bool decay_all = false;  // also decay biases and norm gains
  float grad_clip = 0.f;   // global-norm clipping threshold; 0 = none (norm still computed)
};

// Adds inputs "lr" and "step" (f32 scalars), g.outputs["grad_norm"], and the
// update nodes. Requires g.grad_of_param (append_backward first).
void append_optimizer(Graph& g, const OptimizerConfig& cfg);

// The f32 state values append_optimizer keeps per parameter: SGD 1 (its
// momentum buffer, kept at momentum 0 too), AdamW 2 (its moments).
int optimizer_state_values(const OptimizerConfig& cfg);

// The parameters append_optimizer applies weight decay to.
std::set<ValueId> decayed_parameters(const Graph& g, const OptimizerConfig& cfg);

// Learning rate by step: linear warmup from 0 over warmup_steps, then cosine
// (or constant, or linear) decay to min_lr at total_steps.
struct LrSchedule {
  enum class Kind { kConstant, kCosine, kLinear } kind = Kind::kCosine;
  float lr = 1e-3f;
  float min_lr = 0.f;
  int warmup_steps = 0;
  int total_steps = 1;
  // step is 0-based (the step about to run).
  float at(int step) const;
};

}  // namespace meshflow
