// The SPMD partitioner = one device: a training graph lowered to per-rank
// programs (parallel/partition.h) on meshes of 2-8 in-process ranks trains
// with the losses and weights of one device, for the presets (data, Megatron
// TP, TP + sequence parallel, Ulysses context parallel, ZeRO 1-3) and for
// random strategy assignments; and the programs have the collectives the
// textbook plans have.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>

#include "cli_run.h"
#include "grad_check.h"
#include "meshflow/autodiff/autodiff.h"
#include "meshflow/comm/local_world.h"
#include "meshflow/engine/job.h"
#include "meshflow/engine/trainer.h"
#include "meshflow/models/from_config.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/optim/optimizer.h"
#include "meshflow/parallel/partition.h"
#include "meshflow/parallel/strategy_search.h"
#include "one_device_trace.h"

namespace meshflow {
namespace {

json model_json(const std::string& model) {
  json gpt = {{"model_type", "gpt2"},
              {"n_layer", 2},
              {"n_embd", 32},
              {"n_head", 4},
              {"n_positions", 16},
              {"vocab_size", 256},
              {"tie_word_embeddings", true}};
  json llama = {{"model_type", "llama"},    {"num_hidden_layers", 2},
                {"hidden_size", 32},        {"num_attention_heads", 4},
                {"num_key_value_heads", 2}, {"intermediate_size", 64},
                {"vocab_size", 256},        {"max_position_embeddings", 16}};
  if (model == "resnet")  // Fashion-MNIST sized: 28 -> 14 -> 7 -> 4 rows
    return {{"model_type", "resnet"},  {"num_channels", 1}, {"embedding_size", 8},
            {"hidden_sizes", {8, 16}}, {"depths", {1, 1}},  {"layer_type", "basic"},
            {"num_labels", 10},        {"image_size", 28}};
  if (model == "gpt_dropout") {
    gpt["resid_pdrop"] = 0.1;
    gpt["embd_pdrop"] = 0.1;
  }
  return model == "llama" ? llama : gpt;
}

RunConfig run(const std::string& model, int micro_batches, const json& parallel) {
  json doc = {
      {"model", model_json(model)},
      {"data", {{"dataset", model == "resnet" ? "fashion_mnist" : "fortunes"}}},
      {"train",
       {{"steps", 3},
        {"batch_size", 8},
        {"micro_batches", micro_batches},
        {"seq_len", 16},
        {"threads", 1},
        {"eval_batches", 2}}},
      // GPT's key bias has an exactly-zero gradient (softmax is shift invariant),
      // which Adam would turn rounding noise into steps on: GPT trains with SGD.
      {"optimizer",
       model == "llama" || model == "resnet"
           ? json{{"type", "adamw"}, {"lr", 1e-3}, {"weight_decay", 0.1}, {"grad_clip", 1.0}}
           : json{{"type", "sgd"}, {"lr", 0.1}, {"momentum", 0.9}, {"grad_clip", 1.0}}}};
  if (!parallel.is_null()) doc["parallel"] = parallel;
  return value_or_throw(parse_run_config(doc, ""));
}

using testing::expect_same;
using testing::Trace;
using testing::train;
using testing::train_ranks;

struct PresetCase {
  std::string model, mesh, preset;
  int zero = 0, micro_batches = 1;
  std::string recompute = "none";
  std::string ring_order = "";  // preset "ring": "" (the default, zigzag) or "contiguous"
};

class PartitionPreset : public ::testing::TestWithParam<PresetCase> {};

TEST_P(PartitionPreset, SameLossesAndWeightsAsOneDevice) {
  const PresetCase& c = GetParam();
  // One device without recomputation is the reference.
  const Trace single = train(run(c.model, c.micro_batches, nullptr), nullptr);
  json par = {{"mode", "semi"}, {"mesh", c.mesh}, {"preset", c.preset}, {"zero", c.zero}};
  if (!c.ring_order.empty()) par["ring_order"] = c.ring_order;
  RunConfig rc = run(c.model, c.micro_batches, par);
  if (c.recompute == "full") rc.train.recompute.mode = RecomputePolicy::kFull;
  if (c.recompute == "selective") rc.train.recompute.mode = RecomputePolicy::kSelective;
  expect_same(single, train_ranks(rc, rc.parallel.mesh.num_ranks()), c.mesh + " " + c.preset);
}

INSTANTIATE_TEST_SUITE_P(
    Presets, PartitionPreset,
    ::testing::Values(
        PresetCase{"gpt", "dp=2", "dp"}, PresetCase{"llama", "dp=4", "dp", 0, 2},
        PresetCase{"gpt", "tp=2", "megatron"}, PresetCase{"llama", "dp=2,tp=2", "megatron"},
        PresetCase{"gpt", "dp=2,tp=2", "megatron-sp"}, PresetCase{"llama", "tp=2", "megatron-sp"},
        PresetCase{"gpt_dropout", "dp=2,tp=2", "megatron-sp"},
        PresetCase{"llama", "cp=2", "ulysses"}, PresetCase{"gpt", "dp=2,cp=2", "ulysses"},
        PresetCase{"llama", "dp=2", "dp", 1}, PresetCase{"gpt", "dp=2", "dp", 2, 2},
        PresetCase{"llama", "dp=2,tp=2", "megatron", 3}, PresetCase{"gpt", "dp=4", "dp", 3, 2},
        // Recomputation inside partitioned programs (dropout masks too).
        PresetCase{"gpt_dropout", "dp=2,tp=2", "megatron-sp", 1, 2, "full"},
        PresetCase{"llama", "dp=2,tp=2", "megatron", 3, 1, "selective"},
        PresetCase{"llama", "cp=2", "ulysses", 0, 1, "full"},
        // Ring attention (k/v blocks round the cp ring), alone and with dp or tp:
        // the sequence in zigzag order (the default; dropout masks, rope angles
        // and GPT's position table at true positions), and in contiguous blocks.
        PresetCase{"gpt", "cp=2", "ring"}, PresetCase{"llama", "cp=2", "ring"},
        PresetCase{"gpt", "cp=4", "ring"}, PresetCase{"llama", "cp=4", "ring"},
        PresetCase{"gpt", "dp=2,cp=2", "ring"}, PresetCase{"llama", "dp=2,cp=2", "ring"},
        PresetCase{"gpt", "tp=2,cp=2", "ring"}, PresetCase{"llama", "tp=2,cp=2", "ring"},
        // ... and beside Megatron-SP (ring-sp: the sequence over cp*tp
        // outside attention), and Megatron-SP with Ulysses' cp.
        PresetCase{"gpt_dropout", "tp=2,cp=2", "ring-sp"},
        PresetCase{"llama", "tp=2,cp=2", "ring-sp", 0, 1, "full"},
        PresetCase{"llama", "dp=2,tp=2,cp=2", "ring-sp", 1},
        PresetCase{"gpt_dropout", "tp=2,cp=2", "megatron-sp"},
        PresetCase{"gpt", "dp=2,tp=2,cp=2", "megatron-sp", 2},
        PresetCase{"llama", "cp=2", "ring", 0, 1, "full"},
        PresetCase{"gpt_dropout", "cp=4", "ring", 0, 2},
        PresetCase{"gpt_dropout", "cp=2", "ring", 0, 1, "selective"},
        PresetCase{"gpt", "cp=4", "ring", 0, 1, "none", "contiguous"},
        PresetCase{"llama", "dp=2,cp=2", "ring", 0, 1, "none", "contiguous"},
        // ZeRO over dp x cp (the optimizer state, gradients and weights
        // sharded over both, as the planner prices it).
        PresetCase{"gpt", "dp=2,cp=2", "ring", 1},
        PresetCase{"llama", "dp=2,cp=2", "ulysses", 2, 2},
        PresetCase{"gpt", "dp=1,cp=2", "ring", 3}),
    [](const auto& info) {
      const PresetCase& c = info.param;
      std::string mesh = c.mesh;
      for (char& ch : mesh)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      std::string preset = c.preset;
      for (char& ch : preset)
        if (ch == '-') ch = '_';
      return c.model + "_" + mesh + "_" + preset + "_zero" + std::to_string(c.zero) + "_m" +
             std::to_string(c.micro_batches) + "_" + c.recompute +
             (c.ring_order.empty() ? "" : "_" + c.ring_order);
    });

// What the preset "ring" resolves to is what runs: the zigzag order over cp
// by default (the program's attention in it, GPT's position table reordered),
// contiguous blocks when asked, and nothing reordered without a cp ring.
TEST(PartitionRing, ZigzagOrderIsWhatRuns) {
  struct Want {
    std::string mesh, order;
    int64_t zigzag;
  };
  for (const Want& w : {Want{"dp=2,cp=4", "", 4}, Want{"cp=2", "zigzag", 2},
                        Want{"cp=4", "contiguous", 0}, Want{"dp=2", "", 0}}) {
    json par = {{"mode", "semi"}, {"mesh", w.mesh}, {"preset", "ring"}};
    if (!w.order.empty()) par["ring_order"] = w.order;
    const RunConfig rc = run("gpt", 1, par);
    const Job job = value_or_throw(resolve_job(rc, rc.parallel.mesh.num_ranks()));
    EXPECT_EQ(job.seq_zigzag, w.zigzag) << w.mesh << " " << w.order;
    const ModelGraph m =
        value_or_throw(build_training_graph(rc, job.micro_batch_rows, job.seq_zigzag));
    int zigzag_ops = 0, attention = 0;
    for (const Node& n : m.graph.nodes()) {
      zigzag_ops += n.kind == OpKind::kZigzag;
      if (n.kind == OpKind::kAttention || n.kind == OpKind::kAttentionGrad) {
        EXPECT_EQ(n.attrs.seq_zigzag, w.zigzag) << n.name;
        ++attention;
      }
    }
    EXPECT_EQ(attention, 4);  // 2 blocks, forward and backward
    EXPECT_EQ(zigzag_ops, w.zigzag ? 2 : 0) << "wpe's slice and its gradient";
    EXPECT_EQ(m.zigzag_inputs.size(), w.zigzag ? 2u : 0u);
  }
}

// ---- random strategies: any valid assignment trains like one device ----

// 200 assignments: a random mesh of 2-8 ranks (1-3 axes), a random valid
// strategy for every node and a random stored layout for every source, two
// training steps, GPT (with dropout) and LLaMA alternating.
TEST(PartitionRandom, TwoHundredStrategyAssignmentsMatchOneDevice) {
  const std::vector<std::string> meshes = {"x=2",     "x=4",     "a=2,b=2",    "x=8",
                                           "a=2,b=4", "a=4,b=2", "a=2,b=2,c=2"};
  std::map<std::string, Trace> single;
  int checked = 0;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    const std::string model = seed % 2 ? "llama" : "gpt_dropout";
    const std::string mesh_text = meshes[seed % meshes.size()];
    json par = {{"mode", "semi"}, {"mesh", mesh_text}};
    RunConfig rc = run(model, seed % 3 == 0 ? 2 : 1, par);
    rc.train.steps = 2;
    RunConfig rc1 = rc;
    rc1.has_parallel = false;
    const std::string key = model + std::to_string(rc.train.micro_batches);
    if (!single.count(key)) single[key] = train(rc1, nullptr);
    // The graph the trainer will build, to draw strategies for.
    ModelGraph m =
        value_or_throw(build_training_graph(rc, rc.train.batch_size / rc.train.micro_batches));
    PartitionOptions o = random_strategies(m.graph, rc.parallel.mesh, seed);
    SCOPED_TRACE("seed " + std::to_string(seed) + " " + model + " on " + mesh_text);
    // Not a vacuous draw: most nodes really are split somewhere.
    int split = 0;
    for (const auto& [id, st] : o.fixed) {
      bool any = false;
      for (const Layout& l : st.inputs) any |= !l.is_replicated();
      split += any;
    }
    EXPECT_GT(split, static_cast<int>(o.fixed.size()) / 2) << "of " << o.fixed.size();
    expect_same(single[key], train_ranks(rc, rc.parallel.mesh.num_ranks(), &o),
                "random " + std::to_string(seed));
    if (HasFailure()) return;
    ++checked;
  }
  EXPECT_EQ(checked, 200);
}

// The same on ResNet graphs (convolution, batch norm, pooling): random valid
// strategies split the batch, the channels (output: like column parallel;
// input: Partial) and the height / width (halo exchanges) over 2-8 ranks.
TEST(PartitionRandom, ResNetStrategyAssignmentsMatchOneDevice) {
  const std::vector<std::string> meshes = {"x=2", "a=2,b=2", "x=4", "a=2,b=4", "a=2,b=2,c=2"};
  RunConfig rc1 = run("resnet", 1, json());
  rc1.train.steps = 2;
  const Trace single = train(rc1, nullptr);
  std::map<OpKind, int> halo_splits;  // window ops whose x (or dx) was split spatially
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const std::string mesh_text = meshes[seed % meshes.size()];
    RunConfig rc = run("resnet", 1, json{{"mode", "semi"}, {"mesh", mesh_text}});
    rc.train.steps = 2;
    ModelGraph m = value_or_throw(build_training_graph(rc, rc.train.batch_size));
    PartitionOptions o = random_strategies(m.graph, rc.parallel.mesh, seed);
    SCOPED_TRACE("seed " + std::to_string(seed) + " resnet on " + mesh_text);
    for (const auto& [id, st] : o.fixed) {
      const Node& n = m.graph.node(id);
      const Layout* x = n.kind == OpKind::kConv2d || n.kind == OpKind::kMaxPool2d ? &st.inputs[0]
                        : n.kind == OpKind::kConv2dGradWeight                     ? &st.inputs[1]
                        : n.kind == OpKind::kConv2dGradInput || n.kind == OpKind::kMaxPool2dGrad
                            ? &st.outputs[0]
                            : nullptr;
      if (x != nullptr && (!x->shard_axes(2).empty() || !x->shard_axes(3).empty()))
        ++halo_splits[n.kind];
    }
    expect_same(single, train_ranks(rc, rc.parallel.mesh.num_ranks(), &o),
                "random resnet " + std::to_string(seed));
    if (HasFailure()) return;
  }
  // The spatial splits were really drawn, for the convolution and both its
  // gradients. (The stem pool's 7 output rows split no way on 28x28 images;
  // ParallelShardingNumeric.WindowsSplitSpatiallyExchangeHalos splits pooling.)
  for (OpKind k : {OpKind::kConv2d, OpKind::kConv2dGradInput, OpKind::kConv2dGradWeight})
    EXPECT_GE(halo_splits[k], 2) << op_name(k);
}

