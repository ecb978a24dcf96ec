#include "meshflow/cli/plan_check.h"

#include <algorithm>
#include <cstdio>

#include "meshflow/ops/op_def.h"

namespace meshflow::cli {

namespace {

// Communication: the collectives (ops/op_def.h) and a window op's halo exchange.
bool communicates(OpKind k) {
  return is_collective(k) || k == OpKind::kNeighborExchange || k == OpKind::kNeighborExchangeGrad;
}

bool is_optimizer(OpKind k) {
  return k == OpKind::kSumSquares || k == OpKind::kClipCoef || k == OpKind::kSgdUpdate ||
         k == OpKind::kAdamWUpdate;
}

std::string line(const char* what, double predicted, double measured) {
  char buf[160];
  const double diff = predicted > 0 ? 100 * (measured / predicted - 1) : 0;
  if (predicted > 0)
    std::snprintf(buf, sizeof buf, "  %-12s predicted %9.2f ms  measured %9.2f ms  %+6.1f%%\n",
                  what, 1e3 * predicted, 1e3 * measured, diff);
  else
    std::snprintf(buf, sizeof buf, "  %-12s predicted %9.2f ms  measured %9.2f ms\n", what,
                  1e3 * predicted, 1e3 * measured);
  return buf;
}

}  // namespace

RunMeasurement measure_run(const std::vector<double>& after_first,
                           const std::vector<double>& at_end, int steps,
                           std::vector<double> step_seconds, double comm_wait_s,
                           double grad_accumulate_s, double stash_copy_s, int64_t peak_bytes) {
  RunMeasurement m;
  m.steps = steps;
  m.peak_bytes = peak_bytes;
  m.by_kind = !at_end.empty();
  if (steps < 1) return m;
  for (size_t k = 0; k < at_end.size(); ++k) {
    const double s = at_end[k] - (k < after_first.size() ? after_first[k] : 0.0);
    const OpKind kind = static_cast<OpKind>(k);
    (communicates(kind)   ? m.collectives_s
     : is_optimizer(kind) ? m.optimizer_s
                          : m.compute_s) += s / steps;
  }
  m.collectives_s += comm_wait_s / steps;
  // Priced in the optimizer (CostConstants::grads_accumulated_in_buckets).
  if (m.by_kind) m.optimizer_s += grad_accumulate_s / steps;
  // Priced in the chunks' F and B (ChunkCost::save_s, restore_s).
  if (m.by_kind) m.compute_s += stash_copy_s / steps;
  if (!step_seconds.empty()) {
    std::nth_element(step_seconds.begin(), step_seconds.begin() + step_seconds.size() / 2,
                     step_seconds.end());
    m.step_s = step_seconds[step_seconds.size() / 2];
  }
  return m;
}

Result<RunMeasurement> slowest_rank_measurement(Communicator& comm, const RunMeasurement& mine) {
  constexpr int kFields = 5;
  const float row[kFields] = {float(mine.compute_s), float(mine.collectives_s),
                              float(mine.optimizer_s), float(mine.step_s),
                              mine.by_kind ? 1.0f : 0.0f};
  std::vector<float> all(static_cast<size_t>(kFields * comm.size()));
  MF_RETURN_IF_ERROR(comm.all_gather(row, kFields, all.data()));
  RunMeasurement out = mine;
  out.ranks = comm.size();
  // By work (compute and optimizer), not collectives: a rank's collectives
  // hold its waits for the others, so the rank the others wait on, the
  // slowest, has the least of them.
  double most = -1;
  for (int r = 0; r < comm.size(); ++r) {
    const float* f = &all[static_cast<size_t>(kFields * r)];
    const double work = double(f[0]) + f[2];
    if (work <= most) continue;
    most = work;
    out.rank = r;
    out.compute_s = f[0], out.collectives_s = f[1], out.optimizer_s = f[2], out.step_s = f[3];
    out.by_kind = f[4] > 0;
  }
  return out;  // (peak_bytes and steps: this rank's; rank 0 reports them)
}

PlanCheck check_plan(const plan::LocalAutoPlan& a, const RunMeasurement& m) {
  PlanCheck c;
  const plan::StepCost& p = a.best;
  // A pipeline's bubble and stage-to-stage transfers are no kernels: they
  // are the step's rest (wall time less kernels), beside the prediction's.
  const bool pipeline = p.plan.pp > 1;
  const double p_compute = p.compute_s + p.recompute_s + (pipeline ? 0 : p.bubble_s);
  const double p_comm = p.tp_comm_s + p.cp_comm_s + p.dp_comm_s + (pipeline ? 0 : p.pp_comm_s);
  const std::string who = m.ranks > 1 ? "rank " + std::to_string(m.rank) + " of " +
                                            std::to_string(m.ranks) + " (the most compute)"
                                      : "rank 0";
  std::string r = "plan check (" + plan::plan_label(p.plan) + ", " + who + ", " +
                  std::to_string(m.steps) + " steps after the first" +
                  (m.ranks > 1 ? "; collectives include waiting for the other ranks" : "") + "):\n";
  // Ranks time-sharing the cores: while one waits in a collective the others
  // compute on its core, so a rank's kernels run faster than its share and
  // its collectives hold the others' compute. The split measures the
  // schedule, not the kernels or the links; the step does.
  const bool time_shared = a.time_shared_cores > 0 && m.ranks > 1;
  r += line("step", p.step_time_s, m.step_s);
  if (!m.by_kind) {
    r += "  (this engine timed no kernels: step and memory only)\n";
  } else {
    r += line("compute", p_compute, m.compute_s);
    r += line("collectives", p_comm, m.collectives_s);  // (with the waits for other ranks)
    r += line("optimizer", p.optimizer_s, m.optimizer_s);
    if (pipeline) {
      r += line("bubble, p2p", p.bubble_s + p.pp_comm_s,
                std::max(0.0, m.step_s - m.compute_s - m.collectives_s - m.optimizer_s));
      if (m.ranks <= 1)
        r += "  (one rank's kernels: the prediction's parts are the slowest stage's, so no "
             "corrections from this pipeline run)\n";
    }
    if (time_shared)
      r += "  (" + std::to_string(m.ranks) + " ranks time-share " +
           std::to_string(a.time_shared_cores) +
           " cores: a rank's kernels ran on the cores the waiting ones gave up, so compute and "
           "collectives are not apart; the step corrects the compute, the links keep their "
           "bandwidth)\n";
  }
  // A pipeline's parts are its slowest stage's: corrections need that
  // stage's kernels (the rank with the most, of every rank's).
  const bool correctable = m.by_kind && (!pipeline || m.ranks > 1);
  char buf[200];
  // Rank 0's memory: a pipeline's stage 0 (the plan's worst stage may be another).
  const double p_memory =
      pipeline && !a.best_stages.empty() ? a.best_stages[0].total : p.memory.total;
  std::snprintf(buf, sizeof buf, "  %-12s predicted %9.2f MiB measured %9.2f MiB %+6.1f%%\n",
                pipeline ? "memory, st 0" : "memory", p_memory / (1 << 20),
                double(m.peak_bytes) / (1 << 20),
                p_memory > 0 ? 100 * (double(m.peak_bytes) / p_memory - 1) : 0.0);
  r += buf;
  // The corrections this run gives: the optimizer is memory-bound work like
  // the compute's small kernels, so it moves with compute. Time-shared: the
  // step's ratio, all of it the compute's (the cores are busy throughout).
  if (correctable && time_shared) {
    if (p.step_time_s > 0 && m.step_s > 0) c.compute_ratio = m.step_s / p.step_time_s;
  } else {
    if (correctable && p_compute + p.optimizer_s > 0 && m.compute_s + m.optimizer_s > 0)
      c.compute_ratio = (m.compute_s + m.optimizer_s) / (p_compute + p.optimizer_s);
    if (correctable && p_comm > 0 && m.collectives_s > 0) c.comm_ratio = m.collectives_s / p_comm;
  }
  auto corrected = [&](const plan::StepCost& s) {
    const double compute = s.compute_s + s.recompute_s + s.bubble_s + s.optimizer_s;
    const double comm = s.tp_comm_s + s.cp_comm_s + s.pp_comm_s + s.dp_comm_s;
    return s.step_time_s + (c.compute_ratio - 1) * compute + (c.comm_ratio - 1) * comm;
  };
  const double mine = corrected(p);
  const plan::StepCost* best = nullptr;
  for (const plan::StepCost& s : a.candidates) {
    if (!s.fits || s.plan == p.plan) continue;
    if (corrected(s) < 0.97 * mine && (!best || corrected(s) < corrected(*best))) best = &s;
  }
  std::snprintf(buf, sizeof buf,
                "  corrections: compute x%.2f, collectives x%.2f (meshflow train "
                "--calibrate-from-run FILE writes the refitted cluster file)\n",
                c.compute_ratio, c.comm_ratio);
  r += buf;
  if (best) {
    c.faster = *best;
    std::snprintf(buf, sizeof buf,
                  "  with these corrections %s would now be faster: %.2f ms per step against "
                  "%.2f ms\n",
                  plan::plan_label(best->plan).c_str(), 1e3 * corrected(*best), 1e3 * mine);
  } else {
    std::snprintf(buf, sizeof buf,
                  "  with these corrections this plan is still the fastest of the %zu "
                  "priced\n",
                  a.candidates.size());
  }
  r += buf;
  c.report = r;
  return c;
}

plan::Cluster refit_cluster(const plan::Cluster& local, const PlanCheck& c) {
  plan::Cluster out = local;
  plan::PeakFlops& f = out.device.peak_flops;
  for (double* v : {&f.f32, &f.tf32, &f.bf16, &f.f16}) *v /= c.compute_ratio;
  out.device.memory_bandwidth_bytes_per_s /= c.compute_ratio;
  out.intra_node.bandwidth_bytes_per_s /= c.comm_ratio;
  out.inter_node.bandwidth_bytes_per_s /= c.comm_ratio;
  out.between_islands.bandwidth_bytes_per_s /= c.comm_ratio;
  return out;
}

}  // namespace meshflow::cli
