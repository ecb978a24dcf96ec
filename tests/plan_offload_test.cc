// The planner's offload (Plan::offload): the optimizer state of a ZeRO plan
// on the host (ZeRO-Offload) or on NVMe (ZeRO-Infinity), priced from the
// cluster file's "host" section (PCIe per device, host memory and its
// bandwidth, NVMe bandwidth and capacity per node), and searched only when no
// plan fits without it.
#include <gtest/gtest.h>

#include <string>

#include "cli_run.h"
#include "meshflow/config/json_reader.h"
#include "meshflow/core/check.h"
#include "meshflow/plan/emit.h"
#include "meshflow/plan/search.h"
#include "shipped_files.h"

namespace meshflow::plan {
namespace {

using meshflow::testing::source_dir;

using meshflow::testing::load_model;
using meshflow::testing::load_sized_cluster;

// LLaMA-3 70B, batch 64 x 4096, on one DGX A100 (8 x 80 GB): no plan fits on
// the devices (ZeRO-3's parameters and gradients alone are 33 GiB a device,
// the optimizer state 99 GiB more), so the search offloads the state to the
// host; on 64 GPUs plans fit without it and none is offloaded.
TEST(PlanOffload, ChosenOnlyWhenNothingElseFits) {
  const TrainingJob job{load_model("llama3_70b.json"), 64, 4096};
  CostModel eight(job, load_sized_cluster("dgx_a100_80gb.json", 8));
  SearchOptions o;
  o.top_k = 1;
  const SearchResult r = value_or_throw(search_plans(eight, 8, o));
  const StepCost& best = r.plans[0];
  EXPECT_EQ(best.plan.offload, Offload::kHost) << plan_label(best.plan);
  EXPECT_GE(best.plan.zero, 1);
  EXPECT_TRUE(best.fits);
  EXPECT_EQ(best.memory.optimizer, 0);
  // What it moved off would not have fit in what the device has left.
  EXPECT_GT(best.memory.offloaded, best.usable_memory - best.memory.total);
  EXPECT_LE(best.memory.total, best.usable_memory);
  // Pinned off, nothing fits.
  o.fixed = value_or_throw(parse_fixed("offload=none"));
  Result<SearchResult> none = search_plans(eight, 8, o);
  ASSERT_FALSE(none.is_ok());
  EXPECT_NE(none.status().message().find("does not fit on 8 devices"), std::string::npos)
      << none.status().message();
  // Where plans fit, none offloads.
  CostModel many(job, load_sized_cluster("dgx_a100_80gb.json", 64));
  o.fixed = FixedChoices{};
  const SearchResult big = value_or_throw(search_plans(many, 64, o));
  for (const StepCost& c : big.plans) EXPECT_EQ(c.plan.offload, Offload::kNone);
}

// The price: the state leaves device memory; the step pays the PCIe traffic
// (gradients down, weights up), the CPU update at the node's memory
// bandwidth shared by its devices, and with NVMe the state's read and write.
TEST(PlanOffload, PricedFromTheHostSection) {
  const Cluster c = load_sized_cluster("dgx_a100_80gb.json", 8);
  CostModel cm(TrainingJob{load_model("gpt3_13b.json"), 64, 2048}, c);
  Plan p;
  p.dp = 8, p.micro_batch = 1, p.num_micro_batches = 8, p.zero = 1;
  p.recompute = Recompute::kFull;
  const StepCost dev = value_or_throw(cm.price(p));
  p.offload = Offload::kHost;
  const StepCost host = value_or_throw(cm.price(p));
  p.offload = Offload::kNvme;
  const StepCost nvme = value_or_throw(cm.price(p));
  EXPECT_GT(dev.memory.optimizer, 0);
  EXPECT_DOUBLE_EQ(host.memory.offloaded, dev.memory.optimizer);
  EXPECT_DOUBLE_EQ(host.memory.total, dev.memory.total - dev.memory.optimizer);
  EXPECT_EQ(host.memory.optimizer, 0);
  // The updates of 13B / 8 parameters a device: 2 bytes each way over 24 GB/s
  // of PCIe, the CPU's 16 bytes a parameter (mixed AdamW) at 300 / 8 GB/s.
  const double per_device = double(cm.num_parameters()) / 8;
  const double pcie = 2 * per_device * 2 / c.host.link_bandwidth_bytes_per_s;
  EXPECT_NEAR(host.comm.offload, 2 * per_device * 2, 1e-6 * host.comm.offload);
  EXPECT_GT(host.step_time_s, dev.step_time_s + pcie);
  // NVMe: the 12-byte state read and written at 12 / 8 GB/s on top.
  EXPECT_NEAR(nvme.step_time_s - host.step_time_s,
              2 * dev.memory.optimizer / (c.host.nvme_bandwidth_bytes_per_s / 8),
              1e-6 * nvme.step_time_s);
  std::printf(
      "gpt3 13b dp=8 zero1: step %.2f s on the device, %.2f s offload=host, %.2f s "
      "offload=nvme; %.1f GiB of optimizer state a device moved off\n",
      dev.step_time_s, host.step_time_s, nvme.step_time_s, dev.memory.optimizer / (1 << 30));
}

TEST(PlanOffload, InvalidPlansSayWhy) {
  CostModel cm(TrainingJob{load_model("gpt3_1.3b.json"), 64, 2048},
               load_sized_cluster("dgx_a100_80gb.json", 8));
  Plan p;
  p.dp = 8, p.micro_batch = 1, p.num_micro_batches = 8;
  p.offload = Offload::kHost;
  EXPECT_NE(cm.invalid_reason(p).find("needs zero >= 1"), std::string::npos)
      << cm.invalid_reason(p);
  // A cluster file without a host section.
  CostModel bare(TrainingJob{load_model("gpt3_1.3b.json"), 64, 2048},
                 load_sized_cluster("h100_96gb.json", 8));
  p.zero = 1;
  EXPECT_NE(bare.invalid_reason(p).find("cluster file's \"host\" section"), std::string::npos)
      << bare.invalid_reason(p);
  EXPECT_NE(parse_fixed("offload=ssd").status().message().find("none, host, nvme"),
            std::string::npos);
  EXPECT_EQ(value_or_throw(parse_fixed("offload=nvme,zero=1")).to_string(), "zero=1,offload=nvme");
  Result<Cluster> bad = parse_cluster(json::parse(R"({"devices_per_node": 1,
      "device": {"peak_flops": {"f32": 1e12}, "memory_bytes": 1000,
                 "memory_bandwidth_bytes_per_s": 1e9},
      "intra_node": {"bandwidth_bytes_per_s": 1e9},
      "host": {"link_bandwidth_bytes_per_s": -1}})"));
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("cluster.host.link_bandwidth_bytes_per_s must be >= 0"),
            std::string::npos)
      << bad.status().message();
}

// What each stack runs: DeepSpeed's offload_optimizer, Megatron-LM's
// --optimizer-cpu-offload (host only), TorchTitan none.
TEST(PlanOffload, EmittedForTheStacksThatRunIt) {
  const TrainingJob job{load_model("llama3_70b.json"), 64, 4096};
  Plan p;
  p.dp = 8, p.micro_batch = 1, p.num_micro_batches = 8, p.zero = 2;
  p.offload = Offload::kNvme;
  const std::string ds = value_or_throw(emit_plan(p, job, true, EmitTarget::kDeepSpeed));
  EXPECT_NE(ds.find("\"offload_optimizer\""), std::string::npos) << ds;
  EXPECT_NE(ds.find("\"nvme\""), std::string::npos) << ds;
  EXPECT_FALSE(emit_plan(p, job, true, EmitTarget::kMegatron).is_ok());
  p.offload = Offload::kHost;
  p.zero = 1;  // Megatron-LM's distributed optimizer (it refuses ZeRO-2: PlanEmit)
  const std::string mg = value_or_throw(emit_plan(p, job, true, EmitTarget::kMegatron));
  EXPECT_NE(mg.find("--optimizer-cpu-offload"), std::string::npos) << mg;
  p.zero = 3, p.sp = true;
  const Status tt = emit_plan(p, job, true, EmitTarget::kTorchTitan).status();
  EXPECT_NE(tt.message().find("pin offload=none"), std::string::npos) << tt.message();
}

// Weights grouping (Plan::group, ZeRO-1 with whole parameters per rank):
// the largest group sets the optimizer state (at least the word embedding),
// the gradients are all-reduced as without ZeRO and every parameter is
// broadcast from its owner after the updates.
TEST(PlanGroup, LargestGroupSetsTheStateAndBroadcastsAreAdded) {
  CostModel cm(TrainingJob{load_model("llama3_8b.json"), 256, 2048},
               load_sized_cluster("dgx_a100_80gb.json", 32));
  Plan p;
  p.dp = 32, p.micro_batch = 1, p.num_micro_batches = 8, p.zero = 1;
  p.recompute = Recompute::kFull;
  const StepCost shard = value_or_throw(cm.price(p));
  p.group = true;
  const StepCost group = value_or_throw(cm.price(p));
  // 8B / 32 = 250M parameters an even share; the 128256 x 4096 word table is
  // 525M: one rank's group holds it, so the state is twice sharding's.
  const double table = 128256.0 * 4096.0;
  EXPECT_NEAR(group.memory.optimizer, 12 * table, 0.02 * 12 * table);
  EXPECT_GT(group.memory.optimizer, 2 * shard.memory.optimizer);
  EXPECT_GT(group.comm.data_parallel, 1.4 * shard.comm.data_parallel);  // + the broadcasts
  EXPECT_GT(group.step_time_s, shard.step_time_s);
  EXPECT_NE(plan_label(group.plan).find("zero1 group"), std::string::npos);
  // The search offers it (pinned here) and writes it for the runtime.
  SearchOptions o;
  o.top_k = 0;
  o.fixed = value_or_throw(parse_fixed("dp=32,zero=1,zero_style=group"));
  const SearchResult r = value_or_throw(search_plans(cm, 32, o));
  EXPECT_TRUE(r.plans[0].plan.group);
  p.zero = 2;
  EXPECT_NE(cm.invalid_reason(p).find("weights grouping (group) is ZeRO-1"), std::string::npos)
      << cm.invalid_reason(p);
  EXPECT_NE(parse_fixed("zero_style=grp").status().message().find("shard or group"),
            std::string::npos);
}

// Ring attention (Plan::ring, preset "ring"): cp over the keys, k/v blocks
// passed around the cp ranks. Ulysses needs the kv heads to split over cp;
// the ring does not, so where kv_heads < cp only the ring runs, and the
// search finds it.
TEST(PlanRing, RunsWhereUlyssesCannotAndIsPricedByItsShifts) {
  CostModel cm(TrainingJob{load_model("llama3_8b.json"), 16, 8192},
               load_sized_cluster("dgx_a100_80gb.json", 16));
  Plan p;
  p.dp = 1, p.cp = 16, p.micro_batch = 1, p.num_micro_batches = 16, p.zero = 1;
  p.recompute = Recompute::kFull;
  Result<StepCost> ulysses = cm.price(p);  // 8 kv heads over cp=16
  EXPECT_FALSE(ulysses.is_ok() && cm.invalid_reason(p).empty());
  p.ring = true;
  ASSERT_TRUE(cm.invalid_reason(p).empty()) << cm.invalid_reason(p);
  const StepCost ring = value_or_throw(cm.price(p));
  EXPECT_GT(ring.cp_comm_s, 0);
  EXPECT_GT(ring.comm.context_parallel, 0);
  EXPECT_NE(plan_label(ring.plan).find("cp=16ring"), std::string::npos);
  // Pinned (the search tries the ring only when asked), it is the plan.
  SearchOptions o;
  o.top_k = 0;
  o.fixed = value_or_throw(parse_fixed("cp=16,ring=true"));
  const SearchResult r = value_or_throw(search_plans(cm, 16, o));
  EXPECT_TRUE(r.plans[0].plan.ring) << plan_label(r.plans[0].plan);
  p.cp = 1, p.dp = 16, p.num_micro_batches = 1;
  EXPECT_NE(cm.invalid_reason(p).find("ring attention"), std::string::npos) << cm.invalid_reason(p);
  std::printf("llama3 8b seq 8192 on 16 A100s, cp=16: ring %s, %.2f s a step, cp comm %.2f s\n",
              plan_label(r.plans[0].plan).c_str(), r.plans[0].step_time_s, r.plans[0].cp_comm_s);
}

// The fused attention at its kernel's own efficiency (the cluster file's
// FlashAttention-2 table on H100, 15-34% of peak by length) rather than the
// GEMM curve (~65%): the attention's share of compute, and so the
// difference, grows with the sequence.
TEST(PlanAttention, FusedKernelAtItsOwnEfficiency) {
  ModelConfig model = load_model("llama3_8b.json");
  std::get<LlamaConfig>(model).max_position_embeddings = 65536;
  Plan p;
  p.dp = 8, p.micro_batch = 1, p.num_micro_batches = 1, p.zero = 3;
  p.recompute = Recompute::kFull;
  double ratio[2];
  const int64_t seqs[2] = {2048, 65536};
  for (int i = 0; i < 2; ++i) {
    Cluster fa2 = load_sized_cluster("h100_sxm.json", 8), gemm = fa2;
    ASSERT_EQ(fa2.device.attention_efficiency.count("flash2"), 1u);
    gemm.device.attention_efficiency.clear();
    const StepCost slow = value_or_throw(CostModel(TrainingJob{model, 8, seqs[i]}, fa2).price(p));
    const StepCost fast = value_or_throw(CostModel(TrainingJob{model, 8, seqs[i]}, gemm).price(p));
    ratio[i] = slow.compute_s / fast.compute_s;
  }
  EXPECT_GT(ratio[0], 1.02);
  EXPECT_GT(ratio[1], ratio[0] + 0.3);
  EXPECT_LT(ratio[1], 0.834 * 0.78 / 0.292);  // the curve's top over FA2's slowest at 32k+
  std::printf("llama3 8b on 8 H100s, FA2 vs the GEMM curve: compute x%.2f at 2k, x%.2f at 64k\n",
              ratio[0], ratio[1]);
}

// The stack's fused kernel decides the attention's price: on A100 the
// FlashAttention-1 era kernel (40% / 30% of peak) against FlashAttention-2 on
// the GEMM curve (~74%). The attention's FLOPs are the same, so the compute
// difference is the attention's time alone and grows with the sequence; a
// kernel the cluster file does not list is priced on the curve.
TEST(PlanAttention, TheStacksKernelByName) {
  ModelConfig model = load_model("llama3_8b.json");
  std::get<LlamaConfig>(model).max_position_embeddings = 32768;
  Plan p;
  p.dp = 8, p.micro_batch = 1, p.num_micro_batches = 1, p.zero = 3;
  const Cluster a100 = load_sized_cluster("dgx_a100_80gb.json", 8);
  CostConstants flash1, unlisted;
  flash1.fused_attention = "flash1";
  unlisted.fused_attention = "cudnn";
  double ratio[2];
  const int64_t seqs[2] = {2048, 32768};
  for (int i = 0; i < 2; ++i) {
    const TrainingJob job{model, 8, seqs[i]};
    const StepCost fa2 = value_or_throw(CostModel(job, a100).price(p));
    const StepCost fa1 = value_or_throw(CostModel(job, a100, flash1).price(p));
    const StepCost curve = value_or_throw(CostModel(job, a100, unlisted).price(p));
    EXPECT_DOUBLE_EQ(curve.compute_s, fa2.compute_s);
    ratio[i] = fa1.compute_s / fa2.compute_s;
  }
  EXPECT_GT(ratio[0], 1.03);
  EXPECT_GT(ratio[1], ratio[0] + 0.4);
  EXPECT_LT(ratio[1], 0.74 / 0.30);
  std::printf("llama3 8b on 8 A100s, FA1 vs FA2: compute x%.2f at 2k, x%.2f at 32k\n", ratio[0],
              ratio[1]);
}

// A stack that overlaps tp communication with its GEMMs (Megatron-LM's
// --tp-comm-overlap) pays a block's first chunk of it (1/tp) and, for the
// rest the GEMMs cover, the GEMMs' slowdown under it (s / (1 + s) of it,
// s = CostConstants::tp_overlap_compute_slowdown); what they do not cover when
// they cannot.
TEST(PlanTpOverlap, ExposesTheFirstChunkWhereTheGemmsCoverTheRest) {
  const TrainingJob job{load_model("gpt3_175b.json"), 64, 2048};
  Plan p;
  p.dp = 1, p.tp = 8, p.pp = 8, p.sp = true, p.micro_batch = 1, p.num_micro_batches = 64;
  p.zero = 1;
  CostConstants overlap;
  overlap.tp_comm_overlap = true;
  const StepCost plain =
      value_or_throw(CostModel(job, load_sized_cluster("h100_sxm.json", 64)).price(p));
  const StepCost hidden =
      value_or_throw(CostModel(job, load_sized_cluster("h100_sxm.json", 64), overlap).price(p));
  ASSERT_GT(plain.tp_comm_s, 0);
  const double s = CostConstants{}.tp_overlap_compute_slowdown;
  const double covered = 1.0 / 8 + 7.0 / 8 * s / (1 + s);           // 0.26 at s = 0.189
  EXPECT_LT(hidden.tp_comm_s, (covered + 0.05) * plain.tp_comm_s);  // + the embedding's and head's
  EXPECT_GT(hidden.tp_comm_s, 0.99 * covered * plain.tp_comm_s);
  // The step saves the hidden communication, and the bubble it made longer.
  const double saved = plain.step_time_s - hidden.step_time_s;
  EXPECT_GE(saved, 0.99 * (plain.tp_comm_s - hidden.tp_comm_s));
  EXPECT_LT(saved, 1.25 * (plain.tp_comm_s - hidden.tp_comm_s));
  // Over the nodes' links (tp=16 on 8-GPU nodes) the GEMMs cover less of it.
  p.tp = 16, p.pp = 4;
  const StepCost wide =
      value_or_throw(CostModel(job, load_sized_cluster("h100_sxm.json", 64)).price(p));
  const StepCost wide_overlap =
      value_or_throw(CostModel(job, load_sized_cluster("h100_sxm.json", 64), overlap).price(p));
  EXPECT_GT(wide.tp_comm_s, plain.tp_comm_s);
  EXPECT_GT(wide_overlap.tp_comm_s / wide.tp_comm_s, hidden.tp_comm_s / plain.tp_comm_s);
  std::printf("gpt3 175b tp comm: tp=8 %.2f s -> %.2f s overlapped; tp=16 %.2f s -> %.2f s\n",
              plain.tp_comm_s, hidden.tp_comm_s, wide.tp_comm_s, wide_overlap.tp_comm_s);
}

// With few kv heads (LLaMA-3 70B: 8 of 64) the ring's k/v shifts move less
// than Ulysses' all_to_alls of q, k, v and out, and hide under the blocks'
// compute: where both run, the ring is the cheaper cp.
TEST(PlanRing, BeatsUlyssesWithFewKvHeads) {
  CostModel cm(TrainingJob{load_model("llama3_70b.json"), 64, 8192},
               load_sized_cluster("dgx_a100_80gb.json", 64));
  Plan p;
  p.dp = 8, p.tp = 4, p.cp = 2, p.micro_batch = 1, p.num_micro_batches = 8, p.zero = 1;
  p.recompute = Recompute::kFull;
  ASSERT_TRUE(cm.invalid_reason(p).empty()) << cm.invalid_reason(p);
  const StepCost ulysses = value_or_throw(cm.price(p));
  p.ring = true;
  const StepCost ring = value_or_throw(cm.price(p));
  EXPECT_LT(ring.comm.context_parallel, ulysses.comm.context_parallel);
  EXPECT_LT(ring.cp_comm_s, ulysses.cp_comm_s);
  EXPECT_LT(ring.step_time_s, ulysses.step_time_s);
  std::printf(
      "llama3 70b cp=2 tp=4: ulysses %.2f s (cp %.3f s, %.1f GB), ring %.2f s (%.3f s, %.1f GB)\n",
      ulysses.step_time_s, ulysses.cp_comm_s, ulysses.comm.context_parallel / 1e9, ring.step_time_s,
      ring.cp_comm_s, ring.comm.context_parallel / 1e9);
}

// The ring's shifts run while its blocks compute: priced as what the compute
// does not hide. Its bytes grow with the sequence, its compute with the
// square: at 8k the shifts (over the nodes' links) are mostly exposed, at
// 128k mostly hidden, though they carry 16x the bytes.
TEST(PlanRing, ShiftsHideUnderTheBlocksCompute) {
  ModelConfig model = load_model("llama3_8b.json");
  std::get<LlamaConfig>(model).max_position_embeddings = 131072;
  Plan p;
  p.dp = 1, p.cp = 16, p.micro_batch = 1, p.num_micro_batches = 16, p.zero = 1, p.ring = true;
  p.recompute = Recompute::kFull;
  StepCost at[2];
  const int64_t seqs[2] = {8192, 131072};
  for (int i = 0; i < 2; ++i) {
    CostModel cm(TrainingJob{model, 16, seqs[i]}, load_sized_cluster("dgx_a100_80gb.json", 16));
    ASSERT_TRUE(cm.invalid_reason(p).empty()) << cm.invalid_reason(p);
    at[i] = value_or_throw(cm.price(p));
  }
  EXPECT_NEAR(at[1].comm.context_parallel / at[0].comm.context_parallel, 16.0, 0.1);
  EXPECT_GT(at[0].cp_comm_s, at[0].compute_s) << "8k: the shifts outlast the blocks";
  EXPECT_LT(at[1].cp_comm_s, 0.25 * 16 * at[0].cp_comm_s) << "128k: most of them hidden";
  EXPECT_LT(at[1].cp_comm_s, 0.2 * at[1].compute_s);
  // The zigzag order cuts the sequence into 2*cp chunks: 4104 = 8 x 513 is
  // split by cp=8, but not into 16 chunks.
  CostModel odd(TrainingJob{model, 16, 4104}, load_sized_cluster("dgx_a100_80gb.json", 16));
  p.cp = 8, p.dp = 2, p.num_micro_batches = 8;
  EXPECT_NE(odd.invalid_reason(p).find("2*cp = 16 chunks"), std::string::npos)
      << odd.invalid_reason(p);
  std::printf("ring cp=16 exposed shifts: %.2f s at 8k (compute %.2f s), %.2f s at 128k (%.2f s)\n",
              at[0].cp_comm_s, at[0].compute_s, at[1].cp_comm_s, at[1].compute_s);
}

// Ring attention beside Megatron-SP (Plan::sp with Plan::ring, preset
// "ring-sp"; Megatron-Core's --sequence-parallel --cp-comm-type p2p,
// TorchTitan's 4D runs): valid and priced on the program the partitioner
// builds, its norms and residuals on seq / (cp x tp) rows, so it stashes
// less than the ring without sp; its tp traffic is sp's all_gathers and
// reduce_scatters. Until 2026-11-27 the cost model refused it ("no sp").
TEST(PlanRing, BesideSequenceParallelStashesLess) {
  ModelConfig model = load_model("llama3_70b.json");
  std::get<LlamaConfig>(model).max_position_embeddings = 32768;
  CostModel cm(TrainingJob{model, 64, 32768}, load_sized_cluster("h100_sxm.json", 64));
  Plan p;
  p.dp = 2, p.tp = 8, p.cp = 4, p.micro_batch = 1, p.num_micro_batches = 32, p.zero = 1;
  p.ring = true;
  p.recompute = Recompute::kSelective;
  ASSERT_TRUE(cm.invalid_reason(p).empty()) << cm.invalid_reason(p);
  const StepCost ring = value_or_throw(cm.price(p));
  p.sp = true;
  ASSERT_TRUE(cm.invalid_reason(p).empty()) << cm.invalid_reason(p);
  const StepCost ring_sp = value_or_throw(cm.price(p));
  EXPECT_LT(ring_sp.memory.activations, 0.8 * ring.memory.activations);
  // sp's tp traffic: the forward's all_gather + reduce_scatter move an
  // all_reduce's bytes; the backward gathers the stashed shard again for the
  // weight gradients (Korthikanti et al. 2022, §4.2.2), so somewhat more.
  EXPECT_GT(ring_sp.comm.tensor_parallel, ring.comm.tensor_parallel);
  EXPECT_LT(ring_sp.comm.tensor_parallel, 1.5 * ring.comm.tensor_parallel);
  EXPECT_GT(ring_sp.cp_comm_s + ring_sp.compute_s, 0.0);
  std::printf(
      "llama3 70B 32k tp=8 cp=4ring: activations %.1f GiB, with sp %.1f GiB; step %.2f s, "
      "%.2f s\n",
      ring.memory.activations / (1 << 30), ring_sp.memory.activations / (1 << 30), ring.step_time_s,
      ring_sp.step_time_s);
  p.tp = 1, p.dp = 16, p.num_micro_batches = 4;
  EXPECT_NE(cm.invalid_reason(p).find("sp (sequence parallelism) needs tp > 1"), std::string::npos)
      << cm.invalid_reason(p);
}

// Compute slowed under an overlapped collective by the ring it runs on
// (CostModel::overlap_slowdown_on): Lee et al. 2025's figure on a node's GPU
// links, a NIC's share of it on a ring with one GPU per node. The constant
// reproduces both of the paper's averages in this model: overlapped, the
// compute takes 1.189x its time alone, and one after the other the step takes
// 1.102x the overlapped one.
TEST(PlanCostModel, OverlapSlowsComputeByTheRingsBandwidth) {
  const Cluster c = load_sized_cluster("h100_sxm.json", 64);
  const TrainingJob job{load_model("gpt3_13b.json"), 64, 2048};
  const CostModel cm(job, c);
  const double s = CostConstants{}.overlap_compute_slowdown;
  const double compute = 1.0, comm = 1.102 * 1.189 - 1;  // the paper's communication share
  EXPECT_NEAR(compute + CostModel::overlap_exposed_s(comm, compute, s), 1.189, 0.005);
  EXPECT_NEAR(CostModel::overlap_exposed_s(3.0, compute, s), 2.0, 1e-12);  // outlasts it
  EXPECT_EQ(CostModel::overlap_exposed_s(0.0, compute, s), 0.0);

  // By link: the node's links, one NIC, two striped NICs, eight (capped).
  const double nic_share = c.inter_node.effective_bandwidth() / c.intra_node.effective_bandwidth();
  ASSERT_LT(nic_share, 0.5);
  EXPECT_DOUBLE_EQ(cm.overlap_slowdown_on(c.intra_node), s);
  EXPECT_NEAR(cm.overlap_slowdown_on(c.inter_node), s * nic_share, 1e-12);
  EXPECT_NEAR(cm.overlap_slowdown_on(c.ring_link_for_axis(16, 4)), 2 * s * nic_share, 1e-12);
  EXPECT_DOUBLE_EQ(cm.overlap_slowdown_on(c.ring_link_for_axis(64, 1)), s);

  // ZeRO-3 prices it: the share of the layers' hidden gathers and
  // reduce_scatters a step pays is s / (1 + s) on one node's ring, and the
  // NIC's smaller slowdown on a ring with one GPU per node (tp = 8).
  auto exposed_share = [&](const Plan& p) {
    CostConstants none, all;
    none.overlap_compute_slowdown = 0;  // the first gather and last reduce_scatter
    all.zero3_prefetch = false;         // every collective
    const double d = value_or_throw(cm.price(p)).dp_comm_s;
    const double lo = value_or_throw(CostModel(job, c, none).price(p)).dp_comm_s;
    const double hi = value_or_throw(CostModel(job, c, all).price(p)).dp_comm_s;
    return (d - lo) / (hi - lo);
  };
  Plan fsdp;
  fsdp.dp = 8, fsdp.micro_batch = 1, fsdp.num_micro_batches = 8, fsdp.zero = 3;
  const double on_node = exposed_share(fsdp);
  EXPECT_NEAR(on_node, s / (1 + s), 0.02);
  Plan at_nic = fsdp;  // a layer's compute still longer than its gathers at the NIC
  at_nic.tp = 8, at_nic.micro_batch = 8, at_nic.num_micro_batches = 1;
  const double s_nic = s * nic_share;
  const double across = exposed_share(at_nic);
  EXPECT_NEAR(across, s_nic / (1 + s_nic), 0.02);
  std::printf(
      "overlap slowdown: %.2f on a node's links, %.2f at a NIC; ZeRO-3 exposes %.2f and %.2f "
      "of its hidden collectives\n",
      s, s_nic, on_node, across);
}

// TorchTitan's op-level SAC (CostConstants::selective_is_op_sac, what
// `--emit torchtitan` writes for selective recompute): every second matmul of
// a block (LLaMA: wk, wo, w3) and everything but the matmuls and the
// attention recompute; the block keeps its input, wq's, wv's, w1's and w2's
// outputs and the attention's. Megatron-LM's selective recompute (the
// attention core) saves nothing under a fused kernel.
TEST(PlanCostModel, TorchTitansOpSacRecomputesEverySecondMatmul) {
  const ModelConfig model = load_model("llama3_8b.json");
  const TrainingJob job{model, 16, 8192};
  const Cluster c = load_sized_cluster("h100_sxm.json", 8);
  const TransformerDims d = value_or_throw(transformer_dims(model));
  // wk, wo, w3 of wq, wk, wv, wo, w1, w3, w2: (h kv + h^2 + h f) / (2h^2 + 2h kv + 3h f).
  EXPECT_NEAR(op_sac_matmul_share(d), 79.69 / 218.10, 1e-3);
  EXPECT_TRUE(stack_constants(EmitTarget::kTorchTitan, true).selective_is_op_sac);

  Plan p;
  p.dp = 8, p.micro_batch = 2, p.num_micro_batches = 1, p.zero = 3;
  CostConstants op_sac;
  op_sac.selective_is_op_sac = true;
  auto priced = [&](Recompute rc, const CostConstants& k) {
    Plan q = p;
    q.recompute = rc;
    return value_or_throw(CostModel(job, c, k).price(q));
  };
  const StepCost megatron = priced(Recompute::kSelective, CostConstants{});
  const StepCost sac = priced(Recompute::kSelective, op_sac);
  const StepCost full = priced(Recompute::kFull, op_sac);
  const StepCost none = priced(Recompute::kNone, op_sac);
  // Time: the recomputed matmuls' share of the blocks' forward matmuls plus
  // their other forward work, per block.
  const LayerCost lc = value_or_throw(CostModel(job, c, op_sac).layer_cost(1, 1, 2));
  const double per_block = lc.forward_matmul_s * op_sac_matmul_share(d) + lc.forward_s -
                           lc.forward_matmul_s - lc.attention_core_s;
  ASSERT_GT(lc.forward_matmul_s, 0.5 * lc.forward_s);
  EXPECT_NEAR(sac.recompute_s, double(d.layers) * per_block, 1e-9 * sac.recompute_s);
  EXPECT_LT(sac.recompute_s, 0.5 * full.recompute_s);
  // Memory: compiled, the saved tensors are 2(3h + kv + f) bytes a token
  // against the 12h + 4kv + 6f of no recompute (0.40 of it for LLaMA-3 8B;
  // measured 13.0 / 36.5 = 0.36, docs/cluster.md).
  const double h = double(d.hidden), kv = double(d.kv_heads * d.head_dim), f = double(d.ffn);
  const double kept = sac.memory.activations / none.memory.activations;
  EXPECT_NEAR(kept, 2 * (3 * h + kv + f) / (12 * h + 4 * kv + 6 * f), 0.01);
  EXPECT_GT(sac.memory.activations, full.memory.activations);
  EXPECT_NEAR(megatron.memory.activations, none.memory.activations, 0.01 * none.memory.activations);
  std::printf(
      "llama3 8b, s=8192, mb 2: recompute megatron-selective %.3f s, op-sac %.3f s, full "
      "%.3f s; activations op-sac %.1f GiB of %.1f (none), %.1f (full)\n",
      megatron.recompute_s, sac.recompute_s, full.recompute_s,
      sac.memory.activations / (1ull << 30), none.memory.activations / (1ull << 30),
      full.memory.activations / (1ull << 30));
}

// Eager PyTorch (CostConstants::eager) keeps what a LLaMA block's Python
// leaves for the backward: the RMSNorms' f32 copies, RoPE's f32 q and k, K
// and V repeated to every head, silu's output beside w1's and w3's (53 B a
// token and hidden unit for LLaMA-3 8B in bf16, measured 52.0 on an H200,
// against Korthikanti's 34, which the compiled block's 36.5 follows); its
// op-level SAC caches w2's output too (15.5, measured 15.0; 13.5 compiled,
// measured 13.0). The loss's peak per logit: 11.44 B eager, 3.44 compiled
// (TorchTitan's stack compiles it with the model), 8 elsewhere.
TEST(PlanCostModel, EagerPyTorchKeepsItsIntermediatesAndItsF32Loss) {
  const ModelConfig model = load_model("llama3_8b.json");
  const TrainingJob job{model, 16, 8192};
  const Cluster c = load_sized_cluster("h100_sxm.json", 8);
  const TransformerDims d = value_or_throw(transformer_dims(model));
  Plan p;
  p.dp = 8, p.micro_batch = 2, p.num_micro_batches = 1, p.zero = 3;
  const double per_unit = 2.0 * 8192 * double(d.hidden);  // tokens x hidden of one micro-batch
  const auto per_token_h = [&](Recompute rc, bool op_sac, bool eager) {
    Plan q = p;
    q.recompute = rc;
    return layer_activation_bytes(d, q, job.seq, AttentionKernel::kFused, 2.0, op_sac, eager) /
           per_unit;
  };
  EXPECT_NEAR(per_token_h(Recompute::kNone, false, false), 34.0, 0.1);
  EXPECT_NEAR(per_token_h(Recompute::kNone, false, true), 53.0, 0.1);
  EXPECT_NEAR(per_token_h(Recompute::kSelective, true, true), 15.5, 0.1);
  EXPECT_NEAR(per_token_h(Recompute::kSelective, true, false), 13.5, 0.1);
  // Full recompute keeps the block's input either way; GPT's eager blocks
  // are ATen's fused ops (layer_norm, gelu): Korthikanti's count.
  EXPECT_EQ(per_token_h(Recompute::kFull, false, true),
            per_token_h(Recompute::kFull, false, false));
  TransformerDims gpt = d;
  gpt.llama = false;
  Plan q = p;
  EXPECT_EQ(layer_activation_bytes(gpt, q, job.seq, AttentionKernel::kFused, 2.0, false, true),
            layer_activation_bytes(gpt, q, job.seq, AttentionKernel::kFused, 2.0, false, false));

  // The planner's memory: activations and the head's loss move by what the
  // constants say, and `--emit torchtitan` prices the compiled loss.
  CostConstants titan = stack_constants(EmitTarget::kTorchTitan, true);
  EXPECT_EQ(titan.loss_bytes_per_logit, CostConstants::kCompiledLossBytesPerLogit);
  CostConstants eager = titan;
  set_eager(&eager);
  EXPECT_TRUE(eager.eager);
  EXPECT_EQ(eager.elementwise_cost, CostConstants::kEagerElementwise);
  p.recompute = Recompute::kNone;
  const StepCost compiled_cost = value_or_throw(CostModel(job, c, titan).price(p));
  const StepCost eager_cost = value_or_throw(CostModel(job, c, eager).price(p));
  const double logits = 2.0 * 8192 * double(d.vocab);
  // (Without recompute there is no recompute working set in the temporaries.)
  EXPECT_NEAR(eager_cost.memory.temporaries - compiled_cost.memory.temporaries,
              (11.44 - 3.44) * logits, 1e-6 * logits);
  EXPECT_NEAR(eager_cost.memory.activations / compiled_cost.memory.activations, 53.0 / 34.0, 0.01);
}

// ZeRO-3 over 8 ranks, one micro-batch of 2: the FP8 gather tests' plan.
Plan fsdp_over_8() {
  Plan p;
  p.dp = 8, p.micro_batch = 2, p.num_micro_batches = 1, p.zero = 3;
  return p;
}

// FSDP's weight gathers in FP8 (TorchTitan's enable_fsdp_float8_all_gather).
CostConstants fp8_gathers() {
  CostConstants k;
  k.fp8_weight_gather = true;
  return k;
}

// TrainingJob::fp8: the blocks' linear GEMMs at the device's FP8 rate plus
// the casts of their operands (2 bytes an input element a GEMM: read 2, write
// both layouts, shared by two GEMMs); the
// attention and the head stay 16-bit. A device without an FP8 rate refuses it.
TEST(PlanCostModel, Fp8RunsTheBlocksLinearsAtTheFp8Rate) {
  const ModelConfig model = load_model("llama3_8b.json");
  TrainingJob job{model, 16, 8192};
  const Cluster c = load_sized_cluster("h100_sxm.json", 8);
  const LayerCost bf16 = value_or_throw(CostModel(job, c).layer_cost(1, 1, 2));
  job.fp8 = true;
  const CostModel cm(job, c);
  ASSERT_TRUE(cm.status().is_ok()) << cm.status().message();
  const LayerCost fp8 = value_or_throw(cm.layer_cost(1, 1, 2));
  EXPECT_DOUBLE_EQ(fp8.attention_core_s, bf16.attention_core_s);
  EXPECT_DOUBLE_EQ(fp8.head_fwd_s, bf16.head_fwd_s);
  EXPECT_DOUBLE_EQ(fp8.embed_fwd_s, bf16.embed_fwd_s);
  // The block's forward GEMMs: wq, wk, wv, wo, w1, w3, w2 over 16384 tokens.
  const TransformerDims d = value_or_throw(transformer_dims(model));
  const double h = double(d.hidden), kv = double(d.kv_heads * d.head_dim), f = double(d.ffn);
  const double tokens = 2.0 * 8192;
  const std::vector<std::pair<double, double>> kn = {{h, h}, {h, kv}, {h, kv}, {h, h},
                                                     {h, f}, {h, f},  {f, h}};
  const double scale = CostConstants{}.matmul_efficiency_scale;
  double gemm = 0, cast = 0;
  for (const auto& [k, n] : kn) {
    gemm += c.fp8_matmul_time_s(2 * tokens * k * n) / scale;
    cast += c.memory_time_s(2.0 * (tokens * k + k * n));
  }
  EXPECT_NEAR(fp8.forward_matmul_s, gemm + cast, 1e-3 * fp8.forward_matmul_s);
  EXPECT_LT(fp8.forward_matmul_s, 0.65 * bf16.forward_matmul_s);
  // Transformer Engine's weight cache (Megatron-Core's schedules): the GEMMs
  // cast their activations and gradients alone; the step casts the stage's
  // block weights once (4 bytes an element: read, FP8 copy, its transpose).
  CostConstants cached;
  cached.fp8_weight_cache = true;
  const CostModel te(job, c, cached);
  double cast_x = 0;
  for (const auto& [k, n] : kn) cast_x += c.memory_time_s(2.0 * tokens * k);
  EXPECT_NEAR(value_or_throw(te.layer_cost(1, 1, 2)).forward_matmul_s, gemm + cast_x,
              1e-3 * fp8.forward_matmul_s);
  Plan accumulating;
  accumulating.dp = 1, accumulating.micro_batch = 2, accumulating.num_micro_batches = 8;
  const StepCost every = value_or_throw(cm.price(accumulating));
  const StepCost once = value_or_throw(te.price(accumulating));
  EXPECT_NEAR(once.optimizer_s - every.optimizer_s,
              c.memory_time_s(4.0 * double(d.layers) * double(fp8.layer_params)),
              1e-9 * once.optimizer_s);
  // Saved: the weight's cast in each forward and input-gradient GEMM of
  // every block, for each of the 8 micro-batches, less the step's one cast.
  EXPECT_NEAR(every.step_time_s - once.step_time_s,
              8.0 * 2 * double(d.layers) * (cast - cast_x) - (once.optimizer_s - every.optimizer_s),
              0.05 * 8.0 * 2 * double(d.layers) * (cast - cast_x));
  std::printf(
      "llama3 8b block forward GEMMs, s=8192 mb 2 on H100: bf16 %.2f ms, fp8 %.2f ms "
      "(%.2f of it the casts)\n",
      1e3 * bf16.forward_matmul_s, 1e3 * fp8.forward_matmul_s, 1e3 * cast);
  // FSDP's gathers in FP8 (TorchTitan's enable_fsdp_float8_all_gather): a
  // ZeRO-3 step moves the blocks' weights at 1 byte an element, the
  // gradients' reduce_scatters and the embedding/head's gathers unchanged.
  const StepCost g16 = value_or_throw(CostModel(job, c).price(fsdp_over_8()));
  const StepCost g8 = value_or_throw(CostModel(job, c, fp8_gathers()).price(fsdp_over_8()));
  const double blocks = double(d.layers) * double(fp8.layer_params);
  const double all = blocks + double(fp8.embed_params + fp8.head_params);
  // Two gathers a step (forward, backward) of every weight, over 8 ranks.
  EXPECT_NEAR(g16.comm.data_parallel - g8.comm.data_parallel, 2 * 7.0 / 8 * blocks * (2 - 1),
              1e-6 * g16.comm.data_parallel);
  EXPECT_LT(g8.dp_comm_s, g16.dp_comm_s);
  EXPECT_GT(all, blocks);
  const CostModel a100(job, load_sized_cluster("dgx_a100_80gb.json", 8));
  EXPECT_NE(a100.status().message().find("FP8 training needs the device's FP8 tensor-core rate"),
            std::string::npos)
      << a100.status().message();
}

// TrainingJob::fp8_scaling rowwise (torchao's rowwise recipe): each GEMM casts
// both its operands itself (4 bytes an input element on average, no shared
// FP8 copy) and
// runs at fp8_rowwise_gemm_efficiency of the FP8 rate; FSDP gathers the
// weights in 16-bit, and Transformer Engine's weight cache does not apply.
TEST(PlanCostModel, Fp8RowwiseCastsPerGemmOnSlowerKernels) {
  const ModelConfig model = load_model("llama3_8b.json");
  TrainingJob job{model, 16, 8192};
  job.fp8 = true;
  const Cluster c = load_sized_cluster("h100_sxm.json", 8);
  const LayerCost tensorwise = value_or_throw(CostModel(job, c).layer_cost(1, 1, 2));
  job.fp8_scaling = Fp8Scaling::kRowwise;
  const LayerCost rowwise = value_or_throw(CostModel(job, c).layer_cost(1, 1, 2));
  const TransformerDims d = value_or_throw(transformer_dims(model));
  const double h = double(d.hidden), kv = double(d.kv_heads * d.head_dim), f = double(d.ffn);
  const double tokens = 2.0 * 8192;
  const std::vector<std::pair<double, double>> kn = {{h, h}, {h, kv}, {h, kv}, {h, h},
                                                     {h, f}, {h, f},  {f, h}};
  const CostConstants k;
  ASSERT_GT(k.fp8_rowwise_gemm_efficiency, 0.5);
  ASSERT_LT(k.fp8_rowwise_gemm_efficiency, 1.0);
  double gemm = 0, cast = 0;
  for (const auto& [kk, n] : kn) {
    gemm += c.fp8_matmul_time_s(2 * tokens * kk * n) /
            (k.matmul_efficiency_scale * k.fp8_rowwise_gemm_efficiency);
    cast += c.memory_time_s(4.0 * (tokens * kk + kk * n));
  }
  EXPECT_NEAR(rowwise.forward_matmul_s, gemm + cast, 1e-3 * rowwise.forward_matmul_s);
  EXPECT_GT(rowwise.forward_matmul_s, 1.1 * tensorwise.forward_matmul_s);
  EXPECT_DOUBLE_EQ(rowwise.attention_core_s, tensorwise.attention_core_s);
  // Transformer Engine's cache is a tensorwise recipe's: a rowwise job casts
  // its weights in every GEMM and pays no step cast.
  CostConstants cached;
  cached.fp8_weight_cache = true;
  EXPECT_DOUBLE_EQ(value_or_throw(CostModel(job, c, cached).layer_cost(1, 1, 2)).forward_matmul_s,
                   rowwise.forward_matmul_s);
  // FSDP's FP8 gathers are tensorwise's alone: rowwise gathers 16-bit.
  const StepCost plain = value_or_throw(CostModel(job, c).price(fsdp_over_8()));
  const StepCost asked = value_or_throw(CostModel(job, c, fp8_gathers()).price(fsdp_over_8()));
  EXPECT_DOUBLE_EQ(asked.comm.data_parallel, plain.comm.data_parallel);
  // The names, and a wrong one named with the two valid.
  EXPECT_EQ(value_or_throw(parse_fp8_scaling("rowwise", "x")), Fp8Scaling::kRowwise);
  EXPECT_STREQ(fp8_scaling_name(Fp8Scaling::kTensorwise), "tensorwise");
  const Result<Fp8Scaling> bad = parse_fp8_scaling("blockwise", "--fp8-scaling");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("--fp8-scaling must be tensorwise (one scale a tensor) or "
                                        "rowwise"),
            std::string::npos)
      << bad.status().message();
  std::printf(
      "llama3 8b block forward GEMMs, s=8192 mb 2 on H100: fp8 tensorwise %.2f ms, "
      "rowwise %.2f ms\n",
      1e3 * tensorwise.forward_matmul_s, 1e3 * rowwise.forward_matmul_s);
}

