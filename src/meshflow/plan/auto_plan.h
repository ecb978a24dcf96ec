// Auto mode for local runs: `"parallel": {"mode": "auto", "search": "full"}`
// with `meshflow train CONFIG --ranks N`. The planner prices every
// data/tensor/pipeline split of the N in-process ranks (mesh dp x tp x pp,
// the Megatron preset with or without sequence parallelism, and the strategy
// search's per-operator layout, Plan::ops; for a language model pipelines
// of 1F1B or ZB-H1 with pp, 2pp or 4pp micro-batches), each ZeRO stage
// (without pipelines) and recompute policy, for this model and batch on this
// machine's calibrated cluster shared among the ranks (share_machine,
// meshflow_cpu_constants), and returns the plan that fits (the rule below)
// as the "parallel" object resolve_job runs like one the user wrote. No
// context parallelism.
//
//   MF_ASSIGN_OR_RETURN(Cluster local, load_local_cluster());        //
//   configs/clusters/local_cpu.json MF_ASSIGN_OR_RETURN(json par, auto_parallel_section(rc, 4,
//   local));
//   // par = {"mode": "semi", "mesh": "dp=2,tp=2", "preset": "megatron", "zero": 1,
//   //        "recompute": "none"}
//   rc.parallel = value_or_throw(parse_strategy_config(par));
//
// The micro-batch count is the config's train.micro_batches (the plan's
// micro-batch = batch_size / (dp x micro_batches)); recompute "none" means the
// plan adds none (train.recompute, when set, still applies).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "meshflow/core/status.h"
#include "meshflow/plan/cluster.h"
#include "meshflow/plan/cost_model.h"
#include "meshflow/runtime/run_config.h"

namespace meshflow::plan {

// How far apart two local plans' predicted step times must be for the model
// to tell them apart: the spread of its relative errors across plan kinds on
// this machine (bench/plan_accuracy --only dp2,tp2-ops,dp4,dp2-tp2,
// dp2-tp2-ops,tp4-ops --repeat 3, 2026-11-26: errors -15.3% to -20.8%, the
// tensor-parallel plans the most negative: the in-process transport's
// synchronizations cost more than its latency when ranks time-share cores).
inline constexpr double kLocalPlanSpread = 0.03;
// The same for a plan whose ranks wait on each other inside the step while
// they time-share fewer cores (Cluster::shared_cores): a pipeline's stages,
// context parallel's ring shifts or all_to_alls every block. Processor
// sharing (SimCosts::cores) predicts those 5-13% fast (bench/plan_accuracy
// pp4-1f1b-mb4, pp2-tp2-mb2, two runs on the 2-core AMD host, 2026-11-26;
// cp4-ring -7.2% and -9.9% on the Intel VM, 2026-11-26), against 3% for the
// plans above.
inline constexpr double kTimeSharedSyncSpread = 0.13;
// The spread of plan p's prediction on `shared` (share_machine's cluster).
double local_plan_spread(const Plan& p, const Cluster& shared);

struct LocalAutoPlan {
  nlohmann::json parallel;                   // the semi-mode "parallel" object of the best plan
  StepCost best;                             // its prediction
  std::vector<MemoryBreakdown> best_stages;  // a pipeline's: every stage's memory (stage 0 first)
  StepCost fastest;                  // the fastest predicted (best, or within the spread of it)
  double spread = kLocalPlanSpread;  // fastest's spread (local_plan_spread), the window used
  std::vector<StepCost> candidates;  // every valid plan priced (fitting or not)
  // The cores the ranks time-share as priced (share_machine with more ranks
  // than cores: Cluster::shared_cores); 0: a core or more each.
  int64_t time_shared_cores = 0;
};

// The plan for `rc`'s model, train.batch_size, train.seq_len and
// train.micro_batches on `ranks` local ranks of the one-device cluster
// `local`: of the fitting plans predicted within the fastest's spread
// (local_plan_spread) of it, the one with the smallest tp x cp, then the fewest stages, then
// without ZeRO, then the fastest (ties: less memory). Any model the engine builds (the MLP's plans
// are dp x tp with ZeRO; the language models' also cp without pipelines). Errors: no split valid
// for the batch and the model's widths, nothing fits.
Result<LocalAutoPlan> plan_local_run(const RunConfig& rc, int ranks, const Cluster& local);

// A layout the user chose (not auto mode's), priced as plan_local_run prices
// its candidates, for the train-time plan check (`meshflow train
// --check-plan`): best = p's prediction, parallel = parallel_section(p),
// candidates = every plan plan_local_run prices (so the check can say that
// another would be faster) with p among them, fastest = the fastest that
// fits. Errors: p is not valid for this model, batch and ranks (why).
Result<LocalAutoPlan> price_local_plan(const RunConfig& rc, int ranks, const Cluster& local,
                                       const Plan& p);

// The run config's "parallel" object that runs plan `p` exactly (one function
// for `meshflow plan --out` and auto mode, so what is priced is what runs):
// dp alone: mode "data" (bucketed, overlapped all-reduces); tp: preset
// "megatron" ("megatron-sp" with sp; with cp as well, the sequence split over
// cp and Ulysses attention on heads over tp*cp); cp alone: preset "ulysses";
// ZeRO: "zero" on the partitioner (preset "dp" when nothing else splits); pp:
// "pipeline" with the schedule, micro-batches and virtual stages; recompute:
// "recompute". A model without attention heads (the MLP) gets Megatron's MLP
// split as rules in place of a preset (see the .cc); it has no cp, sp or pp.
Result<nlohmann::json> parallel_section(const Plan& p, const ModelConfig& model);

// plan_local_run(...).parallel.
Result<nlohmann::json> auto_parallel_section(const RunConfig& rc, int ranks, const Cluster& local);

// This machine's cluster: the file `path` when given; else the file
// $MESHFLOW_LOCAL_CLUSTER names; else a calibration of this very machine (its
// device name, this_machine_device_name(), matches): the cached one
// (local_cluster_cache_path()) when this build's software measured it
// (Cluster::calibrated_with == calibration_software()), else
// configs/clusters/local_cpu.json (under
// the current directory, then under the source tree this library was built
// from) when it was measured here; else this machine is measured now
// (plan::calibrate, seconds, once: the result is cached, and a line on
// stderr says which file was not this machine's and where the new one is).
// Errors: a named file missing or invalid (listing the places tried), a
// calibration that fails.
Result<Cluster> load_local_cluster(const std::string& path = "");

// Where load_local_cluster caches this machine's calibration:
// $MESHFLOW_CACHE_DIR, else $XDG_CACHE_HOME/meshflow, else ~/.cache/meshflow;
// one file per device name (a home shared by several machines keeps each
// one's). Empty when none of those is set.
std::string local_cluster_cache_path();

}  // namespace meshflow::plan
