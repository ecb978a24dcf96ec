// Auto mode for local runs (plan/auto_plan.h): the planner picks a dp/tp/ZeRO/
// recompute plan for N in-process ranks of this machine's calibrated cluster,
// returned as a semi-mode "parallel" object the Trainer runs; and the pieces it
// stands on: share_machine (ranks sharing the cores) and the static-arena
// memory model (the executor's own memory planner over the local program).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

#include "cli_run.h"
#include "meshflow/cli/plan_check.h"
#include "meshflow/comm/communicator.h"
#include "meshflow/comm/local_world.h"
#include "meshflow/engine/job.h"
#include "meshflow/engine/pipeline_trainer.h"
#include "meshflow/engine/trainer.h"
#include "meshflow/plan/auto_plan.h"
#include "meshflow/plan/calibrate.h"
#include "meshflow/plan/simulate.h"
#include "scoped_env.h"

namespace meshflow::plan {
namespace {

json small_gpt() {
  return {{"model_type", "gpt2"},
          {"n_layer", 2},
          {"n_embd", 64},
          {"n_head", 4},
          {"n_positions", 64},
          {"vocab_size", 256},
          {"tie_word_embeddings", true}};
}

RunConfig run_config(const json& parallel, int batch = 8, int micro_batches = 1) {
  json doc = {{"model", small_gpt()},
              {"data", {{"dataset", "fortunes"}}},
              {"train",
               {{"steps", 1},
                {"batch_size", batch},
                {"micro_batches", micro_batches},
                {"seq_len", 32},
                {"eval_batches", 1}}},
              {"optimizer", {{"type", "adamw"}, {"lr", 1e-3}}}};
  if (!parallel.is_null()) doc["parallel"] = parallel;
  return value_or_throw(parse_run_config(doc, ""));
}

Cluster local() {
  Result<Cluster> c = load_local_cluster();
  EXPECT_TRUE(c.is_ok()) << c.status().message();
  return c.is_ok() ? *c : Cluster{};
}

// Kernel efficiency by shape on this machine's file: the small GPT's
// matmuls (64 wide, 16-wide heads) are priced slower with the measured
// thin-GEMM curve than by their FLOPs alone, a 512-wide one's less so.
TEST(PlanAuto, ThinMatmulsArePricedByTheirShape) {
  const Cluster with = value_or_throw(share_machine(local(), 1));
  ASSERT_FALSE(with.device.matmul_thin_efficiency.empty()) << "configs/clusters/local_cpu.json";
  Cluster without = with;
  without.device.matmul_thin_efficiency = {};
  auto compute_s = [&](int64_t width, const Cluster& c) {
    json m = small_gpt();
    m["n_embd"] = width;
    // 64 sequences of 32: GEMMs of 2048 rows, where thin sides cost.
    const CostModel cm(TrainingJob{value_or_throw(parse_model_config(m)), 64, 32}, c,
                       meshflow_cpu_constants());
    Plan p;
    p.micro_batch = 64;
    return value_or_throw(cm.price(p)).compute_s;
  };
  const double narrow = compute_s(64, with) / compute_s(64, without);
  const double wide = compute_s(512, with) / compute_s(512, without);
  EXPECT_GT(narrow, 1.05);
  EXPECT_GE(wide, 1.0);
  EXPECT_LT(wide, narrow);
}

TEST(PlanAuto, ShareMachineSplitsTheDevice) {
  const Cluster m = local();
  const Cluster c = value_or_throw(share_machine(m, 4));
  EXPECT_EQ(c.total_devices(), 4);
  EXPECT_EQ(c.nodes, 1);
  EXPECT_DOUBLE_EQ(c.device.peak_flops.f32, m.device.peak_flops.f32 / 4);
  EXPECT_DOUBLE_EQ(c.device.memory_bandwidth_bytes_per_s,
                   m.device.memory_bandwidth_bytes_per_s / 4);
  // The same per-core work has the same efficiency: a call 4x smaller on a quarter.
  EXPECT_DOUBLE_EQ(c.matmul_efficiency(1e8), m.matmul_efficiency(4e8));
  Cluster two = m;
  two.devices_per_node = 2;
  Result<Cluster> bad = share_machine(two, 2);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("one-device cluster"), std::string::npos);
}

// More ranks than cores: a collective's message step takes the machine's
// measured time-shared step (Cluster::time_shared_latency_s: the shipped
// file's, 5.6 us on the 2-core VM), not the calibrated link's 1 us; a file
// without it (older calibrations) adds the transport's spin time, a bound.
// With a core a rank the link is the calibrated one.
TEST(PlanAuto, TimeSharedRanksPayTheMeasuredStep) {
  const Cluster m = local();
  ASSERT_GT(m.time_shared_latency_s, m.intra_node.latency_s);
  const Cluster shared = value_or_throw(share_machine(m, 4, 2));
  EXPECT_DOUBLE_EQ(shared.intra_node.latency_s, m.time_shared_latency_s);
  EXPECT_DOUBLE_EQ(shared.inter_node.latency_s, m.time_shared_latency_s);
  EXPECT_DOUBLE_EQ(value_or_throw(share_machine(m, 2, 2)).intra_node.latency_s,
                   m.intra_node.latency_s);
  EXPECT_DOUBLE_EQ(value_or_throw(share_machine(m, 4, 4)).intra_node.latency_s,
                   m.intra_node.latency_s);
  Cluster old = m;
  old.time_shared_latency_s = 0;
  EXPECT_DOUBLE_EQ(value_or_throw(share_machine(old, 4, 2)).intra_node.latency_s,
                   m.intra_node.latency_s + LocalTransportOptions{}.spin_us * 1e-6);
  // A ZeRO-1 step's per-tensor reduce_scatters and gathers on 4 ranks of 2
  // cores: what the measured step prices against the spin's bound.
  const ModelConfig mc = value_or_throw(parse_model_config(small_gpt()));
  Plan z1;
  z1.dp = 4, z1.micro_batch = 4, z1.num_micro_batches = 1, z1.zero = 1;
  const double measured =
      value_or_throw(CostModel(TrainingJob{mc, 16, 32}, shared, meshflow_cpu_constants()).price(z1))
          .dp_comm_s;
  const double bound =
      value_or_throw(CostModel(TrainingJob{mc, 16, 32}, value_or_throw(share_machine(old, 4, 2)),
                               meshflow_cpu_constants())
                         .price(z1))
          .dp_comm_s;
  EXPECT_LT(measured, 0.5 * bound);
}

// More ranks than cores: a pipeline's ranks waiting in its bubble give their
// cores to the others (SimCosts::cores), so 4 stages on 2 cores take less than
// on 4 dedicated quarter-machines, but no less than the work over 2 cores;
// data parallelism keeps every rank busy, its compute priced the same either way.
TEST(PlanAuto, PipelineRanksTimeShareTheCores) {
  json model = small_gpt();
  model["n_layer"] = 4;
  const ModelConfig mc = value_or_throw(parse_model_config(model));
  const Cluster shared = value_or_throw(share_machine(local(), 4, 2));
  const Cluster dedicated = value_or_throw(share_machine(local(), 4, 4));
  EXPECT_EQ(shared.shared_cores, 2);
  EXPECT_EQ(dedicated.shared_cores, 0);
  const CostModel on_two(TrainingJob{mc, 16, 32}, shared, meshflow_cpu_constants());
  const CostModel on_four(TrainingJob{mc, 16, 32}, dedicated, meshflow_cpu_constants());
  Plan pipe;
  pipe.pp = 4, pipe.micro_batch = 4, pipe.num_micro_batches = 4;
  const StepCost a = value_or_throw(on_two.price(pipe)), b = value_or_throw(on_four.price(pipe));
  EXPECT_LT(a.step_time_s, 0.9 * b.step_time_s);
  const double work = a.compute_s + a.tp_comm_s + a.pp_comm_s;  // one rank's, at a quarter
  EXPECT_GT(a.step_time_s, work * 4 / 2 / 2);  // 4 ranks' work, each core 2 quarters' speed
  // `meshflow simulate`'s trace runs the same time-shared schedule: its
  // step is the price's (its actions drawn as long as they ran, stretched
  // past their cost while more ranks than cores compute).
  const SimulatedStep sim = simulate_step(a);
  EXPECT_NEAR(sim.step_time_s / a.step_time_s, 1.0, 1e-9);
  EXPECT_LT(sim.step_time_s, 0.9 * simulate_step(b).step_time_s);
  Plan dp;
  dp.dp = 4, dp.micro_batch = 4, dp.num_micro_batches = 1;
  // (its collectives' messages pay the measured time-shared step on shared cores)
  const StepCost d2 = value_or_throw(on_two.price(dp)), d4 = value_or_throw(on_four.price(dp));
  EXPECT_DOUBLE_EQ(d2.compute_s, d4.compute_s);
  EXPECT_NEAR(d2.step_time_s - d2.dp_comm_s, d4.step_time_s - d4.dp_comm_s, 1e-3 * d4.step_time_s);
  // Auto mode's tie window: wider for the time-shared pipeline and context
  // parallel, whose predictions are the least sure.
  EXPECT_EQ(local_plan_spread(pipe, shared), kTimeSharedSyncSpread);
  EXPECT_EQ(local_plan_spread(pipe, dedicated), kLocalPlanSpread);
  EXPECT_EQ(local_plan_spread(dp, shared), kLocalPlanSpread);
  Plan ring;
  ring.cp = 4, ring.ring = true, ring.micro_batch = 16;
  EXPECT_EQ(local_plan_spread(ring, shared), kTimeSharedSyncSpread);
  EXPECT_EQ(local_plan_spread(ring, dedicated), kLocalPlanSpread);
}

// No cluster file named: this machine's calibration. A cached one of this
// machine is used as it is; one of another machine (a shipped file measured
// elsewhere, a home shared with another host) is not: this machine is
// measured once and the result cached under its device name.
TEST(PlanAuto, LocalClusterIsThisMachines) {
  const std::string dir = ::testing::TempDir() + "/mf_cluster_cache_" + std::to_string(::getpid());
  testing::ScopedEnv named("MESHFLOW_LOCAL_CLUSTER", nullptr);
  testing::ScopedEnv cache_dir("MESHFLOW_CACHE_DIR", dir.c_str());
  const std::string cache = local_cluster_cache_path();
  ASSERT_EQ(cache.rfind(dir + "/local_cpu-", 0), 0u) << cache;
  std::filesystem::create_directories(dir);
  Cluster mine =
      value_or_throw(load_cluster(testing::source_dir() + "/configs/clusters/local_cpu.json"));
  mine.device.name = this_machine_device_name();
  mine.calibrated_with = calibration_software();
  mine.device.peak_flops.f32 = 123e9;
  std::ofstream(cache) << format_cluster_json(mine);
  EXPECT_EQ(value_or_throw(load_cluster(cache)).calibrated_with, calibration_software());
  EXPECT_EQ(value_or_throw(load_local_cluster()).device.peak_flops.f32, 123e9);

  Cluster other = mine;
  other.device.name = "Some Other CPU (64 threads, OpenBLAS SGEMM)";
  std::ofstream(cache) << format_cluster_json(other);
  ::testing::internal::CaptureStderr();
  const Cluster got = value_or_throw(load_local_cluster());
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(got.device.name, this_machine_device_name());
  EXPECT_GT(got.device.peak_flops.f32, 0);
  EXPECT_NE(got.device.peak_flops.f32, 123e9);
  const Cluster cached = value_or_throw(load_cluster(cache));
  if (value_or_throw(load_cluster(testing::source_dir() + "/configs/clusters/local_cpu.json"))
          .device.name != this_machine_device_name()) {  // measured here
    EXPECT_NE(said.find("this machine is " + this_machine_device_name()), std::string::npos)
        << said;
    if (said.find("cached in " + cache) != std::string::npos) {
      EXPECT_EQ(cached.device.name, this_machine_device_name());
      EXPECT_EQ(cached.device.peak_flops.f32, got.device.peak_flops.f32);
    } else {  // measured beside other work (tests run two at a time): used, not kept
      EXPECT_NE(said.find("not cached: other processes used"), std::string::npos) << said;
      EXPECT_EQ(cached.device.name, other.device.name);
    }
  }
  // This machine's calibration by other software (another OpenBLAS, an
  // older calibration): measured again in a fresh process, and said why.
  const bool shipped_here =
      value_or_throw(load_cluster(testing::source_dir() + "/configs/clusters/local_cpu.json"))
          .device.name == this_machine_device_name();
  Cluster old = mine;
  old.calibrated_with = "meshflow calibration 0; OpenBLAS 0.0.1";
  std::ofstream(cache) << format_cluster_json(old);
  const std::string gpt = testing::source_dir() + "/configs/gpt_fortunes.json";
  const testing::CliRun s =
      testing::run_cli("explain " + gpt + " --ranks 2 --no-nodes --set " +
                       "'parallel={\"mode\": \"auto\", \"search\": \"full\"}'");
  EXPECT_EQ(s.code, 0) << s.output;
  if (!shipped_here) {
    EXPECT_NE(s.output.find("was measured with \"meshflow calibration 0; OpenBLAS 0.0.1\", this "
                            "build is \"" +
                            calibration_software() + "\""),
              std::string::npos)
        << s.output;
    const Cluster now = value_or_throw(load_cluster(cache));
    if (s.output.find("cached in " + cache) != std::string::npos) {
      EXPECT_EQ(now.calibrated_with, calibration_software());
      EXPECT_NE(now.device.peak_flops.f32, 123e9);
    }
  }
  // A cache file cut short (a crash while writing, a full disk) is passed
  // over, not an error: a fresh process (no measurement held in memory)
  // plans on the shipped file or measures again.
  std::ofstream(cache) << format_cluster_json(mine).substr(0, 40);
  const std::string cfg = testing::source_dir() + "/configs/gpt_fortunes.json";
  const testing::CliRun e =
      testing::run_cli("explain " + cfg + " --ranks 2 --no-nodes --set " +
                       "'parallel={\"mode\": \"auto\", \"search\": \"full\"}'");
  EXPECT_EQ(e.code, 0) << e.output;
  EXPECT_NE(e.output.find("planned by search"), std::string::npos) << e.output;
  // A cache directory that cannot be made (under a file): measured, used,
  // not kept, and said so; never an error.
  std::ofstream(dir + "/a_file") << "x";
  testing::ScopedEnv bad_dir("MESHFLOW_CACHE_DIR", (dir + "/a_file/cache").c_str());
  const testing::CliRun b =
      testing::run_cli("explain " + cfg + " --ranks 2 --no-nodes --set " +
                       "'parallel={\"mode\": \"auto\", \"search\": \"full\"}'");
  EXPECT_EQ(b.code, 0) << b.output;
  if (b.output.find("measured it for the planner") != std::string::npos) {
    EXPECT_NE(b.output.find("not cached"), std::string::npos) << b.output;
  }
  // A corrupt configs/clusters/local_cpu.json where the process runs (a
  // broken install), with no cache: an error naming the file, exit 2.
  std::filesystem::create_directories(dir + "/run/configs/clusters");
  std::ofstream(dir + "/run/configs/clusters/local_cpu.json") << "{\"nodes\": ";
  testing::ScopedEnv empty_cache("MESHFLOW_CACHE_DIR", (dir + "/empty").c_str());
  const std::filesystem::path cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir + "/run");
  const testing::CliRun c =
      testing::run_cli("explain " + cfg + " --ranks 2 --no-nodes --set " +
                       "'parallel={\"mode\": \"auto\", \"search\": \"full\"}'");
  std::filesystem::current_path(cwd);
  EXPECT_EQ(c.code, 2) << c.output;
  EXPECT_NE(c.output.find("configs/clusters/local_cpu.json"), std::string::npos) << c.output;
  std::filesystem::remove_all(dir);
}