// CostConstants::fp8_tp_all_gather (TorchTitan's enable_float8_tensorwise_tp):
// a sequence-parallel block's tp all_gathers move 1 byte an element under
// tensorwise FP8, its reduce_scatters 16-bit; rowwise gathers in 16-bit.
TEST(PlanCostModel, Fp8TensorwiseGathersTheTpActivationsInFp8) {
  TrainingJob job{load_model("llama3_70b.json"), 16, 8192};
  job.fp8 = true;
  const Cluster c = load_sized_cluster("h100_sxm.json", 8);
  CostConstants titan;
  titan.fp8_tp_all_gather = true;
  const LayerCost plain = value_or_throw(CostModel(job, c).layer_cost(8, 1, 1, true));
  const LayerCost fp8 = value_or_throw(CostModel(job, c, titan).layer_cost(8, 1, 1, true));
  // Two gathers and two reduce_scatters of s x h a block and pass, each
  // moving 7/8 of the buffer: the gathers' half of the bytes is halved.
  const double buffer = 8192.0 * 8192.0 * 2;
  const double per_pass = 4 * 7.0 / 8 * buffer;
  EXPECT_NEAR(plain.tp_fwd_bytes, per_pass, 1e-6 * per_pass);
  EXPECT_NEAR(fp8.tp_fwd_bytes, 0.75 * per_pass, 1e-6 * per_pass);
  EXPECT_LT(fp8.tp_fwd_s, plain.tp_fwd_s);
  EXPECT_LT(fp8.tp_bwd_s, plain.tp_bwd_s);
  job.fp8_scaling = Fp8Scaling::kRowwise;
  const LayerCost rowwise = value_or_throw(CostModel(job, c, titan).layer_cost(8, 1, 1, true));
  EXPECT_DOUBLE_EQ(rowwise.tp_fwd_bytes, plain.tp_fwd_bytes);
}

