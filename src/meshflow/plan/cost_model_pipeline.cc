// Pipelines in the cost model: their time in CostModel::price (the runtime's
// schedule simulated with the plan's per-chunk costs, or the schedules'
// closed forms: the search's sweep), a chunk-priced pipeline's ranks
// (stages_from_chunks, memory_by_rank), the stage split chosen by time and
// memory for it (chunk_stage_split), and every stage's memory
// (memory_by_stage).
#include <algorithm>
#include <limits>

#include "meshflow/plan/cost_model.h"

namespace meshflow::plan {

// The runtime's schedule for p, simulated with per-chunk costs: F, B and W of
// a chunk (1/vp of the stage), each compute action carrying its message to the
// neighbour stage (one activation out per F, one gradient back per B), as the
// closed forms charge them.
//
// Beyond a few rounds of micro-batches the schedule is periodic: each further
// round of pp micro-batches adds the same time. So a long run (a million
// micro-batches is a valid plan) is simulated at two lengths with the same
// remainder mod pp, and extended by that round's time.
SimCosts CostModel::chunk_sim_costs(const Plan& p, const StageTimes& st) const {
  const double v = double(p.vp);
  SimCosts costs;
  costs.forward = st.forward_s / v + st.p2p_s;
  costs.backward_input = st.backward_s / v + st.p2p_s;
  costs.backward_weight = st.weight_grad_s / v;
  costs.backward = costs.backward_input + costs.backward_weight;
  costs.p2p = 0;
  if (p2p_overlapped(p)) {  // each message a delay; its compute slowed
    costs.forward = st.forward_s / v + p2p_under_compute_s(p, st.forward_s / v, st.p2p_s);
    costs.backward_input = st.backward_s / v + p2p_under_compute_s(p, st.backward_s / v, st.p2p_s);
    costs.backward = costs.backward_input + costs.backward_weight;
    costs.p2p = st.p2p_s;
  }
  costs.cores = static_cast<int>(cluster_.shared_cores);
  costs.ranks_per_stage = static_cast<int>(p.dp * p.tp * p.cp);
  return costs;
}

bool CostModel::p2p_overlapped(const Plan& p) const {
  return k_.overlap_p2p_interleaved && p.pp > 1 && p.schedule == ScheduleKind::kInterleaved;
}

double CostModel::p2p_under_compute_s(const Plan& p, double compute, double p2p) const {
  const Link& link = cluster_.link_for_axis(p.pp, axis_stride(p, "pp"));
  const double s = std::max(overlap_slowdown_on(link), 0.0);
  // overlap_exposed_s's share while the message is shorter than the
  // compute (slowed); past that the whole compute runs slowed.
  return std::min(p2p * s / (1 + s), compute * s);
}

StageTimes ChunkCost::with_copies(bool split) const {
  StageTimes t = times;
  t.forward_s += save_s;
  t.backward_s += split ? bi_copy_s : restore_s;
  if (split) t.weight_grad_s += w_copy_s;
  return t;
}

// A chunk-priced pipeline's ranks: each holds the chunks the schedule
// places on it (chunk_rank); the slowest rank's times drive the schedule.
void CostModel::stages_from_chunks(const Plan& p, const std::vector<ChunkCost>& chunks,
                                   StageTimes* st, LayerCost* lc, double* p2p_bytes) const {
  double slowest = -1, act = 0;
  const ScheduleOptions so{p.schedule, static_cast<int>(p.pp), 1, static_cast<int>(p.vp)};
  for (int64_t r = 0; r < p.pp; ++r) {
    StageTimes s;
    LayerCost l;
    for (size_t c = 0; c < chunks.size(); ++c) {
      if (chunk_rank(so, static_cast<int>(c)) != r) continue;
      const ChunkCost& k = chunks[c];
      const StageTimes t = k.with_copies(splits_backward(p.schedule));
      s.forward_s += t.forward_s;
      s.backward_s += t.backward_s;
      s.weight_grad_s += t.weight_grad_s;
      s.tp_comm_s += k.times.tp_comm_s;
      s.cp_comm_s += k.times.cp_comm_s;
      s.recompute_s += k.times.recompute_s;
      l.head_params += k.params - k.copied_params;  // (a tied copy is not updated)
      l.head_param_tensors += k.param_tensors;
      l.head_comm_bytes += k.tp_bytes;
      l.outside_cp_bytes += k.cp_bytes;
      l.opt_comm_outside_s += k.opt_comm_s;
      l.opt_comm_outside_bytes += k.opt_comm_bytes;
      l.opt_bucketed_tp_outside_bytes += k.opt_bucketed_tp_bytes;
      l.input_bytes += k.input_bytes;
      act = std::max(act, k.act_bytes);
    }
    const double total = s.forward_s + s.backward_s + s.weight_grad_s;
    if (total > slowest) slowest = total, *st = s;
    if (r == 0 || l.head_params > lc->head_params) *lc = l;
  }
  *p2p_bytes = act;
  st->p2p_s = 0;
  if (p.pp > 1) {
    const Link& pp_link = cluster_.link_for_axis(p.pp, axis_stride(p, "pp"));
    st->p2p_s =
        cluster_.collective_time_s(Collective::kSendRecv, 2, act, pp_link) / k_.p2p_efficiency;
  }
}

Result<std::vector<MemoryBreakdown>> CostModel::memory_by_rank(const Plan& p,
                                                               const std::vector<ChunkCost>& chunks,
                                                               const StageTimes& st) const {
  // The stashes each rank holds at its peak (F done, its B or W not yet):
  // the runtime's schedule simulated with each chunk's stash bytes (a rank's
  // chunks hold different stashes: zb-v's rank 0 the embedding's and the
  // head's); past a few rounds the peak is reached.
  const int64_t m = p.num_micro_batches, pp = p.pp;
  ScheduleOptions so;
  so.kind = p.schedule;
  so.stages = static_cast<int>(pp);
  so.micro_batches = static_cast<int>(m <= 5 * pp ? m : 4 * pp + m % pp);
  so.virtual_stages = static_cast<int>(p.vp);
  so.zb_v_costs = chunk_sim_costs(p, st);  // its order, as simulated_pipeline_s makes it
  MF_ASSIGN_OR_RETURN(const meshflow::Schedule sched, make_schedule(so));
  SimCosts stashes;
  for (const ChunkCost& k : chunks) {
    stashes.stash_bytes.push_back(k.stash_bytes);
    stashes.weight_hold_bytes.push_back(k.weight_hold_bytes);
  }
  MF_ASSIGN_OR_RETURN(const SimResult sim, simulate(sched, stashes));
  std::vector<MemoryBreakdown> out;
  for (int64_t r = 0; r < pp; ++r) {
    double params = 0, copied = 0, arena = 0, inputs = 0, bucketed_tp = 0;
    for (size_t c = 0; c < chunks.size(); ++c) {
      if (chunk_rank(so, static_cast<int>(c)) != r) continue;
      const ChunkCost& k = chunks[c];
      params += double(k.params);
      copied += double(k.copied_params);
      arena += k.arena_bytes;
      inputs += k.input_bytes;
      bucketed_tp += k.opt_bucketed_tp_bytes;
    }
    out.push_back(chunk_rank_memory(p, params, copied, arena, inputs, bucketed_tp,
                                    sim.peak_stash_bytes[static_cast<size_t>(r)]));
  }
  return out;
}

Result<double> CostModel::simulated_pipeline_s(const Plan& p, const SimCosts& costs) const {
  // zb-v's order is made for these chunk costs, as the runtime's for its own.
  int zb_v_order = -1;
  auto makespan = [&](int64_t m) -> Result<double> {
    ScheduleOptions so;
    so.kind = p.schedule;
    so.stages = static_cast<int>(p.pp);
    so.micro_batches = static_cast<int>(m);
    so.virtual_stages = static_cast<int>(p.vp);
    so.zb_v_costs = costs;
    so.zb_v_order = zb_v_order;
    Result<meshflow::Schedule> made = make_schedule(so);
    if (!made.is_ok() && so.zb_v_order >= 0) {  // that order stalls at this length: the best
      so.zb_v_order = -1;
      made = make_schedule(so);
    }
    MF_ASSIGN_OR_RETURN(const meshflow::Schedule sched, std::move(made));
    MF_ASSIGN_OR_RETURN(const SimResult sim, simulate(sched, costs));
    zb_v_order = sched.options.zb_v_order;  // the longer run extends this order
    return sim.makespan;
  };
  const int64_t m = p.num_micro_batches, pp = p.pp;
  // zb-v's order is list-scheduled at the costs, so its rounds repeat only
  // nearly: simulated whole up to 64k micro-batch chunk passes (m = 4096 at
  // pp = 8), then extended from longer runs, with the order chosen for the first.
  const bool zb_v = p.schedule == ScheduleKind::kZbV;
  if (zb_v && m * pp <= 32768) return makespan(m);
  const int64_t rounds = zb_v ? 16 : 4;  // simulated in full up to (rounds + 1) x pp micro-batches
  if (m <= (rounds + 1) * pp) return makespan(m);
  const int64_t m1 = rounds * pp + m % pp, m2 = m1 + pp;
  MF_ASSIGN_OR_RETURN(const double t1, makespan(m1));
  MF_ASSIGN_OR_RETURN(const double t2, makespan(m2));
  return t1 + double((m - m1) / pp) * (t2 - t1);
}

// The pipeline's time for one step's micro-batches (simulated or the
// schedule's closed form, see PipelineModel); fills the step's parts.
Result<double> CostModel::pipeline_time(const Plan& p, const StageTimes& st, PipelineModel model,
                                        StepCost* out) const {
  StepCost& r = *out;
  const double m = double(p.num_micro_batches), pp = double(p.pp), v = double(p.vp);
  const double F = st.forward_s, B = st.backward_s, W = st.weight_grad_s, T = F + B + W;
  // Per micro-batch: an activation out and a gradient back, each blocking its
  // chunk, or with the interleaved schedule's p2p overlapped what they slow
  // the chunks they run under, their delay paid once per stage in the
  // warm-up and the flush.
  const bool async = p2p_overlapped(p);
  const double p2p_mb =
      async
          ? v * (p2p_under_compute_s(p, F / v, st.p2p_s) + p2p_under_compute_s(p, B / v, st.p2p_s))
          : 2 * v * st.p2p_s;
  const double steady = m * (T + p2p_mb);
  double pipeline = steady;
  if (p.pp > 1) {
    switch (p.schedule) {
      case ScheduleKind::kGPipe:
      case ScheduleKind::k1F1B:
        pipeline = (m + pp - 1) * (T + p2p_mb);
        break;
      case ScheduleKind::kInterleaved:
        pipeline = (m * v + pp - 1) * (T + p2p_mb) / v + (async ? 2 * (pp - 1) * st.p2p_s : 0.0);
        break;
      case ScheduleKind::kZbH1:
        // Qi et al. 2023: ZB-H1 (1F1B's memory) leaves (p-1)(F+B-W);
        // (p-1)(F+B-2W) is ZB-H2's, which needs about twice the activations.
        pipeline = steady + (pp - 1) * (std::max(0.0, F + B - W) + 2 * st.p2p_s);
        break;
      case ScheduleKind::kZbV:
        // ZB-H1's form over half-stage chunks: (p-1) max(F, F+B-W)/2, the
        // start-up skew alone when W >= B (schedule.h); shorter W's leave
        // more, which the simulation (the leaders' price) shows.
        pipeline = steady + (pp - 1) * (std::max(F, F + B - W) / 2 + 2 * st.p2p_s);
        break;
    }
    r.pipeline_costs = chunk_sim_costs(p, st);
    if (model == PipelineModel::kSimulated) {
      Result<double> sim = simulated_pipeline_s(p, r.pipeline_costs);
      if (!sim.is_ok()) return sim.status().with_context("plan " + plan_label(p));
      pipeline = *sim;
    }
  }
  r.bubble_s = pipeline - steady;
  r.pp_comm_s = m * p2p_mb;
  r.recompute_s = m * st.recompute_s;
  r.tp_comm_s = m * st.tp_comm_s;
  r.cp_comm_s = m * st.cp_comm_s;
  r.compute_s = m * T - r.recompute_s - r.tp_comm_s - r.cp_comm_s;

  return pipeline;
}

Result<std::vector<int64_t>> CostModel::chunk_stage_split(const Plan& p) const {
  const int64_t L = pipeline_layers_, pp = p.pp;
  if (L < pp) return std::vector<int64_t>{};
  Plan q = p;
  q.layers_per_stage.clear();
  std::shared_ptr<const StrategySearch> searched;
  if (q.ops) {
    MF_ASSIGN_OR_RETURN(searched, op_search(q.tp, q.cp, q.micro_batch));
  }
  // Every block its own chunk (the first with the embedding, the last with
  // the head and the loss), as the runtime's split would cut them.
  MF_ASSIGN_OR_RETURN(
      const std::vector<ChunkCost> blocks,
      chunk_costs(q.tp, q.cp, q.micro_batch, L, q.sp, q.recompute,
                  std::vector<int64_t>(static_cast<size_t>(L), 1), searched, q.ring));
  // The stashes a rank holds: after each of its F, B, Bi and W (in its own
  // order, whatever the timing), n micro-batches from F to B (or Bi) and h
  // from Bi to W; its peak for a stage's stash S and hold H is the most
  // n S + h H over those states.
  const int64_t m = q.num_micro_batches;
  ScheduleOptions so;
  so.kind = q.schedule;
  so.stages = static_cast<int>(pp);
  so.micro_batches = static_cast<int>(m <= 5 * pp ? m : 4 * pp + m % pp);
  MF_ASSIGN_OR_RETURN(const meshflow::Schedule sched, make_schedule(so));
  std::vector<std::vector<std::pair<int, int>>> states(static_cast<size_t>(pp));
  for (int64_t r = 0; r < pp; ++r) {
    int live = 0, held = 0;
    for (const Action& act : sched.ranks[size_t(r)]) {
      switch (act.kind) {
        case ActionKind::kForward:
          ++live;
          break;
        case ActionKind::kBackward:
          --live;
          break;
        case ActionKind::kBackwardInput:
          --live, ++held;
          break;
        case ActionKind::kBackwardWeight:
          --held;
          break;
        default:
          continue;
      }
      states[size_t(r)].emplace_back(live, held);
    }
  }
  auto peak_kept = [&](int64_t r, double stash, double hold) {
    double most = 0;
    for (const auto& [n, h] : states[size_t(r)]) most = std::max(most, n * stash + h * hold);
    return most;
  };

  // What a stage holding blocks [a, b) costs, from its blocks' costs: times,
  // parameters and stashes added, the arena taken as the values its blocks
  // keep readable to the end of a run (their stashes; the messages between
  // its blocks stay inside it) beside the largest of their temporaries, the
  // fed input as the largest block's. Where that puts the stage's memory
  // near its budget (within kNear either way), the stage's own chunk is
  // priced instead, as the runtime cuts it (the program split at a and b).
  constexpr double kNear = 1.25;
  const size_t n = static_cast<size_t>(L);
  auto at = [n](size_t a, size_t b) { return a * (n + 1) + b; };
  std::vector<ChunkCost> range(n * (n + 1));
  std::vector<char> exact_range(n * (n + 1), 0);
  for (size_t a = 0; a < n; ++a)
    for (size_t b = a + 1; b <= n; ++b) {
      ChunkCost& r = range[at(a, b)];
      const ChunkCost& c = blocks[b - 1];
      const ChunkCost prev = b > a + 1 ? range[at(a, b - 1)] : ChunkCost{};
      r.times.forward_s = prev.times.forward_s + c.times.forward_s;
      r.times.backward_s = prev.times.backward_s + c.times.backward_s;
      r.times.weight_grad_s = prev.times.weight_grad_s + c.times.weight_grad_s;
      r.save_s = prev.save_s + c.save_s, r.restore_s = prev.restore_s + c.restore_s;
      r.bi_copy_s = prev.bi_copy_s + c.bi_copy_s, r.w_copy_s = prev.w_copy_s + c.w_copy_s;
      r.params = prev.params + c.params;
      r.copied_params = prev.copied_params + c.copied_params;
      r.stash_bytes = prev.stash_bytes + c.stash_bytes;
      r.weight_hold_bytes = prev.weight_hold_bytes + c.weight_hold_bytes;
      r.opt_bucketed_tp_bytes = prev.opt_bucketed_tp_bytes + c.opt_bucketed_tp_bytes;
      r.input_bytes = std::max(prev.input_bytes, c.input_bytes);
      // (Here kept_bytes: the inner kept values; arena_bytes: the largest temporaries.)
      r.kept_bytes = prev.kept_bytes + c.kept_bytes - c.act_out_bytes - c.grad_out_bytes;
      r.arena_bytes = std::max(prev.arena_bytes, c.arena_bytes - c.kept_bytes);
      r.grad_out_bytes = blocks[a].grad_out_bytes, r.act_out_bytes = c.act_out_bytes;
    }
  for (ChunkCost& r : range) r.arena_bytes += r.kept_bytes + r.grad_out_bytes + r.act_out_bytes;
  const bool split = splits_backward(q.schedule);
  auto time = [&](size_t a, size_t b) {
    const StageTimes t = range[at(a, b)].with_copies(split);
    return t.forward_s + t.backward_s + t.weight_grad_s;
  };
  auto memory = [&](int64_t s, const ChunkCost& c) {
    return chunk_rank_memory(q, double(c.params), double(c.copied_params), c.arena_bytes,
                             c.input_bytes, c.opt_bucketed_tp_bytes,
                             peak_kept(s, c.stash_bytes, c.weight_hold_bytes))
        .total;
  };
  Status failed = Status::ok();
  auto price_range = [&](size_t a, size_t b) {
    std::vector<int64_t> cut;
    if (a > 0) cut.push_back(int64_t(a));
    cut.push_back(int64_t(b - a));
    if (b < n) cut.push_back(int64_t(n - b));
    Result<std::vector<ChunkCost>> cuts = chunk_costs(
        q.tp, q.cp, q.micro_batch, int64_t(cut.size()), q.sp, q.recompute, cut, searched, q.ring);
    if (!cuts.is_ok()) {
      failed = cuts.status();
      return;
    }
    // (Times stay the blocks' sums, copies included: one objective.)
    const ChunkCost sums = range[at(a, b)];
    ChunkCost& r = range[at(a, b)];
    r = (*cuts)[a > 0 ? 1 : 0];
    r.times = sums.times;
    r.save_s = sums.save_s, r.restore_s = sums.restore_s;
    r.bi_copy_s = sums.bi_copy_s, r.w_copy_s = sums.w_copy_s;
    exact_range[at(a, b)] = 1;
  };
  const double usable = k_.usable_memory_fraction * double(cluster_.device.memory_bytes);
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> budget(static_cast<size_t>(pp), usable);  // per stage, for the estimate
  auto estimate = [&](int64_t s, size_t a, size_t b) {
    double bytes = memory(s, range[at(a, b)]);
    const double cap = budget[size_t(s)];
    if (!exact_range[at(a, b)] && bytes < kNear * cap && bytes * kNear > cap && b - a < n) {
      price_range(a, b);
      bytes = memory(s, range[at(a, b)]);
    }
    return bytes;
  };

  // The split with every stage's time within T of least largest memory share
  // (inf when none fits); *split gets it.
  auto solve = [&](double T, std::vector<int64_t>* split) {
    // share[s][b]: stages 0..s hold blocks [0, b); from[s][b]: where stage s starts.
    std::vector<std::vector<double>> share(size_t(pp), std::vector<double>(n + 1, inf));
    std::vector<std::vector<size_t>> from(size_t(pp), std::vector<size_t>(n + 1, 0));
    for (int64_t s = 0; s < pp; ++s) {
      const size_t lo = size_t(s) + 1, hi = n - size_t(pp - 1 - s);
      for (size_t b = lo; b <= hi; ++b)
        for (size_t a = size_t(s); a < (s == 0 ? 1 : b); ++a) {  // stage s starts at block a
          const double before = s == 0 ? 0.0 : share[size_t(s - 1)][a];
          if (before == inf || time(a, b) > T || budget[size_t(s)] <= 0) continue;
          const double here = std::max(before, estimate(s, a, b) / budget[size_t(s)]);
          if (here < share[size_t(s)][b]) share[size_t(s)][b] = here, from[size_t(s)][b] = a;
        }
    }
    const double worst = share[size_t(pp - 1)][n];
    if (worst < inf && split) {
      split->assign(size_t(pp), 0);
      size_t b = n;
      for (int64_t s = pp - 1; s >= 0; --s) {
        const size_t a = from[size_t(s)][b];
        (*split)[size_t(s)] = int64_t(b - a);
        b = a;
      }
    }
    return worst;
  };
  // The least slowest-stage time that fits: a bisection over the ranges' times.
  std::vector<double> times;
  for (size_t a = 0; a < n; ++a)
    for (size_t b = a + 1; b <= n; ++b)
      if (b - a < n) times.push_back(time(a, b));
  std::sort(times.begin(), times.end());
  times.erase(std::unique(times.begin(), times.end()), times.end());
  // The fastest split that fits the estimate (where none does, the one of
  // least largest share) is priced whole: each stage's own program and the
  // stash its schedule holds. Where that does not fit, its stages' budgets
  // for the estimate become the usable memory less the estimate's error
  // there, and the next split is tried.
  std::vector<std::vector<int64_t>> tried;
  for (int round = 0; round < 6; ++round) {
    size_t lo = 0, hi = times.size() - 1;  // the least time whose split fits the estimate
    if (solve(times[hi], nullptr) <= 1)
      while (lo < hi) {
        const size_t mid = (lo + hi) / 2;
        if (solve(times[mid], nullptr) <= 1)
          hi = mid;
        else
          lo = mid + 1;
      }
    std::vector<int64_t> split;
    const double share = solve(times[hi], &split);
    MF_RETURN_IF_ERROR(failed);
    if (share == inf) break;  // no stage budget left
    if (std::find(tried.begin(), tried.end(), split) != tried.end()) break;
    tried.push_back(split);
    q.layers_per_stage = split;
    MF_ASSIGN_OR_RETURN(
        const std::vector<ChunkCost> chunks,
        chunk_costs(q.tp, q.cp, q.micro_batch, pp, q.sp, q.recompute, split, searched, q.ring));
    MF_ASSIGN_OR_RETURN(const std::vector<MemoryBreakdown> exact,
                        memory_by_rank(q, chunks, StageTimes{}));
    bool fits = true;
    size_t a = 0;
    for (int64_t s = 0; s < pp; ++s) {
      const size_t b = a + size_t(split[size_t(s)]);
      const double total = exact[size_t(s)].total;
      if (total > usable) fits = false;
      budget[size_t(s)] = usable - (total - estimate(s, a, b));
      a = b;
    }
    if (fits) return split;
  }
  return std::vector<int64_t>{};
}

// Every stage's memory: the chunk-priced pipeline's ranks, or the formula's
// stages one by one (the search prices only the worst).
Result<std::vector<MemoryBreakdown>> CostModel::memory_by_stage(const Plan& p) const {
  if (p.pp <= 1) return std::vector<MemoryBreakdown>{};
  const std::string why = invalid_reason(p);
  if (!why.empty()) return Status::invalid("plan " + plan_label(p) + ": " + why);
  std::shared_ptr<const StrategySearch> searched;
  if (p.ops) {
    MF_ASSIGN_OR_RETURN(searched, op_search(p.tp, p.cp, p.micro_batch));
  }
  std::vector<MemoryBreakdown> stages;
  if (prices_by_chunk(p)) {
    MF_ASSIGN_OR_RETURN(const std::vector<ChunkCost> chunks,
                        chunk_costs(p.tp, p.cp, p.micro_batch, p.pp * p.vp, p.sp, p.recompute,
                                    p.layers_per_stage, searched, p.ring, p.recompute_layers));
    StageTimes st;
    LayerCost lc;
    double p2p_bytes = 0;
    stages_from_chunks(p, chunks, &st, &lc, &p2p_bytes);
    MF_ASSIGN_OR_RETURN(stages, memory_by_rank(p, chunks, st));
  } else {
    MF_ASSIGN_OR_RETURN(const LayerCost lc,
                        layer_cost(p.tp, p.cp, p.micro_batch, p.sp, p.ops, p.ring));
    MF_RETURN_IF_ERROR(memory_per_device(p, lc, &stages).status());
  }
  if (p.offload != Offload::kNone)
    for (MemoryBreakdown& m : stages) m.offload_optimizer();  // (as price does)
  return stages;
}

}  // namespace meshflow::plan