TEST(PlanAuto, PlansTheMlpToo) {
  // Any model the engine builds: the MLP's dp x tp splits are priced from
  // its partitioned program; a tensor-parallel choice writes the MLP rules.
  const Cluster m = local();
  json doc = {
      {"model", {{"type", "mlp"}, {"input_dim", 784}, {"hidden", {512, 256}}, {"num_classes", 10}}},
      {"data", {{"dataset", "fashion_mnist"}}},
      {"train", {{"steps", 1}, {"batch_size", 64}, {"eval_batches", 1}}},
      {"parallel", {{"mode", "auto"}, {"search", "full"}}}};
  const RunConfig rc = value_or_throw(parse_run_config(doc, ""));
  Result<LocalAutoPlan> a = plan_local_run(rc, 2, m);
  ASSERT_TRUE(a.is_ok()) << a.status().message();
  std::set<int64_t> tps;
  for (const StepCost& c : a->candidates) tps.insert(c.plan.tp);
  EXPECT_EQ(tps, (std::set<int64_t>{1, 2}));
  const json& par = a->parallel;
  Result<StrategyConfig> sc = parse_strategy_config(par);
  ASSERT_TRUE(sc.is_ok()) << sc.status().message() << "\n" << par.dump();
  EXPECT_EQ(sc->mesh.num_ranks(), 2);
  if (a->best.plan.tp == 2 && !a->best.plan.ops) {
    EXPECT_EQ(par["rules"]["hidden"], "tp") << par.dump();
  }
  if (a->best.plan.ops) {  // the strategy search's: a split tuple for every forward node
    EXPECT_TRUE(par["strategies"].contains("fc1")) << par.dump();
  }
  // The searched layout was priced for tp=2 beside Megatron's MLP split.
  EXPECT_TRUE(std::any_of(a->candidates.begin(), a->candidates.end(),
                          [](const StepCost& c) { return c.plan.ops && c.plan.tp == 2; }));
}

