#include "meshflow/engine/job.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>

#include "meshflow/engine/pipeline_trainer.h"
#include "meshflow/engine/trainer.h"
#include "meshflow/models/cells.h"
#include "meshflow/models/from_config.h"
#include "meshflow/plan/auto_plan.h"

namespace meshflow {

namespace {

std::string str(int64_t x) {
  return std::to_string(x);
}

ParallelMode mode_of(const std::string& m) {
  if (m == "semi") return ParallelMode::kSemi;
  if (m == "hybrid") return ParallelMode::kHybrid;
  if (m == "auto") return ParallelMode::kAuto;
  return ParallelMode::kData;
}

// parallel.recompute ("full" / "selective" as a plan writes it) -> train.recompute.
Status fold_recompute(RunConfig* rc) {
  const std::string& prc = rc->parallel.recompute;
  if (prc.empty() || prc == "none") return Status::ok();
  RecomputePolicy& tr = rc->train.recompute;
  const RecomputePolicy::Mode mode =
      prc == "full" ? RecomputePolicy::kFull : RecomputePolicy::kSelective;
  if (tr.mode != RecomputePolicy::kNone && tr.mode != mode)
    return Status::invalid("parallel.recompute \"" + prc +
                           "\" differs from train.recompute; give one of them");
  tr.mode = mode;
  const std::vector<int>& blocks = rc->parallel.recompute_layers;
  if (!blocks.empty()) {
    std::vector<int> given = tr.layers, want = blocks;
    std::sort(given.begin(), given.end());
    std::sort(want.begin(), want.end());
    want.erase(std::unique(want.begin(), want.end()), want.end());
    if (!rc->train.recompute_cells.empty() || (!given.empty() && given != want))
      return Status::invalid(
          "parallel.recompute_layers differs from train.recompute_layers; give one of them");
    tr.layers = want;
  }
  return Status::ok();
}

// The model's cells (models/cells.h), from its forward graph at batch 1:
// only when a config names cells.
Result<std::vector<ModelCell>> model_cells(const RunConfig& rc) {
  MF_ASSIGN_OR_RETURN(ModelConfig cfg, parse_model_config(rc.model));
  MF_ASSIGN_OR_RETURN(ModelGraph m, build_model(cfg, /*batch=*/1, /*seq=*/1));
  return std::move(m.cells);
}

// train.recompute_layers: cell names become block numbers; blocks chosen with
// nothing to recompute are an error, never silently a run without it.
Status resolve_recompute_layers(RunConfig* rc) {
  TrainConfig& tc = rc->train;
  if (!tc.recompute_cells.empty()) {
    MF_ASSIGN_OR_RETURN(std::vector<ModelCell> cells, model_cells(*rc));
    MF_ASSIGN_OR_RETURN(std::vector<int> blocks,
                        blocks_named(cells, tc.recompute_cells, "train.recompute_layers"));
    std::vector<int>& layers = tc.recompute.layers;
    layers.insert(layers.end(), blocks.begin(), blocks.end());
    std::sort(layers.begin(), layers.end());
    layers.erase(std::unique(layers.begin(), layers.end()), layers.end());
    tc.recompute_cells.clear();
  }
  if (!tc.recompute.layers.empty() && tc.recompute.mode == RecomputePolicy::kNone)
    return Status::invalid(
        "train.recompute_layers chooses blocks to recompute, but train.recompute is \"none\"; "
        "set train.recompute to \"full\" (the whole blocks) or \"selective\"");
  return Status::ok();
}

// parallel.pipeline.stage_of: the cells' stages become layers_per_stage.
Status resolve_stage_of(const RunConfig& rc, PipelineConfig* pc, std::vector<std::string>* notes) {
  if (pc->stage_of.empty()) return Status::ok();
  MF_ASSIGN_OR_RETURN(std::vector<ModelCell> cells, model_cells(rc));
  MF_ASSIGN_OR_RETURN(pc->layers_per_stage, blocks_per_stage(cells, pc->stage_of, pc->stages));
  std::string per;
  for (int64_t n : pc->layers_per_stage) per += (per.empty() ? "" : ", ") + str(n);
  notes->push_back("parallel.pipeline.stage_of: blocks per stage [" + per + "]");
  pc->stage_of.clear();
  return Status::ok();
}

// Data-mode pipelines: stages x dp replicas, the mesh may name dp and pp only.
Status check_data_pipeline(const StrategyConfig& par, const PipelineConfig& pc, int world) {
  int dp = 0;
  for (const MeshAxis& a : par.has_mesh ? par.mesh.axes() : std::vector<MeshAxis>{}) {
    if (a.name == "dp") {
      dp = a.size;
    } else if (a.name == "pp") {
      if (a.size != pc.stages)
        return Status::invalid("parallel.mesh has pp=" + str(a.size) +
                               " but parallel.pipeline.stages=" + str(pc.stages) +
                               "; make them equal (or leave pp out of the mesh)");
    } else if (a.size > 1) {
      return Status::invalid(
          "parallel.mesh axis " + a.name + "=" + str(a.size) +
          " with parallel.pipeline in mode \"data\": the stages run data parallel only; for "
          "tensor, context or sequence parallel inside each stage set \"mode\": \"semi\" with a "
          "preset (megatron, megatron-sp, ulysses, ring, ring-sp), rules or strategies");
    }
  }
  const int need = dp > 0 ? pc.stages * dp : (world % pc.stages == 0 ? world : 0);
  if (need == 0 || need != world)
    return Status::invalid(
        "parallel.pipeline has " + str(pc.stages) + " stages" +
        (dp > 0 ? " and the mesh dp=" + str(dp) + ", so the job needs stages x dp = " + str(need) +
                      " ranks"
                : ", so the job needs a multiple of " + str(pc.stages) + " ranks") +
        ", but it has " + str(world) + "; run with --ranks " + str(need > 0 ? need : pc.stages) +
        " (or mpirun -np " + str(need > 0 ? need : pc.stages) + ")");
  return Status::ok();
}

// The mesh of one program when no pipeline: parallel.mesh or dp = world.
Result<Mesh> flat_mesh(const StrategyConfig& par, int world, bool partitioned) {
  if (!par.has_mesh) return Mesh::line(world, "dp");
  const Mesh& mesh = par.mesh;
  if (mesh.axis_index("pp") >= 0 && mesh.size(mesh.axis_index("pp")) > 1)
    return Status::invalid("parallel.mesh " + mesh.to_string() +
                           " has a pp axis but no parallel.pipeline section; add \"pipeline\": "
                           "{\"stages\": " +
                           str(mesh.size(mesh.axis_index("pp"))) +
                           ", \"schedule\": \"1f1b\", \"micro_batches\": ...} or drop pp");
  if (mesh.num_ranks() != world)
    return Status::invalid("parallel.mesh " + mesh.to_string() + " has " + str(mesh.num_ranks()) +
                           " ranks but the job has " + str(world) + "; run with --ranks " +
                           str(mesh.num_ranks()) + " (or mpirun -np " + str(mesh.num_ranks()) +
                           ") or change the mesh");
  if (!partitioned)
    for (const MeshAxis& a : mesh.axes())
      if (a.name != "dp" && a.size > 1)
        return Status::invalid(
            "parallel.mesh axis " + a.name + "=" + str(a.size) +
            " in mode \"data\": data parallel splits the batch over dp only; for tensor, "
            "sequence or context parallel set \"mode\": \"semi\" with a preset (megatron, "
            "megatron-sp, ulysses, ring, ring-sp), rules or strategies");
  return mesh;
}

}  // namespace

Result<Mesh> spmd_stage_mesh(const StrategyConfig& par, int stages, int world) {
  std::vector<MeshAxis> axes;
  for (const MeshAxis& a : par.has_mesh ? par.mesh.axes() : std::vector<MeshAxis>{}) {
    if (a.name != "pp") {
      axes.push_back(a);
    } else if (a.size != stages) {
      return Status::invalid("parallel.mesh has pp=" + std::to_string(a.size) +
                             " but parallel.pipeline.stages=" + std::to_string(stages) +
                             "; make them equal (or leave pp out of the mesh)");
    }
  }
  if (!par.has_mesh) {
    if (stages < 1 || world % stages != 0)
      return Status::invalid("parallel.pipeline has " + std::to_string(stages) +
                             " stages, so the job needs a multiple of " + std::to_string(stages) +
                             " ranks, but it has " + std::to_string(world));
    return Mesh::line(world / stages, "dp");
  }
  if (axes.empty()) return Mesh::line(1, "dp");
  MF_ASSIGN_OR_RETURN(Mesh sub, Mesh::make(axes));
  if (sub.num_ranks() * stages != world)
    return Status::invalid(
        "parallel.pipeline has " + std::to_string(stages) + " stages, each on the sub-mesh " +
        sub.to_string() + " of " + std::to_string(sub.num_ranks()) +
        " ranks, so the job needs stages x sub-mesh = " + std::to_string(stages * sub.num_ranks()) +
        " ranks, but it has " + std::to_string(world) + "; run with --ranks " +
        std::to_string(stages * sub.num_ranks()) + " (or mpirun -np " +
        std::to_string(stages * sub.num_ranks()) + ")");
  return sub;
}

const char* parallel_mode_name(ParallelMode m) {
  switch (m) {
    case ParallelMode::kData:
      return "data";
    case ParallelMode::kSemi:
      return "semi";
    case ParallelMode::kHybrid:
      return "hybrid";
    case ParallelMode::kAuto:
      return "auto";
  }
  return "?";
}

namespace {

// The planned section for the run's first line: its split tuples counted, not
// listed, past a few (a ResNet's are dozens; `meshflow explain` shows each
// node's strategy and the cost that decided it).
std::string compact_section(const std::string& section) {
  constexpr size_t kListed = 4;
  nlohmann::json j = nlohmann::json::parse(section, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("strategies") ||
      !j["strategies"].is_object() || j["strategies"].size() <= kListed)
    return section;
  j["strategies"] =
      std::to_string(j["strategies"].size()) + " split tuples (meshflow explain lists each node's)";
  return j.dump();
}

}  // namespace

std::string Job::describe() const {
  std::string how;
  if (pipeline)
    how = "pipeline " + str(pipeline->stages) + " stages x " +
          (partitioned ? "mesh " + mesh.to_string() : "dp " + str(mesh.num_ranks())) + ", " +
          std::string(schedule_name(pipeline->schedule)) +
          (pipeline->virtual_stages > 1 ? " v=" + str(pipeline->virtual_stages) : "");
  else if (mode == ParallelMode::kData)
    how = "data parallel" + (partitioned ? ", mesh " + mesh.to_string() : std::string());
  else
    how = partitioned ? "partitioned, mesh " + mesh.to_string() : "one rank";
  if (!planned.empty()) how += "; planned by search: " + compact_section(planned);
  return how;
}

Result<Job> resolve_job(RunConfig rc_in, int world, const PipelineConfig* pipeline,
                        const Result<plan::Cluster>* local) {
  // This machine's cluster, loaded (or measured) once when the job needs it.
  std::optional<Result<plan::Cluster>> loaded;
  auto local_cluster = [&]() -> const Result<plan::Cluster>& {
    if (local) return *local;
    if (!loaded) loaded = plan::load_local_cluster();
    return *loaded;
  };
  Job job;
  job.world = world;
  RunConfig& rc = job.rc;
  rc = std::move(rc_in);
  StrategyConfig& par = rc.parallel;
  if (!rc.has_parallel) par = StrategyConfig{};  // no "parallel" section: nothing of it applies
  MF_RETURN_IF_ERROR(fold_recompute(&rc));
  MF_RETURN_IF_ERROR(resolve_recompute_layers(&rc));
  job.mode = rc.has_parallel ? mode_of(par.mode) : ParallelMode::kData;

  if (job.mode == ParallelMode::kHybrid)
    return Status::invalid(
        "parallel.mode \"hybrid\" (collectives placed by hand) is built through the C++ API "
        "(Builder::all_reduce ... on a per-rank graph, see docs/config.md); a config file has no "
        "way to write a per-rank graph: use \"semi\" (a preset, rules or strategies) or \"auto\"");

  // Auto mode, full search: the planner's best plan for these ranks becomes
  // the section this job runs, resolved below like one the user wrote (a
  // pipeline included; every rank resolves the same).
  if (job.mode == ParallelMode::kAuto && par.search == "full") {
    if (pipeline || !par.pipeline.is_null())
      return Status::invalid(
          "parallel.search \"full\" with parallel.pipeline plans with `meshflow plan MODEL "
          "--cluster ... --out PLAN.json`; train that plan, or use \"search\": \"propagate\"");
    if (!local_cluster().is_ok()) return local_cluster().status();
    Result<plan::LocalAutoPlan> chosen = plan::plan_local_run(rc, world, *local_cluster());
    if (!chosen.is_ok()) return chosen.status().with_context("parallel.search \"full\"");
    job.auto_plan = std::make_shared<const plan::LocalAutoPlan>(std::move(*chosen));
    job.plan_check = job.auto_plan;
    if (rc.offload.active())
      job.notes.push_back(rc.offload.key() +
                          " is not priced: the plan was chosen, and its check "
                          "predicts, with that state in memory and no file streaming");
    const json* section = &job.auto_plan->parallel;
    MF_ASSIGN_OR_RETURN(par, parse_strategy_config(*section, "parallel (planned)"));
    MF_RETURN_IF_ERROR(fold_recompute(&rc));
    job.planned = section->dump();
    // The plan's mode: "semi" (a preset, rules, ZeRO) or "data" (then the
    // flat path below makes it the plan "batch on dp").
    job.mode = par.mode == "data" ? ParallelMode::kData : ParallelMode::kSemi;
  }

  // ZeRO is a layout of the optimizer state, gradients and parameters over dp:
  // it runs on the partitioner. In mode "data" the plan is "batch on dp".
  if (job.mode == ParallelMode::kData && par.zero > 0) {
    par.mode = "semi";
    par.preset = "dp";
    par.rules = preset_rules("dp", par.mesh);
    if (!par.has_mesh) {
      par.mesh = Mesh::line(world, "dp");  // (pipelines: replaced by the stage mesh below)
    }
    job.mode = ParallelMode::kSemi;
    job.notes.push_back("parallel.zero=" + str(par.zero) +
                        " in mode \"data\" runs on the partitioner (preset \"dp\": the batch "
                        "split over dp, ZeRO-" +
                        str(par.zero) + " over dp" +
                        (par.zero_style == "group" ? ", weights grouping" : "") + ")");
  }
  job.partitioned = job.mode != ParallelMode::kData;

  // Semi / auto with nothing said about dp: the batch is split over it. Auto
  // with split tuples propagates from them alone (MindSpore's sharding
  // propagation: the configured ops decide, seed 003). Nothing said at all on
  // a mesh of dp alone is the preset "dp" (the same program, so the plan
  // check prices it as the planner's data-parallel plan).
  const bool propagates_from_tuples = job.mode == ParallelMode::kAuto && !par.strategies.empty();
  if (job.partitioned && par.preset.empty() && par.rules.rules.empty() && !propagates_from_tuples) {
    const Mesh probe = par.has_mesh ? par.mesh : Mesh::line(world, "dp");
    if (probe.num_axes() == 1 && probe.axis_name(0) == "dp" && par.strategies.empty()) {
      par.preset = "dp";
      par.rules = preset_rules("dp", probe);
    } else if (probe.axis_index("dp") >= 0) {
      par.rules.rules.emplace_back("batch", "dp");
    }
  }

  // Pipeline.
  if (pipeline || (rc.has_parallel && !par.pipeline.is_null())) {
    PipelineConfig pc;
    if (pipeline) {
      pc = *pipeline;
    } else {
      // train.micro_batches stands for the pipeline's where the pipeline
      // section sets none (checked against its schedule as if written there).
      json section = par.pipeline;
      if (section.is_object() && !section.contains("micro_batches") && rc.train.micro_batches > 1)
        section["micro_batches"] = rc.train.micro_batches;
      Result<PipelineConfig> parsed = parse_pipeline_config(section);
      if (!parsed.is_ok()) return parsed.status().with_context("parallel");
      pc = *parsed;
    }
    MF_RETURN_IF_ERROR(resolve_stage_of(rc, &pc, &job.notes));
    if (pc.stages == 1) {
      if (rc.train.micro_batches != 1 && rc.train.micro_batches != pc.micro_batches)
        return Status::invalid("train.micro_batches=" + str(rc.train.micro_batches) +
                               " differs from pipeline.micro_batches=" + str(pc.micro_batches) +
                               "; set only one of them (or both to the same number)");
      rc.train.micro_batches = pc.micro_batches;
      if (pc.micro_batches > 1)
        job.notes.push_back("parallel.pipeline with 1 stage: its " + str(pc.micro_batches) +
                            " micro-batches accumulate gradients");
    } else {
      if (rc.train.micro_batches != 1 && rc.train.micro_batches != pc.micro_batches)
        return Status::invalid("train.micro_batches=" + str(rc.train.micro_batches) +
                               " differs from pipeline.micro_batches=" + str(pc.micro_batches) +
                               "; set only pipeline.micro_batches (or both to the same number)");
      if (par.zero_style == "group")
        return Status::invalid(
            "parallel.zero_style \"group\" (weights grouping) runs on one program per rank, "
            "not with parallel.pipeline (" +
            str(pc.stages) + " stages); use \"zero_style\": \"shard\" with the pipeline");
      if (job.partitioned) {
        MF_ASSIGN_OR_RETURN(job.mesh, spmd_stage_mesh(par, pc.stages, world));
      } else {
        MF_RETURN_IF_ERROR(check_data_pipeline(par, pc, world));
        job.mesh = Mesh::line(world / pc.stages, "dp");
        // Each stage's replicas: the plan "batch on dp" on the stage's sub-mesh.
        use_data_parallel_plan(&par, job.mesh);
        rc.has_parallel = true;
        job.partitioned = true;
      }
      job.pipeline = pc;
      job.micro_batches = pc.micro_batches;
    }
  }

  if (!job.pipeline) {
    MF_ASSIGN_OR_RETURN(job.mesh, flat_mesh(par, world, job.partitioned));
    job.micro_batches = rc.train.micro_batches;
    // Data parallel over several ranks is the partitioner's plan "batch on
    // dp": its gradient all_reduces run in buckets, overlapped with the
    // backward (runtime/grad_buckets.h). One rank runs the graph as it is.
    if (!job.partitioned && world > 1) {
      use_data_parallel_plan(&par, job.mesh);
      rc.has_parallel = true;
      job.partitioned = true;
    }
  }

  // Ring attention splits the sequence into one block per cp rank: in
  // zigzag order two chunks of 2 x cp, else one contiguous block. Split
  // tuples (a searched plan's, or the user's) and named-dim rules of the
  // user's own run zigzag when they ask.
  const bool own_layout =
      !par.strategies.empty() || (par.preset.empty() && !par.rules.rules.empty());
  const bool ring_tuples = own_layout && par.ring_order_set;
  if (job.partitioned && ring_tuples && job.mesh.axis_index("cp") < 0)
    return Status::invalid("parallel.ring_order \"" + par.ring_order +
                           "\" orders ring attention's sequence over the mesh axis \"cp\", "
                           "which the mesh " +
                           job.mesh.to_string() + " lacks; add a cp axis or leave ring_order out");
  const bool ring_preset = par.preset == "ring" || par.preset == "ring-sp";
  if (job.partitioned && (ring_preset || ring_tuples) && job.mesh.axis_index("cp") >= 0) {
    const int64_t cp = job.mesh.size(job.mesh.axis_index("cp"));
    const bool zigzag = par.ring_order == "zigzag" && cp > 1;
    const int64_t n = zigzag ? 2 * cp : cp, T = rc.train.seq_len;
    if (T % n != 0)
      return Status::invalid(
          (ring_preset ? "parallel.preset \"" + par.preset + "\"" : "parallel.ring_order") +
          ": train.seq_len=" + str(T) + " does not split into " +
          (zigzag ? "2 x cp = " + str(n) + " chunks (ring_order \"zigzag\")"
                  : "cp=" + str(n) + " blocks") +
          "; ring attention needs a multiple of " + str(n) + " (" +
          str(n * std::max<int64_t>(1, T / n)) + " or " + str(n * (T / n + 1)) + ")" +
          (zigzag ? ", or \"ring_order\": \"contiguous\" (a multiple of " + str(cp) + ")" : ""));
    if (zigzag) job.seq_zigzag = cp;
  }

  // Batch arithmetic, once, in the user's terms: data parallel (and data-mode
  // pipelines) split every micro-batch over the replicas; in the other modes
  // the partitioner checks the split of each dim and names it.
  const TrainConfig& tc = rc.train;
  const int replicas = job.mode == ParallelMode::kData ? job.mesh.num_ranks() : 1;
  if (tc.batch_size % (job.micro_batches * replicas) != 0)
    return Status::invalid(
        "train.batch_size=" + str(tc.batch_size) + " does not split into " +
        str(job.micro_batches) + " micro-batch(es)" +
        (replicas > 1 ? " on " + str(replicas) + " data-parallel replicas" : "") +
        "; use a multiple of " + str(job.micro_batches * replicas));
  job.micro_batch_rows = tc.batch_size / job.micro_batches;

  // The redistributions the partitioner chooses are ranked on this machine's
  // links, as the planner prices them (one collective cost, fed by the
  // cluster file).
  if (job.partitioned) {
    const Result<plan::Cluster>& machine = local_cluster();
    Result<plan::Cluster> shared =
        machine.is_ok() ? plan::share_machine(*machine, world) : machine.status();
    if (shared.is_ok())
      job.reshard_cost = plan::reshard_costs(*shared, job.mesh);
    else
      job.notes.push_back("no local cluster file (" + shared.status().message() +
                          "): redistributions are ranked on default links");
  }
  return job;
}

Result<std::unique_ptr<Engine>> make_engine(const Job& job, std::shared_ptr<Communicator> comm,
                                            TraceWriter* trace, bool profile) {
  if (job.pipeline) {
    MF_ASSIGN_OR_RETURN(std::unique_ptr<PipelineTrainer> p,
                        PipelineTrainer::create(job, std::move(comm), trace));
    p->set_profiling(profile);
    return std::unique_ptr<Engine>(std::move(p));
  }
  MF_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> t, Trainer::create(job, std::move(comm)));
  t->executor().set_profiling(profile);
  t->set_trace(trace);
  return std::unique_ptr<Engine>(std::move(t));
}

}  // namespace meshflow
