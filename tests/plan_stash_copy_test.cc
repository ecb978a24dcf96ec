// The pipeline trainer's stash copies, priced as it makes them. Its executor
// reuses one arena for every micro-batch, so the values the backward reads
// are kept per micro-batch: the forward writes its own activations straight
// into the micro-batch's stash (ChunkProgram::stash_in_place), and the rest
// (fed inputs, activations also sent on) it copies out after the forward and
// back before the backward (split into Bi and W: Bi copies back what it reads
// and saves what W reads, W copies those back with its own forward entries).
// The cost model adds those copies, a read and a write of their bytes at the
// rank's memory rate, to the chunk's F, B and W; the trainer times them
// (Engine::stash_copy_seconds), which the plan check counts as compute
// beside the kernels.
#include <gtest/gtest.h>

#include <algorithm>

#include "meshflow/comm/communicator.h"
#include "meshflow/comm/local_world.h"
#include "meshflow/engine/job.h"
#include "meshflow/plan/auto_plan.h"
#include "meshflow/plan/calibrate.h"
#include "meshflow/plan/cost_model.h"

namespace meshflow::plan {
namespace {

json gpt4() {
  return {{"model_type", "gpt2"},
          {"n_layer", 4},
          {"n_embd", 64},
          {"n_head", 4},
          {"n_positions", 64},
          {"vocab_size", 256},
          {"tie_word_embeddings", true}};
}

TEST(PlanStashCopies, PricedInTheChunksTimesAsTheTrainerCopies) {
  const ModelConfig mc = value_or_throw(parse_model_config(gpt4()));
  const Cluster two = value_or_throw(share_machine(value_or_throw(load_local_cluster()), 2));
  const CostModel cm(TrainingJob{mc, 16, 32}, two, meshflow_cpu_constants());
  const std::vector<ChunkCost> chunks = value_or_throw(cm.chunk_costs(1, 1, 4, 2));
  ASSERT_EQ(chunks.size(), 2u);
  for (const ChunkCost& c : chunks) {
    ASSERT_GT(c.stash_bytes, 0.0);
    // The forward writes its activations into the stash in place; the fed
    // inputs (tokens, targets, the received activation) are copied.
    const double all = two.memory_time_s(2 * c.stash_bytes);
    EXPECT_GT(c.save_s, 0.0);
    EXPECT_LT(c.save_s, 0.25 * all) << c.save_s / all;
    EXPECT_DOUBLE_EQ(c.restore_s, c.save_s);
    // Split, the stash goes back in two parts with the W stash twice more.
    EXPECT_GT(c.bi_copy_s, 0.0);
    EXPECT_GT(c.w_copy_s, 0.0);
    EXPECT_GE(c.bi_copy_s + c.w_copy_s, c.restore_s);
    const StageTimes one = c.with_copies(false), split = c.with_copies(true);
    EXPECT_DOUBLE_EQ(one.forward_s, c.times.forward_s + c.save_s);
    EXPECT_DOUBLE_EQ(one.backward_s, c.times.backward_s + c.restore_s);
    EXPECT_DOUBLE_EQ(one.weight_grad_s, c.times.weight_grad_s);
    EXPECT_DOUBLE_EQ(split.backward_s, c.times.backward_s + c.bi_copy_s);
    EXPECT_DOUBLE_EQ(split.weight_grad_s, c.times.weight_grad_s + c.w_copy_s);
  }
  // The plan's slowest stage carries its chunk's copies, by schedule.
  for (ScheduleKind kind : {ScheduleKind::k1F1B, ScheduleKind::kZbH1}) {
    Plan p;
    p.pp = 2, p.micro_batch = 4, p.num_micro_batches = 4, p.schedule = kind;
    const StepCost c = value_or_throw(cm.price(p));
    double slowest = 0;
    for (const ChunkCost& k : chunks) {
      const StageTimes t = k.with_copies(splits_backward(kind));
      slowest = std::max(slowest, t.forward_s + t.backward_s + t.weight_grad_s);
    }
    EXPECT_NEAR(c.stage.forward_s + c.stage.backward_s + c.stage.weight_grad_s, slowest,
                1e-12 * slowest)
        << schedule_name(kind);
  }

  // The trainer times its copies on every rank of the pipeline, each step.
  Plan p;
  p.pp = 2, p.micro_batch = 4, p.num_micro_batches = 4;
  const json doc = {
      {"model", gpt4()},
      {"data", {{"dataset", "fortunes"}}},
      {"train", {{"steps", 2}, {"batch_size", 16}, {"seq_len", 32}, {"eval_batches", 1}}},
      {"optimizer", {{"type", "adamw"}, {"lr", 1e-3}}},
      {"parallel", value_or_throw(parallel_section(p, mc))}};
  const Job job = value_or_throw(resolve_job(value_or_throw(parse_run_config(doc, "")), 2));
  Status s = run_local_ranks(2, [&](const std::shared_ptr<Transport>& t) -> Status {
    MF_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e,
                        make_engine(job, Communicator::world(t), nullptr, false));
    if (e->stash_copy_seconds() != 0.0) return Status::internal("copies before a step");
    e->step();
    const double one = e->stash_copy_seconds();
    if (!(one > 0.0)) return Status::internal("no stash copies timed in a step");
    e->step();
    if (!(e->stash_copy_seconds() > one)) return Status::internal("the second step's copies");
    return Status::ok();
  });
  EXPECT_TRUE(s.is_ok()) << s.message();
}

}  // namespace
}  // namespace meshflow::plan
