// The planner against this machine (issue 6 §6): trains a small GPT (or, with
// --model configs/models/mlp_fashion.json, the MLP on Fashion-MNIST; with
// configs/models/resnet_fashion.json, the small ResNet) under a dozen plans
// on 1-4 in-process ranks (data parallel, Megatron tensor parallel, sequence
// parallel, ZeRO 1-3, recompute, gradient accumulation; for the ResNet
// channels, height, pipelines and recompute), measures the median step time and each
// rank's peak memory (Engine::peak_bytes: persistent storage + the static
// arena, + a pipeline's activation stash), prices the same plans with the cost
// model on the calibrated cluster shared among the ranks (plan::share_machine),
// and prints predicted vs measured with the median errors.
//
// The machine may be shared: a step counts as clean when other processes used
// at most 10% of the CPU meanwhile (/proc/stat less this process); each plan
// runs until `--steps` clean steps (up to 8x that) and reports their median,
// and how many of its steps were clean.
//
//   plan_accuracy [--cluster FILE|now (default: this machine's calibration)] [--steps 6] [--warmup
//   2]
//                 [--only NAME,...] [--model M.json] [--batch 16] [--seq 128] [--breakdown]
//                 [--repeat R] [--profile] [--auto 2,4 [--auto-within 0.05]]
// --cluster now: this machine measured at the start of the run (a shared VM's
// speed drifts: on 2026-11-28 the 2-core VM's SGEMM ran at 201 GFLOP/s where
// the calibration shipped that morning had 306, and the table against the
// shipped file read 39% off, 12% against the fresh one);
// --repeat R: each plan's measured time is the least disturbed of R runs,
// taken in rounds over all the plans (A B C, A B C, ...) so that the
// machine's drift falls on every plan alike; --breakdown: the predicted and measured parts of time
// and memory and the program's collectives; --profile: rank 0's kernel time by op kind beside the
// roofline of the same nodes and that roofline with each matmul's shape (the
// cluster file's thin-GEMM grid); --auto N,...: auto mode's choice on N ranks
// against every plan it priced that fits and is predicted within
// --auto-within (5%) of the fastest, each run and measured, and the choice
// against the fastest by median step (within the steps' spread or beyond it)
// and by fastest step.
//
// bench/plan_accuracy.sh builds it and runs it with the defaults.
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "meshflow/comm/communicator.h"
#include "meshflow/comm/local_world.h"
#include "meshflow/config/json_reader.h"
#include "meshflow/engine/job.h"
#include "meshflow/engine/pipeline_trainer.h"
#include "meshflow/engine/trainer.h"
#include "meshflow/kernels/cpu/blas_core.h"
#include "meshflow/ops/matmul_dims.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/plan/auto_plan.h"
#include "meshflow/plan/calibrate.h"
#include "meshflow/plan/cluster.h"
#include "meshflow/plan/cost_model.h"
#include "meshflow/plan/rank_program.h"

using namespace meshflow;
using plan::cpu_sample;
using plan::CpuSample;