// ---- the strategy search's plans: what it picks trains like one device ----

// The per-operator search (parallel/strategy_search.h) on the tp axis of a
// dp x tp mesh, written as the config's split tuples (as auto mode writes
// them) and trained: GPT, LLaMA and a ResNet on 2-8 ranks, with links fast
// enough that it splits operators (not just the batch) in every case.
TEST(PartitionSearched, SearchedStrategiesTrainLikeOneDevice) {
  struct Case {
    std::string model;
    int dp, tp;
  };
  for (const Case& c : {Case{"gpt", 1, 2}, Case{"llama", 2, 2}, Case{"gpt_dropout", 2, 2},
                        Case{"llama", 1, 4}, Case{"resnet", 1, 2}, Case{"gpt", 2, 4}}) {
    SCOPED_TRACE(c.model + " dp=" + std::to_string(c.dp) + " tp=" + std::to_string(c.tp));
    RunConfig rc1 = run(c.model, 1, json());
    rc1.train.steps = 2;
    const Trace single = train(rc1, nullptr);
    ModelGraph m = value_or_throw(build_training_graph(rc1, rc1.train.batch_size));
    StrategySearchOptions o;
    o.batch_axes = {"dp"};
    o.node_time_s = [](const Graph& g, const Node& n) { return op_cost(g, n).flops / 1e9; };
    const Mesh search_mesh = value_or_throw(Mesh::parse("dp=1,tp=" + std::to_string(c.tp)));
    const StrategySearch r = value_or_throw(search_strategies(m.graph, search_mesh, o));
    json strategies = json::object();
    int operator_splits = 0;  // decisions that split over tp something other than the batch
    for (const auto& [key, splits] : r.strategies) strategies[key] = splits;
    for (const StrategyDecision& d : r.decisions) {
      const std::string batch_only = "((dp*tp";
      if (d.splits.find("tp") != std::string::npos && d.splits.rfind(batch_only, 0) != 0)
        ++operator_splits;
    }
    EXPECT_GE(operator_splits, 3) << r.summary();
    RunConfig rc = run(c.model, 1,
                       json{{"mode", "semi"},
                            {"mesh", "dp=" + std::to_string(c.dp) + ",tp=" + std::to_string(c.tp)},
                            {"rules", {{"batch", "dp"}}},
                            {"strategies", strategies}});
    rc.train.steps = 2;
    rc.train.batch_size = rc1.train.batch_size;
    expect_same(single, train_ranks(rc, c.dp * c.tp), "searched");
    if (HasFailure()) return;
  }
}

// The search on a dp x tp x cp mesh, as the planner runs it (plan/cost_model_ops.cc):
// the program in zigzag order over cp, attention's sequence free to split
// over cp (a ring), the tuples written with "ring_order": "zigzag" so the
// trainer runs the same order. Long sequences of narrow models, one per dp
// replica: cp has no batch to split and the tokens outweigh the weights, so
// the search splits the tokens (attention as a ring), and the plan trains
// with one device's losses and weights.
TEST(PartitionSearched, SearchedRingOverCpTrainsLikeOneDevice) {
  struct Case {
    std::string model;
    int dp, tp, cp;
  };
  for (const Case& c : {Case{"gpt", 1, 1, 2}, Case{"llama", 1, 2, 2}, Case{"gpt_dropout", 2, 1, 2},
                        Case{"llama", 1, 1, 4}}) {
    SCOPED_TRACE(c.model + " dp=" + std::to_string(c.dp) + " tp=" + std::to_string(c.tp) +
                 " cp=" + std::to_string(c.cp));
    RunConfig rc1 = run(c.model, 1, json());
    json model = model_json(c.model);
    for (const char* k : {"n_positions", "max_position_embeddings"})
      if (model.contains(k)) model[k] = 64;
    for (const char* k : {"n_embd", "hidden_size"})
      if (model.contains(k)) model[k] = 16;
    if (model.contains("intermediate_size")) model["intermediate_size"] = 32;
    rc1.model = model;
    rc1.train.seq_len = 64;
    rc1.train.steps = 2;
    rc1.train.batch_size = c.dp;
    const Trace single = train(rc1, nullptr);
    ModelGraph m = value_or_throw(build_training_graph(rc1, 1, c.cp));
    StrategySearchOptions o;
    o.batch_axes = {"dp"};
    o.ring_axes = {"cp"};
    o.node_time_s = [](const Graph& g, const Node& n) { return op_cost(g, n).flops / 1e9; };
    o.cost.default_link.latency_s = 0;  // bandwidth-bound collectives
    const std::string mesh = "dp=" + std::to_string(c.dp) +
                             (c.tp > 1 ? ",tp=" + std::to_string(c.tp) : "") +
                             ",cp=" + std::to_string(c.cp);
    const Mesh search_mesh = value_or_throw(Mesh::parse("dp=1" + mesh.substr(mesh.find(','))));
    const StrategySearch r = value_or_throw(search_strategies(m.graph, search_mesh, o));
    EXPECT_TRUE(r.ring) << r.summary();
    json strategies = json::object();
    for (const auto& [key, splits] : r.strategies) strategies[key] = splits;
    RunConfig rc = run(c.model, 1,
                       json{{"mode", "semi"},
                            {"mesh", mesh},
                            {"rules", {{"batch", "dp"}}},
                            {"strategies", strategies},
                            {"ring_order", "zigzag"}});
    rc.model = rc1.model;
    rc.train = rc1.train;
    expect_same(single, train_ranks(rc, c.dp * c.tp * c.cp), "searched ring");
    if (HasFailure()) return;
  }
}

