#include "meshflow/optim/optimizer.h"

#include <cmath>

#include "meshflow/core/check.h"
#include "meshflow/ops/builder.h"
#include "meshflow/ops/verify.h"

namespace meshflow {

namespace {
// True when node n reads parameter p as a bias or a norm gain: input 1 of
// bias_add, the broadcast (smaller) operand of add, or gamma/beta of a norm.
bool reads_as_bias_or_gain(const Graph& g, const Node& n, ValueId p) {
  switch (n.kind) {
    case OpKind::kBiasAdd:
      return n.inputs[1] == p;
    case OpKind::kAdd: {
      ValueId other = n.inputs[0] == p ? n.inputs[1] : n.inputs[0];
      return g.shape(p).numel() < g.shape(other).numel();
    }
    case OpKind::kLayerNorm:
      return n.inputs[1] == p || n.inputs[2] == p;
    case OpKind::kRmsNorm:
      return n.inputs[1] == p;
    case OpKind::kBatchNorm:
      return n.inputs[1] == p || n.inputs[2] == p;
    default:
      return false;
  }
}
}  // namespace

std::set<ValueId> decayed_parameters(const Graph& g, const OptimizerConfig& cfg) {
  std::set<ValueId> decayed;
  for (ValueId p : g.parameters()) decayed.insert(p);
  if (cfg.decay_all) return decayed;
  // A parameter is exempt when every forward use reads it as a bias or a gain.
  std::map<ValueId, bool> all_bias_uses;
  for (const Node& n : g.nodes()) {
    if (n.phase != Phase::kForward) continue;
    for (ValueId v : n.inputs) {
      if (!decayed.count(v)) continue;
      bool bias = reads_as_bias_or_gain(g, n, v);
      auto it = all_bias_uses.find(v);
      all_bias_uses[v] = it == all_bias_uses.end() ? bias : it->second && bias;
    }
  }
  for (const auto& [p, bias] : all_bias_uses)
    if (bias) decayed.erase(p);
  return decayed;
}

void append_optimizer(Graph& g, const OptimizerConfig& cfg) {
  const std::set<ValueId> decayed = decayed_parameters(g, cfg);
  Builder b(g);
  b.set_phase(Phase::kOptimizer);
  auto scope = b.scope("optim");
  ValueId lr = b.input("lr", Shape{});
  ValueId step = b.input("step", Shape{});

  // A parameter's own optimizer nodes (its gradient's sum of squares, its
  // update and states) carry its block (Node::layer), as its forward and
  // backward do: what the planner prices per block (plan/cost_model.h).
  auto layer_of = [&](ValueId param) { return g.node(g.value(param).producer).layer; };
  // Global gradient norm over every parameter's gradient.
  std::vector<ValueId> squares;
  for (const auto& [param, grad] : g.grad_of_param) {
    b.set_layer(layer_of(param));
    squares.push_back(b.op1(OpKind::kSumSquares, {grad}, {}, "sumsq." + g.value(param).name));
  }
  MF_CHECK(!squares.empty()) << "append_optimizer: no parameter has a gradient";
  b.set_layer(-1);
  Attrs clip;
  clip.max_norm = cfg.grad_clip;
  std::vector<ValueId> cc = b.op(OpKind::kClipCoef, squares, clip, "clip");
  ValueId coef = cc[0];
  g.outputs["grad_norm"] = cc[1];

  // Copy: the loop adds values (and so may grow the map's source, not the map).
  const std::map<ValueId, ValueId> grads = g.grad_of_param;
  for (const auto& [param, grad] : grads) {
    const std::string name = g.value(param).name;
    const Shape shape = g.shape(param);
    b.set_layer(layer_of(param));
    Attrs a;
    a.weight_decay = decayed.count(param) ? cfg.weight_decay : 0.f;
    if (cfg.kind == OptimizerKind::kSgd) {
      a.momentum = cfg.momentum;
      a.nesterov = cfg.nesterov;
      ValueId buf = b.state(name + ".momentum", shape);
      b.op(OpKind::kSgdUpdate, {param, grad, buf, lr, coef}, a, "sgd." + name);
    } else {
      a.beta1 = cfg.beta1;
      a.beta2 = cfg.beta2;
      a.eps = cfg.eps;
      ValueId m = b.state(name + ".exp_avg", shape);
      ValueId v = b.state(name + ".exp_avg_sq", shape);
      b.op(OpKind::kAdamWUpdate, {param, grad, m, v, lr, step, coef}, a, "adamw." + name);
    }
  }
  b.set_layer(-1);
  debug_verify(g, "optimizer");
}

int optimizer_state_values(const OptimizerConfig& cfg) {
  return cfg.kind == OptimizerKind::kSgd ? 1 : 2;
}

float LrSchedule::at(int step) const {
  if (warmup_steps > 0 && step < warmup_steps)
    return lr * static_cast<float>(step + 1) / static_cast<float>(warmup_steps);
  if (kind == Kind::kConstant) return lr;
  const int decay_steps = std::max(1, total_steps - warmup_steps);
  const float t = std::min(1.f, static_cast<float>(step - warmup_steps) / decay_steps);
  if (kind == Kind::kLinear) return min_lr + (lr - min_lr) * (1.f - t);
  return min_lr + 0.5f * (lr - min_lr) * (1.f + std::cos(3.14159265358979f * t));
}

}  // namespace meshflow
