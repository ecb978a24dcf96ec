// Recomputation (autodiff/recompute.h): full, selective and per-op recompute
// give the same losses, gradients and AdamW weights as no recompute (bit for
// bit: the clones run the same kernels on the same inputs, dropout included),
// the clones sit where the backward of their block needs them, the static
// memory plan's arena shrinks by the expected amount, and bad policies are
// reported by name.
#include "meshflow/autodiff/recompute.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <set>

#include "meshflow/autodiff/autodiff.h"
#include "meshflow/core/random.h"
#include "meshflow/models/gpt.h"
#include "meshflow/models/llama.h"
#include "meshflow/models/mlp.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/ops/verify.h"
#include "meshflow/optim/optimizer.h"
#include "meshflow/runtime/executor.h"

namespace meshflow {
namespace {

using Policy = RecomputePolicy;

constexpr int64_t kBatch = 2, kSeq = 16, kVocab = 64;

// resid_pdrop and embd_pdrop > 0: recomputed dropouts must redraw the same masks.
GptConfig tiny_gpt(int64_t layers = 3) {
  GptConfig c;
  c.n_layer = layers;
  c.n_embd = 32;
  c.n_head = 4;
  c.n_positions = kSeq;
  c.vocab_size = kVocab;
  c.resid_pdrop = 0.2f;
  c.embd_pdrop = 0.1f;
  return c;
}

LlamaConfig tiny_llama() {
  LlamaConfig c;
  c.num_hidden_layers = 3;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.intermediate_size = 64;
  c.vocab_size = kVocab;
  c.max_position_embeddings = kSeq;
  return c;
}

Graph model_graph(const std::string& model) {
  return model == "gpt" ? value_or_throw(build_gpt(tiny_gpt(), kBatch, kSeq)).graph
                        : value_or_throw(build_llama(tiny_llama(), kBatch, kSeq)).graph;
}

OptimizerConfig adamw() {
  OptimizerConfig oc;
  oc.kind = OptimizerKind::kAdamW;
  oc.lr = 1e-2f;
  oc.weight_decay = 0.1f;
  return oc;
}

// Forward + backward (+ recompute) + AdamW; the pass before or after the optimizer.
Graph training_graph(const std::string& model, const Policy& p, bool after_optimizer) {
  Graph g = model_graph(model);
  append_backward(g);
  if (after_optimizer) append_optimizer(g, adamw());
  Status s = apply_recompute(g, p);
  EXPECT_TRUE(s.is_ok()) << s.message();
  if (!after_optimizer) append_optimizer(g, adamw());
  Status v = verify(g);
  EXPECT_TRUE(v.is_ok()) << v.message();
  return g;
}

struct TrainRun {
  std::vector<float> losses;
  std::map<std::string, std::vector<float>> grads;   // first step's gradient, by parameter
  std::map<std::string, std::vector<float>> params;  // after the last step
  int64_t arena = 0;
};

std::vector<float> copy_floats(const void* p, int64_t n) {
  const float* f = static_cast<const float*>(p);
  return std::vector<float>(f, f + n);
}

TrainRun train(const Graph& g, int steps) {
  ExecutorOptions eo;
  eo.seed = 3;
  Executor ex(g, eo);
  TrainRun r;
  r.arena = ex.memory().arena;
  std::vector<int32_t> tokens(kBatch * kSeq), targets(kBatch * kSeq);
  for (int s = 0; s < steps; ++s) {
    Rng rng(100 + s);
    for (auto& t : tokens) t = static_cast<int32_t>(rng.below(kVocab));
    for (auto& t : targets) t = static_cast<int32_t>(rng.below(kVocab));
    EXPECT_TRUE(ex.feed_data("tokens", tokens.data(), tokens.size() * 4).is_ok());
    EXPECT_TRUE(ex.feed_data("targets", targets.data(), targets.size() * 4).is_ok());
    const int32_t rng_offset[2] = {s, 0};
    if (g.find("rng_offset") != kNoValue) {
      EXPECT_TRUE(ex.feed_data("rng_offset", rng_offset, sizeof rng_offset).is_ok());
    }
    ex.feed_scalar("loss_scale", 1.f);
    ex.feed_scalar("lr", 1e-2f);
    ex.feed_scalar("step", static_cast<float>(s + 1));
    ex.run(ex.training_order());
    r.losses.push_back(ex.scalar(g.loss));
    if (s == 0)
      for (auto [p, grad] : g.grad_of_param)
        r.grads[g.value(p).name] = copy_floats(ex.data(grad), g.shape(grad).numel());
  }
  for (ValueId p : g.parameters())
    r.params[g.value(p).name] = copy_floats(ex.data(p), g.shape(p).numel());
  return r;
}

// Number of elements that differ in bits, over all tensors of a and b.
int64_t bit_differences(const std::map<std::string, std::vector<float>>& a,
                        const std::map<std::string, std::vector<float>>& b) {
  EXPECT_EQ(a.size(), b.size());
  int64_t diff = 0;
  for (const auto& [name, x] : a) {
    const std::vector<float>& y = b.at(name);
    EXPECT_EQ(x.size(), y.size()) << name;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i)
      diff += std::memcmp(&x[i], &y[i], sizeof(float)) != 0;
  }
  return diff;
}

int count_clones(const Graph& g) {
  int n = 0;
  for (const Node& node : g.nodes()) n += node.name.find("@recompute") != std::string::npos;
  return n;
}

// ---------------------------------------------------------------------------
// Same numbers as no recompute.

struct Case {
  std::string name, model;
  Policy policy;
  bool after_optimizer = false;
};

Policy full(std::vector<int> layers = {}) {
  Policy p;
  p.mode = Policy::kFull;
  p.layers = std::move(layers);
  return p;
}
Policy selective() {
  Policy p;
  p.mode = Policy::kSelective;
  return p;
}
Policy ops(std::vector<std::string> names) {
  Policy p;
  p.mode = Policy::kOps;
  p.op_names = std::move(names);
  return p;
}

class SameNumbers : public ::testing::TestWithParam<Case> {};

TEST_P(SameNumbers, LossGradientsAndAdamWWeightsAreBitIdentical) {
  const Case& c = GetParam();
  Graph base = training_graph(c.model, Policy{}, false);
  Graph g = training_graph(c.model, c.policy, c.after_optimizer);
  EXPECT_GT(count_clones(g), 0);
  TrainRun a = train(base, 3), b = train(g, 3);
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t s = 0; s < a.losses.size(); ++s) EXPECT_EQ(a.losses[s], b.losses[s]) << "step " << s;
  EXPECT_EQ(bit_differences(a.grads, b.grads), 0);
  EXPECT_EQ(bit_differences(a.params, b.params), 0);
  std::printf("  %-16s clones %3d  arena %7lld -> %7lld bytes  extra fwd FLOPs %.3g\n",
              c.name.c_str(), count_clones(g), static_cast<long long>(a.arena),
              static_cast<long long>(b.arena), recompute_extra_flops(g));
}