// ---- structure: the collectives the textbook plans have ----

LocalProgram lowered(const std::string& model, const std::string& mesh, const std::string& preset,
                     int zero = 0) {
  json par = {{"mode", "semi"}, {"mesh", mesh}, {"preset", preset}, {"zero", zero}};
  RunConfig rc = run(model, 1, par);
  ModelGraph m = value_or_throw(build_training_graph(rc, rc.train.batch_size));
  const PartitionOptions o = partition_options(rc.parallel, rc.parallel.mesh);
  Annotation a = value_or_throw(annotate(m.graph, rc.parallel.mesh, o));
  return value_or_throw(lower(m.graph, a, 0));
}

// Rank 0's program of `model` (a model config) on tp=2 with megatron-sp, one
// micro-batch of `batch` x `seq`.
LocalProgram lowered_megatron_sp(const json& model, int64_t batch, int64_t seq) {
  const json doc = {{"model", model},
                    {"data", {{"dataset", "fortunes"}}},
                    {"train", {{"steps", 1}, {"batch_size", batch}, {"seq_len", seq}}},
                    {"optimizer", {{"type", "sgd"}, {"lr", 0.1}}},
                    {"parallel", {{"mode", "semi"}, {"mesh", "tp=2"}, {"preset", "megatron-sp"}}}};
  const RunConfig rc = value_or_throw(parse_run_config(doc, ""));
  const ModelGraph m = value_or_throw(build_training_graph(rc, rc.train.batch_size));
  const PartitionOptions o = partition_options(rc.parallel, rc.parallel.mesh);
  return value_or_throw(lower(m.graph, value_or_throw(annotate(m.graph, rc.parallel.mesh, o)), 0));
}

// Collectives of `kind` over `axis` in `phase`; blocks_only: those moving a
// value of a transformer block (GPT "h.N.", LLaMA "model.layers.N."), not the
// embedding, the head or the loss.
int count(const LocalProgram& p, OpKind kind, Phase phase, const std::string& axis,
          bool blocks_only = false) {
  int c = 0;
  for (const CollectiveRecord& r : p.collectives) {
    const bool block = r.value.rfind("h.", 0) == 0 || r.value.rfind("model.layers.", 0) == 0;
    if (r.kind == kind && r.phase == phase && r.mesh_axis == axis && (block || !blocks_only)) ++c;
  }
  return c;
}

// A ResNet split over height and width: every convolution and pooling
// exchanges its halo with its neighbours (neighbor_exchange, forward and
// backward); nothing is all-gathered; batch norm reduces its statistics and
// the global average pool its sums.
TEST(PartitionSpatial, HeightAndWidthSplitsExchangeHalosNotGathers) {
  json model = model_json("resnet");
  model["image_size"] = 32;  // 32 -> 16 -> 8 -> 4 rows: every split even
  json doc = {{"model", model},
              {"data", {{"dataset", "fashion_mnist"}}},
              {"train", {{"batch_size", 4}, {"threads", 1}}},
              {"optimizer", {{"type", "sgd"}, {"lr", 0.1}}},
              {"parallel", {{"mode", "semi"}, {"mesh", "h=2,w=2"}}}};
  RunConfig rc = value_or_throw(parse_run_config(doc, ""));
  const Mesh& mesh = rc.parallel.mesh;
  ModelGraph m = value_or_throw(build_training_graph(rc, 4));
  // Every forward convolution and pooling: x split by height over h, width over w.
  const Layout hw = value_or_throw(Layout::make({Placement::Shard(2), Placement::Shard(3)}));
  PartitionOptions o;
  int windows = 0;
  for (NodeId id = 0; id < m.graph.num_nodes(); ++id) {
    const Node& n = m.graph.node(id);
    if (n.phase != Phase::kForward || (n.kind != OpKind::kConv2d && n.kind != OpKind::kMaxPool2d))
      continue;
    for (const ShardingStrategy& st : enumerate_strategies(m.graph, n, mesh))
      if (st.inputs[0] == hw && (st.inputs.size() == 1 || st.inputs[1].is_replicated())) {
        o.fixed[id] = st;
        ++windows;
      }
  }
  ASSERT_EQ(windows, 7);  // 6 convolutions (one a 1x1 shortcut) and the stem pool
  Annotation a = value_or_throw(annotate(m.graph, mesh, o));
  const LocalProgram p = value_or_throw(lower(m.graph, a, 0));
  for (const std::string axis : {"h", "w"}) {
    SCOPED_TRACE(axis);
    // The 5 convolutions wider than 1x1 and the pool grow x in the forward; in
    // the backward the convolutions' weight gradients and the pool's gradient
    // grow x again, and dx is folded back by the pool and the 4 convolutions
    // after the stem (the image needs no gradient).
    EXPECT_EQ(count(p, OpKind::kNeighborExchange, Phase::kForward, axis), 6);
    EXPECT_EQ(count(p, OpKind::kNeighborExchangeGrad, Phase::kBackward, axis), 5);
    EXPECT_EQ(count(p, OpKind::kNeighborExchange, Phase::kBackward, axis), 6);
    for (Phase ph : {Phase::kForward, Phase::kBackward})
      EXPECT_EQ(count(p, OpKind::kAllGather, ph, axis), 0);
  }
}

// Megatron tensor parallel: per block one all_reduce after the row-parallel
// attention projection and one after fc2 in the forward; in the backward one
// reduction per block half, plus one for the vocab-parallel LM head's input
// gradient; the vocab-parallel embedding's output is the one other forward all_reduce.
TEST(PartitionStructure, MegatronHasOneAllReducePerBlockHalf) {
  for (const std::string model : {"gpt", "llama"}) {
    LocalProgram p = lowered(model, "dp=2,tp=2", "megatron");
    const int layers = 2;
    EXPECT_EQ(count(p, OpKind::kAllReduce, Phase::kForward, "tp", true), 2 * layers) << model;
    // + the embedding's; + the vocab-parallel cross-entropy's three, run
    // inside its kernel and recorded (op_def.h InnerCollective).
    EXPECT_EQ(count(p, OpKind::kAllReduce, Phase::kForward, "tp"), 2 * layers + 1 + 3) << model;
    int in_kernel = 0;
    for (const CollectiveRecord& r : p.collectives)
      in_kernel += r.consumer == "loss (in its kernel)" && r.mesh_axis == "tp";
    EXPECT_EQ(in_kernel, 3) << model;
    int bwd = 0;
    for (OpKind k : {OpKind::kAllReduce, OpKind::kReduceScatter})
      bwd += count(p, k, Phase::kBackward, "tp");
    EXPECT_EQ(bwd, 2 * layers + 1) << model;
    for (Phase ph : {Phase::kForward, Phase::kBackward}) {
      EXPECT_EQ(count(p, OpKind::kAllGather, ph, "tp"), 0) << model;
      EXPECT_EQ(count(p, OpKind::kAllToAll, ph, "tp"), 0) << model;
    }
    EXPECT_EQ(count(p, OpKind::kReduceScatter, Phase::kForward, "tp"), 0) << model;
    // Data parallel: the loss in the forward; the block weights' gradients
    // reduce over dp once per step, in the optimizer phase.
    EXPECT_EQ(count(p, OpKind::kAllReduce, Phase::kForward, "dp"), 1) << "the loss";
    EXPECT_EQ(count(p, OpKind::kAllReduce, Phase::kBackward, "dp", true), 0) << model;
    EXPECT_GT(count(p, OpKind::kAllReduce, Phase::kOptimizer, "dp"), 0) << model;
  }
}

// Megatron's VocabParallelEmbedding backward: each tp rank writes the rows
// of the table gradient it holds, from the whole output gradient; nothing of
// the table's size is communicated. The reduction of the output gradient is
// deferred into the table only where the table is no bigger than two of it
// (a byte-level vocabulary); with a real one (BLOOM: 250,880 rows against
// 2,048 tokens) the table's reduce_scatter was 122 times the tokens' bytes,
// every micro-batch.
TEST(PartitionStructure, VocabParallelEmbeddingWritesItsRowsOfTheGradient) {
  auto program = [](int vocab, Annotation* annotation, bool tuple = false) {
    json par = {{"mode", "semi"}, {"mesh", "tp=2"}, {"preset", "megatron"}};
    // The lookup alone by a split tuple (the vocab rows over tp): its
    // gradient node follows it, by factor name.
    if (tuple)
      par = {{"mode", "auto"}, {"mesh", "tp=2"}, {"strategies", {{"wte", "((tp,1),(1,1))"}}}};
    RunConfig rc = run("gpt", 1, par);
    json doc = model_json("gpt");
    doc["vocab_size"] = vocab;
    rc.model = doc;
    rc.train.batch_size = 16;
    ModelGraph m = value_or_throw(build_training_graph(rc, rc.train.batch_size));
    *annotation = value_or_throw(
        annotate(m.graph, rc.parallel.mesh, partition_options(rc.parallel, rc.parallel.mesh)));
    NodeId grad = -1;
    for (NodeId id = 0; id < m.graph.num_nodes(); ++id)
      if (m.graph.node(id).kind == OpKind::kEmbeddingGrad) grad = id;
    EXPECT_GE(grad, 0);
    return std::make_pair(value_or_throw(lower(m.graph, *annotation, 0)), grad);
  };
  auto table_bytes = [](const LocalProgram& p) {  // backward bytes moving the table's gradient
    int64_t b = 0;
    for (const CollectiveRecord& r : p.collectives)
      if (r.phase == Phase::kBackward && r.value.rfind("wte.grad", 0) == 0) b += r.bytes_per_rank;
    return b;
  };
  auto backward_bytes = [](const LocalProgram& p) {
    int64_t b = 0;
    for (const CollectiveRecord& r : p.collectives)
      if (r.phase == Phase::kBackward) b += r.bytes_per_rank;
    return b;
  };
  // 256 tokens of 32 channels a micro-batch: tables of 4096 and 8192 rows.
  Annotation a4, a8;
  const auto [p4, g4] = program(4096, &a4);
  const auto [p8, g8] = program(8192, &a8);
  for (const Annotation* a : {&a4, &a8}) {
    const NodeId g = a == &a4 ? g4 : g8;
    ASSERT_GE(g, 0);
    EXPECT_EQ(a->node[g].inputs[0].to_string(), "[R]");
    EXPECT_EQ(a->node[g].outputs[0].to_string(), "[S(0)]");
  }
  EXPECT_EQ(table_bytes(p4), 0);
  EXPECT_EQ(backward_bytes(p4), backward_bytes(p8)) << "the backward does not grow with the vocab";
  Annotation at;
  const auto [pt, gt] = program(4096, &at, true);
  ASSERT_GE(gt, 0);
  EXPECT_EQ(at.node[gt].outputs[0].to_string(), "[S(0)]") << at.why[gt];
  EXPECT_EQ(table_bytes(pt), 0);
  // A byte-level vocabulary (64 rows < 256 tokens): the partial sums add
  // into the table, reduced once there.
  Annotation a64;
  const auto [p64, g64] = program(64, &a64);
  ASSERT_GE(g64, 0);
  EXPECT_TRUE(a64.node[g64].outputs[0].has_partial());
  EXPECT_GT(table_bytes(p64), 0);
}