TEST(PlanAuto, ValidPlanForOneTwoFourRanks) {
  const Cluster m = local();
  const RunConfig rc = run_config(json{{"mode", "auto"}, {"search", "full"}});
  for (int ranks : {1, 2, 4}) {
    SCOPED_TRACE("ranks=" + std::to_string(ranks));
    Result<LocalAutoPlan> a = plan_local_run(rc, ranks, m);
    ASSERT_TRUE(a.is_ok()) << a.status().message();
    const json& par = a->parallel;
    // dp alone runs on the bucketed data-parallel path; anything else on the partitioner.
    EXPECT_EQ(par["mode"], a->best.plan.dp == ranks && a->best.plan.zero == 0 ? "data" : "semi");
    Result<StrategyConfig> sc = parse_strategy_config(par);
    ASSERT_TRUE(sc.is_ok()) << sc.status().message() << "\n" << par.dump();
    EXPECT_EQ(sc->mesh.num_ranks(), ranks) << par.dump();
    const Plan& p = a->best.plan;
    std::printf("%d ranks: %s  (%s, predicted %.1f ms, %.1f MiB per rank, %zu candidates)\n", ranks,
                par.dump().c_str(), plan_label(p).c_str(), 1e3 * a->best.step_time_s,
                a->best.memory.total / (1 << 20), a->candidates.size());
    EXPECT_EQ(p.dp * p.tp * p.cp, ranks);
    EXPECT_EQ(p.pp, 1);
    EXPECT_TRUE(a->best.fits);
    // Every dp x tp x cp split (and sp, ring, ZeRO, recompute) was priced;
    // the chosen plan is within the spread of the fastest, and no plan within
    // it has a smaller tp x cp (or as small, fewer stages, or none without
    // ZeRO when it uses ZeRO).
    std::set<int64_t> tps, cps;
    EXPECT_EQ(a->spread,
              local_plan_spread(a->fastest.plan, value_or_throw(share_machine(m, ranks))));
    const double within = a->fastest.step_time_s * (1 + a->spread);
    EXPECT_LE(a->best.step_time_s, within);
    for (const StepCost& c : a->candidates) {
      tps.insert(c.plan.tp);
      cps.insert(c.plan.cp);
      if (!c.fits) continue;
      EXPECT_LE(a->fastest.step_time_s, c.step_time_s) << plan_label(c.plan);
      if (c.step_time_s > within) continue;
      EXPECT_GE(c.plan.tp * c.plan.cp, p.tp * p.cp) << plan_label(c.plan);
      if (c.plan.tp * c.plan.cp == p.tp * p.cp && c.plan.pp == p.pp && p.zero > 0) {
        EXPECT_GT(c.plan.zero, 0) << plan_label(c.plan);
      }
    }
    EXPECT_EQ(static_cast<int>(tps.size()), ranks == 1 ? 1 : (ranks == 2 ? 2 : 3));
    EXPECT_EQ(static_cast<int>(cps.size()), ranks == 1 ? 1 : (ranks == 2 ? 2 : 3));
    if (ranks > 1) {
      const bool has_zero3 = std::any_of(a->candidates.begin(), a->candidates.end(),
                                         [](const StepCost& c) { return c.plan.zero == 3; });
      EXPECT_TRUE(has_zero3);
    }
    Result<json> section = auto_parallel_section(rc, ranks, m);
    ASSERT_TRUE(section.is_ok());
    EXPECT_EQ(*section, par);
  }
}

TEST(PlanAuto, ChosenPlanTrains) {
  const Cluster m = local();
  RunConfig rc = run_config(json{{"mode", "auto"}, {"search", "full"}});
  const json par = value_or_throw(auto_parallel_section(rc, 2, m));
  RunConfig run = run_config(par);
  if (par["recompute"] == "full") run.train.recompute.mode = RecomputePolicy::kFull;
  if (par["recompute"] == "selective") run.train.recompute.mode = RecomputePolicy::kSelective;
  Status s = run_local_ranks(2, [&](const std::shared_ptr<Transport>& t) -> Status {
    MF_ASSIGN_OR_RETURN(auto tr, Trainer::create(run, Communicator::world(t)));
    const StepResult r = tr->step();
    if (!(r.loss > 0)) return Status::internal("loss " + std::to_string(r.loss));
    return Status::ok();
  });
  EXPECT_TRUE(s.is_ok()) << s.message() << "\n" << par.dump();
}

// The strategy search's plans (Plan::ops) are auto mode's candidates beside
// the template layouts, for every tp x cp > 1; the section of one carries its
// split tuples (with cp, in zigzag order), and the trainer running it holds
// the memory the planner predicted (within 5%: the planner priced the program
// those tuples build).
TEST(PlanAuto, SearchedPlansArePricedAndRunAsPriced) {
  const Cluster m = local();
  const RunConfig rc = run_config(json{{"mode", "auto"}, {"search", "full"}});
  Result<LocalAutoPlan> a = plan_local_run(rc, 4, m);
  ASSERT_TRUE(a.is_ok()) << a.status().message();
  std::set<std::pair<int64_t, int64_t>> ops_meshes;  // (tp, cp)
  const StepCost* ops = nullptr;
  const StepCost* ops_cp = nullptr;
  for (const StepCost& c : a->candidates) {
    if (!c.plan.ops) continue;
    ops_meshes.insert({c.plan.tp, c.plan.cp});
    ASSERT_NE(c.plan.searched, nullptr);
    if (c.plan.zero != 0 || c.plan.recompute != Recompute::kNone || c.plan.pp != 1) continue;
    if (c.plan.tp == 2 && c.plan.cp == 1) ops = &c;
    if (c.plan.tp == 2 && c.plan.cp == 2) ops_cp = &c;
  }
  EXPECT_EQ(ops_meshes,
            (std::set<std::pair<int64_t, int64_t>>{{2, 1}, {4, 1}, {1, 2}, {2, 2}, {1, 4}}));
  ASSERT_NE(ops, nullptr);
  ASSERT_NE(ops_cp, nullptr);
  EXPECT_NE(plan_label(ops->plan).find("+ops"), std::string::npos);
  for (const StepCost* c : {ops, ops_cp}) {
    SCOPED_TRACE(plan_label(c->plan));
    const json par =
        value_or_throw(parallel_section(c->plan, value_or_throw(parse_model_config(rc.model))));
    ASSERT_TRUE(par.contains("strategies")) << par.dump();
    EXPECT_EQ(par["mode"], "semi");
    EXPECT_TRUE(par["strategies"].contains("h.?.mlp.c_fc")) << par.dump();
    EXPECT_EQ(par.value("ring_order", ""), c->plan.cp > 1 ? "zigzag" : "") << par.dump();
    const RunConfig run = run_config(par);
    std::vector<double> held(4, 0);
    Status s = run_local_ranks(4, [&](const std::shared_ptr<Transport>& t) -> Status {
      MF_ASSIGN_OR_RETURN(const Job job, resolve_job(run, 4));
      MF_ASSIGN_OR_RETURN(auto tr, Trainer::create(job, Communicator::world(t)));
      const StepResult r = tr->step();
      if (!(r.loss > 0)) return Status::internal("loss " + std::to_string(r.loss));
      held[t->rank()] = static_cast<double>(tr->executor().memory().total());
      return Status::ok();
    });
    ASSERT_TRUE(s.is_ok()) << s.message() << "\n" << par.dump();
    const double measured = *std::max_element(held.begin(), held.end());
    EXPECT_NEAR(c->memory.total / measured, 1.0, 0.05)
        << "predicted " << c->memory.total << " measured " << measured;
  }
  // Without a price, a plan has no strategies to write.
  Plan unpriced = ops->plan;
  unpriced.searched = nullptr;
  Result<json> none = parallel_section(unpriced, value_or_throw(parse_model_config(rc.model)));
  ASSERT_FALSE(none.is_ok());
  EXPECT_NE(none.status().message().find("not searched yet"), std::string::npos);
}

TEST(PlanAuto, ErrorsSayWhy) {
  const Cluster m = local();
  // 3 ranks: batch 4 does not split over dp=3, and tp=3 does not divide 4 heads.
  const RunConfig rc = run_config(json(), 4);
  Result<LocalAutoPlan> a = plan_local_run(rc, 3, m);
  ASSERT_FALSE(a.is_ok());
  EXPECT_NE(a.status().message().find("no dp x tp x cp plan of 3 ranks"), std::string::npos)
      << a.status().message();
  Result<Cluster> missing = load_local_cluster("/nonexistent/cluster.json");
  EXPECT_FALSE(missing.is_ok());
}

