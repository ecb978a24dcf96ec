#include "meshflow/plan/simulate.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <string>
#include <vector>

#include "meshflow/core/check.h"

namespace meshflow::plan {

namespace {

enum Kind { kF = 0, kB = 1, kW = 2 };

struct Op {
  Kind kind;
  int64_t chunk, mb;
};

// The order stage `s` runs its forward and backward chunks in.
std::vector<Op> stage_order(const Plan& p, int64_t s) {
  const int64_t m = p.num_micro_batches, v = p.vp, pp = p.pp;
  std::vector<Op> fwd, bwd;
  for (int64_t k = 0; k < m * v; ++k) {
    if (p.schedule == Schedule::kInterleaved) {
      // Megatron-LM: groups of pp micro-batches go through chunk 0, then chunk 1, ...
      const int64_t mb = (k / (pp * v)) * pp + k % pp, c = (k / pp) % v;
      fwd.push_back({kF, c, mb});
      bwd.push_back({kB, v - 1 - c, mb});
    } else {
      fwd.push_back({kF, 0, k});
      bwd.push_back({kB, 0, k});
    }
  }
  std::vector<Op> order;
  if (p.schedule == Schedule::kGPipe || pp == 1) {
    order = fwd;
    order.insert(order.end(), bwd.begin(), bwd.end());
    return order;
  }
  const int64_t n = m * v;
  const int64_t warm = p.schedule == Schedule::kInterleaved
                           ? std::min((pp - s - 1) * 2 + (v - 1) * pp, n)
                           : std::min(pp - s - 1, n);
  size_t fi = 0, bi = 0;
  for (; fi < static_cast<size_t>(warm); ++fi) order.push_back(fwd[fi]);
  while (fi < fwd.size()) {
    order.push_back(fwd[fi++]);
    order.push_back(bwd[bi++]);
  }
  while (bi < bwd.size()) order.push_back(bwd[bi++]);
  return order;
}

std::string op_name(const Op& o, int64_t v) {
  const char* k = o.kind == kF ? "F" : o.kind == kB ? "B" : "W";
  std::string s = std::string(k) + " mb=" + std::to_string(o.mb);
  if (v > 1) s += " chunk=" + std::to_string(o.chunk);
  return s;
}

}  // namespace

SimulatedStep simulate_step(const StepCost& c) {
  const Plan& p = c.plan;
  const int64_t pp = p.pp, v = p.vp, m = p.num_micro_batches;
  const bool zb = p.schedule == Schedule::kZeroBubbleH1;
  const double f_dur = c.stage.forward_s / double(v);
  const double w_dur = c.stage.weight_grad_s / double(v);
  const double b_dur = c.stage.backward_s / double(v) + (zb ? 0.0 : w_dur);
  const double p2p = c.stage.p2p_s;
  const double us = 1e6;

  // finish[kind][stage][chunk][mb], -1 until scheduled.
  auto at = [&](int k, int64_t s, int64_t ch, int64_t mb) {
    return ((static_cast<size_t>(k) * pp + s) * v + ch) * m + mb;
  };
  std::vector<double> finish(static_cast<size_t>(3 * pp * v * m), -1.0);
  // When op (stage s) may start by its data dependencies; < 0 if not yet known.
  auto ready = [&](const Op& o, int64_t s) -> double {
    if (o.kind == kF) {
      if (s > 0)
        return finish[at(kF, s - 1, o.chunk, o.mb)] < 0
                   ? -1
                   : finish[at(kF, s - 1, o.chunk, o.mb)] + p2p;
      if (o.chunk > 0) {
        const double f = finish[at(kF, pp - 1, o.chunk - 1, o.mb)];
        return f < 0 ? -1 : f + p2p;
      }
      return 0;
    }
    const double own = finish[at(kF, s, o.chunk, o.mb)];
    if (own < 0) return -1;
    double dep = own;
    if (s < pp - 1) {
      const double b = finish[at(kB, s + 1, o.chunk, o.mb)];
      if (b < 0) return -1;
      dep = std::max(dep, b + p2p);
    } else if (o.chunk < v - 1) {
      const double b = finish[at(kB, 0, o.chunk + 1, o.mb)];
      if (b < 0) return -1;
      dep = std::max(dep, b + p2p);
    }
    return dep;
  };

  SimulatedStep out;
  std::vector<int> compute_track(pp), p2p_track(pp);
  for (int64_t s = 0; s < pp; ++s) {
    const std::string proc = "stage " + std::to_string(s);
    compute_track[s] = out.trace.track(static_cast<int>(s), proc, 0, "compute");
    p2p_track[s] = out.trace.track(static_cast<int>(s), proc, 1, "p2p");
  }
  std::vector<std::vector<Op>> order(pp);
  for (int64_t s = 0; s < pp; ++s) order[s] = stage_order(p, s);
  std::vector<size_t> next(pp, 0);
  std::vector<double> free_at(pp, 0.0), busy(pp, 0.0);
  std::vector<std::deque<Op>> pending_w(pp);
  size_t remaining = 0;
  for (const auto& o : order) remaining += o.size();
  remaining += zb ? static_cast<size_t>(pp * v * m) : 0;

  const double min_dur = std::min(f_dur, b_dur);
  std::vector<double> t_main(pp);
  while (remaining > 0) {
    // The earliest start of each stage's next F or B (-1: its inputs are not known yet).
    double t0 = std::numeric_limits<double>::infinity();
    for (int64_t s = 0; s < pp; ++s) {
      t_main[s] = -1;
      if (next[s] < order[s].size()) {
        const double r = ready(order[s][next[s]], s);
        if (r >= 0) t_main[s] = std::max(free_at[s], r);
      }
      if (t_main[s] >= 0) t0 = std::min(t0, t_main[s]);
    }
    double best_t = std::numeric_limits<double>::infinity();
    int64_t best_s = -1;
    bool best_is_w = false;
    for (int64_t s = 0; s < pp; ++s) {
      // A deferred W runs where it delays nothing: before an F/B that cannot
      // start until after it (an unknown input arrives no sooner than t0 + one op + p2p).
      bool use_w = false;
      if (!pending_w[s].empty()) {
        const double earliest = t_main[s] >= 0 ? t_main[s]
                                : next[s] < order[s].size()
                                    ? t0 + min_dur + p2p
                                    : std::numeric_limits<double>::infinity();
        use_w = earliest >= free_at[s] + w_dur - 1e-12;
      }
      const double t = use_w ? free_at[s] : t_main[s];
      if (t >= 0 && t < best_t) {
        best_t = t;
        best_s = s;
        best_is_w = use_w;
      }
    }
    if (best_s < 0) {  // only deferred Ws can run: the stage free first runs one
      for (int64_t s = 0; s < pp; ++s)
        if (!pending_w[s].empty() && free_at[s] < best_t) {
          best_t = free_at[s];
          best_s = s;
          best_is_w = true;
        }
    }
    MF_CHECK(best_s >= 0) << "pipeline schedule deadlocked: " << plan_label(p);
    const int64_t s = best_s;
    Op o;
    double dur;
    if (best_is_w) {
      o = pending_w[s].front();
      pending_w[s].pop_front();
      dur = w_dur;
    } else {
      o = order[s][next[s]++];
      dur = o.kind == kF ? f_dur : b_dur;
    }
    if (best_t > free_at[s] + 1e-12)
      out.trace.span(compute_track[s], "bubble", "bubble", free_at[s] * us,
                     (best_t - free_at[s]) * us);
    const double end = best_t + dur;
    finish[at(o.kind, s, o.chunk, o.mb)] = end;
    free_at[s] = end;
    busy[s] += dur;
    --remaining;
    const char* cat = o.kind == kF ? "forward" : o.kind == kB ? "backward" : "weight_grad";
    out.trace.span(compute_track[s], op_name(o, v), cat, best_t * us, dur * us,
                   {{"micro_batch", std::to_string(o.mb)}, {"chunk", std::to_string(o.chunk)}});
    if (o.kind == kB && zb) pending_w[s].push_back({kW, o.chunk, o.mb});
    // Sends to the neighbour that needs this result.
    const bool send_f = o.kind == kF && (s < pp - 1 || o.chunk < v - 1);
    const bool send_b = o.kind == kB && (s > 0 || o.chunk > 0);
    if ((send_f || send_b) && pp > 1 && p2p > 0)
      out.trace.span(p2p_track[s], send_f ? "send activation" : "send gradient", "send", end * us,
                     p2p * us, {{"micro_batch", std::to_string(o.mb)}});
  }
  double pipeline_end = 0;
  for (double f : free_at) pipeline_end = std::max(pipeline_end, f);
  double idle = 0;
  for (int64_t s = 0; s < pp; ++s) {
    if (pipeline_end > free_at[s] + 1e-12)
      out.trace.span(compute_track[s], "bubble", "bubble", free_at[s] * us,
                     (pipeline_end - free_at[s]) * us);
    idle += pipeline_end - busy[s];
    double t = pipeline_end;
    if (c.dp_comm_s > 0) {
      out.trace.span(compute_track[s], "gradient reduce (exposed)", "collective", t * us,
                     c.dp_comm_s * us, {{"zero", std::to_string(p.zero)}});
      t += c.dp_comm_s;
    }
    out.trace.span(compute_track[s], "optimizer", "optimizer", t * us, c.optimizer_s * us);
  }
  out.pipeline_s = pipeline_end;
  out.step_time_s = pipeline_end + c.dp_comm_s + c.optimizer_s;
  out.bubble_fraction = pipeline_end > 0 ? idle / (double(pp) * pipeline_end) : 0;
  return out;
}

namespace {

Result<int64_t> get_int(const json& j, const std::string& where, const std::string& key,
                        int64_t dflt, bool required) {
  if (!j.is_object() || !j.contains(key)) {
    if (required) return Status::invalid(where + "." + key + " is required");
    return dflt;
  }
  const json& v = j.at(key);
  if (!v.is_number_integer() || v.get<int64_t>() < 0)
    return Status::invalid(where + "." + key + " must be an integer >= 0, got " + v.dump());
  return v.get<int64_t>();
}

}  // namespace

Result<PlannedRun> parse_plan_file(const json& f) {
  PlannedRun r;
  if (!f.is_object() || !f.contains("model") || !f.contains("parallel") || !f.contains("plan"))
    return Status::invalid(
        "a plan file has \"model\", \"train\", \"parallel\" and \"plan\" (write one with "
        "meshflow plan --out)");
  MF_ASSIGN_OR_RETURN(r.job.model, parse_model_config(f.at("model")));
  const json train = f.value("train", json::object());
  MF_ASSIGN_OR_RETURN(r.job.global_batch, get_int(train, "train", "batch_size", 0, true));
  MF_ASSIGN_OR_RETURN(r.job.seq, get_int(train, "train", "seq_len", 0, true));
  const json& planner = f.at("plan");
  if (!planner.is_object() || !planner.contains("cluster"))
    return Status::invalid("plan.cluster is required (the cluster the plan was made for)");
  MF_ASSIGN_OR_RETURN(r.cluster, parse_cluster(planner.at("cluster")));
  const std::string attention = planner.value("attention", std::string("fused"));
  if (attention != "fused" && attention != "materialized")
    return Status::invalid("plan.attention must be fused or materialized, got " + attention);
  if (attention == "materialized") r.constants.attention = AttentionKernel::kMaterialized;

  const json& par = f.at("parallel");
  Plan& p = r.plan;
  const std::string mesh = par.value("mesh", std::string());
  size_t start = 0;
  while (start < mesh.size()) {
    size_t end = mesh.find(',', start);
    if (end == std::string::npos) end = mesh.size();
    const std::string item = mesh.substr(start, end - start);
    start = end + 1;
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    const int64_t val = eq == std::string::npos ? -1 : std::atoll(item.c_str() + eq + 1);
    if (val < 1 || (key != "dp" && key != "tp" && key != "pp" && key != "cp"))
      return Status::invalid("parallel.mesh: '" + item +
                             "' must be axis=size with axis one of dp, tp, pp, cp");
    (key == "dp" ? p.dp : key == "tp" ? p.tp : key == "pp" ? p.pp : p.cp) = val;
  }
  const json pipe = par.value("pipeline", json::object());
  MF_ASSIGN_OR_RETURN(int64_t stages, get_int(pipe, "parallel.pipeline", "stages", p.pp, false));
  if (stages != p.pp)
    return Status::invalid("parallel.pipeline.stages=" + std::to_string(stages) +
                           " differs from the mesh's pp=" + std::to_string(p.pp));
  // Micro-batches: the pipeline's, else train.micro_batches (gradient accumulation).
  MF_ASSIGN_OR_RETURN(int64_t accumulate, get_int(train, "train", "micro_batches", 1, false));
  MF_ASSIGN_OR_RETURN(p.num_micro_batches,
                      get_int(pipe, "parallel.pipeline", "micro_batches", accumulate, false));
  MF_ASSIGN_OR_RETURN(p.vp, get_int(pipe, "parallel.pipeline", "virtual_stages", 1, false));
  MF_ASSIGN_OR_RETURN(p.schedule, parse_schedule(pipe.value("schedule", std::string("1f1b"))));
  MF_ASSIGN_OR_RETURN(p.recompute, parse_recompute(par.value("recompute", std::string("none"))));
  MF_ASSIGN_OR_RETURN(int64_t zero, get_int(par, "parallel", "zero", 0, false));
  p.zero = static_cast<int>(zero);
  p.sp = par.value("preset", std::string()) == "megatron-sp";
  const int64_t per_mb = p.dp * std::max<int64_t>(1, p.num_micro_batches);
  if (p.num_micro_batches < 1 || r.job.global_batch % per_mb != 0)
    return Status::invalid("train.batch_size=" + std::to_string(r.job.global_batch) +
                           " is not a multiple of dp * micro_batches = " + std::to_string(per_mb));
  p.micro_batch = r.job.global_batch / per_mb;
  return r;
}

}  // namespace meshflow::plan
