// A resolved job as the planner's plan (engine/job.h: plan_of_job), for the
// train-time plan check of a layout the user chose.
#include <algorithm>
#include <cctype>
#include <string>
#include <utility>
#include <vector>

#include "meshflow/engine/job.h"
#include "meshflow/models/from_config.h"
#include "meshflow/parallel/strategy_search.h"
#include "meshflow/pipeline/schedule.h"
#include "meshflow/plan/rank_program.h"

namespace meshflow {

namespace {

std::string str(int64_t x) {
  return std::to_string(x);
}

// Everything of a resolved job that decides what runs, as one line: two jobs
// with the same key build the same programs on the same meshes. (Not the
// mode: once resolved, "data" over several ranks and "semi" with the preset
// dp are the same partitioned program. Nor an axis of size 1, which splits
// nothing: the mesh {tp: 2} a user writes and the planner's {dp: 1, tp: 2}
// with its rule {batch: dp} are one program.)
std::string layout_key(const Job& j) {
  const StrategyConfig& par = j.rc.parallel;
  auto trivial = [&](const std::string& axis) {
    const int i = j.mesh.axis_index(axis);
    return i < 0 || j.mesh.size(i) == 1;
  };
  std::string mesh;
  for (const MeshAxis& a : j.mesh.axes())
    if (a.size > 1) mesh += (mesh.empty() ? "" : ", ") + a.name + ": " + str(a.size);
  std::string k = std::string(j.partitioned ? "partitioned" : "one program") + " mesh {" + mesh +
                  "} micro-batches " + str(j.micro_batches);
  if (j.pipeline) {
    const PipelineConfig& pc = *j.pipeline;
    k += " pipeline " + str(pc.stages) + " " + std::string(schedule_name(pc.schedule)) + " v" +
         str(pc.virtual_stages) + " blocks [";
    for (int64_t n : pc.layers_per_stage) k += str(n) + " ";
    k += "]";
  }
  if (!par.preset.empty()) k += " preset " + par.preset;
  if (j.seq_zigzag > 1) k += " zigzag over " + str(j.seq_zigzag);
  if (par.zero > 0) k += " zero" + str(par.zero) + " " + par.zero_style;
  std::vector<std::pair<std::string, std::string>> rules;
  for (const auto& rule : par.rules.rules) {
    const std::vector<std::string> axes = DimRules::axes_in(rule.second);
    if (!std::all_of(axes.begin(), axes.end(), trivial)) rules.push_back(rule);
  }
  std::sort(rules.begin(), rules.end());
  if (!rules.empty()) {
    k += " rules {";
    for (const auto& [dim, axis] : rules) k += dim + ":" + axis + " ";
    k += "}";
  }
  // A split tuple's trivial axes as 1 ("(dp, cp, 1, 1)" on dp = 1 is "(1, cp, 1, 1)";
  // numbers, MindSpore's split counts, stay).
  auto splits_key = [&](const std::string& splits) {
    std::string out, name;
    auto flush = [&] {
      const bool axis = !name.empty() && !std::isdigit(static_cast<unsigned char>(name[0]));
      out += axis && trivial(name) ? "1" : name;
      name.clear();
    };
    for (char c : splits) {
      if (std::isalnum(static_cast<unsigned char>(c)) || c == '_') {
        name += c;
      } else {
        flush();
        out += c;
      }
    }
    flush();
    return out;
  };
  for (const auto& [pattern, splits] : par.strategies)
    k += " " + pattern + "=" + splits_key(splits);
  const RecomputePolicy& rcp = j.rc.train.recompute;
  k += " recompute " + str(rcp.mode);
  if (!rcp.layers.empty()) {
    k += " of blocks [";
    for (int b : rcp.layers) k += str(b) + " ";
    k += "]";
  }
  return k;
}

const char* const kPrices =
    "; the planner prices data parallel, the presets dp, megatron, megatron-sp, ulysses and "
    "ring on a mesh of dp, tp and cp, split tuples and named-dim rules (the search's or your "
    "own) on tp or cp, ZeRO, pipelines, and recompute none, selective or full of every block "
    "or of the first N blocks of each pipeline chunk";

// The plan's degrees, schedule, ZeRO and recompute read off the job (not
// yet checked to run it: runs_as).
Result<plan::Plan> layout_of(const Job& job) {
  const RunConfig& rc = job.rc;
  const StrategyConfig& par = rc.parallel;
  const std::string prices = kPrices;  // (for the + below)
  const RecomputePolicy& rcp = rc.train.recompute;
  if (rcp.mode == RecomputePolicy::kOps)
    return Status::invalid("recompute of named ops (train.recompute_ops) is not priced" + prices);
  if (!rcp.layers.empty() && rcp.mode != RecomputePolicy::kFull)
    return Status::invalid(
        "selective recompute of some blocks (train.recompute_layers) is not "
        "priced" +
        prices);
  if (rc.offload.active())
    return Status::invalid(rc.offload.key() +
                           " is not priced (the plan would hold that state in memory "
                           "and stream no file)" +
                           prices);
  plan::Plan p;
  for (int a = 0; a < job.mesh.num_axes(); ++a) {
    const std::string& axis = job.mesh.axis_name(a);
    const int64_t n = job.mesh.size(a);
    if (axis == "dp") {
      p.dp = n;
    } else if (axis == "tp") {
      p.tp = n;
    } else if (axis == "cp") {
      p.cp = n;
    } else {
      return Status::invalid("mesh axis '" + axis + "' (" + job.mesh.to_string() +
                             ") is not priced" + prices);
    }
  }
  if (job.pipeline) {
    const PipelineConfig& pc = *job.pipeline;
    p.pp = pc.stages;
    p.vp = pc.virtual_stages;
    p.schedule = pc.schedule;
    p.layers_per_stage = pc.layers_per_stage;
  }
  p.num_micro_batches = std::max(1, job.micro_batches);
  const int64_t rows = p.dp * p.num_micro_batches;
  if (rc.train.batch_size % rows != 0)
    return Status::invalid("train.batch_size " + str(rc.train.batch_size) +
                           " does not split into dp x micro-batches = " + str(rows));
  p.micro_batch = rc.train.batch_size / rows;
  p.zero = par.zero;
  p.group = par.zero > 0 && par.zero_style == "group";
  p.sp = par.preset == "megatron-sp" || par.preset == "ring-sp";
  p.ring = par.preset == "ring" || par.preset == "ring-sp";
  p.recompute = rcp.mode == RecomputePolicy::kFull        ? plan::Recompute::kFull
                : rcp.mode == RecomputePolicy::kSelective ? plan::Recompute::kSelective
                                                          : plan::Recompute::kNone;
  if (!rcp.layers.empty()) {
    // Priced: the first N blocks of each pipeline chunk (Plan::recompute_layers).
    MF_ASSIGN_OR_RETURN(const ModelConfig model, parse_model_config(rc.model));
    // The blocks: a transformer's; a ResNet's residual layers (priced without pipelines).
    const auto* resnet = std::get_if<ResNetConfig>(&model);
    const int64_t blocks = resnet ? resnet->num_blocks() : plan::num_blocks(model);
    const std::vector<int64_t> chunks = plan::chunk_blocks(p, blocks);
    std::vector<int64_t> given(rcp.layers.begin(), rcp.layers.end());
    std::sort(given.begin(), given.end());
    given.erase(std::unique(given.begin(), given.end()), given.end());
    const bool all = int64_t(given.size()) == blocks && given.back() == blocks - 1;
    const std::optional<int64_t> n = plan::first_blocks_count(chunks, given);
    if (!all && !n) {
      // The nearest priced form: as many of each chunk as of the first.
      const int64_t near = std::max<int64_t>(
          1, std::count_if(given.begin(), given.end(), [&](int64_t b) { return b < chunks[0]; }));
      std::string mine, first;
      for (int64_t b : given) mine += (mine.empty() ? "" : ", ") + str(b);
      for (int64_t b : plan::first_blocks_of_chunks(chunks, near))
        first += (first.empty() ? "" : ", ") + str(b);
      return Status::invalid("train.recompute_layers [" + mine +
                             "] is not priced: the planner prices full recompute of the first N "
                             "blocks of each pipeline chunk (N = " +
                             str(near) + ": [" + first + "])" + prices);
    }
    p.recompute_layers = all ? 0 : *n;
  }
  return p;
}

// What plan `p` runs, resolved as a user's section would be, must be this
// job, or the prediction would be of another program.
Status runs_as(const Job& job, const plan::Plan& p) {
  const RunConfig& rc = job.rc;
  const StrategyConfig& par = rc.parallel;
  MF_ASSIGN_OR_RETURN(const ModelConfig model, parse_model_config(rc.model));
  MF_ASSIGN_OR_RETURN(const json section, plan::parallel_section(p, model));
  RunConfig again = rc;
  again.has_parallel = true;
  MF_ASSIGN_OR_RETURN(again.parallel, parse_strategy_config(section, "parallel (priced)"));
  Result<Job> planned = resolve_job(again, job.world);
  const std::string mine = layout_key(job);
  if (!planned.is_ok() || layout_key(*planned) != mine) {
    std::string what = "this job's layout";
    if (!par.strategies.empty() || (par.preset.empty() && !par.rules.rules.empty()))
      what =
          "parallel.strategies or parallel.rules of your own (priced on a mesh with tp or cp, "
          "with \"ring_order\": \"zigzag\" on cp, as the planner writes them)";
    return Status::invalid(what + " is not priced (the job runs: " + mine + "; the nearest plan, " +
                           plan::plan_label(p) + ", runs: " +
                           (planned.is_ok() ? layout_key(*planned) : planned.status().message()) +
                           ")" + kPrices);
  }
  return Status::ok();
}

}  // namespace

Result<plan::Plan> plan_of_job(const Job& job) {
  MF_ASSIGN_OR_RETURN(const plan::Plan p, layout_of(job));
  MF_RETURN_IF_ERROR(runs_as(job, p));
  return p;
}

Status price_job_plan(Job* job, const plan::Cluster& local) {
  if (job->auto_plan) {
    job->plan_check = job->auto_plan;
    return Status::ok();
  }
  MF_ASSIGN_OR_RETURN(const plan::Plan p, layout_of(*job));
  const Status runs = runs_as(*job, p);
  const StrategyConfig& par = job->rc.parallel;
  const bool own_rules = par.preset.empty() && !par.rules.rules.empty();
  if (!runs.is_ok() && (!par.strategies.empty() || own_rules) && p.tp * p.cp > 1) {
    // Split tuples the strategy search wrote (auto mode, `meshflow plan
    // --out`): searched again on this cluster, they are the same tuples.
    plan::Plan ops = p;
    ops.ops = true, ops.sp = false;
    Result<plan::LocalAutoPlan> priced = plan::price_local_plan(job->rc, job->world, local, ops);
    if (priced.is_ok() && runs_as(*job, priced->best.plan).is_ok()) {
      job->plan_check = std::make_shared<const plan::LocalAutoPlan>(std::move(*priced));
      return Status::ok();
    }
    // Split tuples and named-dim rules of the user's own: the program they
    // build, priced as written (not searched).
    auto given = std::make_shared<StrategySearch>();
    given->strategies = par.strategies;
    given->rules = par.rules.rules;
    given->fixed = true;
    ops.searched = given;
    Result<plan::LocalAutoPlan> own = plan::price_local_plan(job->rc, job->world, local, ops);
    if (own.is_ok() && runs_as(*job, own->best.plan).is_ok()) {
      job->plan_check = std::make_shared<const plan::LocalAutoPlan>(std::move(*own));
      return Status::ok();
    }
  }
  MF_RETURN_IF_ERROR(runs);
  MF_ASSIGN_OR_RETURN(plan::LocalAutoPlan priced,
                      plan::price_local_plan(job->rc, job->world, local, p));
  job->plan_check = std::make_shared<const plan::LocalAutoPlan>(std::move(priced));
  return Status::ok();
}

}  // namespace meshflow
