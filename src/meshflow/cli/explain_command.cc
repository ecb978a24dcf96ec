#include "meshflow/cli/explain_command.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>

#include "meshflow/engine/job.h"
#include "meshflow/engine/trainer.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/parallel/configured.h"
#include "meshflow/parallel/strategy_search.h"
#include "meshflow/runtime/grad_buckets.h"
#include "meshflow/runtime/progress.h"

namespace meshflow::cli {

namespace {
std::string layouts(const std::vector<Layout>& ls) {
  std::string s;
  for (size_t i = 0; i < ls.size(); ++i) s += (i ? ", " : "") + ls[i].to_string();
  return s;
}
}  // namespace

std::string explain_text(const Graph& g, const Annotation& a, const LocalProgram& p,
                         bool list_nodes, int micro_batches) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "mesh %s: %d ranks; program of rank %d: %d nodes (%d global)\n",
                a.mesh.to_string().c_str(), a.mesh.num_ranks(), p.rank, p.graph.num_nodes(),
                g.num_nodes());
  out += line;
  if (list_nodes) {
    out += "\nnode layouts (inputs -> outputs; how chosen):\n";
    for (NodeId id = 0; id < g.num_nodes(); ++id) {
      const Node& n = g.node(id);
      const ShardingStrategy& st = a.node[id];
      std::snprintf(line, sizeof line, "  %-5s %-16s %-34s %s -> %s  (%s)\n",
                    std::string(phase_name(n.phase)).substr(0, 5).c_str(),
                    std::string(op_name(n.kind)).c_str(), n.name.c_str(),
                    n.inputs.empty() ? "" : layouts(st.inputs).c_str(), layouts(st.outputs).c_str(),
                    a.why[id].c_str());
      out += line;
    }
  }
  if (a.groups.on()) out += "\n" + a.groups.summary(a.mesh) + "\n";
  out += "\ncollectives inserted (per micro-batch in forward/backward, per step in optimizer):\n";
  struct Total {
    int count = 0;
    int64_t bytes = 0;
    int reps = 1;  // runs per training step (runs_per_step)
  };
  std::map<std::pair<std::string, std::string>, Total> totals;  // (phase, kind)
  for (const CollectiveRecord& c : p.collectives) {
    const std::string phase(phase_name(c.phase));
    std::snprintf(line, sizeof line, "  %-9s %-15s over %-3s %-32s for %-32s %s -> %s  %s/rank\n",
                  phase.c_str(), std::string(op_name(c.kind)).c_str(), c.mesh_axis.c_str(),
                  c.value.c_str(), c.consumer.c_str(), c.before.to_string().c_str(),
                  c.after.to_string().c_str(), format_bytes(c.bytes_per_rank).c_str());
    out += line;
    Total& t = totals[{phase, std::string(op_name(c.kind))}];
    ++t.count;
    t.bytes += c.bytes_per_rank;
    t.reps = runs_per_step(c, micro_batches);
  }
  if (p.collectives.empty()) out += "  (none: every node reads its inputs where they are)\n";
  out += "\nper step, by phase and kind (" + std::to_string(micro_batches) + " micro-batch(es)):\n";
  int64_t step_bytes = 0;
  std::map<std::string, int64_t> by_axis;  // per step
  for (const CollectiveRecord& c : p.collectives)
    by_axis[c.mesh_axis] += c.bytes_per_rank * runs_per_step(c, micro_batches);
  for (const auto& [key, t] : totals) {
    const int reps = t.reps;  // metric: evaluation only, 0 in a training step
    std::snprintf(line, sizeof line, "  %-9s %-15s %4d x %d  %s/rank\n", key.first.c_str(),
                  key.second.c_str(), t.count, reps, format_bytes(t.bytes * reps).c_str());
    out += line;
    step_bytes += t.bytes * reps;
  }
  out += "  total sent per rank per step: " + format_bytes(step_bytes) + "\n";
  if (!by_axis.empty()) {
    out += "  by mesh axis:";
    for (const auto& [axis, bytes] : by_axis)
      out += " " + axis + " " + format_bytes(bytes) + " (" + std::to_string(bytes) + " B)";
    out += "\n";
  }
  return out;
}