// ... and trains equal to one device, the table split over tp.
TEST(PartitionNumeric, VocabParallelEmbeddingGradientMatchesOneDevice) {
  json par = {{"mode", "semi"}, {"mesh", "tp=2"}, {"preset", "megatron"}};
  RunConfig rc = run("gpt", 1, par);
  json doc = model_json("gpt");
  doc["vocab_size"] = 1024;
  rc.model = doc;
  rc.train.steps = 2;
  RunConfig one = rc;
  one.has_parallel = false;
  const testing::Trace single = train(one, nullptr);
  expect_same(single, train_ranks(rc, 2), "tp=2 vocab 1024");
  // The lookup split by a split tuple alone, its gradient by row shard too.
  RunConfig tuple = run(
      "gpt", 1, {{"mode", "auto"}, {"mesh", "tp=2"}, {"strategies", {{"wte", "((tp,1),(1,1))"}}}});
  tuple.model = doc;
  tuple.train.steps = 2;
  expect_same(single, train_ranks(tuple, 2), "wte ((tp,1),(1,1)) vocab 1024");
}

// Under sequence parallelism on a mesh with data axes (dp; cp, whose ranks
// hold other tokens), the embedding gradient gathers its output gradient
// over tp only (the minor axis of the sequence split), and the table comes
// out Partial over dp and cp, summed with the step's other gradients once
// per step (Megatron's embedding gradient, reduced over its dp x cp group).
// Before, the per-node price charged that sum every micro-batch, so each
// rank gathered the whole batch's gradient over dp (and the sequence over
// cp) every micro-batch and computed the table's gradient of all of it, on a
// mesh the planner (dp = 1) never priced.
TEST(PartitionStructure, EmbeddingGradientIsSummedWithTheStepsGradientsNotGatheredOverData) {
  struct Case {
    const char* model;
    const char* mesh;
    const char* preset;
  };
  for (const Case& c :
       {Case{"gpt", "dp=2,tp=2", "megatron-sp"}, Case{"llama", "dp=2,tp=2", "megatron-sp"},
        Case{"llama", "cp=2,tp=2", "ring-sp"}, Case{"gpt", "dp=2,cp=2,tp=2", "ring-sp"}}) {
    SCOPED_TRACE(std::string(c.model) + " " + c.mesh + " " + c.preset);
    RunConfig rc = run(c.model, 1, {{"mode", "semi"}, {"mesh", c.mesh}, {"preset", c.preset}});
    json doc = model_json(c.model);
    doc["vocab_size"] = 8192;  // the table far larger than the micro-batch's 128 tokens
    rc.model = doc;
    const ModelGraph m = value_or_throw(build_training_graph(rc, rc.train.batch_size));
    const Annotation a = value_or_throw(
        annotate(m.graph, rc.parallel.mesh, partition_options(rc.parallel, rc.parallel.mesh)));
    const LocalProgram p = value_or_throw(lower(m.graph, a, 0));
    NodeId grad = -1;
    for (NodeId id = 0; id < m.graph.num_nodes(); ++id)
      if (m.graph.node(id).kind == OpKind::kEmbeddingGrad) grad = id;
    ASSERT_GE(grad, 0);
    const Mesh& mesh = rc.parallel.mesh;
    const Layout& table = a.node[grad].outputs[0];
    for (int ax = 0; ax < mesh.num_axes(); ++ax) {
      if (mesh.axis_name(ax) == "tp") {
        EXPECT_TRUE(table.at(ax).is_shard() && table.at(ax).dim() == 0) << table.to_string();
      } else {
        EXPECT_TRUE(table.at(ax).is_partial()) << mesh.axis_name(ax) << ": " << table.to_string();
      }
    }
    bool reduced_once = false;
    for (const CollectiveRecord& r : p.collectives) {
      const bool for_grad = r.consumer.find("embedding_grad") != std::string::npos;
      if (r.phase == Phase::kBackward && for_grad) {
        EXPECT_EQ(r.mesh_axis, "tp") << r.value << ": " << op_name(r.kind);
      }
      // (GPT's tied table: the sum of its two gradients, "wte.grad.acc_wte.weight".)
      reduced_once |= r.phase == Phase::kOptimizer && r.mesh_axis != "tp" &&
                      (r.value.find("embedding_grad") != std::string::npos ||
                       r.value.rfind("wte.grad", 0) == 0);
    }
    EXPECT_TRUE(reduced_once);
  }
}

// The planner prices the program of one data-parallel replica (a mesh
// without dp, plan/rank_program.h); the run adds dp. What the other axes do
// must not change with it: every node's placement on tp and cp is the same
// on both meshes (a real vocabulary and a byte-level one). Before the step's
// gradient sum was priced as such, megatron-sp and ring-sp gathered the
// embedding's gradient over dp, which the planner never saw.
json propagate_section(const std::string& model);

TEST(PartitionStructure, AddingDataParallelChangesNothingOnTheOtherAxes) {
  struct Case {
    const char* model;
    const char* mesh;  // without dp; the run adds dp=2
    const char* preset;
  };
  auto annotated = [](const Case& c, const std::string& mesh, int64_t batch, int vocab) {
    json par = {{"mode", "semi"}, {"mesh", mesh}, {"preset", c.preset}};
    if (std::string(c.preset) == "propagate") {  // split tuples on some ops, the rest propagated
      par = propagate_section(c.model);
      par["mesh"] = mesh;
    }
    RunConfig rc = run(c.model, 1, par);
    json doc = model_json(c.model);
    doc["vocab_size"] = vocab;
    rc.model = doc;
    rc.train.batch_size = batch;
    const Job job = value_or_throw(resolve_job(rc, rc.parallel.mesh.num_ranks()));
    ModelGraph m = value_or_throw(build_training_graph(rc, job.micro_batch_rows, job.seq_zigzag));
    Annotation a = value_or_throw(
        annotate(m.graph, rc.parallel.mesh, partition_options(rc.parallel, rc.parallel.mesh)));
    return std::make_pair(std::move(m), std::move(a));
  };
  for (const Case& c : {Case{"gpt", "tp=2", "megatron"}, Case{"llama", "tp=2", "megatron-sp"},
                        Case{"gpt", "tp=2", "megatron-sp"}, Case{"llama", "cp=2", "ring"},
                        Case{"gpt", "cp=2", "ulysses"}, Case{"llama", "cp=2,tp=2", "ring-sp"},
                        Case{"gpt", "cp=2,tp=2", "megatron-sp"}, Case{"gpt", "tp=2", "propagate"},
                        Case{"llama", "tp=2", "propagate"}}) {
    for (int vocab : {256, 8192}) {
      SCOPED_TRACE(std::string(c.model) + " " + c.mesh + " " + c.preset + " vocab " +
                   std::to_string(vocab));
      // (Split tuples name dp: the planner's mesh has it, of size 1.)
      const bool tuples = std::string(c.preset) == "propagate";
      const auto [m1, a1] = annotated(c, (tuples ? "dp=1," : "") + std::string(c.mesh), 4, vocab);
      const auto [m2, a2] = annotated(c, std::string("dp=2,") + c.mesh, 8, vocab);
      ASSERT_EQ(m1.graph.num_nodes(), m2.graph.num_nodes());
      int differ = 0;
      auto same = [&](const Layout& x, const Layout& y) {  // on the axes of a1's mesh, by name
        for (int ax = 0; ax < a1.mesh.num_axes(); ++ax) {
          if (a1.mesh.axis_name(ax) == "dp") continue;
          const Placement p = x.at(ax);
          const Placement q = y.at(a2.mesh.axis_index(a1.mesh.axis_name(ax)));
          if (p.kind() != q.kind() || (p.is_shard() && p.dim() != q.dim())) return false;
        }
        return true;
      };
      for (NodeId id = 0; id < m1.graph.num_nodes() && differ < 3; ++id) {
        const ShardingStrategy& s1 = a1.node[id];
        const ShardingStrategy& s2 = a2.node[id];
        bool ok = s1.inputs.size() == s2.inputs.size() && s1.outputs.size() == s2.outputs.size();
        for (size_t i = 0; ok && i < s1.inputs.size(); ++i) ok = same(s1.inputs[i], s2.inputs[i]);
        for (size_t i = 0; ok && i < s1.outputs.size(); ++i)
          ok = same(s1.outputs[i], s2.outputs[i]);
        if (!ok) {
          ++differ;
          ADD_FAILURE() << node_label(m1.graph.node(id)) << ": " << a1.why[id] << " vs "
                        << a2.why[id] << " with dp";
        }
      }
    }
  }
}