INSTANTIATE_TEST_SUITE_P(
    Recompute, SameNumbers,
    ::testing::Values(Case{"gpt_full", "gpt", full()}, Case{"gpt_full_layer1", "gpt", full({1})},
                      Case{"gpt_full_after_opt", "gpt", full({0, 2}), true},
                      Case{"gpt_selective", "gpt", selective()},
                      Case{"gpt_ops_mlp", "gpt", ops({"h.1.mlp.*", "h.2.ln_2"})},
                      Case{"llama_full", "llama", full()},
                      Case{"llama_selective", "llama", selective(), true},
                      Case{"llama_ops", "llama",
                           ops({"model.layers.0.mlp.*", "*.self_attn.core"})}),
    [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

// ---------------------------------------------------------------------------
// Structure of the rewritten graph.

TEST(Recompute, ClonesRunPerBlockRightBeforeTheirBackward) {
  Graph g = model_graph("gpt");
  append_backward(g);
  const ValueId loss = g.loss;
  const auto grads = g.grad_of_param;
  const int values_before = g.num_values();
  ASSERT_TRUE(apply_recompute(g, full()).is_ok());
  ASSERT_TRUE(verify(g).is_ok());
  EXPECT_EQ(g.loss, loss);
  EXPECT_EQ(g.grad_of_param, grads);
  EXPECT_GT(g.num_values(), values_before);

  std::set<int> seen;
  int prev_layer = -2;
  for (NodeId id = 0; id < g.num_nodes(); ++id) {
    const Node& n = g.node(id);
    const bool clone = n.name.find("@recompute") != std::string::npos;
    if (clone) {
      EXPECT_EQ(n.phase, Phase::kBackward) << n.name;
      EXPECT_GE(n.layer, 0) << n.name;
      // One contiguous run per block: a block's clones never resume after another's.
      if (n.layer != prev_layer) {
        EXPECT_TRUE(seen.insert(n.layer).second) << n.name;
      }
      prev_layer = n.layer;
      // The next non-clone node is a backward node of the same block.
      NodeId next = id + 1;
      while (g.node(next).name.find("@recompute") != std::string::npos) ++next;
      if (g.node(next).layer != n.layer) continue;
      EXPECT_EQ(g.node(next).phase, Phase::kBackward);
    } else {
      prev_layer = -2;
      // No backward node of a block reads a forward value of its own block
      // except the block's input: everything else comes from the clones.
      if (n.phase != Phase::kBackward || n.layer < 0) continue;
      for (ValueId v : n.inputs) {
        const Node& p = g.producer(v);
        bool saved =
            p.phase == Phase::kForward && p.layer == n.layer && p.kind != OpKind::kParameter;
        EXPECT_FALSE(saved) << n.name << " reads saved " << g.value(v).name;
      }
    }
  }
  EXPECT_EQ(seen, (std::set<int>{0, 1, 2}));
  // Blocks are recomputed last-first, as their backward runs.
  std::vector<int> order;
  for (const Node& n : g.nodes())
    if (n.name.find("@recompute") != std::string::npos &&
        (order.empty() || order.back() != n.layer))
      order.push_back(n.layer);
  EXPECT_EQ(order, (std::vector<int>{2, 1, 0}));
}

TEST(Recompute, SelectiveRecomputesTheAttentionCore) {
  Graph g = model_graph("llama");
  append_backward(g);
  ASSERT_TRUE(apply_recompute(g, selective()).is_ok());
  std::map<OpKind, int> kinds;
  for (const Node& n : g.nodes())
    if (n.name.find("@recompute") != std::string::npos) ++kinds[n.kind];
  // Per block: the fused attention and its "from_heads" transpose (its output is
  // saved for o_proj's weight gradient). The q/k/v rope + transpose are not
  // cloned: their inputs are not saved, so recomputing them saves nothing.
  EXPECT_EQ(kinds, (std::map<OpKind, int>{{OpKind::kAttention, 3}, {OpKind::kTranspose, 3}}));
}

TEST(Recompute, DropoutCloneDrawsTheForwardMask) {
  Graph g = model_graph("gpt");
  append_backward(g);
  ASSERT_TRUE(apply_recompute(g, full({0})).is_ok());
  ValueId fwd = kNoValue, again = kNoValue;
  for (const Node& n : g.nodes()) {
    if (n.name == "h.0.attn.resid_drop") fwd = n.outputs[0];
    if (n.name == "h.0.attn.resid_drop@recompute") {
      again = n.outputs[0];
      EXPECT_EQ(n.kind, OpKind::kDropout);
      EXPECT_EQ(g.value(n.inputs[1]).name, "rng_offset");  // the saved offset, not a copy
    }
  }
  ASSERT_NE(fwd, kNoValue);
  ASSERT_NE(again, kNoValue);
  EXPECT_EQ(g.producer(fwd).attrs.seed, g.producer(again).attrs.seed);
  ExecutorOptions eo;
  eo.seed = 1;
  eo.fetch = {fwd, again};
  Executor ex(g, eo);
  std::vector<int32_t> tokens(kBatch * kSeq, 5);
  ASSERT_TRUE(ex.feed_data("tokens", tokens.data(), tokens.size() * 4).is_ok());
  ASSERT_TRUE(ex.feed_data("targets", tokens.data(), tokens.size() * 4).is_ok());
  ex.feed_scalar("loss_scale", 1.f);
  for (int32_t step : {0, 7}) {
    const int32_t offset[2] = {step, 0};
    ASSERT_TRUE(ex.feed_data("rng_offset", offset, sizeof offset).is_ok());
    ex.run(ex.forward_backward_order());
    const int64_t n = g.shape(fwd).numel();
    const float* a = ex.data_f(fwd);
    const float* b = ex.data_f(again);
    int64_t zeros = 0;
    for (int64_t i = 0; i < n; ++i) zeros += a[i] == 0.f;
    EXPECT_EQ(std::memcmp(a, b, n * sizeof(float)), 0) << "step " << step;
    // p = 0.2 of the elements dropped, give or take.
    EXPECT_GT(zeros, n / 10);
    EXPECT_LT(zeros, n * 3 / 10);
  }
}

// The check above has teeth: a clone drawing another mask changes the gradients.
TEST(Recompute, AnotherMaskInTheCloneWouldBeCaught) {
  Graph base = training_graph("gpt", Policy{}, false);
  Graph g = training_graph("gpt", full({1}), false);
  // The MLP's residual dropout only feeds the block output (a checkpoint): not
  // cloned. The attention's feeds ln_2, whose input the backward reads: cloned.
  std::set<std::string> dropouts;
  for (const Node& n : g.nodes())
    if (n.kind == OpKind::kDropout && n.name.find("@recompute") != std::string::npos)
      dropouts.insert(n.name);
  EXPECT_EQ(dropouts, (std::set<std::string>{"h.1.attn.resid_drop@recompute"}));
  bool changed = false;
  for (NodeId id = 0; id < g.num_nodes(); ++id)
    if (g.node(id).kind == OpKind::kDropout &&
        g.node(id).name.find("@recompute") != std::string::npos) {
      g.mutable_node(id).attrs.seed += 1;
      changed = true;
    }
  ASSERT_TRUE(changed);
  TrainRun a = train(base, 1), b = train(g, 1);
  EXPECT_EQ(a.losses[0], b.losses[0]);  // the forward is untouched
  EXPECT_GT(bit_differences(a.grads, b.grads), 0);
}

TEST(Recompute, ExtraFlopsAreTheRecomputedForward) {
  Graph g = model_graph("gpt");
  append_backward(g);
  double block_forward = 0;
  for (const Node& n : g.nodes())
    if (n.phase == Phase::kForward && n.layer >= 0) block_forward += op_cost(g, n).flops;
  EXPECT_EQ(recompute_extra_flops(g), 0.0);
  ASSERT_TRUE(apply_recompute(g, full()).is_ok());
  const double extra = recompute_extra_flops(g);
  double step = 0;
  for (const Node& n : g.nodes()) step += op_cost(g, n).flops;
  std::printf(
      "  full recompute: extra %.4g FLOPs = %.1f%% of the blocks' forward, %.1f%% of the "
      "step\n",
      extra, 100 * extra / block_forward, 100 * extra / step);
  // Everything but what only feeds the block output (the MLP's c_proj and the
  // residual adds, whose outputs the backward does not read).
  EXPECT_GT(extra, 0.5 * block_forward);
  EXPECT_LT(extra, block_forward);
}

// ---------------------------------------------------------------------------
// Memory: the executor's static plan.

// Arena (the executor's static plan) and saved-for-backward bytes of a
// training graph (forward, backward, AdamW) under a policy.
struct MemoryFigures {
  int64_t arena = 0, saved = 0;
};

MemoryFigures measure(const std::function<Graph()>& build, const Policy& p) {
  Graph g = build();
  append_backward(g);
  EXPECT_TRUE(apply_recompute(g, p).is_ok());
  append_optimizer(g, adamw());
  Executor ex(g);
  return {ex.memory().arena, saved_for_backward_bytes(g)};
}

// Bytes of the forward values the backward of block 1 reads (its input included).
int64_t saved_per_block(Graph g) {
  append_backward(g);
  std::vector<char> read(g.num_values(), 0);
  for (const Node& n : g.nodes())
    if (n.phase == Phase::kBackward && n.layer == 1)
      for (ValueId v : n.inputs) read[v] = 1;
  int64_t bytes = 0;
  for (ValueId v = 0; v < g.num_values(); ++v) {
    const Node& p = g.producer(v);
    if (read[v] && p.phase == Phase::kForward && p.layer >= 0 && p.kind != OpKind::kParameter)
      bytes += g.shape(v).numel() * 4;
  }
  return bytes;
}

// Without recompute, all L blocks' saved activations (per_block each, block
// input included) are alive when the backward starts. With full recompute only
// the L block inputs are, plus one block's recomputed activations at a time:
//   expected saving = L*per_block - (L*input + per_block - input) = (L-1)*(per_block - input).
// Asserted: at least 2/3 of it (the greedy plan packs the two graphs differently).
// Selective saves the attention out + lse + from_heads per block: a little, but > 0.
void check_memory(const std::string& model, const std::function<Graph()>& build, int64_t L,
                  int64_t tokens, int64_t C, int64_t H) {
  const int64_t input = tokens * C * 4;  // bytes of a block input [B,T,C]
  const int64_t per_block = saved_per_block(build());
  const MemoryFigures none = measure(build, Policy{});
  const MemoryFigures all = measure(build, full());
  const MemoryFigures sel = measure(build, selective());
  const MemoryFigures half = measure(build, full({0, 1, 2}));
  const int64_t expected = (L - 1) * (per_block - input);
  auto ll = [](int64_t v) { return static_cast<long long>(v); };
  std::printf(
      "  %s L=%lld tokens=%lld C=%lld: saved per block %lld bytes (%.1f x [B,T,C])\n"
      "    arena none %lld | full %lld (-%lld, expected ~-%lld) | full layers 0-2 %lld (-%lld) | "
      "selective %lld (-%lld)\n"
      "    saved-for-backward: none %lld | full %lld | selective %lld\n",
      model.c_str(), ll(L), ll(tokens), ll(C), ll(per_block), double(per_block) / input,
      ll(none.arena), ll(all.arena), ll(none.arena - all.arena), ll(expected), ll(half.arena),
      ll(none.arena - half.arena), ll(sel.arena), ll(none.arena - sel.arena), ll(none.saved),
      ll(all.saved), ll(sel.saved));
  EXPECT_GE(none.arena - all.arena, expected * 2 / 3);
  EXPECT_LT(half.arena, none.arena);
  EXPECT_GT(half.arena, all.arena);
  EXPECT_GT(none.arena - sel.arena, 0);
  EXPECT_LT(none.arena - sel.arena, none.arena - all.arena);
  // Exactly out [B,H,T,D] + from_heads [B,T,H,D] + lse [B,H,T] per block leave the saved set.
  EXPECT_EQ(none.saved - sel.saved, L * (2 * input + tokens * H * 4));
}

TEST(Recompute, MemoryPlanShrinksAsExpected) {
  const int64_t B = 4, T = 64, L = 6, C = 64, H = 4;
  GptConfig gpt = tiny_gpt(L);
  gpt.n_embd = C;
  gpt.n_head = H;
  gpt.n_positions = T;
  gpt.vocab_size = 128;
  check_memory(
      "GPT", [&] { return value_or_throw(build_gpt(gpt, B, T)).graph; }, L, B * T, C, H);
  LlamaConfig llama = tiny_llama();
  llama.num_hidden_layers = L;
  llama.hidden_size = C;
  llama.num_attention_heads = H;
  llama.num_key_value_heads = 2;
  llama.intermediate_size = 4 * C;
  llama.max_position_embeddings = T;
  llama.vocab_size = 128;
  check_memory(
      "LLaMA", [&] { return value_or_throw(build_llama(llama, B, T)).graph; }, L, B * T, C, H);
}

// ---------------------------------------------------------------------------
// Errors.

TEST(Recompute, UnknownLayerNamesTheValidRange) {
  Graph g = model_graph("gpt");
  append_backward(g);
  const int nodes = g.num_nodes();
  Status s = apply_recompute(g, full({1, 7}));
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("layer 7"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("0..2"), std::string::npos) << s.message();
  EXPECT_EQ(g.num_nodes(), nodes);  // unchanged
}

TEST(Recompute, UnmatchedOpNameListsSimilarNames) {
  Graph g = model_graph("gpt");
  append_backward(g);
  Status s = apply_recompute(g, ops({"h.1.mlp.*", "h.1.mlp_typo.*"}));
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("\"h.1.mlp_typo.*\""), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("h.1.mlp.c_fc"), std::string::npos) << s.message();
  Policy p = ops({"h.0.mlp.*"});
  p.layers = {1};
  s = apply_recompute(g, p);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("in layers 1"), std::string::npos) << s.message();
  EXPECT_FALSE(apply_recompute(g, ops({})).is_ok());
}