// The H200 is an H100 with 1.43 times the memory bandwidth: a block's
// GEMMs and attention run at the same rates, its memory-bound ops faster.
// Measured on one of each (PyTorch 2.11, bench/gpu/hopper_kernels.py's block
// section, bench/gpu/results/), a block's forward and backward took, on the
// H200 over the H100: LLaMA-3 8B (2 x 8192 tokens) 0.980 compiled and 0.962
// eager; 70B and 405B at tp = 8 (8192 tokens, eager) 0.913 and 0.941. The
// cluster files give the same ratios within 0.02.
TEST(PlanCostModel, H200PricesMemoryBoundWorkByItsBandwidth) {
  struct Case {
    const char* model;
    int64_t tp, micro_batch;
    bool eager;
    double measured;
  };
  for (const Case& k : {Case{"llama3_8b.json", 1, 2, false, 43.81 / 44.69},
                        Case{"llama3_8b.json", 1, 2, true, 49.61 / 51.56},
                        Case{"llama3_70b.json", 8, 1, true, 15.16 / 16.60},
                        Case{"llama3_405b.json", 8, 1, true, 44.23 / 47.00}}) {
    const TrainingJob job{load_model(k.model), 16, 8192};
    CostConstants constants;
    if (k.eager) set_eager(&constants);
    double t[2];
    int i = 0;
    for (const char* name : {"h100_sxm.json", "h200_sxm.json"}) {
      const LayerCost lc = value_or_throw(CostModel(job, load_sized_cluster(name, 8), constants)
                                              .layer_cost(k.tp, 1, k.micro_batch));
      t[i++] = lc.forward_s + lc.backward_s + lc.weight_grad_s;
    }
    EXPECT_NEAR(t[1] / t[0], k.measured, 0.02) << k.model << " eager " << k.eager;
    EXPECT_LT(t[1], t[0]) << k.model;
    std::printf("%s tp=%lld eager=%d: h200 / h100 %.3f predicted, %.3f measured\n", k.model,
                static_cast<long long>(k.tp), int(k.eager), t[1] / t[0], k.measured);
  }
}