namespace {

struct Case {
  std::string name;
  int ranks = 1;
  std::string mesh;    // "dp=2,tp=2"
  std::string preset;  // dp | megatron | megatron-sp | ops (the strategy search)
  int zero = 0;
  std::string recompute = "none";
  int micro_batches = 1;
  int pp = 1;  // pipeline stages (a ResNet's residual layers)
  std::string schedule = "1f1b";
  // Blocks per stage: these, or (planned) the planner's choice by time and
  // memory (CostModel::stage_split); neither: the runtime's own split.
  std::vector<int64_t> layers = {};
  bool planned = false;
  int recompute_layers = 0;  // with "full": only the first N blocks of each chunk recompute
};

struct Measured {
  double step_s = 0;         // median over steps of the slowest rank's step
  double best_s = 0;         // the fastest of those steps (the least disturbed)
  double spread = 0;         // (max - min) / median of those steps
  MemoryStats memory;        // the rank with the largest peak (a pipeline's: without its stash)
  double peak = 0;           // its peak bytes (Engine::peak_bytes)
  std::string collectives;   // rank 0's program: collective kind x phase counts
  int steps = 0, clean = 0;  // steps timed, and those other processes left alone
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int64_t degree(const std::string& mesh, const std::string& axis) {
  const size_t at = mesh.find(axis + "=");
  return at == std::string::npos ? 1 : std::atoll(mesh.c_str() + at + axis.size() + 1);
}

bool g_profile = false;
const plan::Cluster* g_cluster = nullptr;  // the shared cluster of the plan being measured

// --profile: rank 0's measured seconds per step by op kind beside the
// roofline (plan::Cluster) of the same nodes of its program, and the same
// with each matmul's shape (Cluster::matmul_shape_factor: the thin-GEMM
// curve of the cluster file, where it has one).
void print_profile(Executor& ex, int steps, int micro_batches) {
  const Graph& g = ex.graph();
  std::vector<double> pred(kNumOpKinds, 0.0), shaped(kNumOpKinds, 0.0);
  std::vector<int> count(kNumOpKinds, 0);
  auto add = [&](const std::vector<NodeId>& order, double times) {
    for (NodeId id : order) {
      const Node& n = g.node(id);
      const OpCost c = op_cost(g, n);
      const double t = g_cluster->roofline_time_s(c.flops, c.bytes, DType::F32);
      double f = 1;
      if (n.kind == OpKind::kMatMul) {
        const MatMulDims d = value_or_throw(matmul_dims(g, n));
        f = g_cluster->matmul_shape_factor(double(d.M), double(d.N), double(d.K));
      }
      pred[int(n.kind)] += times * t;
      shaped[int(n.kind)] += times * std::max(g_cluster->matmul_time_s(c.flops, DType::F32) / f,
                                              g_cluster->memory_time_s(c.bytes));
      count[int(n.kind)] += int(times);
    }
  };
  add(ex.forward_backward_order(), micro_batches);
  add(ex.optimizer_order(), 1);
  const std::vector<double>& meas = ex.seconds_by_kind();
  double tm = 0, tp = 0, ts = 0;
  std::printf("    %-22s %6s %10s %10s %10s\n", "op kind", "nodes", "meas ms", "roofline",
              "by shape");
  for (int k = 0; k < kNumOpKinds; ++k) {
    if (meas[k] <= 0 && pred[k] <= 0) continue;
    tm += meas[k] / steps, tp += pred[k], ts += shaped[k];
    std::printf("    %-22s %6d %10.2f %10.2f %10.2f\n", std::string(op_name(OpKind(k))).c_str(),
                count[k], 1e3 * meas[k] / steps, 1e3 * pred[k], 1e3 * shaped[k]);
  }
  std::printf("    %-22s %6s %10.2f %10.2f %10.2f\n", "total", "", 1e3 * tm, 1e3 * tp, 1e3 * ts);
}

// The run config's "parallel" section of a case: the partitioned program
// (mode semi, as meshflow_cpu_constants prices it) with the preset's rules; an
// MLP's tensor parallelism is the rules `meshflow plan --out` writes for it
// (plan::parallel_section).
json parallel_of(const ModelConfig& mc, const Case& c, const plan::Plan& p) {
  // A ResNet, or the strategy search's plan: the section `meshflow plan
  // --out` writes for the plan, as is.
  if (std::holds_alternative<ResNetConfig>(mc) || p.ops || p.pp > 1)
    return value_or_throw(plan::parallel_section(p, mc));
  json par = {{"mode", "semi"}, {"mesh", c.mesh}, {"preset", c.preset}, {"zero", c.zero}};
  if (p.recompute_layers > 0) {  // the blocks parallel_section names
    par["recompute"] = "full";
    par["recompute_layers"] = plan::first_blocks_of_chunks(
        plan::chunk_blocks(p, plan::num_blocks(mc)), p.recompute_layers);
  }
  if (!is_language_model(mc) && p.tp > 1) {
    par = value_or_throw(plan::parallel_section(p, mc));
    par["mesh"] = c.mesh;
  }
  return par;
}

Result<Measured> measure(const json& model, const Case& c, const json& parallel, int batch, int seq,
                         int warmup, int steps) {
  const bool lm = is_language_model(value_or_throw(parse_model_config(model)));
  json train = {{"steps", warmup + steps},
                {"batch_size", batch},
                {"recompute", c.recompute},
                {"eval_batches", 1}};
  if (c.pp == 1) train["micro_batches"] = c.micro_batches;  // a pipeline's are its section's
  if (lm) train["seq_len"] = seq;
  json doc = {{"model", model},
              {"data", {{"dataset", lm ? "fortunes" : "fashion_mnist"}}},
              {"train", train},
              {"optimizer", {{"type", "adamw"}, {"lr", 1e-3}, {"weight_decay", 0.1}}},
              {"parallel", parallel}};
  MF_ASSIGN_OR_RETURN(RunConfig rc, parse_run_config(doc, ""));
  MF_ASSIGN_OR_RETURN(const Job job, resolve_job(rc, c.ranks));
  std::mutex mu;
  std::string collectives;
  // Steps run until `steps` of them were clean (other processes used at most
  // plan::kDisturbedShare of the machine meanwhile) or kMaxSteps ran; the median
  // is over the clean ones (over all when fewer were clean: `clean` says how many).
  const int max_steps = std::max(steps, 8 * steps);
  std::vector<double> per_step;  // slowest rank's seconds per step (after warm-up)
  std::vector<char> clean;
  std::vector<double> step_secs(static_cast<size_t>(c.ranks), 0.0);
  bool stop = false;
  CpuSample before;
  auto decide = [&]() noexcept {  // runs once per step, after every rank finished it
    const CpuSample after = cpu_sample();
    const double busy = after.others_busy_fraction(before);
    before = after;
    per_step.push_back(*std::max_element(step_secs.begin(), step_secs.end()));
    clean.push_back(busy <= plan::kDisturbedShare);
    const int done = static_cast<int>(per_step.size());
    int n_clean = 0;
    for (int i = warmup; i < done; ++i) n_clean += clean[i];
    stop = (done >= warmup + steps && n_clean >= steps) || done >= warmup + max_steps;
  };
  std::barrier sync(c.ranks, decide);
  std::vector<MemoryStats> mem(static_cast<size_t>(c.ranks));
  std::vector<int64_t> peak(static_cast<size_t>(c.ranks), 0);
  auto body = [&](std::shared_ptr<Communicator> comm, int rank) -> Status {
    // The engine the job calls for: the Trainer, or the PipelineTrainer.
    Result<std::unique_ptr<Engine>> created = make_engine(job, comm, nullptr, false);
    if (!created.is_ok()) {
      sync.arrive_and_drop();
      return created.status();
    }
    std::unique_ptr<Engine> engine = std::move(created).value();
    auto* tr = dynamic_cast<Trainer*>(engine.get());
    auto* pipe = dynamic_cast<PipelineTrainer*>(engine.get());
    sync.arrive_and_wait();  // every rank built: start the clock together
    if (rank == 0) {
      per_step.clear(), clean.clear();
      before = cpu_sample();
    }
    sync.arrive_and_wait();
    for (int i = 0;; ++i) {
      if (i == warmup && rank == 0 && g_profile && tr) tr->executor().set_profiling(true);
      if (i == warmup && g_profile && pipe) pipe->set_profiling(true);
      step_secs[static_cast<size_t>(rank)] = engine->step().seconds;
      sync.arrive_and_wait();
      if (stop) break;
    }
    if (rank == 0 && g_profile && tr)
      print_profile(tr->executor(), static_cast<int>(per_step.size()) - warmup, c.micro_batches);
    if (g_profile && pipe) {  // each stage's kernels per step (its compute, no waits)
      double kernels = 0;
      for (double x : pipe->seconds_by_kind()) kernels += x;
      const int measured_steps = static_cast<int>(per_step.size()) - warmup;
      std::lock_guard<std::mutex> lock(mu);
      std::printf("    stage %d: kernels %.1f ms per step\n", rank,
                  1e3 * kernels / std::max(1, measured_steps));
    }
    std::lock_guard<std::mutex> lock(mu);
    if (rank == 0 && tr && tr->program()) {
      std::map<std::string, int> n;
      for (const CollectiveRecord& r : tr->program()->collectives)
        ++n[std::string(op_name(r.kind)) + "/" + std::string(phase_name(r.phase))];
      for (const auto& [k, v] : n) collectives += k + " x" + std::to_string(v) + " ";
    }
    mem[static_cast<size_t>(rank)] = tr ? tr->executor().memory() : pipe->memory();
    peak[static_cast<size_t>(rank)] = engine->peak_bytes();  // a pipeline's: + its stash
    return Status::ok();
  };
  if (c.ranks == 1) {
    MF_RETURN_IF_ERROR(body(nullptr, 0));
  } else {
    MF_RETURN_IF_ERROR(run_local_ranks(c.ranks, [&](const std::shared_ptr<Transport>& t) {
      return body(Communicator::world(t), t->rank());
    }));
  }
  Measured m;
  std::vector<double> all, good;
  for (size_t i = static_cast<size_t>(warmup); i < per_step.size(); ++i) {
    all.push_back(per_step[i]);
    if (clean[i]) good.push_back(per_step[i]);
  }
  m.clean = static_cast<int>(good.size());
  m.steps = static_cast<int>(all.size());
  const std::vector<double>& use = good.size() >= 2 ? good : all;
  m.step_s = median(use);
  m.best_s = *std::min_element(use.begin(), use.end());
  m.spread =
      (*std::max_element(use.begin(), use.end()) - *std::min_element(use.begin(), use.end())) /
      m.step_s;
  for (size_t r = 0; r < mem.size(); ++r)
    if (double(peak[r]) > m.peak) m.peak = double(peak[r]), m.memory = mem[r];
  m.collectives = collectives;
  return m;
}

plan::Plan plan_of(const Case& c, int batch) {
  plan::Plan p;
  p.dp = degree(c.mesh, "dp");
  p.tp = degree(c.mesh, "tp");
  p.cp = degree(c.mesh, "cp");
  p.pp = c.pp;
  p.schedule = value_or_throw(parse_schedule_kind(c.schedule));
  p.sp = c.preset == "megatron-sp" || c.preset == "ring-sp";
  p.ops = c.preset == "ops";
  p.ring = c.preset == "ring" || c.preset == "ring-sp";
  p.num_micro_batches = c.micro_batches;
  p.micro_batch = batch / (p.dp * c.micro_batches);
  p.zero = c.zero;
  p.recompute = value_or_throw(plan::parse_recompute(c.recompute));
  p.recompute_layers = c.recompute_layers;
  p.layers_per_stage = c.layers;
  return p;
}

double mib(double b) {
  return b / (1024.0 * 1024.0);
}

std::vector<int> split_ints(const std::string& s) {
  std::vector<int> out;
  size_t at = 0;
  while (at <= s.size()) {
    const size_t comma = std::min(s.find(',', at), s.size());
    out.push_back(std::atoi(s.substr(at, comma - at).c_str()));
    at = comma + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  meshflow::cpu::use_supported_blas_kernels(argv);  // kernels/cpu/blas_core.h
  std::string cluster_path, model_path, only;  // no --cluster: this machine's (load_local_cluster)
  int steps = 6, warmup = 2, batch = 16, seq = 128, repeat = 1;
  std::vector<int> auto_ranks;
  double auto_within = 0.05;
  bool breakdown = false;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "plan_accuracy: %s needs a value\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--cluster")
      cluster_path = next();
    else if (k == "--model")
      model_path = next();
    else if (k == "--only")
      only = "," + next() + ",";
    else if (k == "--steps")
      steps = std::atoi(next().c_str());
    else if (k == "--warmup")
      warmup = std::atoi(next().c_str());
    else if (k == "--batch")
      batch = std::atoi(next().c_str());
    else if (k == "--seq")
      seq = std::atoi(next().c_str());
    else if (k == "--repeat")
      repeat = std::max(1, std::atoi(next().c_str()));
    else if (k == "--breakdown")
      breakdown = true;
    else if (k == "--profile")
      g_profile = true;
    else if (k == "--auto")
      auto_ranks = split_ints(next());
    else if (k == "--auto-within")
      auto_within = std::atof(next().c_str());
    else {
      std::fprintf(stderr, "plan_accuracy: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  // A small GPT: 4 layers, hidden 256, 4 heads, bytes (gpt_bytes_small.json's shape).
  json model = {{"model_type", "gpt2"},
                {"n_layer", 4},
                {"n_embd", 256},
                {"n_head", 4},
                {"n_positions", 256},
                {"vocab_size", 256},
                {"tie_word_embeddings", true}};
  if (!model_path.empty()) model = value_or_throw(read_json_file(model_path));
  const bool now = cluster_path == "now";
  const plan::Cluster machine =
      now ? plan::cluster_from_calibration(value_or_throw(plan::calibrate()), "local_cpu")
          : value_or_throw(plan::load_local_cluster(cluster_path));
  if (cluster_path.empty() || now)
    cluster_path =
        std::string(now ? "measured now: " : "") + "this machine's (" + machine.device.name + ")";
  const ModelConfig mc = value_or_throw(parse_model_config(model));

  const bool lm = is_language_model(mc);
  const std::vector<Case> lm_cases = {
      {"dp1", 1, "dp=1", "dp"},
      {"dp1-mb4", 1, "dp=1", "dp", 0, "none", 4},
      {"dp1-mb16", 1, "dp=1", "dp", 0, "none", 16},
      {"dp1-full", 1, "dp=1", "dp", 0, "full"},
      {"dp1-selective", 1, "dp=1", "dp", 0, "selective"},
      {"dp2", 2, "dp=2", "dp"},
      {"dp4", 4, "dp=4", "dp"},
      {"tp2", 2, "dp=1,tp=2", "megatron"},
      {"tp2-sp", 2, "dp=1,tp=2", "megatron-sp"},
      {"dp2-tp2", 4, "dp=2,tp=2", "megatron"},
      {"dp2-tp2-sp", 4, "dp=2,tp=2", "megatron-sp"},
      {"dp2-tp2-zero1", 4, "dp=2,tp=2", "megatron", 1},
      {"dp2-zero1", 2, "dp=2", "dp", 1},
      {"dp2-zero2", 2, "dp=2", "dp", 2},
      // ZeRO-2 reduce-scatters each micro-batch's gradients (ZeRO-1 once).
      {"dp2-zero1-mb4", 2, "dp=2", "dp", 1, "none", 4},
      {"dp2-zero2-mb4", 2, "dp=2", "dp", 2, "none", 4},
      {"dp2-zero3", 2, "dp=2", "dp", 3},
      {"dp4-zero1", 4, "dp=4", "dp", 1},
      {"dp4-zero3", 4, "dp=4", "dp", 3},
      {"dp2-full-zero1", 2, "dp=2", "dp", 1, "full"},
      // Full recompute of the first blocks only (Plan::recompute_layers).
      {"dp1-full:1", 1, "dp=1", "dp", 0, "full", 1, 1, "1f1b", {}, false, 1},
      {"dp2-full:2", 2, "dp=2", "dp", 0, "full", 1, 1, "1f1b", {}, false, 2},
      // The per-operator strategy search's plans (auto mode's third layout).
      {"tp2-ops", 2, "dp=1,tp=2", "ops"},
      {"dp2-tp2-ops", 4, "dp=2,tp=2", "ops"},
      {"tp4-ops", 4, "dp=1,tp=4", "ops"},
      // Context parallel: Ulysses (all_to_all to heads), ring attention
      // (zigzag order) and the strategy search on cp (and tp x cp).
      {"cp2-ulysses", 2, "dp=1,cp=2", "ulysses"},
      {"cp2-ring", 2, "dp=1,cp=2", "ring"},
      {"cp4-ring", 4, "dp=1,cp=4", "ring"},
      {"dp2-cp2-ring", 4, "dp=2,cp=2", "ring"},
      {"cp2-ops", 2, "dp=1,cp=2", "ops"},
      {"tp2-cp2-ops", 4, "dp=1,tp=2,cp=2", "ops"},
      {"dp2-cp2-ops", 4, "dp=2,cp=2", "ops"},
      {"dp2-cp2-ops-zero1", 4, "dp=2,cp=2", "ops", 1},
      {"dp2-cp2-ring-zero1", 4, "dp=2,cp=2", "ring", 1},
      {"tp2-cp2-ring-sp", 4, "dp=1,tp=2,cp=2", "ring-sp"},
      // Megatron on tp with Ulysses on cp, and the ring beside plain tp:
      // auto mode's other two tp x cp layouts.
      {"tp2-cp2", 4, "dp=1,tp=2,cp=2", "megatron"},
      {"tp2-cp2-ring", 4, "dp=1,tp=2,cp=2", "ring"},
      // Pipelines (the pipeline trainer, from the section the planner writes).
      {"pp2-1f1b-mb4", 2, "dp=1", "", 0, "none", 4, 2, "1f1b"},
      {"pp2-1f1b-mb4-planned", 2, "dp=1", "", 0, "none", 4, 2, "1f1b", {}, true},
      {"pp2-1f1b-mb4-full:1", 2, "dp=1", "", 0, "full", 4, 2, "1f1b", {}, false, 1},
      {"pp2-1f1b-mb4-selective", 2, "dp=1", "", 0, "selective", 4, 2, "1f1b"},
      {"pp2-gpipe-mb4", 2, "dp=1", "", 0, "none", 4, 2, "gpipe"},
      {"pp4-1f1b-mb4", 4, "dp=1", "", 0, "none", 4, 4, "1f1b"},
      {"pp4-1f1b-mb4-planned", 4, "dp=1", "", 0, "none", 4, 4, "1f1b", {}, true},
      {"pp2-tp2-mb2", 4, "dp=1,tp=2", "", 0, "none", 2, 2, "1f1b"},
      // ZB-H1 and data-parallel stages: plan kinds local auto mode picks.
      {"pp2-zb-mb4", 2, "dp=1", "", 0, "none", 4, 2, "zb-h1"},
      {"dp2-pp2-zb-mb4", 4, "dp=2", "", 0, "none", 4, 2, "zb-h1"},
  };
  // A model without blocks or sequence: dp x tp and ZeRO (the MLP's tp is
  // Megatron's MLP split, the rules plan::parallel_section writes).
  const std::vector<Case> mlp_cases = {
      {"dp1", 1, "dp=1", "dp"},
      {"dp1-mb4", 1, "dp=1", "dp", 0, "none", 4},
      {"dp2", 2, "dp=2", "dp"},
      {"dp4", 4, "dp=4", "dp"},
      {"tp2", 2, "dp=1,tp=2", "megatron"},
      {"dp2-tp2", 4, "dp=2,tp=2", "megatron"},
      {"dp2-zero1", 2, "dp=2", "dp", 1},
      {"dp2-zero3", 2, "dp=2", "dp", 3},
      {"tp2-ops", 2, "dp=1,tp=2", "ops"},
      {"tp4-ops", 4, "dp=1,tp=4", "ops"},
  };
  // A ResNet (--model configs/models/resnet_fashion.json): batch (dp),
  // channels (tp), height (cp: halo exchanges), residual layers (pp) and
  // ZeRO, each run from the section the planner writes for it.
  const std::vector<Case> resnet_cases = {
      {"dp1", 1, "dp=1", "dp"},
      {"dp2", 2, "dp=2", "dp"},
      {"tp2", 2, "dp=1,tp=2", ""},
      {"cp2", 2, "dp=1,cp=2", ""},
      {"dp2-zero1", 2, "dp=2", "dp", 1},
      {"pp2-1f1b", 2, "dp=1", "", 0, "none", 2, 2, "1f1b"},
      {"pp2-gpipe-mb4", 2, "dp=1", "", 0, "none", 4, 2, "gpipe"},
      {"pp2-zb-mb4", 2, "dp=1", "", 0, "none", 4, 2, "zb-h1"},
      {"pp3-1f1b-mb4", 3, "dp=1", "", 0, "none", 4, 3, "1f1b"},
      {"pp2-tp2", 4, "dp=1,tp=2", "", 0, "none", 2, 2, "1f1b"},
      {"tp2-ops", 2, "dp=1,tp=2", "ops"},
      // Recompute of every residual layer, of the first (without pipelines),
      // and in a pipeline's chunks.
      {"dp2-full", 2, "dp=2", "dp", 0, "full"},
      {"dp1-full:1", 1, "dp=1", "dp", 0, "full", 1, 1, "1f1b", {}, false, 1},
      {"pp2-1f1b-mb4-full", 2, "dp=1", "", 0, "full", 4, 2, "1f1b"},
  };
  const bool resnet = std::holds_alternative<ResNetConfig>(mc);
  const std::vector<Case>& cases = lm ? lm_cases : resnet ? resnet_cases : mlp_cases;

  std::printf("plan accuracy: %s, batch %d x seq %d, cluster %s (%.1f GFLOP/s, %.1f GB/s)\n",
              model.dump().c_str(), batch, lm ? seq : 1, cluster_path.c_str(),
              machine.device.peak_flops.f32 / 1e9,
              machine.device.memory_bandwidth_bytes_per_s / 1e9);
  std::printf("%-16s %5s %10s %10s %7s %6s %6s %10s %10s %7s %8s %7s\n", "plan", "ranks", "pred ms",
              "meas ms", "err", "noise", "clean", "pred MiB", "meas MiB", "err", "best ms", "err");
  std::vector<double> time_err, mem_err, best_err;
  // A case priced: its cluster (the machine shared among its ranks; the
  // profile reads it while the case runs), the price, and the section run.
  struct Priced {
    Case c;
    std::unique_ptr<plan::Cluster> cl;
    plan::StepCost pc;
    json parallel;
    std::string name;  // with the planner's stages
  };
  auto price_case = [&](const Case& c) -> std::optional<Priced> {
    plan::TrainingJob job{mc, batch, lm ? seq : 1};
    Priced p{c,
             std::make_unique<plan::Cluster>(value_or_throw(plan::share_machine(machine, c.ranks))),
             {},
             {},
             c.name};
    plan::CostModel cm(job, *p.cl, plan::meshflow_cpu_constants());
    plan::Plan planned = plan_of(c, batch);
    if (c.planned) {
      Result<std::vector<int64_t>> split = cm.stage_split(planned);
      if (!split.is_ok() || split->empty()) {
        std::printf("%-16s no stage split fits: %s\n", c.name.c_str(),
                    split.is_ok() ? "(none)" : split.status().message().c_str());
        return std::nullopt;
      }
      planned.layers_per_stage = *split;
      for (size_t i = 0; i < planned.layers_per_stage.size(); ++i)
        p.name += (i ? "/" : " ") + std::to_string(planned.layers_per_stage[i]);
    }
    Result<plan::StepCost> pc = cm.price(planned);
    if (!pc.is_ok()) {
      std::printf("%-16s prediction failed: %s\n", c.name.c_str(), pc.status().message().c_str());
      return std::nullopt;
    }
    p.pc = *pc;
    p.parallel = parallel_of(mc, c, pc->plan);  // (an ops plan: the strategies priced)
    return p;
  };
  // One run of a priced case, kept where it is the least disturbed so far
  // (more clean steps, then the faster median).
  auto measure_into = [&](const Priced& p, Result<Measured>* best) {
    g_cluster = p.cl.get();
    Result<Measured> m = measure(model, p.c, p.parallel, batch, seq, warmup, steps);
    if (!best->is_ok() ||
        (m.is_ok() && (m->clean > (*best)->clean ||
                       (m->clean == (*best)->clean && m->step_s < (*best)->step_s))))
      *best = std::move(m);
  };
  // Prints a case's row; what it measured (step_s 0: failed).
  auto report = [&](const Priced& p, const Result<Measured>& me) -> Measured {
    if (!me.is_ok()) {
      std::printf("%-16s run failed: %s\n", p.c.name.c_str(), me.status().message().c_str());
      return {};
    }
    const plan::StepCost* pc = &p.pc;
    const double te = pc->step_time_s / me->step_s - 1;
    const double mem_meas = me->peak;
    const double memerr = pc->memory.total / mem_meas - 1;
    const double be = pc->step_time_s / me->best_s - 1;
    time_err.push_back(std::abs(te));
    mem_err.push_back(std::abs(memerr));
    best_err.push_back(std::abs(be));
    std::printf(
        "%-16s %5d %10.1f %10.1f %+6.1f%% %5.0f%% %3d/%-2d %10.2f %10.2f %+6.1f%% %8.1f "
        "%+6.1f%%\n",
        p.name.c_str(), p.c.ranks, pc->step_time_s * 1e3, me->step_s * 1e3, 100 * te,
        100 * me->spread, me->clean, me->steps, mib(pc->memory.total), mib(mem_meas), 100 * memerr,
        me->best_s * 1e3, 100 * be);
    if (breakdown) {
      const plan::MemoryBreakdown& m = pc->memory;
      const MemoryStats& ms = me->memory;
      std::printf(
          "    predicted: compute %.1f recompute %.1f tp %.1f dp %.1f opt %.1f ms | params %.2f "
          "grads %.2f opt %.2f act %.2f tmp %.2f MiB\n",
          pc->compute_s * 1e3, pc->recompute_s * 1e3, pc->tp_comm_s * 1e3, pc->dp_comm_s * 1e3,
          pc->optimizer_s * 1e3, mib(m.params), mib(m.grads), mib(m.optimizer), mib(m.activations),
          mib(m.temporaries));
      std::printf("    measured:  params %.2f grads %.2f opt %.2f inputs %.2f arena %.2f MiB\n",
                  mib(ms.params), mib(ms.grads), mib(ms.optimizer), mib(ms.inputs), mib(ms.arena));
      if (!me->collectives.empty()) std::printf("    program:   %s\n", me->collectives.c_str());
    }
    std::fflush(stdout);
    return *me;
  };
  // Prices, runs and reports the cases. With --repeat R > 1 the runs go in
  // rounds over all the cases (A B C, A B C, ...), so a drift of the shared
  // machine's speed over minutes falls on every case alike; each case keeps
  // its least disturbed run. With one run each, every row prints as it runs.
  // One Measured per case, in order (step_s 0: not priced or failed).
  auto run_cases = [&](const std::vector<Case>& cases) -> std::vector<Measured> {
    std::vector<std::optional<Priced>> priced;
    for (const Case& c : cases) priced.push_back(price_case(c));
    std::vector<Measured> out(cases.size());
    std::vector<Result<Measured>> best(cases.size(), Status::internal("not run"));
    for (int r = 0; r < repeat; ++r)
      for (size_t i = 0; i < cases.size(); ++i) {
        if (!priced[i]) continue;
        measure_into(*priced[i], &best[i]);
        if (repeat == 1) out[i] = report(*priced[i], best[i]);
      }
    if (repeat > 1)
      for (size_t i = 0; i < cases.size(); ++i)
        if (priced[i]) out[i] = report(*priced[i], best[i]);
    return out;
  };
  if (!auto_ranks.empty()) {
    // Auto mode's choice against the plans it priced: every fitting candidate
    // predicted within --auto-within of the fastest, run and measured.
    for (int ranks : auto_ranks) {
      json train = {{"steps", 1}, {"batch_size", batch}, {"micro_batches", 1}};
      if (lm) train["seq_len"] = seq;
      json doc = {{"model", model},
                  {"data", {{"dataset", lm ? "fortunes" : "fashion_mnist"}}},
                  {"train", train},
                  {"optimizer", {{"type", "adamw"}, {"lr", 1e-3}}},
                  {"parallel", {{"mode", "auto"}, {"search", "full"}}}};
      const RunConfig rc = value_or_throw(parse_run_config(doc, ""));
      const plan::LocalAutoPlan a = value_or_throw(plan::plan_local_run(rc, ranks, machine));
      std::printf("auto mode on %d ranks chose %s (the fastest predicted: %s)\n", ranks,
                  plan::plan_label(a.best.plan).c_str(), plan::plan_label(a.fastest.plan).c_str());
      // The measured fastest by median step and by fastest step: on a shared
      // machine a plan's median can be one disturbed run's, so both are told,
      // with the steps' spread that says whether they differ at all.
      const std::string chosen_name = plan::plan_label(a.best.plan);
      std::string by_median, by_best;
      Measured fastest, fastest_best, chosen;
      std::vector<Case> run;
      for (const plan::StepCost& sc : a.candidates) {
        // (and the chosen plan, which may lie farther: within the spread)
        if (!sc.fits || (sc.step_time_s > a.fastest.step_time_s * (1 + auto_within) &&
                         plan::plan_label(sc.plan) != chosen_name))
          continue;
        const plan::Plan& p = sc.plan;
        Case c;
        c.name = plan::plan_label(p);
        c.ranks = ranks;
        c.mesh = plan::plan_mesh(p);
        c.preset = p.ops      ? "ops"
                   : p.ring   ? (p.sp ? "ring-sp" : "ring")
                   : p.sp     ? "megatron-sp"
                   : p.tp > 1 ? "megatron"
                   : p.cp > 1 ? "ulysses"
                              : "dp";
        c.zero = p.zero;
        c.recompute = plan::recompute_name(p.recompute);
        c.micro_batches = static_cast<int>(p.num_micro_batches);
        c.pp = static_cast<int>(p.pp);
        c.schedule = std::string(schedule_name(p.schedule));
        c.layers = p.layers_per_stage;
        run.push_back(std::move(c));
      }
      const std::vector<Measured> measured = run_cases(run);
      for (size_t i = 0; i < run.size(); ++i) {
        const Measured& m = measured[i];
        const std::string& name = run[i].name;
        if (m.step_s <= 0) continue;
        if (fastest.step_s == 0 || m.step_s < fastest.step_s) fastest = m, by_median = name;
        if (fastest_best.best_s == 0 || m.best_s < fastest_best.best_s)
          fastest_best = m, by_best = name;
        if (name == chosen_name) chosen = m;
      }
      if (chosen.step_s > 0 && fastest.step_s > 0) {
        const double slower = chosen.step_s / fastest.step_s - 1;
        std::printf(
            "auto on %d ranks: chose %s; its median step %+.1f%% against the fastest median (%s), "
            "%s; its fastest step %+.1f%% against the fastest step measured (%s)\n",
            ranks, chosen_name.c_str(), 100 * slower, by_median.c_str(),
            by_median == chosen_name ? "the fastest median itself"
            : slower <= std::max(chosen.spread, fastest.spread)
                ? "within the two plans' step spread (not told apart on this machine)"
                : "beyond the two plans' step spread",
            100 * (chosen.best_s / fastest_best.best_s - 1), by_best.c_str());
      }
    }
    return 0;
  }
  std::vector<Case> chosen_cases;
  for (const Case& c : cases)
    if (only.empty() || only.find("," + c.name + ",") != std::string::npos)
      chosen_cases.push_back(c);
  run_cases(chosen_cases);
  if (!time_err.empty())
    std::printf(
        "median |error|: step time %.1f%% (issue 12's target <= 10%%), peak memory %.1f%% (<= 5%%) "
        "over %zu plans; against each plan's fastest step (the least disturbed, as the "
        "calibration's best-of-N rates are) %.1f%%\n",
        100 * median(time_err), 100 * median(mem_err), time_err.size(), 100 * median(best_err));
  return 0;
}