namespace {

// For each mesh axis: the forward activations every rank along it holds whole
// (Replicate on that axis), largest first, and which op to configure to split
// them. Empty when every large activation is split over every axis.
std::string replicated_activations(const Graph& g, const Annotation& a) {
  std::string out;
  const Mesh& mesh = a.mesh;
  for (int axis = 0; axis < mesh.num_axes(); ++axis) {
    if (mesh.size(axis) == 1) continue;
    std::map<std::string, int64_t> by_op;  // producer glob -> bytes (per rank, whole model)
    int64_t total = 0, split = 0;
    for (NodeId id = 0; id < g.num_nodes(); ++id) {
      const Node& n = g.node(id);
      if (n.phase != Phase::kForward || n.inputs.empty()) continue;
      for (size_t k = 0; k < n.outputs.size(); ++k) {
        const Layout& l = a.node[id].outputs[k];
        int64_t bytes = g.shape(n.outputs[k]).numel() * 4;
        for (int ax = 0; ax < mesh.num_axes(); ++ax)
          if (l.at(ax).is_shard()) bytes /= mesh.size(ax);
        total += bytes;
        if (!l.at(axis).is_replicate()) {
          split += bytes;
          continue;
        }
        by_op[layer_glob(n.name)] += bytes;
      }
    }
    if (total == 0 || split * 2 >= total) continue;  // most activation bytes are split
    std::vector<std::pair<int64_t, std::string>> top;
    for (const auto& [op, bytes] : by_op) top.emplace_back(bytes, op);
    std::sort(top.rbegin(), top.rend());
    out += "  " + mesh.axis_name(axis) + "=" + std::to_string(mesh.size(axis)) + ": " +
           format_bytes(total - split) + " of " + format_bytes(total) +
           " forward activations per rank are whole on every rank along it; largest: ";
    for (size_t i = 0; i < std::min<size_t>(3, top.size()); ++i)
      out += (i ? ", " : "") + top[i].second + " (" + format_bytes(top[i].first) + ")";
    out += ". To split them, configure those ops with a split tuple naming " +
           mesh.axis_name(axis) + " (e.g. the seq dim of \"" + top[0].second +
           "\", as sequence parallelism does), or a rule {\"seq\": \"" + mesh.axis_name(axis) +
           "\"}\n";
  }
  return out;
}

// The strategy search's decisions: per class of forward nodes its split
// tuples and what decided them (its compute, the reshards into it, its
// gradients' reductions, and how much more the next best strategy costs).
std::string search_text(const StrategySearch& r) {
  std::string out = "\nper-operator strategies (the strategy search: " + r.summary() + "):\n";
  char line[512];
  std::snprintf(line, sizeof line, "  %-30s %-34s %9s %9s %9s  %s\n", "nodes", "split tuples",
                "compute", "reshard", "grad red", "next best (+ms)");
  out += line;
  for (const StrategyDecision& d : r.decisions) {
    std::string next = d.runner_up.empty() ? "(no other strategy)" : d.runner_up;
    if (!d.runner_up.empty()) {
      char extra[32];
      std::snprintf(extra, sizeof extra, " (+%.3f)", 1e3 * d.runner_up_extra_s);
      next += extra;
    }
    std::string name = d.pattern;
    if (d.nodes.size() > 1) name += " x" + std::to_string(d.nodes.size());
    std::snprintf(line, sizeof line, "  %-30s %-34s %9.3f %9.3f %9.3f  %s\n", name.c_str(),
                  d.splits.c_str(), 1e3 * d.compute_s, 1e3 * d.comm_in_s, 1e3 * d.grad_reduce_s,
                  next.c_str());
    out += line;
  }
  std::snprintf(line, sizeof line, "  (ms per step; total %.3f ms, bound %.3f ms)\n",
                1e3 * r.objective_s, 1e3 * r.bound_s);
  return out + line;
}

}  // namespace

