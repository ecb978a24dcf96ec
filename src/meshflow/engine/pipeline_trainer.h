// PipelineTrainer: pipeline-parallel training of one rank of a job of
// stages x dp ranks. The training graph Trainer would build is split into
// model chunks (stage_graph.h); this rank runs the chunks of its stage through
// the schedule's action list (schedule.h), sending activations and gradients
// to its neighbours, stashing each micro-batch's activations until its
// backward, and updating its own parameters. Same losses and weights as the
// one-device Trainer with the same micro-batches (to f32 rounding).
//
//   MF_ASSIGN_OR_RETURN(PipelineConfig pc, parse_pipeline_config(doc["pipeline"]));
//   run_local_ranks(pc.stages * dp, [&](const std::shared_ptr<Transport>& t) -> Status {
//     TraceWriter trace;                                    // optional, one per rank
//     MF_ASSIGN_OR_RETURN(auto pt, PipelineTrainer::create(rc, pc, Communicator::world(t),
//                                                          &trace));
//     for (int s = 0; s < rc.train.steps; ++s) StepResult r = pt->step();
//     return Status::ok();   // then merge the per-rank traces and write one file
//   });
//
// Every stage is the partitioned program of the whole model on its own
// sub-mesh (spmd_stage_mesh: the mesh without pp; mode "data": dp = world /
// stages with the plan "batch on dp"), lowered for this rank's sub-mesh rank
// and then split; world rank = stage * S + sub-mesh rank (S = sub-mesh size).
// Tensor / sequence / context parallel, data parallel (the sub-mesh's dp
// axis) and ZeRO run inside the stages; each chunk's gradient all_reduces run
// in buckets overlapped with its backward (runtime/grad_buckets.h). The ranks
// with the same sub-mesh rank form a pipeline and exchange their boundary
// shards (same program, so the same layouts on both sides). Micro-batches:
// pipeline.micro_batches (train.micro_batches must be 1 or the same number).
// Every rank returns the same StepResult.loss.
//
// Messages: one sender thread per (peer, activations|gradients) channel, so a
// send never blocks the schedule; receives block. Each message starts with
// (micro-batch, chunk), checked on receipt.
//
// Recomputation: rc.train.recompute is applied to the training graph before
// the split (as Trainer does), so each chunk recomputes its own blocks.
// Evaluation runs on the plan: each eval batch flows forward through the
// stages (no parameter moves); every rank returns the same loss. Checkpoints
// gather the stages' parameters to world rank 0 (every rank calls it).
//
// Tied embeddings (GPT's wte read by the first and the last stage): the last
// stage's gradient contribution travels with the gradient messages to stage
// 0, which owns the update; after each update stage 0 sends the new values
// to the last stage's copy (PipelineSplit::tied).
//
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "meshflow/comm/communicator.h"
#include "meshflow/core/trace.h"
#include "meshflow/engine/job.h"
#include "meshflow/engine/trainer.h"
#include "meshflow/parallel/partition.h"
#include "meshflow/pipeline/pipeline_config.h"
#include "meshflow/pipeline/schedule.h"
#include "meshflow/pipeline/stage_graph.h"
#include "meshflow/runtime/run_config.h"

namespace meshflow {

// Measured activation-stash memory of one rank.
struct StashStats {
  int64_t peak_bytes = 0;             // high-water mark of stashed bytes over all steps
  int peak_entries = 0;               // most (micro-batch, chunk) stashes alive at once
  std::vector<int> peak_per_chunk;    // per local chunk: most micro-batches stashed at once
  int64_t bytes_per_micro_batch = 0;  // sum over local chunks of one micro-batch's stash
                                      // (split backward: plus what it holds from Bi to W)
};

class PipelineTrainer : public Engine {
 public:
  // world: all stages x dp ranks of the job. trace (optional, owned by the
  // caller, used only by this rank's thread): F/B/W/send/recv/optimizer spans.
  // The job is resolved (engine/job.h: resolve_job) with a pipeline; the
  // engine checks none of it again.
  static Result<std::unique_ptr<PipelineTrainer>> create(const Job& job,
                                                         std::shared_ptr<Communicator> world,
                                                         TraceWriter* trace = nullptr);
  // The same from a run config and a pipeline: resolve_job(rc, ranks, &pc),
  // then the above.
  static Result<std::unique_ptr<PipelineTrainer>> create(const RunConfig& rc,
                                                         const PipelineConfig& pc,
                                                         std::shared_ptr<Communicator> world,
                                                         TraceWriter* trace = nullptr);
  ~PipelineTrainer();

  StepResult step() override;
  // Collective over the world: rank 0 gets every parameter whole, by name
  // (the other ranks an empty map).
  Result<std::map<std::string, Tensor>> gather_parameters();
  // Collective: held-out data (train.eval_batches whole batches, as
  // micro-batches) through the pipeline's forward; every rank gets the loss.
  EvalResult evaluate() override;
  // Collective: rank 0 writes a safetensors file of every parameter.
  Status save_checkpoint(const std::string& path) override;
  // Each rank loads its own parameters from the file (names and shapes checked).
  Status load_checkpoint(const std::string& path) override;
  Status save_state(const std::string& root, int keep) override;
  Result<std::unique_ptr<BackgroundSave>> start_save_state(const std::string& root,
                                                           int keep) override;
  Status load_state(const std::string& path) override;
  int steps_done() const override;
  int64_t num_parameters() const override;  // of the whole model
  bool is_language_model() const override;
  // The executors' planned memory plus the measured activation stash.
  int64_t peak_bytes() const override { return memory().total() + stash_stats_.peak_bytes; }
  // Each stage runs the partitioned program on stage_mesh() (data mode: the
  // plan "batch on dp"); StepResult::flops is the whole job's.
  double flops_scale() const override;
  const Mesh& stage_mesh() const;

  int stage() const { return stage_; }
  int dp_rank() const { return dp_rank_; }
  const Schedule& schedule() const { return schedule_; }
  const PipelineConfig& pipeline_config() const { return pc_; }
  const std::vector<int>& chunks() const { return local_chunks_; }  // this rank's model chunks
  const ChunkProgram& chunk_program(int local) const;
  Executor& executor(int local);
  // This rank's parameters (name -> current values).
  std::vector<std::pair<std::string, const Tensor*>> parameters();
  const StashStats& stash_stats() const { return stash_stats_; }
  // Sum over this rank's chunk executors (parameters, grads, optimizer state, arena).
  MemoryStats memory() const;
  // Kernel seconds by op kind over this rank's chunk executors, while
  // profiling (set_profiling: every chunk's executor).
  std::vector<double> seconds_by_kind() const override;
  double grad_accumulate_seconds() const override;
  double stash_copy_seconds() const override;
  void set_profiling(bool on);
  void set_trace(TraceWriter* trace);

 private:
  struct Impl;
  PipelineTrainer();
  // This rank's chunks' persistent values as blocks of their global tensors
  // (a value copied into several chunks is written by the first).
  std::vector<StateBlock> state_blocks();
  std::unique_ptr<Impl> impl_;
  PipelineConfig pc_;
  Schedule schedule_;
  int stage_ = 0, dp_rank_ = 0;
  std::vector<int> local_chunks_;
  StashStats stash_stats_;
  std::string describe_;  // Job::describe(), for checkpoints' manifests
};

}  // namespace meshflow
