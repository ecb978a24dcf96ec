// The per-operator strategy search (parallel/strategy_search.h): the integer
// program's answer is the optimum of its own objective (checked against every
// assignment of a small graph), it recovers Megatron's column/row split on a
// GPT block where that is the cheap plan, a memory budget changes the answer
// or is refused with the least memory any plan needs, and repeated blocks
// are decided once.
#include "meshflow/parallel/strategy_search.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "meshflow/autodiff/autodiff.h"
#include "meshflow/models/from_config.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/optim/optimizer.h"
#include "meshflow/runtime/run_config.h"

namespace meshflow {
namespace {

Graph training_graph(const nlohmann::json& model, int64_t batch, int64_t seq) {
  ModelGraph m = value_or_throw(build_model(value_or_throw(parse_model_config(model)), batch, seq));
  append_backward(m.graph);
  append_optimizer(m.graph, RunConfig{}.optimizer);
  return std::move(m.graph);
}

nlohmann::json mlp() {
  return {{"type", "mlp"}, {"input_dim", 64}, {"hidden", {128}}, {"num_classes", 16}};
}

nlohmann::json gpt(int64_t layers, int64_t width) {
  return {{"model_type", "gpt2"},
          {"n_layer", layers},
          {"n_embd", width},
          {"n_head", 16},
          {"n_positions", 128},
          {"vocab_size", 256},
          {"tie_word_embeddings", false}};
}

const StrategyDecision& decision(const StrategySearch& r, const std::string& pattern) {
  for (const StrategyDecision& d : r.decisions)
    if (d.pattern == pattern) return d;
  ADD_FAILURE() << "no decision for " << pattern;
  static const StrategyDecision none;
  return none;
}

// Every assignment of the MLP's forward nodes on 4 ranks, priced by the
// search's own objective: none is cheaper than the solver's answer.
TEST(StrategySearch, IlpAnswerIsTheOptimumOfEveryAssignment) {
  const Graph g = training_graph(mlp(), 8, 1);
  const Mesh mesh = value_or_throw(Mesh::parse("tp=4"));
  for (double bandwidth : {1e8, 1e10, 1e12}) {  // from slow links (replicate) to fast (split)
    StrategySearchOptions o;
    o.cost.default_link.bandwidth_bytes_per_s = bandwidth;
    const StrategySearch r = value_or_throw(search_strategies(g, mesh, o));
    EXPECT_TRUE(r.optimal) << r.summary();
    std::vector<int> pick(r.decisions.size(), 0), best_pick;
    double best = 1e300, combos = 1;
    for (const StrategyDecision& d : r.decisions) combos *= d.candidates;
    ASSERT_LT(combos, 5e6) << "too many assignments to enumerate";
    while (true) {
      const double c = r.cost_of(pick);
      if (c < best) best = c, best_pick = pick;
      size_t k = 0;
      while (k < pick.size() && ++pick[k] == r.decisions[k].candidates) pick[k++] = 0;
      if (k == pick.size()) break;
    }
    EXPECT_NEAR(r.objective_s, best, 1e-9 + 1e-9 * best) << "bandwidth " << bandwidth;
    std::vector<int> chosen;
    for (const StrategyDecision& d : r.decisions) chosen.push_back(d.chosen);
    EXPECT_DOUBLE_EQ(r.cost_of(chosen), r.objective_s);
    EXPECT_GT(combos, 100);  // a real choice
  }
}

// A wide GPT block at batch 1 on tp=4 with fast links: splitting the matmuls'
// weights (Megatron) beats splitting tokens (every weight gradient reduced)
// and beats replicating (4x the work).
TEST(StrategySearch, RecoversMegatronColumnRowSplitOnAGptBlock) {
  const Graph g = training_graph(gpt(2, 1024), 1, 128);
  const Mesh mesh = value_or_throw(Mesh::parse("dp=1,tp=4"));
  StrategySearchOptions o;
  o.batch_axes = {"dp"};
  const StrategySearch r = value_or_throw(search_strategies(g, mesh, o));
  EXPECT_TRUE(r.optimal) << r.summary();
  // Column-parallel fc and QKV (weights split on their output columns, the
  // heads), attention on head shards, row-parallel MLP projection (its input
  // and weight split on the contraction).
  EXPECT_EQ(decision(r, "h.*.mlp.c_fc").splits, "((dp, 1, 1), (1, tp))");
  EXPECT_EQ(decision(r, "h.*.mlp.c_proj").splits, "((dp, 1, tp), (tp, 1))");
  EXPECT_EQ(decision(r, "h.*.attn.q_proj").splits, "((dp, 1, 1), (1, tp, 1))");
  EXPECT_EQ(decision(r, "h.*.attn.core").splits,
            "((dp, tp, 1, 1), (dp, tp, 1, 1), (dp, tp, 1, 1))");
  // The attention's output projection: Megatron's row split, or one that
  // costs the same (gathering the heads and splitting the output columns:
  // an all_gather in the forward and an all_reduce of dx in the backward,
  // where Megatron has the all_reduce forward and nothing back).
  const StrategyDecision& proj = decision(r, "h.*.attn.c_proj");
  const std::string row = "((dp, 1, tp, 1), (tp, 1, 1))";
  EXPECT_TRUE(proj.splits == row || (proj.runner_up == row && proj.runner_up_extra_s < 1e-9))
      << proj.splits << ", runner-up " << proj.runner_up << " +" << proj.runner_up_extra_s;
  // Tied: one decision per block position, not per block.
  int fc = 0;
  for (const StrategyDecision& d : r.decisions) fc += d.pattern.find("c_fc") != std::string::npos;
  EXPECT_EQ(fc, 2);  // the matmul and its bias add
  const StrategyDecision& d = decision(r, "h.*.mlp.c_fc");
  EXPECT_EQ(d.nodes.size(), 2u);
  EXPECT_FALSE(d.runner_up.empty());
  EXPECT_GT(d.runner_up_extra_s, 0);
}

// Slow links and a small model: splitting the batch (data parallel) is the
// answer, every weight's gradient reduced once.
TEST(StrategySearch, SmallModelOnSlowLinksSplitsTheBatch) {
  const Graph g = training_graph(mlp(), 4096, 1);
  const Mesh mesh = value_or_throw(Mesh::parse("tp=4"));
  StrategySearchOptions o;
  o.cost.default_link.bandwidth_bytes_per_s = 1e9;
  o.node_time_s = [](const Graph& g, const Node& n) { return op_cost(g, n).flops / 1e9; };
  const StrategySearch r = value_or_throw(search_strategies(g, mesh, o));
  for (const StrategyDecision& d : r.decisions) {
    if (d.candidates == 1) continue;
    EXPECT_EQ(d.splits.rfind("((tp", 0), 0u) << d.pattern << " " << d.splits;
  }
}

// A budget below what the data-parallel answer keeps pushes the weights to
// be split; a budget below any assignment is refused with the least memory.
TEST(StrategySearch, MemoryBudgetSplitsWeightsOrIsRefused) {
  const Graph g = training_graph(gpt(2, 256), 8, 32);
  const Mesh mesh = value_or_throw(Mesh::parse("tp=4"));
  StrategySearchOptions o;
  o.cost.default_link.bandwidth_bytes_per_s = 1e9;
  const StrategySearch free = value_or_throw(search_strategies(g, mesh, o));
  o.memory_budget_bytes = 0.6 * free.memory_bytes;
  Result<StrategySearch> tight = search_strategies(g, mesh, o);
  ASSERT_TRUE(tight.is_ok()) << tight.status().message();
  EXPECT_LE(tight->memory_bytes, o.memory_budget_bytes);
  EXPECT_GE(tight->objective_s, free.objective_s);
  o.memory_budget_bytes = 1e3;
  Result<StrategySearch> none = search_strategies(g, mesh, o);
  ASSERT_FALSE(none.is_ok());
  EXPECT_NE(none.status().message().find("the least memory any assignment"), std::string::npos)
      << none.status().message();
}

// A solver stopped by its time limit (issue 12, bad input): the best
// assignment found so far comes back, priced by the search's own objective,
// with CBC's bound and the gap between them said, never an error or a hang.
TEST(StrategySearch, TimeLimitReturnsTheBestFoundWithItsGap) {
  const Graph g = training_graph(gpt(4, 256), 8, 32);
  const Mesh mesh = value_or_throw(Mesh::parse("tp=4"));
  StrategySearchOptions o;
  o.tie_layers = false;  // every block its own decisions: a larger program
  o.cost.default_link.bandwidth_bytes_per_s = 1e9;
  // A memory row makes it a knapsack: the relaxation is fractional, CBC branches.
  o.memory_budget_bytes = 0.6 * value_or_throw(search_strategies(g, mesh, o)).memory_bytes;
  const StrategySearch full = value_or_throw(search_strategies(g, mesh, o));
  o.time_limit_s = 1e-6;
  const StrategySearch cut = value_or_throw(search_strategies(g, mesh, o));
  ASSERT_TRUE(cut.timed_out) << cut.summary();
  EXPECT_FALSE(cut.optimal);
  EXPECT_NE(cut.summary().find("time limit"), std::string::npos) << cut.summary();
  std::vector<int> chosen;
  for (const StrategyDecision& d : cut.decisions) chosen.push_back(d.chosen);
  EXPECT_DOUBLE_EQ(cut.cost_of(chosen), cut.objective_s);
  EXPECT_GE(cut.objective_s, full.objective_s - 1e-12);  // no better than the optimum
  EXPECT_LE(cut.bound_s, full.objective_s + 1e-9);       // the bound is a bound
  EXPECT_GE(cut.gap, 0);
  EXPECT_NEAR(cut.gap, (cut.objective_s - cut.bound_s) / cut.objective_s, 1e-6);
  EXPECT_EQ(cut.strategies.size(), full.strategies.size());  // a whole plan to run
  EXPECT_LE(cut.memory_bytes, o.memory_budget_bytes);        // that fits
}

// Prices no machine has (a cluster file of years-long message steps, the
// fuzzer's case) get a message naming the term, not CLP's abort on an
// objective coefficient past 1e25.
TEST(StrategySearch, PricesBeyondAnyStepAreRefusedByName) {
  const Graph g = training_graph(gpt(2, 64), 4, 16);
  const Mesh mesh = value_or_throw(Mesh::parse("tp=2"));
  StrategySearchOptions o;
  o.cost.default_link.bandwidth_bytes_per_s = 1e9;
  ASSERT_TRUE(search_strategies(g, mesh, o).is_ok());
  o.cost.default_link.latency_s = 9.2e18;
  Result<StrategySearch> r = search_strategies(g, mesh, o);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("out of range"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("priced at 1.8"), std::string::npos) << r.status().message();
  o.cost.default_link.latency_s = 0;
  o.node_time_s = [](const Graph&, const Node&) { return std::nan(""); };
  r = search_strategies(g, mesh, o);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("node '"), std::string::npos) << r.status().message();
}

// A 2-block GPT at batch 1 x seq 4096, and search options for a dp x cp
// mesh whose cp runs ring attention over 100 GB/s links.
Graph long_sequence_gpt() {
  nlohmann::json model = gpt(2, 128);
  model["n_positions"] = 4096;
  return training_graph(model, 1, 4096);
}

StrategySearchOptions ring_options() {
  StrategySearchOptions o;
  o.batch_axes = {"dp"};
  o.ring_axes = {"cp"};
  o.cost.default_link.bandwidth_bytes_per_s = 1e11;
  return o;
}

// Ring attention in the search: over a cp axis the caller runs in zigzag
// order (ring_axes), a long sequence at batch 1 splits its tokens over cp,
// attention included, its k/v going round the ring. The shifts its compute
// does not hide are priced: on fast links the dk/dv accumulator's last shift
// alone; on slow ones the ring loses.
// Without ring_axes attention's sequence is never split.
TEST(StrategySearch, LongSequencesRunAttentionAsARingOverCp) {
  const Graph g = long_sequence_gpt();
  const Mesh mesh = value_or_throw(Mesh::parse("dp=1,cp=4"));
  StrategySearchOptions o = ring_options();
  const StrategySearch r = value_or_throw(search_strategies(g, mesh, o));
  EXPECT_TRUE(r.optimal) << r.summary();
  EXPECT_TRUE(r.ring);
  const StrategyDecision& core = decision(r, "h.*.attn.core");
  const std::string seq_split = "((dp, 1, cp, 1), (dp, 1, cp, 1), (dp, 1, cp, 1))";
  EXPECT_EQ(core.splits, seq_split);
  EXPECT_EQ(decision(r, "h.*.mlp.c_fc").splits, "((dp, cp, 1), (1, 1))");
  // k and v of one block: [1, 16, 4096/4, 8] f32 each, one shift at 100 GB/s.
  const double shift = 2 * 16 * 1024 * 8 * 4 / 1e11 + o.cost.default_link.latency_s;
  EXPECT_NEAR(core.ring_s, 2 * shift, 1e-12) << "two blocks, tied: each its last shift";

  // Slow links: the shifts are no longer hidden; the ring loses (here to
  // attention run whole on every rank).
  o.cost.default_link.bandwidth_bytes_per_s = 1e8;
  const StrategySearch slow = value_or_throw(search_strategies(g, mesh, o));
  EXPECT_FALSE(slow.ring);
  EXPECT_NE(decision(slow, "h.*.attn.core").splits, seq_split);

  o.cost.default_link.bandwidth_bytes_per_s = 1e11;
  o.ring_axes.clear();
  const StrategySearch no_ring = value_or_throw(search_strategies(g, mesh, o));
  EXPECT_FALSE(no_ring.ring);
  EXPECT_NE(decision(no_ring, "h.*.attn.core").splits, seq_split);
  EXPECT_EQ(decision(no_ring, "h.*.attn.core").ring_s, 0);
  // The ring's candidates include every other: never worse.
  EXPECT_LE(r.objective_s, no_ring.objective_s + 1e-12);
}

// A weight replicated over cp has its gradient Partial over cp; the planner
// sums it in the data-parallel reduction over dp x cp under the backward,
// so the search charges that sum folded_scale of a standalone all_reduce
// over cp (folded_axes). Over other axes (none here) it pays in full.
TEST(StrategySearch, GradientSumsOverFoldedAxesCostTheirShare) {
  const Graph g = long_sequence_gpt();
  const Mesh mesh = value_or_throw(Mesh::parse("dp=1,cp=4"));
  StrategySearchOptions o = ring_options();
  const StrategySearch full = value_or_throw(search_strategies(g, mesh, o));
  const StrategyDecision& fc = decision(full, "h.*.mlp.c_fc");
  ASSERT_EQ(fc.splits, "((dp, cp, 1), (1, 1))");  // the weight whole on every cp rank
  ASSERT_GT(fc.grad_reduce_s, 0);
  o.folded_axes = {"cp"};
  for (double scale : {1.0, 0.25, 0.0}) {
    o.folded_scale = scale;
    const StrategySearch r = value_or_throw(search_strategies(g, mesh, o));
    const StrategyDecision& d = decision(r, "h.*.mlp.c_fc");
    EXPECT_EQ(d.splits, fc.splits) << scale;
    EXPECT_NEAR(d.grad_reduce_s, scale * fc.grad_reduce_s, 1e-12 + 1e-9 * fc.grad_reduce_s)
        << scale;
    EXPECT_LE(r.objective_s, full.objective_s + 1e-12) << scale;
  }
}

TEST(StrategySearch, BatchAxesMustNotBeSearched) {
  const Graph g = training_graph(mlp(), 8, 1);
  StrategySearchOptions o;
  o.batch_axes = {"dp"};
  Result<StrategySearch> r = search_strategies(g, value_or_throw(Mesh::parse("dp=2,tp=2")), o);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("batch axis 'dp'"), std::string::npos);
}

}  // namespace
}  // namespace meshflow