int run_explain(const ExplainOptions& o) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "meshflow: error: %s\n", s.message().c_str());
    return 2;
  };
  Result<RunConfig> rc = load_run_config(o.config, o.overrides);
  if (!rc.is_ok()) return fail(rc.status());
  // The job's rank count: --ranks, else the config's mesh (x pipeline stages), else 1.
  int world = o.ranks;
  if (world <= 0) {
    world = rc->has_parallel && rc->parallel.has_mesh ? rc->parallel.mesh.num_ranks() : 1;
    if (rc->has_parallel && rc->parallel.pipeline.is_object() &&
        rc->parallel.pipeline.contains("stages") &&
        rc->parallel.pipeline.at("stages").is_number_integer() &&
        rc->parallel.mesh.axis_index("pp") < 0)
      world *= std::max<int>(1, rc->parallel.pipeline.at("stages").get<int>());
  }
  // Resolved exactly as `meshflow train --ranks N` resolves it (auto mode included).
  Result<Job> job = resolve_job(*rc, world);
  if (!job.is_ok()) return fail(job.status());
  const Mesh& mesh = job->mesh;
  if (o.rank < 0 || o.rank >= mesh.num_ranks())
    return fail(Status::invalid("--rank " + std::to_string(o.rank) + " is not on the mesh " +
                                mesh.to_string() + " (0.." + std::to_string(mesh.num_ranks() - 1) +
                                ")"));
  Result<ModelGraph> model = build_training_graph(job->rc, job->micro_batch_rows, job->seq_zigzag);
  if (!model.is_ok()) return fail(model.status());
  StrategyConfig pc = job->rc.parallel;
  if (!job->partitioned) {
    // Mode "data" runs exactly these reductions, bucketed and overlapped.
    pc.preset = "dp";
    pc.rules = preset_rules("dp", mesh);
  }
  Result<Annotation> a =
      annotate_config(model->graph, mesh, pc, job->rc.model_source, &job->reshard_cost);
  if (!a.is_ok()) return fail(a.status());
  Result<LocalProgram> p = lower(model->graph, *a, o.rank, job->reshard_cost);
  if (!p.is_ok()) return fail(p.status());
  std::printf("job: %d rank(s), mode %s, %s\n", world, parallel_mode_name(job->mode),
              job->describe().c_str());
  for (const std::string& note : job->notes) std::printf("note: %s\n", note.c_str());
  int bucketed = 0;
  for (const GradientSync& s : gradient_syncs(p->graph)) bucketed += !s.reduce.empty();
  if (bucketed > 0)
    std::printf(
        "note: the all_reduces of %d parameter gradients (optimizer phase below) run in buckets "
        "of %g MiB, started during the backward as each bucket's gradients are final "
        "(train.bucket_mib, train.overlap_comm)\n",
        bucketed, job->rc.train.bucket_mib);
  if (job->pipeline)
    std::printf(
        "note: each of the %d pipeline stages runs its layers of this program on its own "
        "sub-mesh; activations cross stages point to point (%d micro-batches)\n",
        job->pipeline->stages, job->pipeline->micro_batches);
  if (job->auto_plan) {
    const plan::StepCost& best = job->auto_plan->best;
    std::printf("planned by search: %s, predicted %.1f ms per step\n",
                plan::plan_label(best.plan).c_str(), 1e3 * best.step_time_s);
    const plan::StepCost& fastest = job->auto_plan->fastest;
    if (!(fastest.plan == best.plan))
      std::printf(
          "  over %s, predicted %.1f%% faster: within the local model's %.0f%% spread, the "
          "plan with fewer synchronizing collectives (smaller tp x cp, then fewer stages, then no "
          "ZeRO)\n",
          plan::plan_label(fastest.plan).c_str(),
          100 * (best.step_time_s / fastest.step_time_s - 1), 100 * job->auto_plan->spread);
    if (best.plan.searched) std::fputs(search_text(*best.plan.searched).c_str(), stdout);
  } else if (o.predict) {
    // The user's own layout, priced as `train --check-plan` prices it.
    Result<plan::Cluster> local = plan::load_local_cluster();
    Status priced = local.is_ok() ? price_job_plan(&*job, *local) : local.status();
    if (!priced.is_ok()) {
      std::printf("predicted: not priced: %s\n", priced.message().c_str());
    } else {
      const plan::StepCost& mine = job->plan_check->best;
      const plan::StepCost& fastest = job->plan_check->fastest;
      std::printf("predicted on this machine: %s, %.1f ms per step, %.2f MiB per rank%s\n",
                  plan::plan_label(mine.plan).c_str(), 1e3 * mine.step_time_s,
                  mine.memory.total / (1 << 20), mine.fits ? "" : " (does not fit)");
      if (fastest.step_time_s < mine.step_time_s * (1 - job->plan_check->spread))
        std::printf(
            "  the fastest of the %zu plans priced: %s, %.1f ms (%.0f%% faster, beyond "
            "the local model's %.0f%% spread)\n",
            job->plan_check->candidates.size(), plan::plan_label(fastest.plan).c_str(),
            1e3 * fastest.step_time_s, 100 * (1 - fastest.step_time_s / mine.step_time_s),
            100 * job->plan_check->spread);
      else
        std::printf(
            "  within the local model's %.0f%% spread of the fastest of the %zu plans "
            "priced (%s, %.1f ms)\n",
            100 * job->plan_check->spread, job->plan_check->candidates.size(),
            plan::plan_label(fastest.plan).c_str(), 1e3 * fastest.step_time_s);
    }
  }
  std::fputs(explain_text(model->graph, *a, *p, o.nodes, job->micro_batches).c_str(), stdout);
  const std::string whole = replicated_activations(model->graph, *a);
  if (!whole.empty())
    std::printf("\nactivations not split (why memory does not shrink):\n%s", whole.c_str());
  return 0;
}

}  // namespace meshflow::cli
