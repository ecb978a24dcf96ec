// The pipeline's time in CostModel::price: the runtime's schedule simulated
// with the plan's per-chunk costs, or the schedules' closed forms (the
// search's sweep).
#include <algorithm>

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
SimCosts CostModel::chunk_sim_costs(const Plan& p, const StageTimes& st) {
  const double v = double(p.vp);
  SimCosts costs;
  costs.forward = st.forward_s / v + st.p2p_s;
  costs.backward_input = st.backward_s / v + st.p2p_s;
  costs.backward_weight = st.weight_grad_s / v;
  costs.backward = costs.backward_input + costs.backward_weight;
  costs.p2p = 0;
  return costs;
}

Result<double> CostModel::simulated_pipeline_s(const Plan& p, const StageTimes& st) const {
  // zb-v's order is made for these chunk costs, as the runtime's for its own.
  const SimCosts costs = chunk_sim_costs(p, st);
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
  const double p2p_mb = 2 * v * st.p2p_s;  // per micro-batch: activation out, gradient back
  const double steady = m * (T + p2p_mb);
  double pipeline = steady;
  if (p.pp > 1) {
    switch (p.schedule) {
      case ScheduleKind::kGPipe:
      case ScheduleKind::k1F1B:
        pipeline = (m + pp - 1) * (T + p2p_mb);
        break;
      case ScheduleKind::kInterleaved:
        pipeline = (m * v + pp - 1) * (T + p2p_mb) / v;
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
    if (model == PipelineModel::kSimulated) {
      Result<double> sim = simulated_pipeline_s(p, st);
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

}  // namespace meshflow::plan
