// The planner checks itself: after a run that auto mode planned
// ("parallel": {"mode": "auto", "search": "full"}), `meshflow train` compares
// the measured steps with the chosen plan's prediction per component
// (compute, collectives, optimizer, step, memory), prints the differences,
// re-ranks the plans it priced with this run's corrections and says when
// another would now be faster; `--calibrate-from-run FILE` writes the local
// cluster file refitted by those corrections.
//
//   RunMeasurement m = measure_run(kernels_after_first_step, kernels_at_end, steps, ...);
//   PlanCheck c = check_plan(*job.auto_plan, m);
//   std::fputs(c.report.c_str(), stderr);
//   Cluster refit = refit_cluster(local, c);
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "meshflow/comm/communicator.h"
#include "meshflow/plan/auto_plan.h"
#include "meshflow/plan/cluster.h"

namespace meshflow::cli {

// What one rank measured per step, over the steps after the first (the
// first pays for warm-up).
struct RunMeasurement {
  int steps = 0;             // steps measured
  double step_s = 0;         // median step time
  double compute_s = 0;      // kernels that are neither collectives nor the optimizer
  double collectives_s = 0;  // collective kernels + the time a step waited on bucketed reductions
  double optimizer_s = 0;    // norm, clipping and update kernels, and the gradient buckets' sums
  bool by_kind = false;      // the engine timed its kernels (else only step and memory)
  int64_t peak_bytes = 0;
  // Whose kernels these are: rank `rank` of `ranks` (slowest_rank_measurement
  // picks the rank with the most work; the peak memory stays rank 0's).
  int rank = 0, ranks = 1;
};

// seconds_by_kind (Engine::seconds_by_kind) after the first step and at the
// end, the steps between, their wall times, the time they waited on gradient
// reductions and summed micro-batches' gradients into the buckets
// (Engine::grad_accumulate_seconds over those steps), the pipeline stash
// copies (Engine::stash_copy_seconds: priced in compute), and the rank's peak memory.
RunMeasurement measure_run(const std::vector<double>& after_first,
                           const std::vector<double>& at_end, int steps,
                           std::vector<double> step_seconds, double comm_wait_s,
                           double grad_accumulate_s, double stash_copy_s, int64_t peak_bytes);

// Collective over every rank of `comm`: each rank's measurement `mine`
// gathered, the one with the most work (compute + optimizer: a pipeline's
// slowest stage, which the prediction's parts are; not its collectives,
// which hold its waits for the others) returned to every rank with rank 0's
// peak memory. A rank that timed no kernels contributes its step time alone.
Result<RunMeasurement> slowest_rank_measurement(Communicator& comm, const RunMeasurement& mine);

struct PlanCheck {
  std::string report;  // the comparison, a few lines
  // measured / predicted: compute (with the optimizer's memory-bound work)
  // and collectives; 1 where the plan predicted none of it. Ranks that
  // time-share the cores (LocalAutoPlan::time_shared_cores) correct by the
  // step, all of it compute: their split is the schedule's, not the kernels'.
  double compute_ratio = 1, comm_ratio = 1;
  // A candidate faster than the chosen plan once both are corrected (empty:
  // the chosen one still wins).
  std::optional<plan::StepCost> faster;
};

PlanCheck check_plan(const plan::LocalAutoPlan& a, const RunMeasurement& m);

// The local cluster file refitted by a run: compute and memory bandwidth
// divided by the compute ratio, link bandwidths by the collectives' ratio.
plan::Cluster refit_cluster(const plan::Cluster& local, const PlanCheck& c);

}  // namespace meshflow::cli