// The plan check compares like with like: the planner prices the runtime's
// sums of micro-batches' gradients in its buckets as optimizer time
// (CostConstants::grads_accumulated_in_buckets), so the measured optimizer
// part holds them too (Engine::grad_accumulate_seconds), beside the norm and
// update kernels; an engine that timed no kernels reports step and memory
// only. The trainer's figure grows with each step it sums micro-batches in.
TEST(PlanAuto, PlanCheckCountsTheBucketSumsAsOptimizerTime) {
  std::vector<double> first(kNumOpKinds, 0.0), end(kNumOpKinds, 0.0);
  end[static_cast<int>(OpKind::kAdamWUpdate)] = 0.02;
  end[static_cast<int>(OpKind::kMatMul)] = 0.5;
  const cli::RunMeasurement m = cli::measure_run(first, end, 2, {0.3, 0.31}, 0.0, 0.01, 0.04, 1000);
  EXPECT_NEAR(m.optimizer_s, (0.02 + 0.01) / 2, 1e-12);
  EXPECT_NEAR(m.compute_s, (0.5 + 0.04) / 2, 1e-12);  // with the pipeline's stash copies
  const cli::RunMeasurement untimed =
      cli::measure_run({}, {}, 2, {0.3, 0.31}, 0.0, 0.01, 0.04, 1000);
  EXPECT_EQ(untimed.optimizer_s, 0.0);
  EXPECT_EQ(untimed.compute_s, 0.0);

  auto tr = value_or_throw(Trainer::create(run_config(json{{"mode", "data"}}, 8, 4)));
  EXPECT_EQ(tr->grad_accumulate_seconds(), 0.0);
  tr->step();
  const double one = tr->grad_accumulate_seconds();
  EXPECT_GT(one, 0.0);
  tr->step();
  EXPECT_GT(tr->grad_accumulate_seconds(), one);
}

// The plan check of ranks that time-share the cores (share_machine with more
// ranks than cores): while one rank waits in a collective the others compute
// on its core, so its kernels run faster than its share and its collectives
// hold the others' compute. The check corrects by the step, all of it compute,
// and keeps the links (a refit from the split divided their bandwidth by the
// waits: x25 on 4 ranks of 2 cores); ranks with a core each keep the split.
// The rank compared is the one with the most work (compute and optimizer),
// not the one that waited longest in its collectives.
TEST(PlanAuto, PlanCheckOfTimeSharedRanksCorrectsByTheStep) {
  LocalAutoPlan a;
  a.best.plan.dp = 4;
  a.best.step_time_s = 0.200;
  a.best.compute_s = 0.190;
  a.best.dp_comm_s = 0.003;
  a.best.optimizer_s = 0.004;
  a.best.memory.total = 1 << 20;
  a.time_shared_cores = 2;
  cli::RunMeasurement m;
  m.steps = 7;
  m.by_kind = true;
  m.ranks = 4;
  m.step_s = 0.220, m.compute_s = 0.140, m.collectives_s = 0.075, m.optimizer_s = 0.002;
  m.peak_bytes = 1 << 20;
  const cli::PlanCheck shared = cli::check_plan(a, m);
  EXPECT_DOUBLE_EQ(shared.compute_ratio, 0.220 / 0.200);
  EXPECT_DOUBLE_EQ(shared.comm_ratio, 1.0);
  EXPECT_NE(shared.report.find("4 ranks time-share 2 cores"), std::string::npos) << shared.report;
  const Cluster refit = cli::refit_cluster(local(), shared);
  EXPECT_EQ(refit.intra_node.bandwidth_bytes_per_s, local().intra_node.bandwidth_bytes_per_s);
  EXPECT_LT(refit.device.peak_flops.f32, local().device.peak_flops.f32);

  a.time_shared_cores = 0;  // a core or more each: compute and collectives apart
  const cli::PlanCheck apart = cli::check_plan(a, m);
  EXPECT_DOUBLE_EQ(apart.compute_ratio, (0.140 + 0.002) / (0.190 + 0.004));
  EXPECT_DOUBLE_EQ(apart.comm_ratio, 0.075 / 0.003);
  EXPECT_EQ(apart.report.find("time-share"), std::string::npos) << apart.report;

  // Rank 1 did the most work and waited least; rank 0 waited longest.
  std::vector<cli::RunMeasurement> chosen(3);
  Status s = run_local_ranks(3, [&](const std::shared_ptr<Transport>& t) -> Status {
    auto comm = Communicator::world(t);
    cli::RunMeasurement mine = m;
    mine.compute_s = t->rank() == 1 ? 0.150 : 0.120;
    mine.collectives_s = t->rank() == 0 ? 0.100 : t->rank() == 1 ? 0.010 : 0.040;
    MF_ASSIGN_OR_RETURN(chosen[static_cast<size_t>(t->rank())],
                        cli::slowest_rank_measurement(*comm, mine));
    return Status::ok();
  });
  ASSERT_TRUE(s.is_ok()) << s.message();
  for (const cli::RunMeasurement& c : chosen) {
    EXPECT_EQ(c.rank, 1);
    EXPECT_EQ(c.ranks, 3);
    EXPECT_NEAR(c.collectives_s, 0.010, 1e-6);
  }
}

// The static-arena memory model against the executor: one rank, the whole
// per-rank memory (parameters, optimizer state, inputs, arena) predicted from
// the planner's local program within 10%.
TEST(PlanAuto, StaticArenaMemoryMatchesTheExecutor) {
  const Cluster m = local();
  for (const char* recompute : {"none", "full"}) {
    SCOPED_TRACE(recompute);
    RunConfig rc = run_config(json{{"mode", "semi"}, {"mesh", "dp=1"}, {"preset", "dp"}});
    Plan p;
    p.micro_batch = 8;
    p.recompute = value_or_throw(parse_recompute(recompute));
    if (p.recompute == Recompute::kFull) rc.train.recompute.mode = RecomputePolicy::kFull;
    auto tr = value_or_throw(Trainer::create(rc));
    const double measured = static_cast<double>(tr->executor().memory().total());
    const CostModel cm(TrainingJob{value_or_throw(parse_model_config(small_gpt())), 8, 32},
                       value_or_throw(share_machine(m, 1)), meshflow_cpu_constants());
    const StepCost c = value_or_throw(cm.price(p));
    EXPECT_NEAR(c.memory.total / measured, 1.0, 0.10)
        << "predicted " << c.memory.total << " measured " << measured;
  }
}

// The chunk-priced pipeline against the pipeline trainer: a ResNet on two
// stages (1F1B, two micro-batches) from the section the planner writes; per
// rank the model states, the chunk's arena and its activation stash at the
// peak the schedule reaches, predicted within 5% of what the trainer planned
// and held (Engine::peak_bytes; bench/plan_accuracy measured 0.1%).
// The most memory a rank of the job `doc` describes holds in its steps
// (Engine::peak_bytes, with a pipeline's stash), run on `ranks` local ranks
// for `steps` steps; *losses (when given) gets rank 0's.
double held_peak(const json& doc, int ranks, int steps = 1, std::vector<float>* losses = nullptr,
                 std::vector<int64_t>* per_rank = nullptr) {
  const Job job = value_or_throw(resolve_job(value_or_throw(parse_run_config(doc, "")), ranks));
  std::vector<int64_t> peak(static_cast<size_t>(ranks), 0);
  Status s = run_local_ranks(ranks, [&](const std::shared_ptr<Transport>& t) -> Status {
    MF_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e,
                        make_engine(job, Communicator::world(t), nullptr, false));
    for (int i = 0; i < steps; ++i) {
      const StepResult r = e->step();
      if (losses && t->rank() == 0) losses->push_back(r.loss);
    }
    peak[static_cast<size_t>(t->rank())] = e->peak_bytes();
    return Status::ok();
  });
  EXPECT_TRUE(s.is_ok()) << s.message();
  if (per_rank) *per_rank = peak;
  return static_cast<double>(*std::max_element(peak.begin(), peak.end()));
}

// A language model's pipeline on meshflow's executor, priced by the
// runtime's own split of the whole program (as a ResNet's): the predicted
// peak (the worst stage: model states, arena, the stash of the micro-batches
// its schedule keeps in flight), and every stage's, within 5% of what the
// pipeline trainer holds, for the runtime's balanced split and for a given uneven one, 1F1B
// and GPipe (bench/plan_accuracy measured 0.0-0.6%).
TEST(PlanAuto, LanguageModelPipelineMemoryMatchesThePipelineTrainer) {
  json model = small_gpt();
  model["n_layer"] = 4;
  const ModelConfig mc = value_or_throw(parse_model_config(model));
  for (const char* schedule : {"1f1b", "gpipe", "zb-v"}) {
    for (const std::vector<int64_t>& split : {std::vector<int64_t>{}, std::vector<int64_t>{1, 3}}) {
      SCOPED_TRACE(std::string(schedule) + (split.empty() ? " balanced" : " 1/3"));
      Plan p;
      p.pp = 2, p.micro_batch = 4, p.num_micro_batches = 4;
      p.schedule = value_or_throw(parse_schedule_kind(schedule));
      if (p.schedule == ScheduleKind::kZbV) {  // two chunks per stage: 4 of one block
        if (!split.empty()) continue;
        p.vp = 2;
      }
      p.layers_per_stage = split;
      const json doc = {
          {"model", model},
          {"data", {{"dataset", "fortunes"}}},
          {"train", {{"steps", 1}, {"batch_size", 16}, {"seq_len", 32}, {"eval_batches", 1}}},
          {"optimizer", {{"type", "adamw"}, {"lr", 1e-3}}},
          {"parallel", value_or_throw(parallel_section(p, mc))}};
      std::vector<int64_t> ranks;
      const double measured = held_peak(doc, 2, 1, nullptr, &ranks);
      const CostModel cm(TrainingJob{mc, 16, 32}, value_or_throw(share_machine(local(), 2)),
                         meshflow_cpu_constants());
      const StepCost c = value_or_throw(cm.price(p));
      EXPECT_NEAR(c.memory.total / measured, 1.0, 0.05)
          << "predicted " << c.memory.total << " measured " << measured;
      // Every stage (a rank of the pipeline runs one).
      const std::vector<MemoryBreakdown> stages = value_or_throw(cm.memory_by_stage(p));
      ASSERT_EQ(stages.size(), ranks.size());
      for (size_t r = 0; r < ranks.size(); ++r)
        EXPECT_NEAR(stages[r].total / double(ranks[r]), 1.0, 0.05)
            << "stage " << r << ": predicted " << stages[r].total << " measured " << ranks[r];
    }
  }
}