// ... and trains equal to one device.
TEST(PartitionNumeric, EmbeddingGradientSummedOverDataAxesMatchesOneDevice) {
  for (const std::string model : {"gpt", "llama"}) {
    for (const auto& [mesh, preset] :
         {std::pair{"dp=2,tp=2", "megatron-sp"}, std::pair{"dp=2,cp=2,tp=2", "ring-sp"}}) {
      RunConfig rc = run(model, 2, {{"mode", "semi"}, {"mesh", mesh}, {"preset", preset}});
      json doc = model_json(model);
      doc["vocab_size"] = 1024;
      rc.model = doc;
      rc.train.steps = 2;
      RunConfig one = rc;
      one.has_parallel = false;
      expect_same(train(one, nullptr), train_ranks(rc, rc.parallel.mesh.num_ranks()),
                  model + " " + mesh + " " + preset + " vocab 1024");
    }
  }
}

// Megatron TP + SP: in every block, all_gather before the column-parallel
// matmuls and reduce_scatter after the row-parallel ones; no activation
// all_reduce on tp anywhere.
TEST(PartitionStructure, SequenceParallelUsesGatherAndReduceScatter) {
  for (const std::string model : {"gpt", "llama"}) {
    LocalProgram p = lowered(model, "tp=2", "megatron-sp");
    const int layers = 2;
    EXPECT_EQ(count(p, OpKind::kAllGather, Phase::kForward, "tp", true), 2 * layers) << model;
    EXPECT_EQ(count(p, OpKind::kReduceScatter, Phase::kForward, "tp", true), 2 * layers) << model;
    EXPECT_EQ(count(p, OpKind::kReduceScatter, Phase::kBackward, "tp", true), 2 * layers) << model;
    for (const CollectiveRecord& r : p.collectives) {
      const bool in_kernel = r.consumer.find("(in its kernel)") != std::string::npos;
      if (r.kind == OpKind::kAllReduce && r.phase != Phase::kOptimizer && !in_kernel) {
        EXPECT_TRUE(r.bytes_per_rank <= 8) << model << ": " << r.value << " for " << r.consumer;
      }
    }
    // The norm weights' gradients reduce over the sequence shards (tp) by reshard.
    bool norm = false;
    for (const CollectiveRecord& r : p.collectives)
      norm |=
          r.kind == OpKind::kAllReduce && r.phase == Phase::kOptimizer && r.mesh_axis == "tp" &&
          (r.value.find("norm") != std::string::npos || r.value.find("ln_") != std::string::npos);
    EXPECT_TRUE(norm) << model;
  }
}

// Megatron-SP's embedding backward is Megatron's VocabParallelEmbedding's:
// the sequence-split gradient is all_gathered and each rank writes the rows
// of its vocabulary shard. Before, the dim-name rules kept the gradient
// split over seq (as the rules want it) and the table came out Partial, so
// each micro-batch reduce_scattered a whole [vocab, C] table over tp (at
// 530B, 10.7 ms a micro-batch against 0.9 ms for the gather).
TEST(PartitionStructure, SequenceParallelEmbeddingGradientIsVocabParallel) {
  for (const std::string model : {"gpt", "llama"}) {
    // A vocabulary far larger than the micro-batch's 128 tokens, as a real
    // one is (the table, not the links' latency, decides).
    json mj = model_json(model);
    mj["vocab_size"] = 8192;
    const LocalProgram p = lowered_megatron_sp(mj, 8, 16);
    bool gathered = false;
    for (const CollectiveRecord& r : p.collectives) {
      if (r.phase != Phase::kBackward) continue;
      const bool for_table = r.value.find("embedding_grad") != std::string::npos;
      EXPECT_FALSE(for_table && r.kind == OpKind::kReduceScatter) << model << ": " << r.value;
      gathered |= r.kind == OpKind::kAllGather && r.mesh_axis == "tp" &&
                  r.consumer.find("embedding_grad") != std::string::npos && r.value != "tokens" &&
                  r.value != "input_ids";
    }
    EXPECT_TRUE(gathered) << model;
  }
}

// Megatron-SP with many tokens and small weights: the q, k and v
// projections still run column-parallel from ONE all_gather of the normed
// activation that all three read. Before the partitioner shared that
// gather's cost among them, each (priced alone, the gather whole) chose to
// gather its weight instead and all_to_all its output to head shards.
TEST(PartitionStructure, SequenceParallelGathersTheActivationOnceForQkv) {
  for (const std::string model : {"gpt", "llama"}) {
    // Hidden 256 and 2048 tokens (gpt_bytes_small's shape): a q weight
    // is 1/8 of the activation, so gathering one weight and moving one
    // output looks cheaper than the activation's gather to each projection alone.
    json mj = model_json(model);
    mj[model == "gpt" ? "n_embd" : "hidden_size"] = 256;
    if (model == "llama") mj["intermediate_size"] = 512;
    mj[model == "gpt" ? "n_positions" : "max_position_embeddings"] = 128;
    const LocalProgram p = lowered_megatron_sp(mj, 16, 128);
    const int layers = 2;
    EXPECT_EQ(count(p, OpKind::kAllToAll, Phase::kForward, "tp"), 0) << model;
    EXPECT_EQ(count(p, OpKind::kAllGather, Phase::kForward, "tp", true), 2 * layers) << model;
    for (const CollectiveRecord& r : p.collectives) {
      const bool block = r.value.rfind("h.", 0) == 0 || r.value.rfind("model.layers.", 0) == 0;
      if (block && r.phase == Phase::kForward && r.kind == OpKind::kAllGather) {
        EXPECT_EQ(r.value.find("weight"), std::string::npos) << model << ": " << r.value;
      }
    }
  }
}

// Ulysses: q, k, v go from sequence shards to head shards and the output back.
TEST(PartitionStructure, UlyssesUsesAllToAll) {
  LocalProgram p = lowered("llama", "cp=2", "ulysses");
  EXPECT_EQ(count(p, OpKind::kAllToAll, Phase::kForward, "cp"), 4 * 2);
  EXPECT_EQ(count(p, OpKind::kAllGather, Phase::kForward, "cp"), 0);
}

// Ring attention: attention stays on sequence shards; no all_to_all, no
// all_gather over cp in the forward; each attention records its ring's
// k/v shifts (cp - 1 forward; cp - 1 k/v plus cp dk/dv backward) as inner
// collectives, which `meshflow explain` lists.
TEST(PartitionStructure, RingKeepsSequenceShardsAndRecordsItsShifts) {
  for (const char* mesh : {"cp=2", "cp=4", "tp=2,cp=2"}) {
    SCOPED_TRACE(mesh);
    LocalProgram p = lowered("llama", mesh, "ring");
    const int cp = std::string(mesh).find("cp=4") != std::string::npos ? 4 : 2;
    EXPECT_EQ(count(p, OpKind::kAllToAll, Phase::kForward, "cp"), 0);
    EXPECT_EQ(count(p, OpKind::kAllGather, Phase::kForward, "cp", true), 0);
    int rings = 0;
    for (const Node& n : p.graph.nodes())
      if (n.kind == OpKind::kAttention || n.kind == OpKind::kAttentionGrad) {
        EXPECT_GE(n.attrs.mesh_axis, 0) << n.name;
        EXPECT_EQ(n.attrs.group_size, cp) << n.name;
        ++rings;
      }
    EXPECT_EQ(rings, 2 * 2);  // two layers, forward and backward
    int fwd = 0, bwd = 0;
    for (const CollectiveRecord& r : p.collectives)
      if (r.kind == OpKind::kNeighborExchange && r.mesh_axis == "cp" &&
          r.value.find("ring") != std::string::npos) {
        (r.phase == Phase::kForward ? fwd : bwd) += 1;
        // The k/v block of one rank: 2 x [batch 8, kv_heads 2 (/tp), seq 16/cp, head_dim 8] f32.
        const int64_t tp = std::string(mesh).find("tp=2") != std::string::npos ? 2 : 1;
        EXPECT_EQ(r.bytes_per_rank, 2 * 8 * (2 / tp) * (16 / cp) * 8 * 4) << r.value;
      }
    EXPECT_EQ(fwd, 2 * (cp - 1));
    EXPECT_EQ(bwd, 2 * (2 * cp - 1));
  }
}

// Ring attention beside Megatron-SP (preset "ring-sp", Megatron-Core's
// --sequence-parallel with --cp-comm-type p2p): the norms run on seq / (cp x
// tp) rows, sp's all_gather and reduce_scatter over tp frame each block
// half, attention rings over cp on its tp share of the heads, and nothing
// goes all_to_all. Megatron-SP with cp (Ulysses' all_to_all for attention)
// splits the norms the same way: before, its rule {seq: "cp*tp"} named no
// axis of the mesh and was dropped, so the sequence stayed whole outside
// attention (each cp rank ran the whole MLP) and sp was lost.
TEST(PartitionStructure, SequenceParallelBesideContextParallelSplitsTheNorms) {
  for (const char* preset : {"ring-sp", "megatron-sp"}) {
    SCOPED_TRACE(preset);
    const bool ring = std::string(preset) == "ring-sp";
    const LocalProgram p = lowered("gpt", "tp=2,cp=2", preset);
    const int layers = 2;
    int norms = 0;
    for (const Node& n : p.graph.nodes()) {
      if (n.phase != Phase::kForward || n.kind != OpKind::kLayerNorm || n.name.rfind("h.", 0) != 0)
        continue;
      const Shape& x = p.graph.shape(n.inputs[0]);
      for (int d = 0; d < x.rank(); ++d)
        if (x.name(d) == "seq") {
          EXPECT_EQ(x.size(d), 16 / 4) << n.name;
        }
      ++norms;
    }
    EXPECT_EQ(norms, 2 * layers);
    EXPECT_EQ(count(p, OpKind::kAllGather, Phase::kForward, "tp", true), 2 * layers);
    EXPECT_EQ(count(p, OpKind::kReduceScatter, Phase::kForward, "tp", true), 2 * layers);
    EXPECT_EQ(count(p, OpKind::kAllToAll, Phase::kForward, "cp"), ring ? 0 : 4 * layers);
    int rings = 0;
    for (const Node& n : p.graph.nodes())
      rings += (n.kind == OpKind::kAttention || n.kind == OpKind::kAttentionGrad) &&
               n.attrs.mesh_axis >= 0 && n.attrs.group_size == 2;
    EXPECT_EQ(rings, ring ? 2 * layers : 0);
  }
}

