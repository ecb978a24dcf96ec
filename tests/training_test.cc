// Training-level checks: gradient accumulation equals the full batch, the
// optimizer ops equal their textbook formulas, the LR schedule, and the static
// memory plan's invariant.
#include <gtest/gtest.h>

#include <cmath>

#include "grad_check.h"
#include "meshflow/autodiff/autodiff.h"
#include "meshflow/core/random.h"
#include "meshflow/engine/trainer.h"
#include "meshflow/ops/verify.h"
#include "meshflow/optim/optimizer.h"
#include "meshflow/runtime/executor.h"
#include "meshflow/runtime/memory_plan.h"

namespace meshflow {
namespace {

// SGD runs a tiny GPT. AdamW runs a tiny LLaMA: it has no biases, and GPT's
// key bias has a gradient that is zero in exact arithmetic (softmax ignores a
// per-query constant), so Adam turns its rounding noise into full-size steps
// whose sign depends on summation order.
RunConfig tiny_run(int micro_batches, const std::string& optimizer) {
  json gpt = {{"model_type", "gpt2"}, {"n_layer", 2},      {"n_embd", 32},      {"n_head", 2},
              {"n_positions", 16},    {"vocab_size", 256}, {"resid_pdrop", 0.0}};
  json llama = {{"model_type", "llama"},    {"num_hidden_layers", 2},
                {"hidden_size", 32},        {"num_attention_heads", 4},
                {"num_key_value_heads", 2}, {"intermediate_size", 64},
                {"vocab_size", 256},        {"max_position_embeddings", 16}};
  json doc = {
      {"model", optimizer == "sgd" ? gpt : llama},
      {"data", {{"dataset", "fortunes"}}},
      {"train",
       {{"steps", 3},
        {"batch_size", 8},
        {"micro_batches", micro_batches},
        {"seq_len", 16},
        {"threads", 1},
        {"eval_batches", 2}}},
      {"optimizer",
       {{"type", optimizer}, {"lr", optimizer == "sgd" ? 0.1 : 1e-3}, {"schedule", "constant"}}}};
  if (optimizer == "sgd") doc["optimizer"]["momentum"] = 0.9;
  return value_or_throw(parse_run_config(doc, ""));
}

// Max |a-b| / max|b| over all parameters.
double max_param_diff(Trainer& a, Trainer& b) {
  double worst = 0;
  for (ValueId p : a.graph().parameters()) {
    ValueId q = b.graph().find(a.graph().value(p).name);
    EXPECT_NE(q, kNoValue);
    const Tensor& ta = a.executor().storage(p);
    const Tensor& tb = b.executor().storage(q);
    worst = std::max(worst, testing::max_rel_diff(ta.data<float>(), tb.data<float>(), ta.numel()));
  }
  return worst;
}

class Accumulation : public ::testing::TestWithParam<std::string> {};

TEST_P(Accumulation, MicroBatchesGiveTheFullBatchLossesAndWeights) {
  auto full = value_or_throw(Trainer::create(tiny_run(1, GetParam())));
  auto split = value_or_throw(Trainer::create(tiny_run(4, GetParam())));
  for (int s = 0; s < 3; ++s) {
    StepResult a = full->step(), b = split->step();
    EXPECT_NEAR(a.loss, b.loss, 1e-5 * std::fabs(a.loss)) << "step " << s;
    EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-4 * a.grad_norm) << "step " << s;
  }
  // f32 sums in a different order: differences stay at rounding level.
  EXPECT_LT(max_param_diff(*full, *split), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, Accumulation, ::testing::Values("sgd", "adamw"));

// loss = sum(p * c): the gradient of p is c, so updates follow the textbook formulas.
struct OneParam {
  Graph g;
  ValueId p, c;
  explicit OneParam(const OptimizerConfig& oc) {
    Builder b(g);
    p = b.parameter("p", Shape{{"n", 5}}, Init::zeros());
    c = b.input("c", Shape{{"n", 5}});
    g.loss = b.matmul(p, c, {false, false, 1, 0});
    append_backward(g);
    append_optimizer(g, oc);
  }
};

TEST(Optimizer, AdamWMatchesTheFormula) {
  OptimizerConfig oc;
  oc.kind = OptimizerKind::kAdamW;
  oc.weight_decay = 0.1f;
  oc.decay_all = true;
  OneParam m(oc);
  ASSERT_TRUE(verify(m.g).is_ok());
  Executor ex(m.g);
  const double init[5] = {0.5, -1, 2, 0.25, -0.75}, grad[5] = {1, -2, 0.5, 3, -0.1};
  for (int i = 0; i < 5; ++i) {
    ex.storage(m.p).data<float>()[i] = static_cast<float>(init[i]);
    ex.storage(m.c).data<float>()[i] = static_cast<float>(grad[i]);
  }
  double p[5], mm[5] = {}, vv[5] = {};
  std::copy(init, init + 5, p);
  const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1;
  ex.feed_scalar("loss_scale", 1.f);
  for (int t = 1; t <= 4; ++t) {
    ex.feed_scalar("lr", static_cast<float>(lr));
    ex.feed_scalar("step", static_cast<float>(t));
    ex.run(ex.training_order());
    for (int i = 0; i < 5; ++i) {
      p[i] *= 1 - lr * wd;
      mm[i] = b1 * mm[i] + (1 - b1) * grad[i];
      vv[i] = b2 * vv[i] + (1 - b2) * grad[i] * grad[i];
      double mh = mm[i] / (1 - std::pow(b1, t)), vh = vv[i] / (1 - std::pow(b2, t));
      p[i] -= lr * mh / (std::sqrt(vh) + eps);
    }
  }
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(ex.storage(m.p).data<float>()[i], p[i], 1e-6) << i;
}

TEST(Optimizer, SgdMomentumAndClippingMatchTheFormula) {
  OptimizerConfig oc;
  oc.kind = OptimizerKind::kSgd;
  oc.momentum = 0.9f;
  oc.grad_clip = 1.0f;
  OneParam m(oc);
  Executor ex(m.g);
  const double grad[5] = {1, -2, 0.5, 3, -0.1};
  double norm = 0;
  for (double g : grad) norm += g * g;
  norm = std::sqrt(norm);
  for (int i = 0; i < 5; ++i) ex.storage(m.c).data<float>()[i] = static_cast<float>(grad[i]);
  double p[5] = {}, buf[5] = {};
  ex.feed_scalar("loss_scale", 1.f);
  for (int t = 1; t <= 3; ++t) {
    ex.feed_scalar("lr", 0.1f);
    ex.feed_scalar("step", static_cast<float>(t));
    ex.run(ex.training_order());
    EXPECT_NEAR(ex.scalar(m.g.outputs.at("grad_norm")), norm, 1e-5);
    for (int i = 0; i < 5; ++i) {
      double g = grad[i] * (1.0 / (norm + 1e-6));
      buf[i] = 0.9 * buf[i] + g;
      p[i] -= 0.1 * buf[i];
    }
  }
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(ex.storage(m.p).data<float>()[i], p[i], 1e-6) << i;
}

TEST(LrSchedule, WarmupThenCosineToMin) {
  LrSchedule s;
  s.lr = 1.0f;
  s.min_lr = 0.1f;
  s.warmup_steps = 10;
  s.total_steps = 110;
  EXPECT_NEAR(s.at(0), 0.1f, 1e-6);
  EXPECT_NEAR(s.at(9), 1.0f, 1e-6);
  EXPECT_NEAR(s.at(10), 1.0f, 1e-6);
  EXPECT_NEAR(s.at(60), 0.55f, 1e-5);
  EXPECT_NEAR(s.at(110), 0.1f, 1e-6);
  s.kind = LrSchedule::Kind::kLinear;
  EXPECT_NEAR(s.at(60), 0.55f, 1e-5);
}

// Random graphs: no two values alive at the same time share a byte, and the
// arena is never larger than one buffer per value.
TEST(MemoryPlan, LiveValuesNeverOverlap) {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    Graph g;
    Builder b(g);
    Rng rng(seed);
    std::vector<ValueId> live = {b.input("x", Shape{{"n", 16}})};
    for (int i = 0; i < 40; ++i) {
      ValueId a = live[rng.below(live.size())], c = live[rng.below(live.size())];
      ValueId y = rng.below(2) ? b.add(a, c) : b.mul(a, c);
      live.push_back(y);
    }
    std::vector<NodeId> order;
    for (NodeId i = 0; i < g.num_nodes(); ++i) order.push_back(i);
    std::vector<char> persistent(g.num_values(), 0), keep(g.num_values(), 0);
    persistent[live[0]] = 1;
    keep[live.back()] = 1;
    MemoryPlan plan = plan_memory(g, order, persistent, keep);
    EXPECT_LE(plan.arena_bytes, plan.sum_transient_bytes);
    for (ValueId u = 0; u < g.num_values(); ++u)
      for (ValueId v = u + 1; v < g.num_values(); ++v) {
        if (plan.offset[u] < 0 || plan.offset[v] < 0) continue;
        bool alive_together =
            plan.first_use[u] <= plan.last_use[v] && plan.first_use[v] <= plan.last_use[u];
        bool bytes_overlap =
            plan.offset[u] < plan.offset[v] + 64 && plan.offset[v] < plan.offset[u] + 64;
        EXPECT_FALSE(alive_together && bytes_overlap)
            << "values " << u << " and " << v << " seed " << seed;
      }
  }
}

}  // namespace
}  // namespace meshflow

namespace meshflow {
namespace {

TEST(Optimizer, WeightDecaySkipsBiasesAndNormGains) {
  RunConfig rc = tiny_run(1, "sgd");
  ModelGraph m = value_or_throw(build_model_from_json(rc.model, 2, 8));
  OptimizerConfig oc;
  std::set<std::string> decayed;
  for (ValueId p : decayed_parameters(m.graph, oc)) decayed.insert(m.graph.value(p).name);
  for (const char* w :
       {"wte.weight", "wpe.weight", "h.0.attn.q_proj.weight", "h.1.mlp.c_proj.weight"})
    EXPECT_TRUE(decayed.count(w)) << w;
  for (const char* b : {"h.0.attn.q_proj.bias", "h.0.mlp.c_fc.bias", "h.0.ln_1.weight",
                        "h.0.ln_1.bias", "ln_f.weight"})
    EXPECT_FALSE(decayed.count(b)) << b;
  oc.decay_all = true;
  EXPECT_EQ(decayed_parameters(m.graph, oc).size(), m.graph.parameters().size());
}

}  // namespace
}  // namespace meshflow