// The strategy search's plan on pipeline stages (tp=2 x pp=2 under 1F1B and
// interleaved with 2 chunks per stage; cp=2 x pp=2, its attention a ring in
// zigzag order): priced by the runtime's split of the program its split
// tuples build, the pipeline trainer runs it with one device's losses,
// holding the predicted memory.
TEST(PlanAuto, SearchedPlanOnPipelineStagesRunsAsPriced) {
  json model = small_gpt();
  model["n_layer"] = 4;
  const ModelConfig mc = value_or_throw(parse_model_config(model));
  const CostModel cm(TrainingJob{mc, 16, 32}, value_or_throw(share_machine(local(), 4)),
                     meshflow_cpu_constants());
  json doc = {{"model", model},
              {"data", {{"dataset", "fortunes"}}},
              {"train", {{"steps", 3}, {"batch_size", 16}, {"seq_len", 32}, {"eval_batches", 1}}},
              {"optimizer", {{"type", "adamw"}, {"lr", 1e-3}}}};  // (the planner's optimizer)
  std::vector<float> one;
  held_peak(doc, 1, 3, &one);
  struct Case {
    int64_t tp, cp, vp;
  };
  for (const Case& k : {Case{2, 1, 1}, Case{2, 1, 2}, Case{1, 2, 1}}) {
    Plan p;
    p.tp = k.tp, p.cp = k.cp, p.pp = 2, p.ops = true;
    p.vp = k.vp;
    if (k.vp > 1) p.schedule = ScheduleKind::kInterleaved;
    p.micro_batch = 4, p.num_micro_batches = 4;
    SCOPED_TRACE(plan_label(p));
    const StepCost c = value_or_throw(cm.price(p));
    ASSERT_NE(c.plan.searched, nullptr);
    doc["parallel"] = value_or_throw(parallel_section(c.plan, mc));
    ASSERT_TRUE(doc["parallel"].contains("strategies")) << doc["parallel"].dump();
    ASSERT_TRUE(doc["parallel"].contains("pipeline")) << doc["parallel"].dump();
    std::vector<float> four;
    const double measured = held_peak(doc, 4, 3, &four);
    ASSERT_EQ(four.size(), one.size());
    for (size_t i = 0; i < one.size(); ++i) EXPECT_NEAR(four[i], one[i], 5e-5 * one[i]) << i;
    EXPECT_NEAR(c.memory.total / measured, 1.0, 0.05)
        << "predicted " << c.memory.total << " measured " << measured;
  }
}

// A two-stage ResNet on 28x28 single-channel images (Fashion-MNIST) with
// `d0` and `d1` residual layers in its stages.
json tiny_resnet(int d0, int d1) {
  return {{"model_type", "resnet"},   {"num_channels", 1},  {"embedding_size", 16},
          {"hidden_sizes", {16, 32}}, {"depths", {d0, d1}}, {"layer_type", "basic"},
          {"num_labels", 10},         {"image_size", 28}};
}

// Device::kernel_time_scale multiplies the roofline of its kinds alone: a
// ResNet's step (pooling, batch norm, convolutions) grows by what its nodes
// of those kinds add, a GPT's (none of them) does not move.
// A GPT of 2 blocks of width 64 over 32 positions.
json tiny_gpt() {
  return {{"model_type", "gpt2"},
          {"n_layer", 2},
          {"n_embd", 64},
          {"n_head", 4},
          {"n_positions", 32},
          {"vocab_size", 64},
          {"tie_word_embeddings", true}};
}

TEST(PlanAuto, KernelTimeScaleSlowsItsKindsAlone) {
  Cluster listed = value_or_throw(
      load_cluster(meshflow::testing::source_dir() + "/configs/clusters/local_cpu.json"));
  ASSERT_GT(listed.device.kernel_scale(OpKind::kMaxPool2d), 1.0);  // the shipped calibration's
  Cluster plain = listed;
  plain.device.kernel_time_scale.clear();
  Plan p;
  p.dp = 1, p.micro_batch = 16, p.num_micro_batches = 1;
  const auto step = [&](const json& model, const Cluster& c) {
    const ModelConfig mc = value_or_throw(parse_model_config(model));
    return value_or_throw(
        CostModel(TrainingJob{mc, 16, is_language_model(mc) ? 32 : 1}, c, meshflow_cpu_constants())
            .price(p));
  };
  const json resnet = tiny_resnet(1, 1);
  EXPECT_GT(step(resnet, listed).compute_s, 1.2 * step(resnet, plain).compute_s);
  const json gpt = tiny_gpt();
  EXPECT_DOUBLE_EQ(step(gpt, listed).compute_s, step(gpt, plain).compute_s);
}

// meshflow's runtime sums the micro-batches' gradients in f32 buckets
// (runtime/grad_buckets.cc): a copy, then an add pass per later micro-batch,
// priced at memory bandwidth over the rank's parameters (its shard of them
// under ZeRO-2/3); a GPU stack's GEMMs accumulate into the gradients and
// price none.
TEST(PlanAuto, GradientBucketAccumulationIsPriced) {
  const Cluster c = value_or_throw(
      load_cluster(meshflow::testing::source_dir() + "/configs/clusters/local_cpu.json"));
  const json gpt = tiny_gpt();
  const ModelConfig mc = value_or_throw(parse_model_config(gpt));
  CostConstants k = meshflow_cpu_constants();
  ASSERT_TRUE(k.grads_accumulated_in_buckets);
  const CostModel buckets(TrainingJob{mc, 16, 32}, c, k);
  k.grads_accumulated_in_buckets = false;
  const CostModel none(TrainingJob{mc, 16, 32}, c, k);
  const double params = buckets.num_parameters();
  for (int64_t m : {1, 4, 16}) {
    SCOPED_TRACE("micro-batches " + std::to_string(m));
    Plan p;
    p.dp = 1, p.micro_batch = 16 / m, p.num_micro_batches = m;
    const StepCost a = value_or_throw(buckets.price(p)), b = value_or_throw(none.price(p));
    const double passes =
        m > 1 ? 2.0 + 3.0 * double(m - 1) : 0.0;  // one rank, one micro-batch: none
    EXPECT_NEAR(a.optimizer_s - b.optimizer_s, c.memory_time_s(4.0 * params * passes), 1e-12);
    EXPECT_NEAR(a.step_time_s - b.step_time_s, a.optimizer_s - b.optimizer_s, 1e-12);
  }
  // Under ZeRO-2/3 a rank sums its shard: the gradients are reduce-scattered
  // in each micro-batch's backward (ZeRO-1 sums them whole).
  const Cluster two = value_or_throw(share_machine(c, 2));
  k.grads_accumulated_in_buckets = true;
  const CostModel buckets2(TrainingJob{mc, 16, 32}, two, k);
  k.grads_accumulated_in_buckets = false;
  const CostModel none2(TrainingJob{mc, 16, 32}, two, k);
  for (int zero : {1, 2, 3}) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    Plan p;
    p.dp = 2, p.micro_batch = 2, p.num_micro_batches = 4, p.zero = zero;
    const StepCost a = value_or_throw(buckets2.price(p)), b = value_or_throw(none2.price(p));
    const double summed = zero >= 2 ? params / 2 : params;
    EXPECT_NEAR(a.optimizer_s - b.optimizer_s, two.memory_time_s(4.0 * summed * (2.0 + 3.0 * 3)),
                1e-12);
  }
  EXPECT_FALSE(CostConstants{}.grads_accumulated_in_buckets);
}

// A run config of `model` on Fashion-MNIST in auto mode with the full search.
json auto_run(const json& model, int steps) {
  return {{"model", model},
          {"data", {{"dataset", "fashion_mnist"}}},
          {"train", {{"steps", steps}, {"batch_size", 16}, {"eval_batches", 1}}},
          {"optimizer", {{"type", "adamw"}, {"lr", 1e-3}}},
          {"parallel", {{"mode", "auto"}, {"search", "full"}}}};
}

// `machine` with a rank's usable share halfway between the least memory of
// the candidates `in` picks and of the others: only the first kind fits.
Cluster device_between(const Cluster& machine, const LocalAutoPlan& all,
                       const std::function<bool(const Plan&)>& in) {
  double least[2] = {0, 0};  // the others, the picked
  for (const StepCost& c : all.candidates) {
    double& x = least[in(c.plan) ? 1 : 0];
    if (x == 0 || c.memory.total < x) x = c.memory.total;
  }
  EXPECT_GT(least[1], 0);  // priced among the candidates
  EXPECT_LT(least[1], 0.97 * least[0]) << "no less memory than the other plans";
  Cluster small = machine;
  const double usable = 0.5 * (least[1] + least[0]);
  small.device.memory_bytes = static_cast<int64_t>(double(machine.device.memory_bytes) * usable /
                                                   all.candidates.front().usable_memory);
  return small;
}