// A named-dim rule may list alternatives, the first that applies winning:
// {heads: tp, seq: "cp*tp|cp"} splits seq over cp*tp where no heads dim took
// tp, over cp alone where one did.
TEST(PartitionRules, AlternativesFallBackWhenAnAxisIsTaken) {
  const Mesh mesh = value_or_throw(Mesh::parse("tp=2,cp=2"));
  DimRules r = value_or_throw(DimRules::parse("heads: tp, seq: cp*tp|cp"));
  ASSERT_TRUE(r.check(mesh).is_ok());
  const Layout flat = value_or_throw(apply_rules(r, mesh, Shape({{"seq", 8}, {"hidden", 4}})));
  EXPECT_EQ(flat.at(0), Placement::Shard(0, 1));  // tp: the minor half of seq
  EXPECT_EQ(flat.at(1), Placement::Shard(0, 0));  // cp: the major
  const Layout heads =
      value_or_throw(apply_rules(r, mesh, Shape({{"heads", 4}, {"seq", 8}, {"d", 2}})));
  EXPECT_TRUE(heads.at(0).is_shard() && heads.at(0).dim() == 0);  // heads on tp
  EXPECT_TRUE(heads.at(1).is_shard() && heads.at(1).dim() == 1);  // seq on cp
  EXPECT_NE(DimRules::parse("seq: cp*xx|cp")
                .value()
                .check(mesh)
                .message()
                .find("'xx' is not an axis of the mesh"),
            std::string::npos);
  EXPECT_NE(DimRules::parse("seq: tp|").value().check(mesh).message().find("empty axis name"),
            std::string::npos);
}

// ---- sharding propagation (issue 6 §3) ----

// Only the embedding lookup and the matmuls of each block are configured
// (MindSpore's principles: weights, dimension-changing and boundary ops);
// every other op, the whole backward and the optimizer get the strategy with
// the least reshard cost. The forward and backward collectives are the
// Megatron preset's, and training matches one device.
json propagate_section(const std::string& model) {
  const std::string in = "(dp, 1, 1)", heads_in = "(dp, 1, tp, 1)";
  json st;
  if (model == "gpt") {
    st = {{"wte", "((1, 1), (dp, 1))"},
          {"h.*.attn.q_proj", "(" + in + ", (1, tp, 1))"},
          {"h.*.attn.k_proj", "(" + in + ", (1, tp, 1))"},
          {"h.*.attn.v_proj", "(" + in + ", (1, tp, 1))"},
          {"h.*.attn.c_proj", "(" + heads_in + ", (tp, 1, 1))"},
          {"h.*.mlp.c_fc", "(" + in + ", (1, tp))"},
          {"h.*.mlp.c_proj", "((dp, 1, tp), (tp, 1))"}};
  } else {
    const std::string l = "model.layers.*.";
    st = {{"model.embed_tokens", "((1, 1), (dp, 1))"},
          {l + "self_attn.q_proj", "(" + in + ", (1, tp, 1))"},
          {l + "self_attn.k_proj", "(" + in + ", (1, tp, 1))"},
          {l + "self_attn.v_proj", "(" + in + ", (1, tp, 1))"},
          {l + "self_attn.o_proj", "(" + heads_in + ", (tp, 1, 1))"},
          {l + "mlp.gate_proj", "(" + in + ", (1, tp))"},
          {l + "mlp.up_proj", "(" + in + ", (1, tp))"},
          {l + "mlp.down_proj", "((dp, 1, tp), (tp, 1))"}};
  }
  return {{"mode", "auto"}, {"search", "propagate"}, {"mesh", "dp=2,tp=2"}, {"strategies", st}};
}

std::multiset<std::string> fwd_bwd_collectives(const LocalProgram& p) {
  std::multiset<std::string> s;
  for (const CollectiveRecord& r : p.collectives)
    if (r.phase == Phase::kForward || r.phase == Phase::kBackward)
      s.insert(std::string(op_name(r.kind)) + "(" + r.mesh_axis + ") " + r.value + " " +
               r.before.to_string() + "->" + r.after.to_string());
  return s;
}

TEST(PartitionPropagation, MatmulStrategiesAloneReproduceMegatron) {
  for (const std::string model : {"gpt", "llama"}) {
    RunConfig rc = run(model, 1, propagate_section(model));
    ModelGraph m = value_or_throw(build_training_graph(rc, rc.train.batch_size));
    const PartitionOptions o = partition_options(rc.parallel, rc.parallel.mesh);
    Annotation a = value_or_throw(annotate(m.graph, rc.parallel.mesh, o));
    // Derived, not configured: propagated, deferred, the gradients' dual of a
    // configured matmul, the optimizer's reads.
    int propagated = 0;
    for (StrategySource s : a.source)
      propagated += s == StrategySource::kPropagated || s == StrategySource::kDeferredReduction ||
                    s == StrategySource::kUserGradient || s == StrategySource::kUpdateReads;
    EXPECT_GT(propagated, m.graph.num_nodes() / 2) << model;
    const LocalProgram p = value_or_throw(lower(m.graph, a, 0));
    // The preset's block plan: Megatron's rules without the vocab-parallel
    // embedding and head (those are not blocks; not configured here).
    json par = {{"mode", "semi"},
                {"mesh", "dp=2,tp=2"},
                {"rules", {{"batch", "dp"}, {"heads", "tp"}, {"kv_heads", "tp"}, {"ffn", "tp"}}}};
    RunConfig rr = run(model, 1, par);
    const PartitionOptions ro = partition_options(rr.parallel, rr.parallel.mesh);
    const LocalProgram megatron =
        value_or_throw(lower(m.graph, value_or_throw(annotate(m.graph, rr.parallel.mesh, ro)), 0));
    EXPECT_EQ(fwd_bwd_collectives(p), fwd_bwd_collectives(megatron)) << model;
    const Trace single = train(run(model, 1, nullptr), nullptr);
    expect_same(single, train_ranks(rc, 4), model + " propagated");
  }
}

// ---- ZeRO: model-state memory per rank, measured ----

// f32 AdamW: 4 B params + 4 B grads + 8 B moments = 16 B/param. With one
// micro-batch the gradients live in the arena (not persistent), so the
// measured persistent state is params + optimizer: ZeRO-0 12, ZeRO-1/2 4+8/N,
// ZeRO-3 12/N bytes per parameter (up to the parameters whose dims don't split).
TEST(PartitionZero, OptimizerAndParameterBytesShrinkByTheTextbookFractions) {
  const int n = 4;
  auto bytes = [&](int zero) {
    json par = {{"mode", "semi"}, {"mesh", "dp=4"}, {"preset", "dp"}, {"zero", zero}};
    RunConfig rc = run("llama", 2, par);
    rc.train.steps = 1;
    return train_ranks(rc, n)[1].memory;
  };
  const MemoryStats z0 = bytes(0), z1 = bytes(1), z2 = bytes(2), z3 = bytes(3);
  const double P = static_cast<double>(z0.params) / 4;  // parameters
  std::printf("bytes/param  params  grads  optimizer  (N=%d)\n", n);
  for (auto [name, m] : {std::pair{"zero0", z0}, {"zero1", z1}, {"zero2", z2}, {"zero3", z3}})
    std::printf("%-6s       %6.2f  %5.2f  %9.2f\n", name, m.params / P, m.grads / P,
                m.optimizer / P);
  EXPECT_NEAR(z0.optimizer / P, 8.0, 0.05);
  EXPECT_NEAR(z1.optimizer / P, 8.0 / n, 0.05);
  EXPECT_NEAR(z1.params / P, 4.0, 0.01);
  // ZeRO-2: the gradient accumulators (2 micro-batches) hold shards.
  EXPECT_NEAR(z0.grads / P, 4.0, 0.05);
  EXPECT_NEAR(z1.grads / P, 4.0, 0.05);
  EXPECT_NEAR(z2.grads / P, 4.0 / n, 0.05);
  EXPECT_NEAR(z3.params / P, 4.0 / n, 0.05);
  EXPECT_NEAR(z3.optimizer / P, 8.0 / n, 0.05);
  // The textbook totals (params + grads + moments, f32 Adam).
  auto total = [&](const MemoryStats& m) { return (m.params + m.grads + m.optimizer) / P; };
  EXPECT_NEAR(total(z0), 16.0, 0.1);
  EXPECT_NEAR(total(z1), 8.0 + 8.0 / n, 0.1);
  EXPECT_NEAR(total(z2), 4.0 + 12.0 / n, 0.1);
  EXPECT_NEAR(total(z3), 16.0 / n, 0.1);
}