TEST(Recompute, MisuseIsReported) {
  Graph fwd = model_graph("gpt");
  Status s = apply_recompute(fwd, full());
  EXPECT_NE(s.message().find("append_backward"), std::string::npos) << s.message();

  Graph g = model_graph("gpt");
  append_backward(g);
  ASSERT_TRUE(apply_recompute(g, selective()).is_ok());
  s = apply_recompute(g, full());
  EXPECT_NE(s.message().find("already"), std::string::npos) << s.message();

  MlpConfig mc;
  mc.input_dim = 8;
  mc.hidden = {16};
  mc.num_classes = 4;
  Graph mlp = value_or_throw(build_mlp(mc, 4)).graph;
  append_backward(mlp);
  s = apply_recompute(mlp, full());
  EXPECT_NE(s.message().find("no block"), std::string::npos) << s.message();
  s = apply_recompute(mlp, full({0}));
  EXPECT_NE(s.message().find("not a block"), std::string::npos) << s.message();
}

TEST(Recompute, NamePatterns) {
  EXPECT_TRUE(recompute_name_matches("h.1.mlp.*", "h.1.mlp.c_fc"));
  EXPECT_FALSE(recompute_name_matches("h.1.mlp.*", "h.11.mlp.c_fc"));
  EXPECT_TRUE(recompute_name_matches("*.attn.core", "h.3.attn.core"));
  EXPECT_TRUE(recompute_name_matches("h.*.ln_*", "h.0.ln_2"));
  EXPECT_FALSE(recompute_name_matches("h.0.ln_1", "h.0.ln_10"));
  EXPECT_TRUE(recompute_name_matches("*", "anything"));
}

}  // namespace
}  // namespace meshflow