TEST(PlanAuto, ResNetPipelineMemoryMatchesThePipelineTrainer) {
  const json model = tiny_resnet(1, 1);
  const ModelConfig mc = value_or_throw(parse_model_config(model));
  Plan p;
  p.pp = 2, p.micro_batch = 8, p.num_micro_batches = 2;
  const json doc = {{"model", model},
                    {"data", {{"dataset", "fashion_mnist"}}},
                    {"train", {{"steps", 1}, {"batch_size", 16}, {"eval_batches", 1}}},
                    {"optimizer", {{"type", "adamw"}, {"lr", 1e-3}}},
                    {"parallel", value_or_throw(parallel_section(p, mc))}};
  std::vector<int64_t> ranks;
  const double measured = held_peak(doc, 2, 1, nullptr, &ranks);
  const CostModel cm(TrainingJob{mc, 16, 1}, value_or_throw(share_machine(local(), 2)),
                     meshflow_cpu_constants());
  const StepCost c = value_or_throw(cm.price(p));
  EXPECT_NEAR(c.memory.total / measured, 1.0, 0.05)
      << "predicted " << c.memory.total << " measured " << measured;
  const std::vector<MemoryBreakdown> stages = value_or_throw(cm.memory_by_stage(p));
  ASSERT_EQ(stages.size(), ranks.size());
  for (size_t r = 0; r < ranks.size(); ++r)
    EXPECT_NEAR(stages[r].total / double(ranks[r]), 1.0, 0.05) << "stage " << r;
}

// Full recompute of a ResNet's residual layers, priced through the program
// the recompute pass rewrites (the whole one at pp = 1, each chunk of the
// runtime's split in a pipeline), of all of them or (pp = 1) of the first:
// the parallel section the planner writes recomputes them, the run's losses
// equal the run without it, the memory it holds is the predicted one (within
// 2%) and less than without recompute (least with all), and the prediction
// charges the recomputed forward (more backward, recompute_s > 0). Selective
// recompute (the attention core) is refused by name.
TEST(PlanAuto, ResNetRecomputeRunsAsPriced) {
  const json model = tiny_resnet(2, 1);
  const ModelConfig mc = value_or_throw(parse_model_config(model));
  const CostModel cm(TrainingJob{mc, 16, 1}, value_or_throw(share_machine(local(), 2)),
                     meshflow_cpu_constants());
  for (int64_t pp : {1, 2}) {
    SCOPED_TRACE("pp=" + std::to_string(pp));
    Plan p;
    p.pp = pp, p.dp = 3 - pp, p.micro_batch = 8 / (3 - pp), p.num_micro_batches = 2;
    // none, every residual layer, the first one (without pipelines)
    const int variants = pp == 1 ? 3 : 2;
    std::vector<float> losses[3];
    double measured[3] = {0, 0, 0};
    StepCost priced[3];
    for (int v = 0; v < variants; ++v) {
      p.recompute = v ? Recompute::kFull : Recompute::kNone;
      p.recompute_layers = v == 2 ? 1 : 0;
      const json section = value_or_throw(parallel_section(p, mc));
      EXPECT_EQ(section.at("recompute"), v ? "full" : "none");
      if (v == 2) {
        EXPECT_EQ(section.at("recompute_layers"), json::array({0})) << section.dump();
      }
      json train = {{"steps", 2}, {"batch_size", 16}, {"eval_batches", 1}};
      if (pp == 1) train["micro_batches"] = p.num_micro_batches;  // (a pipeline's are its own)
      const json doc = {{"model", model},
                        {"data", {{"dataset", "fashion_mnist"}}},
                        {"train", train},
                        {"optimizer", {{"type", "adamw"}, {"lr", 1e-3}}},
                        {"parallel", section}};
      measured[v] = held_peak(doc, 2, 2, &losses[v]);
      priced[v] = value_or_throw(cm.price(p));
      EXPECT_NEAR(priced[v].memory.total / measured[v], 1.0, 0.02)
          << "variant " << v << ": predicted " << priced[v].memory.total << " measured "
          << measured[v];
      ASSERT_EQ(losses[v].size(), losses[0].size());
      for (size_t i = 0; i < losses[0].size(); ++i) EXPECT_EQ(losses[v][i], losses[0][i]) << i;
    }
    EXPECT_LT(measured[1], measured[0]);
    EXPECT_LT(priced[1].memory.total, priced[0].memory.total);
    EXPECT_GT(priced[1].recompute_s, 0);
    EXPECT_EQ(priced[0].recompute_s, 0);
    EXPECT_GT(priced[1].step_time_s, priced[0].step_time_s);
    if (variants == 3) {  // the first layer alone: in between
      EXPECT_GT(priced[2].recompute_s, 0);
      EXPECT_LT(priced[2].recompute_s, priced[1].recompute_s);
      EXPECT_LT(priced[2].memory.total, priced[0].memory.total);
      EXPECT_LE(priced[1].memory.total, priced[2].memory.total);
    }
  }
  Plan selective;
  selective.dp = 2, selective.micro_batch = 8, selective.recompute = Recompute::kSelective;
  EXPECT_NE(cm.invalid_reason(selective).find("use recompute=full"), std::string::npos)
      << cm.invalid_reason(selective);
  Plan piped_first;  // some layers, in a pipeline: not priced for a ResNet
  piped_first.pp = 2, piped_first.micro_batch = 8, piped_first.num_micro_batches = 2;
  piped_first.recompute = Recompute::kFull, piped_first.recompute_layers = 1;
  EXPECT_NE(cm.invalid_reason(piped_first).find("without pipelines, pp=1"), std::string::npos)
      << cm.invalid_reason(piped_first);
}

// Auto mode on a ResNet recomputes where only that fits: on a machine whose
// share per rank holds the recomputing plans and none without, it picks one,
// writes recompute "full", and the run holds the memory it predicted.
TEST(PlanAuto, ResNetAutoModeRecomputesWhereOnlyThatFits) {
  const json model = tiny_resnet(2, 1);
  json doc = auto_run(model, 2);
  const RunConfig rc = value_or_throw(parse_run_config(doc, ""));
  const Cluster machine = local();
  const LocalAutoPlan all = value_or_throw(plan_local_run(rc, 2, machine));
  // A rank's usable share between the least memory with recompute and without.
  const Cluster small =
      device_between(machine, all, [](const Plan& p) { return p.recompute == Recompute::kFull; });
  ASSERT_FALSE(::testing::Test::HasFailure());
  const LocalAutoPlan chosen = value_or_throw(plan_local_run(rc, 2, small));
  EXPECT_EQ(chosen.best.plan.recompute, Recompute::kFull) << plan_label(chosen.best.plan);
  EXPECT_TRUE(chosen.best.fits);
  EXPECT_EQ(chosen.parallel.at("recompute"), "full") << chosen.parallel.dump();
  doc["parallel"] = chosen.parallel;
  if (chosen.best.plan.num_micro_batches > 1)
    doc["train"]["micro_batches"] = chosen.best.plan.num_micro_batches;
  const double held = held_peak(doc, 2, 2);
  EXPECT_NEAR(chosen.best.memory.total / held, 1.0, 0.02)
      << "predicted " << chosen.best.memory.total << " held " << held;
}

