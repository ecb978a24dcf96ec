// The job: a run config resolved ONCE against the number of ranks, before any
// engine is built. Every choice the "parallel" and "train" sections make is
// checked and settled here, so the engines (Trainer, PipelineTrainer),
// `meshflow explain` and the CLI all see the same plan and check nothing again:
//
//   - parallel.recompute (as `meshflow plan --out` writes it) is folded into
//     train.recompute;
//   - "zero" in mode "data" runs on the partitioner (the plan "batch on dp",
//     ZeRO over dp), never silently dropped;
//   - "semi" / "auto" with a mesh but no preset or rules: the batch is split
//     over dp, except "auto" with split tuples, which propagates from them
//     alone (an axis that splits nothing is an error after annotation:
//     check_axes_used);
//   - cell names are resolved against the model's cells (models/cells.h):
//     pipeline.stage_of into layers_per_stage, train.recompute_layers names
//     into block numbers;
//   - the pipeline section is parsed and checked against the mesh and the rank
//     count; 1 stage folds its micro-batches into gradient accumulation;
//   - batch / micro-batch / replica arithmetic is checked once;
//   - mode "auto" with search "full" asks the planner (plan/auto_plan.h) and the
//     job carries the chosen semi-auto section (`planned`).
//
//   MF_ASSIGN_OR_RETURN(RunConfig rc, load_run_config(path, overrides));
//   MF_ASSIGN_OR_RETURN(Job job, resolve_job(rc, /*world=*/4));
//   MF_ASSIGN_OR_RETURN(auto engine, make_engine(job, comm));  // or, by hand:
//   if (job.pipeline) ... PipelineTrainer::create(job, comm)
//   else              ... Trainer::create(job, comm)
//
// The engines take the Job and check none of it again; their RunConfig
// overloads (C++ callers) resolve the job first.
//
// Errors are a user's mistake: one line naming the key and what is valid.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "meshflow/comm/communicator.h"
#include "meshflow/core/mesh.h"
#include "meshflow/core/status.h"
#include "meshflow/core/trace.h"
#include "meshflow/engine/engine.h"
#include "meshflow/parallel/reshard.h"
#include "meshflow/pipeline/pipeline_config.h"
#include "meshflow/plan/auto_plan.h"
#include "meshflow/runtime/run_config.h"

namespace meshflow {

enum class ParallelMode { kData, kSemi, kHybrid, kAuto };
const char* parallel_mode_name(ParallelMode m);

struct Job {
  RunConfig rc;  // resolved (see above); what the engines are built from
  int world = 1;
  ParallelMode mode = ParallelMode::kData;  // as resolved ("auto" full becomes kSemi)
  // The SPMD partitioner builds the program: semi, auto, ZeRO, and data
  // parallel over more than one rank (the plan "batch on dp"). False: one
  // rank's graph as it is, or the replicas of a data-mode pipeline.
  bool partitioned = false;
  // The mesh one program runs on: parallel.mesh (without pp when pipelined),
  // or dp = world (/ stages) when the config gives none.
  Mesh mesh = Mesh::line(1, "dp");
  std::optional<PipelineConfig> pipeline;  // > 1 stage
  int micro_batches = 1;                   // per step (the pipeline's when pipelined)
  int micro_batch_rows = 1;                // rows of one micro-batch over all replicas
  std::string planned;                     // auto + search full: the chosen section (JSON)
  // ... and the planner's answer: the chosen plan's prediction (with, for
  // the strategy search's plan, every forward node's strategy and the costs
  // that decided it: explain) and every candidate it priced (the train-time
  // plan check compares the run with them).
  std::shared_ptr<const plan::LocalAutoPlan> auto_plan;
  // The prediction the train-time plan check compares the run with
  // (cli/plan_check.h): auto_plan for auto mode; the job's own layout priced
  // by price_job_plan (`meshflow train --check-plan`); null: no check.
  std::shared_ptr<const plan::LocalAutoPlan> plan_check;
  std::vector<std::string> notes;  // what was resolved on the user's behalf
  // The links the reshard planner ranks redistributions on, per mesh axis:
  // the local cluster file's (plan::load_local_cluster, shared among the
  // ranks as the planner shares it), the same collective cost the planner
  // prices the program with; the defaults when there is no such file.
  ReshardCostModel reshard_cost;
  // Preset "ring" with ring_order "zigzag" on cp > 1: the cp ranks the
  // sequence's zigzag order is over (parallel/seq_balance.h); 0: natural order.
  int64_t seq_zigzag = 0;

  // "partitioned, mesh {dp: 2, tp: 2}", "data parallel", "pipeline 2 stages x ...".
  std::string describe() const;
};

// REQUIRES: world >= 1.
// SPMD stages: the sub-mesh every stage is partitioned on: parallel.mesh
// without its pp axis (which must equal stages), or dp = world / stages when
// the config gives no mesh. Errors name the rank count the job needs.
Result<Mesh> spmd_stage_mesh(const StrategyConfig& par, int stages, int world);

// pipeline (optional): the pipeline to run, given directly (C++ callers)
// instead of parsed from rc.parallel.pipeline. local (optional): this
// machine's cluster as plan::load_local_cluster would return it (an error
// included), given so that processes which must resolve the same job plan on
// the same numbers (MPI: rank 0's, broadcast); else load_local_cluster().
Result<Job> resolve_job(RunConfig rc, int world, const PipelineConfig* pipeline = nullptr,
                        const Result<plan::Cluster>* local = nullptr);

// The planner's plan (plan/plan.h) of the layout this job runs, for pricing
// it: data parallel, the presets dp, megatron, megatron-sp, ulysses and ring
// (and the MLP's and ResNet's rules parallel_section writes) on a mesh of
// dp, tp and cp, ZeRO (either style), a pipeline (schedule, micro-batches,
// virtual stages, blocks per stage) and recompute none, selective or full of
// every block. What the plan would run is resolved again and compared with
// the job, so a plan is returned only when it runs exactly this job. Errors
// name what the planner does not price (split tuples or rules of your own,
// recompute of some blocks or ops, ...).
Result<plan::Plan> plan_of_job(const Job& job);

// The plan check's prediction for a job: auto mode's (auto_plan), else
// plan_of_job priced on `local` shared among job->world ranks
// (plan::price_local_plan); split tuples are priced as the strategy search's
// (Plan::ops) when searching on `local` gives exactly them (a plan auto mode
// or `meshflow plan --out` wrote). Sets job->plan_check; errors as
// plan_of_job's.
Status price_job_plan(Job* job, const plan::Cluster& local);

// The engine the job calls for (engine/engine.h): the PipelineTrainer when
// it has stages, else the Trainer (data parallel or the partitioned
// program). comm: all ranks (null for one); trace: this rank's writer (may
// be null); profile: per-op timing in the executor (one-program engine).
Result<std::unique_ptr<Engine>> make_engine(const Job& job, std::shared_ptr<Communicator> comm,
                                            TraceWriter* trace = nullptr, bool profile = false);

}  // namespace meshflow