// Hierarchical ZeRO (HSDP, ZeRO++'s hpZ): the batch is split over rep x dp (4
// data-parallel ranks) but the optimizer state and parameters only over dp (a
// shard group of 2): gradients reduce-scatter over dp and all-reduce over rep.
TEST(PartitionZero, HierarchicalShardGroupSmallerThanDataParallel) {
  const Trace single = train(run("llama", 2, nullptr), nullptr);
  for (int zero : {1, 3}) {
    json par = {
        {"mode", "semi"}, {"mesh", "rep=2,dp=2"}, {"rules", {{"batch", "rep*dp"}}}, {"zero", zero}};
    RunConfig rc = run("llama", 2, par);
    const std::vector<Trace> ranks = train_ranks(rc, 4);
    expect_same(single, ranks, "hierarchical zero " + std::to_string(zero));
    const double P = static_cast<double>(single.memory.params) / 4;
    EXPECT_NEAR(ranks[3].memory.optimizer / P, 8.0 / 2, 0.05) << "zero " << zero;
    if (zero == 3) {
      EXPECT_NEAR(ranks[3].memory.params / P, 4.0 / 2, 0.05);
    }
  }
  // And the program: gradients reduce over rep, shard over dp.
  json par = {
      {"mode", "semi"}, {"mesh", "rep=2,dp=2"}, {"rules", {{"batch", "rep*dp"}}}, {"zero", 2}};
  RunConfig rc = run("llama", 1, par);
  ModelGraph m = value_or_throw(build_training_graph(rc, rc.train.batch_size));
  const PartitionOptions o = partition_options(rc.parallel, rc.parallel.mesh);
  const LocalProgram p =
      value_or_throw(lower(m.graph, value_or_throw(annotate(m.graph, rc.parallel.mesh, o)), 0));
  EXPECT_GT(count(p, OpKind::kReduceScatter, Phase::kBackward, "dp"), 0);
  EXPECT_GT(count(p, OpKind::kAllReduce, Phase::kBackward, "rep") +
                count(p, OpKind::kAllReduce, Phase::kOptimizer, "rep"),
            0);
}

// ---- a mesh axis of size 1 splits nothing ----

// {dp: 3, tp: 1} with the Megatron rules trains like one device (it crashed:
// the vocab "split" over tp=1 sent the cross-entropy down its vocab-parallel
// path without a shard offset); so do a size-1 axis between others and the
// propagation of mode auto.
TEST(PartitionSizeOneAxis, TrainsLikeOneDevice) {
  struct Case {
    std::string mesh, preset;
    int batch;
  };
  for (const Case& c : {Case{"dp=3,tp=1", "megatron", 6}, Case{"dp=2,tp=1,cp=1", "megatron-sp", 8},
                        Case{"dp=1,tp=2", "megatron", 8}}) {
    RunConfig one = run("gpt", 1, nullptr);
    one.train.batch_size = c.batch;
    RunConfig rc = run("gpt", 1, {{"mode", "semi"}, {"mesh", c.mesh}, {"preset", c.preset}});
    rc.train.batch_size = c.batch;
    expect_same(train(one, nullptr), train_ranks(rc, rc.parallel.mesh.num_ranks()),
                c.mesh + " " + c.preset);
  }
  // Mode auto: the configured matmuls name tp (size 1).
  json par = propagate_section("gpt");
  par["mesh"] = "dp=2,tp=1";
  RunConfig rc = run("gpt", 1, par);
  expect_same(train(run("gpt", 1, nullptr), nullptr), train_ranks(rc, 2), "auto dp=2,tp=1");
}

// The crash's configuration itself, through the C++ API (a config refuses a
// dp the batch does not divide): rows whole, the vocabulary named for tp=1.
// No layout places anything on the size-1 axis, and it trains like one device.
TEST(PartitionSizeOneAxis, NothingIsPlacedOnASizeOneAxis) {
  RunConfig rc = run("gpt", 1, {{"mode", "semi"}, {"mesh", "dp=3,tp=1"}});
  PartitionOptions o;
  o.rules = value_or_throw(DimRules::parse("heads: tp, ffn: tp, vocab: tp"));
  o.strategies = {{"h.*.mlp.c_fc", "((1, 1, 1), (1, tp))"}};
  ModelGraph m = value_or_throw(build_training_graph(rc, rc.train.batch_size));
  const Mesh& mesh = rc.parallel.mesh;
  const Annotation a = value_or_throw(annotate(m.graph, mesh, o));
  const int tp = mesh.axis_index("tp");
  for (NodeId id = 0; id < m.graph.num_nodes(); ++id)
    for (const auto* ls : {&a.node[id].inputs, &a.node[id].outputs})
      for (const Layout& l : *ls)
        EXPECT_TRUE(l.at(tp).is_replicate())
            << node_label(m.graph.node(id)) << ": " << l.to_string();
  const LocalProgram p = value_or_throw(lower(m.graph, a, 1));
  EXPECT_TRUE(p.collectives.empty() ||
              std::all_of(p.collectives.begin(), p.collectives.end(),
                          [](const CollectiveRecord& r) { return r.mesh_axis != "tp"; }));
  expect_same(train(run("gpt", 1, nullptr), nullptr), train_ranks(rc, 3, &o), "dp=3,tp=1 api");
}

// ---- split tuples mean what they mean in MindSpore ----

// Megatron's MLP by split tuples alone on a dp x tp mesh (docs/config.md):
// column-parallel fc1, row-parallel fc2.
json mlp_split_tuples(bool with_rules) {
  json par = {
      {"mode", "semi"},
      {"mesh", "dp=2,tp=2"},
      {"strategies",
       {{"h.*.mlp.c_fc", "((dp, 1, 1), (1, tp))"}, {"h.*.mlp.c_proj", "((dp, 1, tp), (tp, 1))"}}}};
  if (with_rules) par["rules"] = {{"batch", "dp"}};
  return par;
}

const Layout& produced(const ModelGraph& m, const Annotation& a, const std::string& value) {
  const ValueId v = m.graph.find(value);
  EXPECT_NE(v, kNoValue) << value;
  return a.produced(m.graph, v);
}

const ShardingStrategy& strategy_of(const ModelGraph& m, const Annotation& a,
                                    const std::string& node) {
  for (NodeId id = 0; id < m.graph.num_nodes(); ++id)
    if (m.graph.node(id).name == node) return a.node[id];
  ADD_FAILURE() << "no node " << node;
  return a.node[0];
}

// The weights are stored split where the matmuls read them, and so are their
// optimizer state; the gradient matmuls run the dual strategies (the weight's
// gradient in the weight's layout, Partial over dp; fc1's input gradient
// Partial over tp); no all_gather of the ffn-wide activation; per block one
// all_reduce over tp in the forward and one in the backward.
TEST(PartitionUserStrategies, WeightsAreStoredAndUpdatedWhereTheOpReadsThem) {
  for (bool with_rules : {true, false}) {
    SCOPED_TRACE(with_rules ? "rules {batch: dp}" : "no rules");
    RunConfig rc = run("gpt", 1, mlp_split_tuples(with_rules));
    ModelGraph m = value_or_throw(build_training_graph(rc, rc.train.batch_size));
    const Mesh& mesh = rc.parallel.mesh;
    const Annotation a =
        value_or_throw(annotate(m.graph, mesh, partition_options(rc.parallel, mesh)));
    const Layout col = value_or_throw(Layout::parse("[R, S(1)]"));  // [hidden, ffn/tp]
    const Layout row = value_or_throw(Layout::parse("[R, S(0)]"));  // [ffn/tp, hidden]
    for (int l = 0; l < 2; ++l) {
      const std::string h = "h." + std::to_string(l) + ".mlp.";
      EXPECT_EQ(produced(m, a, h + "c_fc.weight"), col);
      EXPECT_EQ(produced(m, a, h + "c_proj.weight"), row);
      EXPECT_EQ(produced(m, a, h + "c_fc.weight.momentum"), col);
      EXPECT_EQ(produced(m, a, h + "c_proj.weight.momentum"), row);
      EXPECT_EQ(strategy_of(m, a, h + "c_fc.grad.db").outputs[0].to_string(), "[P, S(1)]");
      EXPECT_EQ(strategy_of(m, a, h + "c_fc.grad.da").outputs[0].to_string(), "[S(0), P]");
      EXPECT_EQ(strategy_of(m, a, h + "c_proj.grad.db").outputs[0].to_string(), "[P, S(0)]");
      EXPECT_EQ(strategy_of(m, a, h + "c_proj.grad.da").outputs[0].to_string(), "[S(0), S(2)]");
    }
    const LocalProgram p = value_or_throw(lower(m.graph, a, 0));
    // (Without rules the rest of the model keeps the batch whole: the MLP's
    // output is gathered over dp, as asked.)
    for (const CollectiveRecord& r : p.collectives) {
      if (r.phase != Phase::kOptimizer && (with_rules || r.mesh_axis == "tp")) {
        EXPECT_NE(r.kind, OpKind::kAllGather) << r.value << " for " << r.consumer;
      }
    }
    EXPECT_EQ(count(p, OpKind::kAllReduce, Phase::kForward, "tp"), 2);
    EXPECT_EQ(count(p, OpKind::kAllReduce, Phase::kBackward, "tp") +
                  count(p, OpKind::kReduceScatter, Phase::kBackward, "tp"),
              2);
    // Each rank holds half the weight: [hidden, ffn / 2].
    const ValueId w = p.graph.find("h.0.mlp.c_fc.weight");
    ASSERT_NE(w, kNoValue);
    EXPECT_EQ(p.graph.shape(w).size(1), 64);
  }
}

TEST(PartitionUserStrategies, TrainLikeOneDevice) {
  const Trace single = train(run("gpt", 1, nullptr), nullptr);
  for (bool with_rules : {true, false})
    expect_same(single, train_ranks(run("gpt", 1, mlp_split_tuples(with_rules)), 4),
                with_rules ? "split tuples + rules" : "split tuples");
  json par = mlp_split_tuples(true);
  par["zero"] = 1;
  expect_same(single, train_ranks(run("gpt", 1, par), 4), "split tuples + zero 1");
}

