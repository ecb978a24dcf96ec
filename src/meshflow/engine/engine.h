// Engine: the one interface every plan trains through. A rank's training loop
// (cli/commands.cc) drives an Engine and does not know which plan it runs:
// the one-program Trainer (engine/trainer.h: data parallel, or the SPMD
// partitioner's program for semi / auto / ZeRO) or the PipelineTrainer
// (engine/pipeline_trainer.h: stages, each one program). make_engine
// (engine/job.h) builds the one a resolved Job calls for.
//
//   MF_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e, make_engine(job, comm, trace));
//   for (int s = 0; s < job.rc.train.steps; ++s) { StepResult r = e->step(); ... }
//   EvalResult v = e->evaluate();                 // collective: every rank calls it
//   MF_RETURN_IF_ERROR(e->save_checkpoint(path)); // collective
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "meshflow/core/status.h"

namespace meshflow {

struct StepResult {
  double comm_wait_seconds = 0;  // time the step blocked on gradient all-reduce (data parallel)
  int step = 0;                  // 1-based count of finished steps
  float loss = 0;                // mean over the micro-batches
  float lr = 0;
  float grad_norm = 0;  // before clipping
  double seconds = 0;
  int64_t items = 0;  // tokens (LMs) or samples in the global batch
  double flops = 0;   // executed FLOPs of this step (see Engine::flops_scale)
  // train.on_nonfinite "skip": the loss or a gradient was not finite, the
  // update was not applied; `nonfinite` says what (as the "stop" error does).
  bool skipped = false;
  std::string nonfinite;
};

// What a step whose loss or gradient norm is not finite reports: the step
// (1-based), the loss, the norm and, when found on this rank, the first
// parameter (graph order) whose gradient is not finite.
std::string nonfinite_message(int step, float loss, float grad_norm,
                              const std::string& first_param);
// What the "stop" error adds: how to avoid it.
std::string nonfinite_advice();

struct EvalResult {
  float loss = 0;
  std::optional<float> accuracy;  // classifiers
  int64_t items = 0;
};

class BackgroundSave;  // engine/state_checkpoint.h

class Engine {
 public:
  virtual ~Engine() = default;
  // One optimizer step over train.batch_size (all micro-batches).
  virtual StepResult step() = 0;
  // Collective: the held-out loss (and accuracy) on rank 0.
  virtual EvalResult evaluate() = 0;
  // Collective: one safetensors file of the whole model, whatever the plan.
  virtual Status save_checkpoint(const std::string& path) = 0;
  // Every rank loads its part of a whole-model file (names and shapes checked).
  virtual Status load_checkpoint(const std::string& path) = 0;
  // Collective: a full-state checkpoint of the steps done so far under the
  // directory `root` (engine/state_checkpoint.h: root/step-NNNNNNNN/, every
  // rank writing the blocks of parameters, buffers and optimizer state it
  // holds, no rank gathering the model); keep: how many stay (0: all).
  virtual Status save_state(const std::string& root, int keep) = 0;
  // The same written in the background (train.async_save): the blocks are
  // copied now, written on a thread; the caller polls the returned save at
  // step boundaries, every rank at the same ones (BackgroundSave::poll).
  virtual Result<std::unique_ptr<BackgroundSave>> start_save_state(const std::string& root,
                                                                   int keep) = 0;
  // Collective: continues from a full-state checkpoint written under any
  // plan and number of ranks (`path`: a step directory, or a root: its
  // latest): every rank reads the blocks its plan needs, and the step count
  // becomes the checkpoint's. Errors change nothing.
  virtual Status load_state(const std::string& path) = 0;
  virtual int steps_done() const = 0;
  // Bytes this rank planned to hold (parameters, gradients, optimizer state,
  // activations: the executors' plans, plus a pipeline's activation stash).
  virtual int64_t peak_bytes() const = 0;
  virtual int64_t num_parameters() const = 0;  // of the whole model
  virtual bool is_language_model() const = 0;
  // StepResult::flops times this is the whole job's FLOPs of a step.
  virtual double flops_scale() const = 0;
  // Kernel time by op kind when profiling is on ("" when the engine has none).
  virtual std::string profile_report() const { return ""; }
  // Seconds of kernel time per OpKind so far (indexed by the kind; empty when
  // the engine does not profile).
  virtual std::vector<double> seconds_by_kind() const { return {}; }
  // Seconds so far spent summing micro-batches' gradients into the gradient
  // buckets (GradientBuckets::accumulate_seconds; 0 without buckets).
  virtual double grad_accumulate_seconds() const { return 0; }
  // Seconds so far spent copying pipeline stashes out of the executor's arena
  // after a forward and back before its backward (0 without a pipeline).
  virtual double stash_copy_seconds() const { return 0; }
};

}  // namespace meshflow
