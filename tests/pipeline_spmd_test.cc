// Pipeline x SPMD stages = one device: each pipeline stage runs the
// partitioned program (parallel/partition.h) of the whole model on its own
// sub-mesh (tensor parallel, data parallel through the partitioner, both, and
// ZeRO within the stages), split into stages by layer (stage_graph.h). Tiny
// GPT (tied and untied) and LLaMA on 2 stages x {tp=2, dp=2, dp=2 x tp=2}
// (4 or 8 in-process ranks) under gpipe, 1f1b, zb-h1 and interleaved give
// the losses and gathered weights of the single-device Trainer with the same
// micro-batches.
#include <gtest/gtest.h>

#include <cmath>

#include "grad_check.h"
#include "meshflow/comm/local_world.h"
#include "meshflow/engine/pipeline_trainer.h"
#include "meshflow/ops/op_def.h"

namespace meshflow {
namespace {

json model_json(const std::string& model, int layers) {
  json gpt = {{"model_type", "gpt2"},
              {"n_layer", layers},
              {"n_embd", 32},
              {"n_head", 4},
              {"n_positions", 16},
              {"vocab_size", 256},
              {"tie_word_embeddings", model == "gpt_tied"}};
  json llama = {{"model_type", "llama"},    {"num_hidden_layers", layers},
                {"hidden_size", 32},        {"num_attention_heads", 4},
                {"num_key_value_heads", 2}, {"intermediate_size", 64},
                {"vocab_size", 256},        {"max_position_embeddings", 16}};
  return model == "llama" ? llama : gpt;
}

// As in parallel_partition_test: GPT's key bias has an exactly-zero gradient
// (softmax is shift invariant), which Adam would turn rounding noise into
// steps on, so GPT trains with SGD (momentum) and LLaMA with AdamW.
RunConfig run(const std::string& model, int layers, int micro_batches, const json& parallel,
              bool clip = true) {
  json doc = {
      {"model", model_json(model, layers)},
      {"data", {{"dataset", "fortunes"}}},
      {"train",
       {{"steps", 3},
        {"batch_size", 8},
        {"micro_batches", micro_batches},
        {"seq_len", 16},
        {"threads", 1},
        {"eval_batches", 1}}},
      {"optimizer",
       model == "llama"
           ? json{{"type", "adamw"}, {"lr", 1e-3}, {"weight_decay", 0.1}, {"grad_clip", 1.0}}
           : json{{"type", "sgd"}, {"lr", 0.1}, {"momentum", 0.9}, {"grad_clip", 1.0}}}};
  if (!parallel.is_null()) doc["parallel"] = parallel;
  if (!clip) doc["optimizer"].erase("grad_clip");
  return value_or_throw(parse_run_config(doc, ""));
}

struct TrainRun {
  std::vector<float> losses;
  std::map<std::string, Tensor> weights;
  float eval_loss = 0;
};

TrainRun train_one_device(const RunConfig& rc) {
  TrainRun out;
  auto trainer = value_or_throw(Trainer::create(rc));
  for (int s = 0; s < rc.train.steps; ++s) out.losses.push_back(trainer->step().loss);
  out.eval_loss = trainer->evaluate().loss;
  out.weights = value_or_throw(trainer->gather_parameters());
  return out;
}

// Every rank's losses and evaluation; rank 0's gathered weights.
std::vector<TrainRun> train_pipeline(const RunConfig& rc, const PipelineConfig& pc, int ranks) {
  std::vector<TrainRun> per_rank(ranks);
  Status s = run_local_ranks(ranks, [&](const std::shared_ptr<Transport>& t) -> Status {
    MF_ASSIGN_OR_RETURN(auto pt, PipelineTrainer::create(rc, pc, Communicator::world(t)));
    int collectives = 0;  // the stages run partitioned programs
    for (size_t c = 0; c < pt->chunks().size(); ++c)
      for (const Node& n : pt->chunk_program(static_cast<int>(c)).graph.nodes())
        collectives += is_collective(n.kind);
    EXPECT_GT(collectives, 0) << "rank " << t->rank();
    TrainRun& out = per_rank[t->rank()];
    for (int i = 0; i < rc.train.steps; ++i) out.losses.push_back(pt->step().loss);
    out.eval_loss = pt->evaluate().loss;
    MF_ASSIGN_OR_RETURN(out.weights, pt->gather_parameters());
    return Status::ok();
  });
  if (!s.is_ok()) throw StatusError(s);
  return per_rank;
}

struct SpmdCase {
  std::string model, mesh, preset;
  ScheduleKind schedule;
  int micro_batches;
  int zero = 0, layers = 2, virtual_stages = 1;
  bool clip = true;  // optimizer.grad_clip = 1
};

std::string case_name(const SpmdCase& c) {
  std::string s = c.model + "_" + c.preset + "_" + c.mesh + "_" +
                  std::string(schedule_name(c.schedule)) + "_m" + std::to_string(c.micro_batches) +
                  (c.zero ? "_zero" + std::to_string(c.zero) : "") +
                  (c.virtual_stages > 1 ? "_v" + std::to_string(c.virtual_stages) : "") +
                  (c.clip ? "" : "_noclip");
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

class PipelineSpmd : public ::testing::TestWithParam<SpmdCase> {};

// Tolerance as in parallel_partition_test: 5e-5 relative on losses, 1e-4 on
// weights (max over elements, relative to the tensor's largest magnitude).
TEST_P(PipelineSpmd, SameLossesAndWeightsAsOneDevice) {
  const SpmdCase& c = GetParam();
  const TrainRun single =
      train_one_device(run(c.model, c.layers, c.micro_batches, nullptr, c.clip));
  json par = {{"mode", "semi"}, {"mesh", c.mesh}, {"preset", c.preset}, {"zero", c.zero}};
  const RunConfig rc = run(c.model, c.layers, c.micro_batches, par, c.clip);
  PipelineConfig pc;
  pc.stages = 2;
  pc.schedule = c.schedule;
  pc.micro_batches = c.micro_batches;
  pc.virtual_stages = c.virtual_stages;
  const int ranks = 2 * rc.parallel.mesh.num_ranks();
  const std::vector<TrainRun> per_rank = train_pipeline(rc, pc, ranks);
  for (int r = 0; r < ranks; ++r) {
    ASSERT_EQ(per_rank[r].losses.size(), single.losses.size());
    for (size_t i = 0; i < single.losses.size(); ++i)
      EXPECT_NEAR(per_rank[r].losses[i], single.losses[i], 5e-5 * std::fabs(single.losses[i]))
          << "rank " << r << " step " << i;
    // Evaluation runs on the plan: every rank has the one-device eval loss.
    EXPECT_NEAR(per_rank[r].eval_loss, single.eval_loss, 5e-5 * single.eval_loss) << "rank " << r;
  }
  const TrainRun& got = per_rank[0];
  ASSERT_EQ(got.weights.size(), single.weights.size());
  for (const auto& [name, w] : single.weights) {
    ASSERT_TRUE(got.weights.count(name)) << name;
    const Tensor& g = got.weights.at(name);
    ASSERT_EQ(g.numel(), w.numel()) << name;
    EXPECT_LT(testing::max_rel_diff(g.data<float>(), w.data<float>(), w.numel()), 1e-4) << name;
  }
  for (int r = 1; r < ranks; ++r) EXPECT_TRUE(per_rank[r].weights.empty()) << r;
}

using K = ScheduleKind;
INSTANTIATE_TEST_SUITE_P(
    Stages, PipelineSpmd,
    ::testing::Values(
        // 2 stages x tp=2 (4 ranks)
        SpmdCase{"gpt", "tp=2", "megatron", K::k1F1B, 2},
        SpmdCase{"gpt_tied", "tp=2", "megatron", K::kGPipe, 4},
        SpmdCase{"llama", "tp=2", "megatron", K::k1F1B, 4},
        SpmdCase{"llama", "tp=2", "megatron", K::kGPipe, 2},
        SpmdCase{"llama", "tp=2", "megatron-sp", K::k1F1B, 2},
        // 2 stages x dp=2 through the partitioner (4 ranks), ZeRO 1-3 within the stages
        SpmdCase{"gpt", "dp=2", "dp", K::kGPipe, 2}, SpmdCase{"llama", "dp=2", "dp", K::k1F1B, 4},
        SpmdCase{"llama", "dp=2", "dp", K::k1F1B, 2, 1},
        // ZeRO-2/3 with micro-batches and grad_clip: the global norm reads the
        // accumulated reduce-scattered shards.
        SpmdCase{"llama", "dp=2", "dp", K::kGPipe, 1, 2},
        SpmdCase{"llama", "dp=2", "dp", K::kGPipe, 2, 2, 2, 1},
        SpmdCase{"gpt_tied", "dp=2", "dp", K::k1F1B, 2, 3, 2, 1},
        SpmdCase{"gpt", "dp=2", "dp", K::k1F1B, 2, 3, 2, 1},
        SpmdCase{"gpt_tied", "dp=2", "dp", K::k1F1B, 2, 2, 2, 1},
        SpmdCase{"gpt_tied", "dp=2", "dp", K::k1F1B, 2, 1, 2, 1},
        SpmdCase{"gpt_tied", "dp=2", "dp", K::kGPipe, 1, 3},
        SpmdCase{"llama", "dp=2,tp=2", "megatron", K::k1F1B, 4, 3, 2, 1},
        // 2 stages x (dp=2, tp=2) = 8 ranks
        SpmdCase{"gpt", "dp=2,tp=2", "megatron", K::k1F1B, 4},
        SpmdCase{"llama", "dp=2,tp=2", "megatron", K::kGPipe, 2},
        SpmdCase{"llama", "dp=2,tp=2", "megatron", K::k1F1B, 2, 1},
        // Split backward and virtual stages
        SpmdCase{"llama", "tp=2", "megatron", K::kZbH1, 2},
        SpmdCase{"llama", "tp=2", "megatron", K::kZbV, 4, 0, 4, 2},
        SpmdCase{"gpt_tied", "dp=2", "dp", K::kZbV, 2, 0, 4, 2},
        SpmdCase{"gpt", "tp=2", "megatron", K::kInterleaved, 2, 0, 4, 2},
        // Ring attention inside the stages, the sequence in zigzag order
        SpmdCase{"gpt", "cp=2", "ring", K::k1F1B, 2},
        SpmdCase{"llama", "cp=2", "ring", K::kZbV, 4, 0, 4, 2}),
    [](const auto& info) { return case_name(info.param); });

// The stage sub-mesh: the mesh without pp; rank-count errors say what to run with.
TEST(PipelineSpmdMesh, SubMeshAndRankCount) {
  StrategyConfig par = value_or_throw(parse_strategy_config(
      json{{"mode", "semi"}, {"mesh", "pp=2,dp=2,tp=2"}, {"preset", "megatron"}}));
  Mesh m = value_or_throw(spmd_stage_mesh(par, 2, 8));
  EXPECT_EQ(m.num_ranks(), 4);
  EXPECT_EQ(m.axis_index("pp"), -1);
  Status s = spmd_stage_mesh(par, 2, 4).status();
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("run with --ranks 8"), std::string::npos) << s.message();
  s = spmd_stage_mesh(par, 4, 16).status();
  EXPECT_NE(s.message().find("pp=2 but parallel.pipeline.stages=4"), std::string::npos)
      << s.message();
  StrategyConfig none = value_or_throw(parse_strategy_config(json{{"mode", "semi"}}));
  EXPECT_EQ(value_or_throw(spmd_stage_mesh(none, 2, 6)).num_ranks(), 3);
}

}  // namespace
}  // namespace meshflow