// The tied embedding read one way by the lookup and another by the LM head:
// the first configuration wins (both exact names), explain says why, the other
// reads it through a reshard, and it trains like one device.
TEST(PartitionUserStrategies, ConflictingConsumersFirstMostSpecificWins) {
  json par = {
      {"mode", "semi"},
      {"mesh", "dp=2,tp=2"},
      {"rules", {{"batch", "dp"}}},
      {"strategies", {{"wte", "((tp, 1), (1, 1))"}, {"lm_head", "((dp, 1, tp), (1, tp))"}}}};
  RunConfig rc = run("gpt", 1, par);
  ModelGraph m = value_or_throw(build_training_graph(rc, rc.train.batch_size));
  const Mesh& mesh = rc.parallel.mesh;
  const Annotation a =
      value_or_throw(annotate(m.graph, mesh, partition_options(rc.parallel, mesh)));
  EXPECT_EQ(produced(m, a, "wte.weight").to_string(), "[R, S(0)]");
  const std::string& why = a.why[m.graph.value(m.graph.find("wte.weight")).producer];
  EXPECT_NE(why.find("stored as wte reads it"), std::string::npos) << why;
  EXPECT_NE(why.find("lm_head reads [R, S(1)]"), std::string::npos) << why;
  // A more specific pattern beats a broader one on the same node.
  json glob = mlp_split_tuples(true);
  glob["strategies"]["h.0.mlp.c_fc"] = "((dp, 1, tp), (tp, 1))";
  RunConfig rg = run("gpt", 1, glob);
  const Annotation ag =
      value_or_throw(annotate(m.graph, mesh, partition_options(rg.parallel, mesh)));
  EXPECT_EQ(produced(m, ag, "h.0.mlp.c_fc.weight").to_string(), "[R, S(0)]");
  EXPECT_EQ(produced(m, ag, "h.1.mlp.c_fc.weight").to_string(), "[R, S(1)]");
  expect_same(train(run("gpt", 1, nullptr), nullptr), train_ranks(rc, 4), "tied, two readings");
}

// ---- ZeRO-1/2 move no more bytes than data parallel ----

// Bytes each rank sends per step (explain's totals), all phases of a training step.
int64_t step_bytes(const LocalProgram& p, int micro_batches) {
  int64_t b = 0;
  for (const CollectiveRecord& r : p.collectives)
    b += r.bytes_per_rank * runs_per_step(r, micro_batches);
  return b;
}

// With global-norm clipping on: the gradient is reduce-scattered and the
// updated weight all-gathered (one all_reduce's bytes), and the norm costs one
// scalar all_reduce, not one per parameter; with tensor parallel, one per axis.
TEST(PartitionZero, ClippingAddsOneScalarAllReduce) {
  for (const std::string model : {"gpt", "llama"}) {
    const LocalProgram z0 = lowered(model, "dp=4", "dp", 0);
    const int64_t dp_bytes = step_bytes(z0, 1);
    for (int zero : {1, 2}) {
      const LocalProgram z = lowered(model, "dp=4", "dp", zero);
      EXPECT_LE(step_bytes(z, 1), dp_bytes + 8) << model << " zero " << zero;
      EXPECT_EQ(count(z, OpKind::kAllReduce, Phase::kOptimizer, "dp"), 1)
          << model << " zero " << zero;
    }
    for (int zero : {0, 1}) {
      const LocalProgram p = lowered(model, "dp=2,tp=2", "megatron", zero);
      int scalars = 0;
      for (const CollectiveRecord& r : p.collectives)
        scalars += r.kind == OpKind::kAllReduce && r.consumer == "optim.clip";
      EXPECT_EQ(scalars, zero == 0 ? 1 : 2) << model << " megatron zero " << zero;
    }
  }
  const Trace single = train(run("llama", 1, nullptr), nullptr);
  for (int zero : {1, 2}) {
    json par = {{"mode", "semi"}, {"mesh", "dp=2,tp=2"}, {"preset", "megatron"}, {"zero", zero}};
    expect_same(single, train_ranks(run("llama", 1, par), 4),
                "megatron zero " + std::to_string(zero));
  }
}

// Collective spans of a Chrome trace, by op name, for one rank (pid).
std::map<std::string, int> traced_collectives(const std::string& trace_json, int pid) {
  std::map<std::string, int> n;
  const json doc = json::parse(trace_json);
  for (const json& e : doc.at("traceEvents")) {
    if (e.value("cat", "") != "collective" || e.value("pid", -1) != pid) continue;
    const std::string name = e.value("name", "");
    const std::string kind = name.substr(0, name.find(' '));
    for (const char* k : {"all_gather", "reduce_scatter", "all_reduce", "all_to_all"})
      if (kind == k) ++n[kind];
  }
  return n;
}

// What explain says one step runs is what the trainer runs: ZeRO-2 with two
// micro-batches reduce-scatters in every backward, gathers once per step, and
// the metric's reduction is not part of a training step.
TEST(PartitionZero, ExplainCountsWhatTheTraceRecords) {
  json par = {{"mode", "semi"}, {"mesh", "dp=2"}, {"preset", "dp"}, {"zero", 2}};
  RunConfig rc = run("gpt", 2, par);
  rc.train.steps = 1;
  std::vector<std::string> traces(2);
  std::vector<std::map<std::string, int>> expected(2);
  Status s = run_local_ranks(2, [&](const std::shared_ptr<Transport>& t) -> Status {
    auto trainer = value_or_throw(Trainer::create(rc, Communicator::world(t)));
    TraceWriter tw;
    trainer->set_trace(&tw);
    trainer->step();
    traces[t->rank()] = tw.to_json();
    for (const CollectiveRecord& r : trainer->program()->collectives)
      expected[t->rank()][std::string(op_name(r.kind))] += runs_per_step(r, 2);
    return Status::ok();
  });
  ASSERT_TRUE(s.is_ok()) << s.message();
  for (int r = 0; r < 2; ++r) {
    for (auto it = expected[r].begin(); it != expected[r].end();)
      it = it->second == 0 ? expected[r].erase(it) : std::next(it);
    EXPECT_EQ(traced_collectives(traces[r], r), expected[r]) << "rank " << r;
  }
  EXPECT_GT(expected[0]["reduce_scatter"], 0);
  // The CLI: explain's "per step" lines against `train --trace` of the same config.
  const std::string dir = ::testing::TempDir();
  const std::string cfg = dir + "/zero2_m2.json";
  json doc = {{"model", model_json("gpt")},
              {"data", {{"dataset", "fortunes"}}},
              {"train",
               {{"steps", 1},
                {"batch_size", 8},
                {"micro_batches", 2},
                {"seq_len", 16},
                {"threads", 1},
                {"eval_batches", 1}}},
              {"optimizer", {{"type", "adamw"}, {"lr", 1e-3}, {"grad_clip", 1.0}}},
              {"parallel", par}};
  std::ofstream(cfg) << doc.dump();
  const testing::CliRun ex = testing::run_cli("explain " + cfg + " --no-nodes");
  ASSERT_EQ(ex.code, 0) << ex.output;
  const testing::CliRun tr = testing::run_cli("train " + cfg + " --ranks 2 --quiet --trace " + dir +
                                              "/zero2_m2.trace.json");
  ASSERT_EQ(tr.code, 0) << tr.output;
  std::ifstream in(dir + "/zero2_m2.trace.json");
  const std::string trace((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::map<std::string, int> from_explain;
  bool totals = false;
  std::istringstream lines(ex.output);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("per step", 0) == 0) totals = true;
    char phase[32], kind[32];
    int n = 0, reps = 0;
    if (totals && std::sscanf(line.c_str(), " %31s %31s %d x %d", phase, kind, &n, &reps) == 4 &&
        n * reps > 0)
      from_explain[kind] += n * reps;
  }
  EXPECT_EQ(traced_collectives(trace, 0), from_explain) << ex.output;
}

}  // namespace
}  // namespace meshflow

namespace meshflow {
namespace {

// A small ResNet on Fashion-MNIST: data parallel (synchronized batch norm),
// channel parallel inside the residual layers ({mid: tp}: the first conv by
// output channels, the last by input channels), and both on 4 ranks equal
// one device: losses, evaluation on the running statistics, and weights.
// (Also the check that caught oneDNN's shared scratchpad when in-process
// ranks run the same cached convolution at once.)
TEST(PartitionResNet, DataChannelAndBothEqualOneDevice) {
  const json model = {{"model_type", "resnet"},   {"num_channels", 1}, {"embedding_size", 32},
                      {"hidden_sizes", {32, 64}}, {"depths", {1, 1}},  {"layer_type", "basic"},
                      {"num_labels", 10},         {"image_size", 28}};
  auto rc_for = [&](const json& parallel) {
    json doc = {{"model", model},
                {"data", {{"dataset", "fashion_mnist"}}},
                {"train", {{"steps", 2}, {"batch_size", 32}, {"threads", 1}, {"eval_batches", 1}}},
                {"optimizer", {{"type", "sgd"}, {"lr", 0.05}, {"momentum", 0.9}}}};
    if (!parallel.is_null()) doc["parallel"] = parallel;
    return value_or_throw(parse_run_config(doc, ""));
  };
  const Trace single = train(rc_for(json()), nullptr);
  for (const auto& [mesh, rules] :
       {std::pair{"dp=2", json{{"batch", "dp"}}}, std::pair{"tp=2", json{{"mid", "tp"}}},
        std::pair{"dp=2,tp=2", json{{"batch", "dp"}, {"mid", "tp"}}}}) {
    const RunConfig rc = rc_for(json{{"mode", "semi"}, {"mesh", mesh}, {"rules", rules}});
    expect_same(single, train_ranks(rc, rc.parallel.mesh.num_ranks()),
                std::string("resnet ") + mesh);
  }
}

}  // namespace
}  // namespace meshflow