// Local auto mode prices a ResNet's pipelines (its residual layers over the
// stages, priced by chunk) and its height split (cp) beside dp and tp: on 2
// and 4 ranks some candidates are pipelines and some split the height,
// every candidate but the searched ones reads back
// from the job its parallel section resolves to, and on a device where the least memory a
// pipeline holds fits and no plan without one does, auto mode picks a
// pipeline whose stages hold their predicted memory (within 5%).
TEST(PlanAuto, ResNetAutoModePricesPipelines) {
  const json model = tiny_resnet(2, 2);
  const ModelConfig mc = value_or_throw(parse_model_config(model));
  json doc = auto_run(model, 1);
  const RunConfig rc = value_or_throw(parse_run_config(doc, ""));
  const Cluster machine = local();
  for (int ranks : {2, 4}) {
    const LocalAutoPlan a = value_or_throw(plan_local_run(rc, ranks, machine));
    int pipelines = 0, heights = 0;
    for (const StepCost& c : a.candidates) {
      SCOPED_TRACE(plan_label(c.plan));
      pipelines += c.plan.pp > 1;
      heights += c.plan.cp > 1;
      if (c.plan.ops) continue;  // its tuples are found by searching again (above)
      json one = doc;
      one["parallel"] = value_or_throw(parallel_section(c.plan, mc));
      const Job job = value_or_throw(resolve_job(value_or_throw(parse_run_config(one, "")), ranks));
      Result<Plan> back = plan_of_job(job);
      ASSERT_TRUE(back.is_ok()) << back.status().message() << "\n" << one["parallel"].dump();
      EXPECT_EQ(*back, c.plan) << plan_label(*back);
    }
    EXPECT_GT(pipelines, 0) << ranks << " ranks";
    EXPECT_GT(heights, 0) << ranks << " ranks";  // the image's height over cp
  }
  // A device between the least memory of a pipeline and of every other plan.
  const LocalAutoPlan all = value_or_throw(plan_local_run(rc, 2, machine));
  const Cluster small = device_between(machine, all, [](const Plan& p) { return p.pp > 1; });
  ASSERT_FALSE(::testing::Test::HasFailure());
  const LocalAutoPlan chosen = value_or_throw(plan_local_run(rc, 2, small));
  ASSERT_EQ(chosen.best.plan.pp, 2) << plan_label(chosen.best.plan);
  EXPECT_TRUE(chosen.best.fits);
  doc["parallel"] = chosen.parallel;
  std::vector<int64_t> ranks;
  held_peak(doc, 2, 1, nullptr, &ranks);
  const CostModel cm(TrainingJob{mc, 16, 1}, value_or_throw(share_machine(machine, 2)),
                     meshflow_cpu_constants());
  const std::vector<MemoryBreakdown> stages = value_or_throw(cm.memory_by_stage(chosen.best.plan));
  ASSERT_EQ(stages.size(), ranks.size());
  for (size_t r = 0; r < ranks.size(); ++r)
    EXPECT_NEAR(stages[r].total / double(ranks[r]), 1.0, 0.05) << "stage " << r;
}

// Local auto mode's height split of a ResNet (cp = 2 on 2 ranks): the
// parallel section it writes trains with one device's losses (the stem's
// split propagated, halos at the windows) and holds the memory it priced
// (within 5%).
TEST(PlanAuto, ResNetAutoModesHeightSplitTrainsAsPriced) {
  const json model = tiny_resnet(1, 1);
  const ModelConfig mc = value_or_throw(parse_model_config(model));
  json doc = auto_run(model, 2);
  const RunConfig rc = value_or_throw(parse_run_config(doc, ""));
  const LocalAutoPlan all = value_or_throw(plan_local_run(rc, 2, local()));
  const StepCost* height = nullptr;
  for (const StepCost& c : all.candidates)
    if (c.plan.cp == 2 && c.plan.recompute == Recompute::kNone) height = &c;
  ASSERT_NE(height, nullptr);
  json one = doc;
  one["parallel"] = value_or_throw(parallel_section(height->plan, mc));
  std::vector<float> split_losses, single_losses;
  const double held = held_peak(one, 2, 2, &split_losses);
  EXPECT_NEAR(height->memory.total / held, 1.0, 0.05)
      << "predicted " << height->memory.total << " held " << held;
  json single = doc;
  single["parallel"] = {{"mode", "data"}};
  held_peak(single, 1, 2, &single_losses);
  ASSERT_EQ(split_losses.size(), single_losses.size());
  for (size_t i = 0; i < split_losses.size(); ++i)
    EXPECT_NEAR(split_losses[i], single_losses[i], 1e-4 * std::abs(single_losses[i])) << i;
}

// Stages chosen under memory on meshflow's executor (CostModel::stage_split
// priced by chunk): a 6-block GPT with a 4096-word vocabulary on two 1F1B
// stages. The runtime's own split (balanced by FLOPs and bytes, 5/1 here)
// weighs the head more than the planner prices it; with memory to spare
// the split is the fastest of all five, on a device where only the most
// even one fits it is that one, on a smaller one none. The pipeline trainer
// runs the split it returns with one device's losses, each stage holding
// its predicted memory (within 5%).
TEST(PlanAuto, StagesChosenUnderMemoryOnTheExecutor) {
  json model = small_gpt();
  model["n_layer"] = 6;
  model["vocab_size"] = 4096;
  const ModelConfig mc = value_or_throw(parse_model_config(model));
  const Cluster two = value_or_throw(share_machine(local(), 2));
  Plan p;
  p.pp = 2, p.micro_batch = 4, p.num_micro_batches = 4;
  std::vector<StepCost> all;  // every split k / 6 - k, priced whole
  const CostModel cm(TrainingJob{mc, 16, 32}, two, meshflow_cpu_constants());
  for (int64_t k = 1; k < 6; ++k) {
    Plan q = p;
    q.layers_per_stage = {k, 6 - k};
    all.push_back(value_or_throw(cm.price(q)));
  }
  auto by = [&](auto key) {
    return *std::min_element(all.begin(), all.end(),
                             [&](const StepCost& a, const StepCost& b) { return key(a) < key(b); });
  };
  const StepCost fastest = by([](const StepCost& c) { return c.step_time_s; });
  const StepCost least = by([](const StepCost& c) { return c.memory.total; });
  EXPECT_EQ(value_or_throw(cm.stage_split(p)), fastest.plan.layers_per_stage);
  const StepCost runtime = value_or_throw(cm.price(p));  // the runtime's split
  EXPECT_LT(fastest.step_time_s, 0.9 * runtime.step_time_s)
      << plan_label(fastest.plan) << " against the runtime's " << plan_label(runtime.plan);

  // A device whose usable memory lies between the least a split needs and
  // the next least.
  std::vector<double> need;
  for (const StepCost& c : all) need.push_back(c.memory.total);
  std::sort(need.begin(), need.end());
  ASSERT_LT(need[0], 0.97 * need[1]);
  auto with_usable = [&](double bytes) {
    Cluster c = two;
    c.device.memory_bytes =
        static_cast<int64_t>(bytes / least.usable_memory * double(two.device.memory_bytes));
    return CostModel(TrainingJob{mc, 16, 32}, c, meshflow_cpu_constants());
  };
  const CostModel tight = with_usable(0.5 * (need[0] + need[1]));
  const std::vector<int64_t> split = value_or_throw(tight.stage_split(p));
  EXPECT_EQ(split, least.plan.layers_per_stage);
  EXPECT_FALSE(value_or_throw(tight.price(p)).fits);  // the runtime's split does not fit
  EXPECT_TRUE(value_or_throw(with_usable(0.98 * need[0]).stage_split(p)).empty());

  // The split runs as priced.
  const json train = {{"steps", 2}, {"batch_size", 16}, {"seq_len", 32}, {"eval_batches", 1}};
  json doc = {{"model", model},
              {"data", {{"dataset", "fortunes"}}},
              {"train", train},
              {"optimizer", {{"type", "adamw"}, {"lr", 1e-3}}}};
  std::vector<float> one, staged;
  doc["train"]["micro_batches"] = 4;
  held_peak(doc, 1, 2, &one);
  doc["train"].erase("micro_batches");
  Plan q = p;
  q.layers_per_stage = split;
  doc["parallel"] = value_or_throw(parallel_section(q, mc));
  ASSERT_EQ(doc["parallel"]["pipeline"]["layers_per_stage"], json(split));
  std::vector<int64_t> ranks;
  held_peak(doc, 2, 2, &staged, &ranks);
  ASSERT_EQ(staged.size(), one.size());
  for (size_t i = 0; i < one.size(); ++i) EXPECT_NEAR(staged[i], one[i], 5e-5 * one[i]) << i;
  const std::vector<MemoryBreakdown> stages = value_or_throw(tight.memory_by_stage(q));
  ASSERT_EQ(stages.size(), 2u);
  for (size_t r = 0; r < 2; ++r)
    EXPECT_NEAR(stages[r].total / double(ranks[r]), 1.0, 0.05)
        << "stage " << r << ": predicted " << stages[r].total << " measured " << ranks[r];
}

// The split against every split, priced whole, on every device size between
// their needs: two 1F1B stages and three ZB-H1 stages of a 6-block GPT. Where
// none fits it says so (empty); else its split fits and is as fast as the
// fastest that fits, within 3% (it minimizes the slowest stage's work, the
// price is the whole schedule's).
TEST(PlanAuto, StageSplitAgainstEverySplit) {
  json model = small_gpt();
  model["n_layer"] = 6;
  model["vocab_size"] = 4096;
  const ModelConfig mc = value_or_throw(parse_model_config(model));
  for (const int64_t pp : {2, 3}) {
    SCOPED_TRACE("pp=" + std::to_string(pp));
    const Cluster machine = value_or_throw(share_machine(local(), int(pp)));
    const CostModel cm(TrainingJob{mc, 16, 32}, machine, meshflow_cpu_constants());
    Plan p;
    p.pp = pp, p.micro_batch = 4, p.num_micro_batches = 4;
    p.schedule = pp == 2 ? ScheduleKind::k1F1B : ScheduleKind::kZbH1;
    std::vector<StepCost> all;
    for (int64_t a = 1; a < 6; ++a)
      for (int64_t b = 1; a + b < 6; ++b) {
        Plan q = p;
        q.layers_per_stage =
            pp == 2 ? std::vector<int64_t>{a, 6 - a} : std::vector<int64_t>{a, b, 6 - a - b};
        if (pp == 2 && b > 1) break;
        all.push_back(value_or_throw(cm.price(q)));
      }
    std::vector<double> need;
    for (const StepCost& c : all) need.push_back(c.memory.total);
    std::sort(need.begin(), need.end());
    need.erase(std::unique(need.begin(), need.end()), need.end());
    need.push_back(2 * need.back());
    for (size_t i = 0; i < need.size(); ++i) {
      const double usable = i == 0 ? 0.99 * need[0] : 0.5 * (need[i - 1] + need[i]);
      Cluster c = machine;
      c.device.memory_bytes =
          static_cast<int64_t>(usable / all[0].usable_memory * double(machine.device.memory_bytes));
      const CostModel sized(TrainingJob{mc, 16, 32}, c, meshflow_cpu_constants());
      const StepCost* best = nullptr;
      for (const StepCost& k : all)
        if (k.memory.total <= usable && (!best || k.step_time_s < best->step_time_s)) best = &k;
      const std::vector<int64_t> split = value_or_throw(sized.stage_split(p));
      SCOPED_TRACE("usable " + std::to_string(usable));
      if (!best) {
        EXPECT_TRUE(split.empty());
        continue;
      }
      ASSERT_FALSE(split.empty()) << "fits: " << plan_label(best->plan);
      Plan q = p;
      q.layers_per_stage = split;
      const StepCost got = value_or_throw(sized.price(q));
      EXPECT_TRUE(got.fits) << plan_label(q);
      EXPECT_LE(got.step_time_s, 1.03 * best->step_time_s)
          << plan_label(q) << " against " << plan_label(best->plan);
    }
  }
}

