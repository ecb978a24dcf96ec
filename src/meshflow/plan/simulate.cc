#include "meshflow/plan/simulate.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "meshflow/core/check.h"
#include "meshflow/models/cells.h"
#include "meshflow/models/from_config.h"
#include "meshflow/optim/optimizer.h"
#include "meshflow/parallel/strategy.h"
#include "meshflow/pipeline/pipeline_config.h"
#include "meshflow/plan/emit.h"
#include "meshflow/runtime/run_config.h"

namespace meshflow::plan {

SimulatedStep simulate_step(const StepCost& c) {
  const Plan& p = c.plan;
  const int64_t pp = p.pp, v = p.vp;
  // The runtime's schedule (pipeline/schedule.h: the per-rank orders the
  // pipeline engine executes), run by its simulator with this plan's costs
  // per chunk: F, B (B + W fused unless zb-h1 splits them), one p2p message.
  ScheduleOptions so;
  so.kind = p.schedule;
  so.stages = static_cast<int>(pp);
  so.micro_batches = static_cast<int>(p.num_micro_batches);
  so.virtual_stages = static_cast<int>(v);
  // The costs the cost model simulated (StepCost::pipeline_costs): a message
  // blocking the action that sends it is drawn inside it, one overlapped
  // (costs.p2p) on the p2p track; ranks time-sharing a machine's cores
  // (SimCosts::cores) stretch their actions, drawn as they ran.
  SimCosts costs;
  if (pp > 1) {
    costs = c.pipeline_costs;
  } else {
    costs.forward = c.stage.forward_s / double(v);
    costs.backward_input = c.stage.backward_s / double(v);
    costs.backward_weight = c.stage.weight_grad_s / double(v);
    costs.backward = costs.backward_input + costs.backward_weight;
  }
  // zb-v's order: made for these chunk costs, as the cost model made it.
  so.zb_v_costs = costs;
  Result<meshflow::Schedule> sched = make_schedule(so);
  MF_CHECK(sched.is_ok()) << plan_label(p) << ": " << sched.status().message();
  Result<SimResult> sim = simulate(*sched, costs);
  MF_CHECK(sim.is_ok()) << plan_label(p) << ": " << sim.status().message();

  const double us = 1e6;
  SimulatedStep out;
  double pipeline_end = 0;
  std::vector<double> free_at(pp, 0.0);
  std::vector<int> compute_track(pp);
  for (int64_t r = 0; r < pp; ++r) {
    const std::string proc = "stage " + std::to_string(r);
    const int compute = out.trace.track(static_cast<int>(r), proc, 0, "compute");
    compute_track[r] = compute;
    const int p2p = out.trace.track(static_cast<int>(r), proc, 1, "p2p");
    const std::vector<Action>& acts = sched->ranks[r];
    for (size_t k = 0; k < acts.size(); ++k) {
      const Action& a = acts[k];
      const double t = sim->start[r][k], dur = sim->finish[r][k] - t;
      const std::vector<std::pair<std::string, std::string>> args = {
          {"micro_batch", std::to_string(a.micro)}, {"chunk", std::to_string(a.chunk)}};
      if (a.kind == ActionKind::kSendAct || a.kind == ActionKind::kSendGrad) {
        // An overlapped message from the send on; a blocking one at the end
        // of the action that carried it.
        const double msg = costs.p2p > 0 ? costs.p2p : c.stage.p2p_s;
        if (msg > 0)
          out.trace.span(p2p, a.kind == ActionKind::kSendAct ? "send activation" : "send gradient",
                         "send", (costs.p2p > 0 ? t : t - msg) * us, msg * us, args);
        continue;
      }
      if (!is_compute(a.kind)) continue;
      if (t > free_at[r] + 1e-12)
        out.trace.span(compute, "bubble", "bubble", free_at[r] * us, (t - free_at[r]) * us);
      const char* cat = a.kind == ActionKind::kForward          ? "forward"
                        : a.kind == ActionKind::kBackwardWeight ? "weight_grad"
                                                                : "backward";
      std::string name = std::string(action_name(a.kind)) + " mb=" + std::to_string(a.micro);
      if (v > 1) name += " chunk=" + std::to_string(a.chunk / pp);
      out.trace.span(compute, name, cat, t * us, dur * us, args);
      free_at[r] = t + dur;
    }
    pipeline_end = std::max(pipeline_end, free_at[r]);
  }
  for (int64_t r = 0; r < pp; ++r) {
    const int compute = compute_track[r];
    if (pipeline_end > free_at[r] + 1e-12)
      out.trace.span(compute, "bubble", "bubble", free_at[r] * us,
                     (pipeline_end - free_at[r]) * us);
    double t = pipeline_end;
    if (c.dp_comm_s > 0) {
      out.trace.span(compute, "gradient reduce (exposed)", "collective", t * us, c.dp_comm_s * us,
                     {{"zero", std::to_string(p.zero)}});
      t += c.dp_comm_s;
    }
    out.trace.span(compute, "optimizer", "optimizer", t * us, c.optimizer_s * us);
  }
  double busy = 0;
  for (double b : sim->busy) busy += b;
  out.pipeline_s = pipeline_end;
  out.step_time_s = pipeline_end + c.dp_comm_s + c.optimizer_s;
  out.bubble_fraction = pipeline_end > 0 ? 1 - busy / (double(pp) * pipeline_end) : 0;
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

// An optional boolean of the plan section (plan.fp8, plan.eager, ...): false
// when absent.
Result<bool> get_flag(const json& planner, const std::string& key) {
  if (!planner.contains(key)) return false;
  const json& v = planner.at(key);
  if (!v.is_boolean())
    return Status::invalid("plan." + key + " must be true or false, got " + v.dump());
  return v.get<bool>();
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
  // (A model without a sequence, a ResNet or the MLP, is priced at seq 1.)
  const bool lm = is_language_model(r.job.model);
  MF_ASSIGN_OR_RETURN(r.job.seq, get_int(train, "train", "seq_len", lm ? 0 : 1, lm));
  // The optimizer the plan was priced with (AdamW when the file names none),
  // read as `meshflow train` reads it.
  if (f.contains("optimizer")) {
    OptimizerConfig opt;
    LrSchedule schedule;
    MF_RETURN_IF_ERROR(parse_optimizer(f.at("optimizer"), &opt, &schedule, 1));
    r.job.optimizer_states = optimizer_state_values(opt);
  }
  const json& planner = f.at("plan");
  if (!planner.is_object() || !planner.contains("cluster"))
    return Status::invalid("plan.cluster is required (the cluster the plan was made for)");
  MF_ASSIGN_OR_RETURN(r.cluster, parse_cluster(planner.at("cluster")));
  // The stack the plan was priced as (`meshflow plan --emit`): its constants.
  std::optional<EmitTarget> stack;
  if (planner.contains("stack")) {
    const json& name = planner.at("stack");
    Result<EmitTarget> t = parse_emit_target(name.is_string() ? name.get<std::string>() : "");
    if (!t.is_ok())
      return Status::invalid(
          "plan.stack must be the --emit target the plan was priced for (megatron, deepspeed "
          "or torchtitan), got " +
          name.dump());
    apply_stack_constants(*t, r.cluster.device.peak_flops.bf16 > 0, &r.constants);
    stack = *t;
  }
  // The blocks' linears in FP8 (`meshflow plan --fp8`).
  MF_ASSIGN_OR_RETURN(r.job.fp8, get_flag(planner, "fp8"));
  if (planner.contains("fp8_scaling")) {
    if (!planner.at("fp8_scaling").is_string())
      return Status::invalid("plan.fp8_scaling must be tensorwise or rowwise, got " +
                             planner.at("fp8_scaling").dump());
    MF_ASSIGN_OR_RETURN(
        r.job.fp8_scaling,
        parse_fp8_scaling(planner.at("fp8_scaling").get<std::string>(), "plan.fp8_scaling"));
  }
  // The model's memory-bound ops run eagerly (`meshflow plan --eager`).
  MF_ASSIGN_OR_RETURN(const bool eager, get_flag(planner, "eager"));
  if (eager) set_eager(&r.constants);
  // Kernels launched synchronously (`meshflow plan --launch-blocking`).
  MF_ASSIGN_OR_RETURN(const bool blocking, get_flag(planner, "launch_blocking"));
  if (blocking) set_launch_blocking(&r.constants);
  const json attention = planner.value("attention", json("fused"));
  if (!attention.is_string())
    return Status::invalid(
        "plan.attention must be a string (fused, materialized or a kernel "
        "the cluster lists), got " +
        attention.dump());
  if (stack && attention.get<std::string>() == "fused")
    apply_stack_attention(*stack, r.cluster, &r.constants);  // as `plan --emit` priced it
  else
    MF_RETURN_IF_ERROR(set_attention_kernel(attention.get<std::string>(), r.cluster,
                                            "plan.attention", &r.constants));

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
  MF_ASSIGN_OR_RETURN(p.schedule, parse_schedule_kind(pipe.value("schedule", std::string("1f1b"))));
  MF_ASSIGN_OR_RETURN(p.recompute, parse_recompute(par.value("recompute", std::string("none"))));
  MF_ASSIGN_OR_RETURN(int64_t zero, get_int(par, "parallel", "zero", 0, false));
  p.zero = static_cast<int>(zero);
  p.group = par.value("zero_style", std::string("shard")) == "group";
  const std::string preset = par.value("preset", std::string());
  p.sp = preset == "megatron-sp" || preset == "ring-sp";
  p.ring = preset == "ring" || preset == "ring-sp";
  // The strategy search's plan: split tuples for every operator and no
  // preset (priced again, the deterministic search gives the same tuples).
  p.ops = par.contains("strategies") && !par.contains("preset") && p.tp * p.cp > 1;
  if (pipe.contains("stage_of")) {
    // The user's cells on stages (MindSpore's cell.pipeline_stage), as the
    // job resolves them: blocks per stage.
    MF_ASSIGN_OR_RETURN(const PipelineConfig pc, parse_pipeline_config(pipe));
    MF_ASSIGN_OR_RETURN(const ModelGraph m, build_model(r.job.model, /*batch=*/1, /*seq=*/1));
    if (p.pp > static_cast<int64_t>(m.cells.size()))
      return Status::invalid("parallel.pipeline.stage_of: the mesh's pp=" + std::to_string(p.pp) +
                             " stages, the model has " + std::to_string(m.cells.size()) +
                             " cells to place (" + describe_cells(m.cells) + ")");
    MF_ASSIGN_OR_RETURN(p.layers_per_stage,
                        blocks_per_stage(m.cells, pc.stage_of, static_cast<int>(p.pp)));
  } else if (pipe.contains("layers_per_stage")) {
    const json& l = pipe.at("layers_per_stage");
    if (!l.is_array())
      return Status::invalid("parallel.pipeline.layers_per_stage must be a list of block counts");
    for (const json& n : l) {
      if (!n.is_number_integer() || n.get<int64_t>() < 1)
        return Status::invalid("parallel.pipeline.layers_per_stage entries are block counts >= 1");
      p.layers_per_stage.push_back(n.get<int64_t>());
    }
  }
  if (par.contains("recompute_layers")) {
    // Full recompute of some blocks, as `meshflow plan --out` writes it: the
    // first N of each pipeline chunk, by number.
    MF_ASSIGN_OR_RETURN(const StrategyConfig sc, parse_strategy_config(par, "parallel"));
    MF_ASSIGN_OR_RETURN(const TransformerDims d, transformer_dims(r.job.model));
    const std::vector<int64_t> sizes = chunk_blocks(p, d.layers);
    const std::optional<int64_t> n = first_blocks_count(
        sizes, std::vector<int64_t>(sc.recompute_layers.begin(), sc.recompute_layers.end()));
    if (!n)
      return Status::invalid(
          "parallel.recompute_layers: the planner prices full recompute of the first N blocks of "
          "each pipeline chunk (Megatron-LM's block method), as `meshflow plan --out` writes "
          "them; these blocks are another choice");
    p.recompute_layers = *n;
    // Equal interleaved chunks are what the planner's balanced split prices.
    if (p.vp > 1 &&
        std::adjacent_find(sizes.begin(), sizes.end(), std::not_equal_to<>()) == sizes.end())
      p.layers_per_stage.clear();
  }
  const int64_t per_mb = p.dp * std::max<int64_t>(1, p.num_micro_batches);
  if (p.num_micro_batches < 1 || r.job.global_batch % per_mb != 0)
    return Status::invalid("train.batch_size=" + std::to_string(r.job.global_batch) +
                           " is not a multiple of dp * micro_batches = " + std::to_string(per_mb));
  p.micro_batch = r.job.global_batch / per_mb;
  return r;
}

}  // namespace meshflow::plan
