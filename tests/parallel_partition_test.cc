// The SPMD partitioner = one device: a training graph lowered to per-rank
// programs (parallel/partition.h) on meshes of 2-8 in-process ranks trains
// with the losses and weights of one device, for the presets (data, Megatron
// TP, TP + sequence parallel, Ulysses context parallel, ZeRO 1-3) and for
// random strategy assignments; and the programs have the collectives the
// textbook plans have.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "grad_check.h"
#include "meshflow/autodiff/autodiff.h"
#include "meshflow/models/from_config.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/optim/optimizer.h"
#include "meshflow/parallel/partition.h"
#include "meshflow/runtime/comm/local_world.h"
#include "meshflow/runtime/trainer.h"

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
  if (model == "gpt_dropout") {
    gpt["resid_pdrop"] = 0.1;
    gpt["embd_pdrop"] = 0.1;
  }
  return model == "llama" ? llama : gpt;
}

RunConfig run(const std::string& model, int micro_batches, const json& parallel) {
  json doc = {
      {"model", model_json(model)},
      {"data", {{"dataset", "fortunes"}}},
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
       model == "llama"
           ? json{{"type", "adamw"}, {"lr", 1e-3}, {"weight_decay", 0.1}, {"grad_clip", 1.0}}
           : json{{"type", "sgd"}, {"lr", 0.1}, {"momentum", 0.9}, {"grad_clip", 1.0}}}};
  if (!parallel.is_null()) doc["parallel"] = parallel;
  return value_or_throw(parse_run_config(doc, ""));
}

struct Trace {
  std::vector<float> losses;
  std::map<std::string, Tensor> weights;
  float eval_loss = 0;
  MemoryStats memory;
};

Trace train(const RunConfig& rc, std::shared_ptr<Communicator> comm,
            const PartitionOptions* given = nullptr) {
  Trace t;
  auto trainer = value_or_throw(Trainer::create(rc, comm, given));
  for (int s = 0; s < rc.train.steps; ++s) t.losses.push_back(trainer->step().loss);
  t.eval_loss = trainer->evaluate().loss;
  t.weights = value_or_throw(trainer->gather_parameters());
  t.memory = trainer->executor().memory();
  return t;
}

// Tolerance: the same sums in another order (shard sums, then ring
// reductions) differ at f32 rounding level; Adam amplifies that a little in
// parameters whose gradient is ~0. 5e-5 relative on losses, 1e-4 on weights
// (max over elements, relative to the tensor's largest magnitude).
void expect_same(const Trace& single, const std::vector<Trace>& ranks, const std::string& what) {
  for (size_t r = 0; r < ranks.size(); ++r) {
    const Trace& t = ranks[r];
    ASSERT_EQ(t.losses.size(), single.losses.size());
    for (size_t i = 0; i < t.losses.size(); ++i)
      EXPECT_NEAR(t.losses[i], single.losses[i], 5e-5 * std::fabs(single.losses[i]))
          << what << " rank " << r << " step " << i;
    EXPECT_NEAR(t.eval_loss, single.eval_loss, 5e-5 * single.eval_loss) << what << " rank " << r;
    for (const auto& [name, w] : single.weights) {
      ASSERT_TRUE(t.weights.count(name)) << name;
      const Tensor& got = t.weights.at(name);
      ASSERT_EQ(got.numel(), w.numel()) << name;
      EXPECT_LT(testing::max_rel_diff(got.data<float>(), w.data<float>(), w.numel()), 1e-4)
          << what << ": " << name << " rank " << r;
    }
  }
}

std::vector<Trace> train_ranks(const RunConfig& rc, int ranks,
                               const PartitionOptions* given = nullptr) {
  std::vector<Trace> per_rank(ranks);
  Status s = run_local_ranks(ranks, [&](const std::shared_ptr<Transport>& t) -> Status {
    per_rank[t->rank()] = train(rc, Communicator::world(t), given);
    return Status::ok();
  });
  EXPECT_TRUE(s.is_ok()) << s.message();
  return per_rank;
}

struct PresetCase {
  std::string model, mesh, preset;
  int zero = 0, micro_batches = 1;
  std::string recompute = "none";
};

class PartitionPreset : public ::testing::TestWithParam<PresetCase> {};

TEST_P(PartitionPreset, SameLossesAndWeightsAsOneDevice) {
  const PresetCase& c = GetParam();
  // One device without recomputation is the reference.
  const Trace single = train(run(c.model, c.micro_batches, nullptr), nullptr);
  json par = {{"mode", "semi"}, {"mesh", c.mesh}, {"preset", c.preset}, {"zero", c.zero}};
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
        PresetCase{"llama", "cp=2", "ulysses", 0, 1, "full"}),
    [](const auto& info) {
      const PresetCase& c = info.param;
      std::string mesh = c.mesh;
      for (char& ch : mesh)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      std::string preset = c.preset;
      for (char& ch : preset)
        if (ch == '-') ch = '_';
      return c.model + "_" + mesh + "_" + preset + "_zero" + std::to_string(c.zero) + "_m" +
             std::to_string(c.micro_batches) + "_" + c.recompute;
    });

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

// ---- structure: the collectives the textbook plans have ----

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

LocalProgram lowered(const std::string& model, const std::string& mesh, const std::string& preset,
                     int zero = 0) {
  json par = {{"mode", "semi"}, {"mesh", mesh}, {"preset", preset}, {"zero", zero}};
  RunConfig rc = run(model, 1, par);
  ModelGraph m = value_or_throw(build_training_graph(rc, rc.train.batch_size));
  const PartitionOptions o = partition_options(rc.parallel, rc.parallel.mesh);
  Annotation a = value_or_throw(annotate(m.graph, rc.parallel.mesh, o));
  return value_or_throw(lower(m.graph, a, 0));
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
    EXPECT_EQ(count(p, OpKind::kAllReduce, Phase::kForward, "tp"), 2 * layers + 1) << model;
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
    for (const CollectiveRecord& r : p.collectives)
      if (r.kind == OpKind::kAllReduce && r.phase != Phase::kOptimizer)
        EXPECT_TRUE(r.bytes_per_rank <= 8) << model << ": " << r.value << " for " << r.consumer;
    // The norm weights' gradients reduce over the sequence shards (tp) by reshard.
    bool norm = false;
    for (const CollectiveRecord& r : p.collectives)
      norm |=
          r.kind == OpKind::kAllReduce && r.phase == Phase::kOptimizer && r.mesh_axis == "tp" &&
          (r.value.find("norm") != std::string::npos || r.value.find("ln_") != std::string::npos);
    EXPECT_TRUE(norm) << model;
  }
}

// Ulysses: q, k, v go from sequence shards to head shards and the output back.
TEST(PartitionStructure, UlyssesUsesAllToAll) {
  LocalProgram p = lowered("llama", "cp=2", "ulysses");
  EXPECT_EQ(count(p, OpKind::kAllToAll, Phase::kForward, "cp"), 4 * 2);
  EXPECT_EQ(count(p, OpKind::kAllGather, Phase::kForward, "cp"), 0);
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
    int propagated = 0;
    for (const std::string& why : a.why)
      propagated += why == "propagated" || why == "deferred reduction";
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
    if (zero == 3) EXPECT_NEAR(ranks[3].memory.params / P, 4.0 / 2, 0.05);
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

}  // namespace
}  // namespace meshflow