// Auto mode prices each pipeline also with its stages chosen under memory:
// on a machine where only such a split fits (a 6-block GPT with 2048 words:
// 3/3 where the runtime's own split is uneven), it picks that plan and writes
// the split into the section it runs.
TEST(PlanAuto, AutoModePicksAStageSplitWhenOnlyItFits) {
  json model = small_gpt();
  model["n_layer"] = 6;
  model["vocab_size"] = 2048;
  json doc = {{"model", model},
              {"data", {{"dataset", "fortunes"}}},
              {"train", {{"steps", 1}, {"batch_size", 16}, {"seq_len", 32}, {"eval_batches", 1}}},
              {"optimizer", {{"type", "adamw"}, {"lr", 1e-3}}},
              {"parallel", {{"mode", "auto"}, {"search", "full"}}}};
  const RunConfig rc = value_or_throw(parse_run_config(doc, ""));
  const Cluster machine = local();
  const LocalAutoPlan all = value_or_throw(plan_local_run(rc, 2, machine));
  std::vector<StepCost> c = all.candidates;
  std::sort(c.begin(), c.end(),
            [](const auto& a, const auto& b) { return a.memory.total < b.memory.total; });
  ASSERT_GE(c.size(), 2u);
  ASSERT_FALSE(c[0].plan.layers_per_stage.empty()) << plan_label(c[0].plan);
  ASSERT_LT(c[0].memory.total, 0.97 * c[1].memory.total);
  Cluster small = machine;
  small.device.memory_bytes =
      static_cast<int64_t>(double(machine.device.memory_bytes) * 0.5 *
                           (c[0].memory.total + c[1].memory.total) / c[0].usable_memory);
  const LocalAutoPlan chosen = value_or_throw(plan_local_run(rc, 2, small));
  EXPECT_EQ(chosen.best.plan, c[0].plan) << plan_label(chosen.best.plan);
  EXPECT_EQ(chosen.parallel["pipeline"]["layers_per_stage"], json(c[0].plan.layers_per_stage))
      << chosen.parallel.dump();
}

// The plan check of a layout the user chose (`meshflow train --check-plan`)
// prices the plan the job runs: every plan auto mode prices reads back from
// the job its section resolves to (the strategy search's by searching
// again), and is priced as plan_local_run priced it, among the same
// candidates.
// A plan without the strategy search's answer (a pointer to each search's own).
Plan unsearched(Plan p) {
  p.searched = nullptr;
  return p;
}

TEST(PlanAuto, EveryPlanReadsBackFromTheJobItRuns) {
  const Cluster m = local();
  const RunConfig rc = run_config(json{{"mode", "auto"}, {"search", "full"}});
  const ModelConfig model = value_or_throw(parse_model_config(rc.model));
  int checked = 0, pipelines = 0, zero = 0, tensor = 0, searched = 0;
  for (int ranks : {1, 2, 4}) {
    const LocalAutoPlan a = value_or_throw(plan_local_run(rc, ranks, m));
    for (const StepCost& c : a.candidates) {
      SCOPED_TRACE(plan_label(c.plan));
      const json par = value_or_throw(parallel_section(c.plan, model));
      Job job = value_or_throw(resolve_job(run_config(par), ranks));
      if (c.plan.ops) {  // its tuples are no preset: found by searching again
        EXPECT_FALSE(plan_of_job(job).is_ok());
        if (c.plan.recompute != Recompute::kNone || c.plan.zero > 0) continue;  // (time)
        const Status priced = price_job_plan(&job, m);
        ASSERT_TRUE(priced.is_ok()) << priced.message();
        EXPECT_EQ(unsearched(job.plan_check->best.plan), unsearched(c.plan));
        EXPECT_DOUBLE_EQ(job.plan_check->best.step_time_s, c.step_time_s);
        ++searched;
        continue;
      }
      Result<Plan> back = plan_of_job(job);
      ASSERT_TRUE(back.is_ok()) << back.status().message() << "\n" << par.dump();
      EXPECT_EQ(*back, c.plan) << plan_label(*back) << "\n" << par.dump();
      ++checked, pipelines += c.plan.pp > 1, zero += c.plan.zero > 0, tensor += c.plan.tp > 1;
    }
    // The user's plan priced among the same candidates, as auto mode priced it.
    const json par = value_or_throw(parallel_section(a.best.plan, model));
    Job job = value_or_throw(resolve_job(run_config(par), ranks));
    const Status priced = price_job_plan(&job, m);
    ASSERT_TRUE(priced.is_ok()) << priced.message() << "\n" << par.dump();
    ASSERT_TRUE(job.plan_check);
    EXPECT_EQ(unsearched(job.plan_check->best.plan), unsearched(a.best.plan));
    EXPECT_DOUBLE_EQ(job.plan_check->best.step_time_s, a.best.step_time_s);
    EXPECT_EQ(job.plan_check->candidates.size(), a.candidates.size());
    EXPECT_DOUBLE_EQ(job.plan_check->fastest.step_time_s, a.fastest.step_time_s);
  }
  std::printf("%d plans read back (%d pipelines, %d with ZeRO, %d with tp), %d searched again\n",
              checked, pipelines, zero, tensor, searched);
  EXPECT_GT(searched, 0);
  EXPECT_GT(pipelines, 0);
  EXPECT_GT(zero, 0);
  EXPECT_GT(tensor, 0);
}

// What the planner does not price is refused by name, never priced as
// something else: split tuples or rules of the user's own, recompute of
// some blocks or of named ops.
TEST(PlanAuto, LayoutsThePlannerDoesNotPriceAreNamed) {
  struct Case {
    json parallel;
    json train;
    const char* says;
  };
  const std::vector<Case> cases = {
      {{{"mode", "semi"},
        {"mesh", "dp=2"},
        {"strategies", {{"h.*.mlp.c_fc", "((dp, 1, 1), (1, 1))"}}}},
       json::object(),
       "parallel.strategies or parallel.rules of your own (priced on a mesh with tp or cp"},
      {{{"mode", "semi"}, {"mesh", "dp=1,tp=2"}, {"rules", {{"batch", "dp"}, {"heads", "tp"}}}},
       json::object(),
       "parallel.strategies or parallel.rules of your own (priced on a mesh with tp or cp"},
      {{{"mode", "data"}},
       {{"recompute", "full"}, {"recompute_layers", {1}}},
       "train.recompute_layers [1] is not priced: the planner prices full recompute of the "
       "first N blocks of each pipeline chunk"},
      {{{"mode", "data"}},
       {{"recompute", "selective"}, {"recompute_layers", {0}}},
       "selective recompute of some blocks (train.recompute_layers) is not priced"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.parallel.dump() + " " + c.train.dump());
    RunConfig rc = run_config(c.parallel);
    if (!c.train.empty()) {
      json doc = {{"model", small_gpt()},
                  {"data", {{"dataset", "fortunes"}}},
                  {"train", {{"steps", 1}, {"batch_size", 8}, {"seq_len", 32}}},
                  {"parallel", c.parallel}};
      doc["train"].update(c.train);
      rc = value_or_throw(parse_run_config(doc, ""));
    }
    Result<Job> job = resolve_job(rc, 2);
    ASSERT_TRUE(job.is_ok()) << job.status().message();
    Result<Plan> p = plan_of_job(*job);
    ASSERT_FALSE(p.is_ok()) << plan_label(*p);
    EXPECT_NE(p.status().message().find(c.says), std::string::npos) << p.status().message();
    EXPECT_NE(p.status().message().find("the planner prices data parallel, the presets"),
              std::string::npos)
        << p.status().message();
  }
}
}  // namespace
}  // namespace meshflow::plan