// A power limit (TorchTitan's H100s ran at 500 of their 700 W): the GEMMs and
// the fused attention at the cube root of the power ratio of the rated
// clock, the optimizer's memory-bound pass and the collectives as before.
TEST(PlanCostModel, PowerLimitSlowsTheGemmsAndAttentionAlone) {
  const TrainingJob job{load_model("llama3_8b.json"), 16, 8192};
  const Cluster rated = load_sized_cluster("h100_96gb.json", 8);
  Cluster capped = rated;
  ASSERT_DOUBLE_EQ(rated.device.rated_power_w, 700);
  capped.device.power_limit_w = 500;
  const double s = std::cbrt(500.0 / 700.0);
  const LayerCost a = value_or_throw(CostModel(job, rated).layer_cost(1, 1, 2));
  const LayerCost b = value_or_throw(CostModel(job, capped).layer_cost(1, 1, 2));
  EXPECT_NEAR(b.forward_matmul_s, a.forward_matmul_s / s, 1e-9 * a.forward_matmul_s);
  EXPECT_NEAR(b.attention_core_s, a.attention_core_s / s, 1e-9 * a.attention_core_s);
  Plan p;
  p.dp = 8, p.micro_batch = 2, p.num_micro_batches = 1, p.zero = 3;
  const StepCost r = value_or_throw(CostModel(job, rated).price(p));
  const StepCost c = value_or_throw(CostModel(job, capped).price(p));
  EXPECT_DOUBLE_EQ(c.optimizer_s, r.optimizer_s);
  EXPECT_DOUBLE_EQ(c.comm.data_parallel, r.comm.data_parallel);  // the bytes the step moves
  EXPECT_GT(c.compute_s, r.compute_s * 1.05);
  EXPECT_LT(c.step_time_s, r.step_time_s / s);  // not everything is compute-bound
  std::printf("llama3 8b dp=8 zero3 on h100_96gb: %.3f s at 700 W, %.3f s at 500 W (%.3f)\n",
              r.step_time_s, c.step_time_s, c.step_time_s / r.step_time_s);
}

}  // namespace
}  // namespace meshflow::plan
