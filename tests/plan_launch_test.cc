// Synchronous kernel launches (CostConstants::blocking_launch_s): the host's
// dispatch of every kernel adds to the step when CUDA_LAUNCH_BLOCKING=1 makes
// each launch wait for its kernel, as BLOOM's training ran.

#include <gtest/gtest.h>

#include <cstdint>

#include "meshflow/core/check.h"
#include "meshflow/models/from_config.h"
#include "meshflow/plan/cost_model.h"
#include "shipped_files.h"

namespace meshflow::plan {
namespace {

using meshflow::testing::load_sized_cluster;

// A GPT of BigScience's 2022 benchmarks: 2048 tokens, BLOOM's 250880-row
// vocabulary, the embedding tied to the head.
ModelConfig bloom_like(int64_t layers, int64_t hidden, int64_t heads) {
  return value_or_throw(parse_model_config({{"model_type", "gpt2"},
                                            {"n_layer", layers},
                                            {"n_embd", hidden},
                                            {"n_head", heads},
                                            {"n_positions", 2048},
                                            {"vocab_size", 250880},
                                            {"n_inner", 4 * hidden},
                                            {"tie_word_embeddings", true}}));
}

// The step's seconds with and without synchronous launches.
struct Both {
  StepCost async, blocking;
  double extra() const { return blocking.step_time_s - async.step_time_s; }
};

Both price_both(const ModelConfig& model, int64_t gpus, const Plan& p) {
  Both r;
  for (bool blocking : {false, true}) {
    CostConstants k = megatron2021_constants();
    k.blocking_launch_s = blocking ? CostConstants::kBlockingLaunch : 0.0;
    CostModel cm(TrainingJob{model, p.dp * p.micro_batch * p.num_micro_batches, 2048},
                 load_sized_cluster("dgx_a100_80gb.json", gpus), k);
    (blocking ? r.blocking : r.async) = value_or_throw(cm.price(p));
  }
  return r;
}

// kBlockingLaunch is the one published A/B of the same stack, reproduced:
// BigScience's 200B (80 layers, hidden 14400, 96 heads) on 80 A100s, TP=8
// PP=10 DP=1, micro-batch 1, global batch 512, full recompute, ran at 91.04
// TFLOPs with CUDA_LAUNCH_BLOCKING=1 and 97.20 without (bigscience
// train/tr11-176B-ml/chronicles-prequel.md, "dealing with JZ hanging"). Its
// TFLOPs are Narayanan et al.'s Eq. 3 with full recompute, so the two step
// times follow from the model's FLOPs.
TEST(PlanLaunch, BlockingLaunchReproducesThePublishedAB) {
  const double B = 512, s = 2048, l = 80, h = 14400, V = 250880, gpus = 80;
  const double flops = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
  const double published_extra = flops / (91.04e12 * gpus) - flops / (97.20e12 * gpus);
  EXPECT_NEAR(published_extra, 15.07, 0.01);
  Plan p;
  p.dp = 1, p.tp = 8, p.pp = 10, p.micro_batch = 1, p.num_micro_batches = 512;
  p.recompute = Recompute::kFull;
  const Both both = price_both(bloom_like(80, 14400, 96), 80, p);
  std::printf("published extra %.2f s, priced %.2f s (async %.2f s, blocking %.2f s)\n",
              published_extra, both.extra(), both.async.step_time_s, both.blocking.step_time_s);
  EXPECT_NEAR(both.extra() / published_extra, 1.0, 0.02);
}

// The host's time goes with the kernels launched, not with the tokens: at one
// global batch, micro-batches of one sequence launch every kernel twice as
// often as micro-batches of two, so they pay twice the host time. Without a
// pipeline the step is the micro-batches in turn, so exactly twice.
TEST(PlanLaunch, BlockingCostGoesWithTheMicroBatchesNotTheTokens) {
  const ModelConfig model = bloom_like(4, 4096, 32);
  auto plan = [](int64_t micro_batch) {
    Plan p;
    p.dp = 1, p.tp = 8, p.micro_batch = micro_batch, p.num_micro_batches = 16 / micro_batch;
    p.recompute = Recompute::kFull;
    return p;
  };
  const Both one = price_both(model, 8, plan(1)), two = price_both(model, 8, plan(2));
  EXPECT_GT(one.extra(), 0);
  EXPECT_NEAR(one.extra() / two.extra(), 2.0, 1e-6);
  // Per micro-batch: a whole number of launches, at least the blocks' own.
  CostModel cm(TrainingJob{model, 16, 2048}, load_sized_cluster("dgx_a100_80gb.json", 8),
               megatron2021_constants());
  const LayerCost lc = value_or_throw(cm.layer_cost(8, 1, 1, false));
  const double launches = one.extra() / 16 / CostConstants::kBlockingLaunch;
  EXPECT_NEAR(launches, std::round(launches), 1e-6);
  EXPECT_GT(launches, 4.0 * lc.block_launches);  // and the recompute's, embedding's, head's
  // The default stacks launch asynchronously: nothing is added.
  EXPECT_EQ(CostConstants{}.blocking_launch_s, 0.0);
}

}  // namespace
}  // namespace meshflow::plan
