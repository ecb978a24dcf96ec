// Full plan search: every combination of mesh degrees (dp, tp, pp, cp),
// sequence parallelism, pipeline schedule and virtual stages, micro-batch size
// and count, recompute policy and ZeRO stage that is valid for the job and
// fits device memory, priced by the CostModel; each pipeline also with its
// stages chosen by time and memory (CostModel::stage_split), and the leaders
// shown also with the strategy search's per-operator layout (Plan::ops); the
// best K come back.
//
//   CostModel cm(job, *with_devices(cluster, 1024));
//   SearchOptions o;  o.top_k = 3;
//   MF_ASSIGN_OR_RETURN(o.fixed, parse_fixed("tp=8,schedule=interleaved"));
//   MF_ASSIGN_OR_RETURN(SearchResult r, search_plans(cm, 1024, o));
//   r.plans[0].step_time_s;   explain_loss(r.plans[0], r.plans[1]);
//
// Repeated layers make it cheap: the per-rank program of one layer is priced
// once per (tp, cp, micro_batch) (CostModel caches it), and a plan is a few
// hundred floating-point operations on top. Pinning every choice with `fixed`
// prices exactly one plan.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "meshflow/core/status.h"
#include "meshflow/plan/cost_model.h"
#include "meshflow/plan/plan.h"

namespace meshflow::plan {

// Choices pinned by `--fix key=value,...`; unset ones are searched.
struct FixedChoices {
  std::optional<int64_t> dp, tp, pp, cp, vp, micro_batch;
  std::optional<bool> sp;
  std::optional<ScheduleKind> schedule;
  std::optional<Recompute> recompute;
  // Plan::recompute_layers (0: every block). Unpinned, the fitting leaders
  // with full recompute are also priced recomputing the fewest blocks that
  // still fit.
  std::optional<int64_t> recompute_layers;
  std::optional<int> zero;
  std::optional<bool> ops;  // the strategy search's per-operator layout (Plan::ops)
  // Unpinned, offload (Plan::offload) is searched only when no plan fits
  // without it: it trades step time for device memory.
  std::optional<Offload> offload;
  std::optional<bool> group;  // zero_style=group (Plan::group) or shard
  std::optional<bool> ring;   // cp as ring attention (Plan::ring) or Ulysses
  bool matches(const Plan& p) const;
  std::string to_string() const;  // "tp=8,pp=4" ("" when nothing is pinned)
};

// "tp=8,pp=4,schedule=1f1b,sp=true,recompute=full,zero=1". Keys: dp, tp, pp,
// cp, sp, vp, micro_batch, schedule, recompute, recompute_layers, zero,
// zero_style, ops, ring, offload. Errors name the key and what is valid.
Result<FixedChoices> parse_fixed(const std::string& text);

// The largest global batch (sequences per step) the search accepts: far
// above any real job, small enough that tokens per step fit in 64 bits.
inline constexpr int64_t kMaxGlobalBatch = int64_t{1} << 32;

struct SearchOptions {
  int top_k = 3;  // runners-up returned after the best plan
  FixedChoices fixed;
  int64_t max_micro_batch =
      32;  // micro-batch sizes tried: divisors of the replica batch up to this
  int64_t max_cp = 16;
  int64_t max_vp = 8;
  // Stop after this many seconds with the best plans found so far
  // (SearchResult::timed_out); 0: no limit.
  double time_limit_s = 0;
  // The same as an instant, used in place of time_limit_s when set: `meshflow
  // plan` gives the cost model's per-operator searches
  // (CostModel::set_op_search_deadline) and the sweep this one deadline, so
  // both stop together however long the setup between took.
  std::optional<std::chrono::steady_clock::time_point> deadline;
  // Plans this returns a reason for are left out (counted as invalid, the
  // first reason reported when nothing is left): `meshflow plan --emit`
  // searches only the plans the target stack runs as planned.
  std::function<std::string(const Plan&)> reject;
  // Skip the per-operator strategy search of the leaders (the template
  // layouts only).
  bool no_op_search = false;
  // Threads the sweep runs on (its (tp, cp) groups spread over them; the
  // answer does not depend on how many); 0: one per core.
  int threads = 0;
};

struct SearchResult {
  std::vector<StepCost> plans;  // fitting plans, fastest first (at most 1 + top_k)
  int64_t evaluated = 0;        // plans priced
  int64_t valid = 0;            // of those, valid for the job
  int64_t fitting = 0;          // of those, within device memory
  double search_time_s = 0;
  bool timed_out = false;  // stopped at time_limit_s: plans are the best of those priced
};

// Searches plans on exactly `devices` devices of cm.cluster(). Returns the
// best plan and up to top_k runners-up. When nothing is valid or nothing
// fits, an error says why and what would fit (the least memory any plan
// needs; the smallest device count on which the model fits). The work is
// bounded by the divisors of the device count and options.max_micro_batch,
// not by the global batch (at most kMaxGlobalBatch), and by time_limit_s.
Result<SearchResult> search_plans(const CostModel& cm, int64_t devices,
                                  const SearchOptions& options);

// Why `other` is slower than `best`, in one line: the step-time components
// that grew most ("+41 ms pipeline bubble, +12 ms recompute").
std::string explain_loss(const StepCost& best, const StepCost& other);

}  // namespace meshflow::plan
