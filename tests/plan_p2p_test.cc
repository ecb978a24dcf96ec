// A pipeline's p2p in the cost model: what one message carries (under
// sequence parallelism the activation is already split over tp: each rank
// sends its shard and nothing is gathered), and the interleaved schedule's
// messages under the other chunks' compute where the stack overlaps them
// (CostConstants::overlap_p2p_interleaved: Megatron-LM's overlap_p2p_comm).
#include <gtest/gtest.h>

#include <string>

#include "meshflow/plan/cost_model.h"
#include "meshflow/plan/emit.h"
#include "meshflow/plan/simulate.h"
#include "shipped_files.h"

namespace meshflow::plan {
namespace {

using meshflow::testing::load_model;
using meshflow::testing::load_sized_cluster;

// LLaMA-3 70B on 64 H100s as Megatron-Bridge's recipe runs it: tp=4 with
// sequence parallelism, pp=8 over the nodes, interleaved with 5 chunks.
Plan bridge_70b() {
  Plan p;
  p.dp = 2, p.tp = 4, p.pp = 8, p.vp = 5, p.sp = true;
  p.schedule = ScheduleKind::kInterleaved;
  p.micro_batch = 1, p.num_micro_batches = 64, p.zero = 1;
  return p;
}

TrainingJob llama70b() {
  return TrainingJob{load_model("llama3_70b.json"), 128, 8192};
}

TEST(PlanPipelineP2p, SequenceParallelSendsItsShardAndGathersNothing) {
  const Cluster cl = load_sized_cluster("h100_sxm.json", 64);
  const CostModel cm(llama70b(), cl);
  Plan p = bridge_70b();
  const StepCost sp = value_or_throw(cm.price(p));
  // One micro-batch's activation, 8192 tokens x 8192 wide in bf16, a quarter
  // of it per rank, over the link between stages (a stage is a node's half).
  const double shard = 8192.0 * 8192.0 * 2.0 / 4.0;
  const Link& pp_link = cl.link_for_axis(p.pp, p.dp * p.tp);
  EXPECT_NEAR(sp.stage.p2p_s / cl.collective_time_s(Collective::kSendRecv, 2, shard, pp_link), 1.0,
              1e-9);
  // Without it, Megatron's scatter/gather: the same quarter sent, then the
  // whole activation all_gathered over tp.
  p.sp = false;
  const StepCost whole = value_or_throw(cm.price(p));
  EXPECT_GT(whole.stage.p2p_s, sp.stage.p2p_s * 1.05);
  EXPECT_NEAR(whole.stage.p2p_s - sp.stage.p2p_s,
              cl.collective_time_s(Collective::kAllGather, p.tp, 4 * shard, cl.intra_node), 1e-9);
}

TEST(PlanPipelineP2p, InterleavedMessagesRunUnderTheOtherChunksWhereTheStackOverlapsThem) {
  const Cluster cl = load_sized_cluster("h100_sxm.json", 64);
  CostConstants overlapped;
  overlapped.overlap_p2p_interleaved = true;
  const CostModel blocking(llama70b(), cl), async(llama70b(), cl, overlapped);
  Plan p = bridge_70b();
  const StepCost b = value_or_throw(blocking.price(p));
  const StepCost a = value_or_throw(async.price(p));
  const double m = 64, v = 5, pp = 8, msg = b.stage.p2p_s;
  ASSERT_GT(msg, 0);
  EXPECT_EQ(a.stage.p2p_s, msg);
  // Blocking: every chunk's F and B carries its message.
  EXPECT_NEAR(b.pp_comm_s / (m * 2 * v * msg), 1.0, 1e-9);
  // Overlapped: only the slowdown of the compute they run under, on the
  // network between nodes (a fraction of NVLink's share).
  EXPECT_GT(a.pp_comm_s, 0);
  EXPECT_LT(a.pp_comm_s, 0.25 * b.pp_comm_s);
  // Each message's delay is paid in the warm-up and the flush: the bubble
  // grows by about 2 (pp - 1) of them, and the step saves the rest.
  EXPECT_GT(a.bubble_s, b.bubble_s);
  const double saved = b.step_time_s - a.step_time_s;
  EXPECT_GT(saved, 0.8 * (b.pp_comm_s - a.pp_comm_s - 2 * (pp - 1) * msg));
  EXPECT_LT(saved, b.pp_comm_s - a.pp_comm_s);
  // The closed form the search sweeps with agrees with the simulated schedule.
  const StepCost closed = value_or_throw(async.price(p, CostModel::PipelineModel::kClosedForm));
  EXPECT_NEAR(closed.step_time_s / a.step_time_s, 1.0, 0.03);
  // simulate's trace runs the same costs: the same pipeline, the sends drawn.
  const SimulatedStep sim = simulate_step(a);
  EXPECT_NEAR(sim.step_time_s / a.step_time_s, 1.0, 1e-6);
  EXPECT_NE(sim.trace.to_json().find("\"send activation\""), std::string::npos);
  // Megatron-LM overlaps them only under its interleaved schedule: 1F1B is
  // priced the same either way.
  p.schedule = ScheduleKind::k1F1B, p.vp = 1;
  EXPECT_EQ(value_or_throw(async.price(p)).step_time_s,
            value_or_throw(blocking.price(p)).step_time_s);
  // `--emit megatron` prices its stack so; TorchTitan's pipelining blocks.
  EXPECT_TRUE(stack_constants(EmitTarget::kMegatron, true).overlap_p2p_interleaved);
  EXPECT_FALSE(stack_constants(EmitTarget::kTorchTitan, true).overlap_p2p_interleaved);
  EXPECT_FALSE(megatron2021_constants().overlap_p2p_interleaved);
}

}  // namespace
}  // namespace meshflow::plan
