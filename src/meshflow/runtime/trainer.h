// Trainer: one training run on this process: model graph -> autodiff ->
// optimizer -> executor, fed by a dataset, stepping with gradient
// accumulation over micro-batches, and evaluating on held-out data.
//
//   MF_ASSIGN_OR_RETURN(RunConfig rc, load_run_config("configs/gpt_fortunes.json", {}));
//   MF_ASSIGN_OR_RETURN(auto trainer, Trainer::create(rc));
//   for (int s = 0; s < rc.train.steps; ++s) { StepResult r = trainer->step(); ... }
//   EvalResult e = trainer->evaluate();
//
// Determinism: weights are seeded by (parameter name, train.seed), batches by
// (train.seed, step, micro-batch), dropout by (node seed, step*m + micro), so a
// run is reproducible bit for bit at a fixed thread count.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "meshflow/data/dataset.h"
#include "meshflow/models/model.h"
#include "meshflow/runtime/executor.h"
#include "meshflow/runtime/run_config.h"

namespace meshflow {

struct StepResult {
  int step = 0;          // 1-based count of finished steps
  float loss = 0;        // mean over the micro-batches
  float lr = 0;
  float grad_norm = 0;   // before clipping
  double seconds = 0;
  int64_t items = 0;     // tokens (LMs) or samples in the global batch
  double flops = 0;      // executed FLOPs of this step
};

struct EvalResult {
  float loss = 0;
  std::optional<float> accuracy;  // classifiers
  int64_t items = 0;
};

class Trainer {
 public:
  static Result<std::unique_ptr<Trainer>> create(const RunConfig& rc);

  StepResult step();
  EvalResult evaluate();
  Status save_checkpoint(const std::string& path);
  Status load_checkpoint(const std::string& path);

  const RunConfig& config() const { return rc_; }
  const Graph& graph() const { return model_.graph; }
  Executor& executor() { return *executor_; }
  bool is_language_model() const { return language_model_; }
  int64_t num_parameters() const { return num_params_; }
  int64_t peak_bytes() const { return executor_->memory().total(); }
  int steps_done() const { return step_; }

 private:
  Trainer() = default;
  void feed_batch(const Batch& b);

  RunConfig rc_;
  ModelGraph model_;
  std::unique_ptr<Dataset> data_;
  std::unique_ptr<Executor> executor_;
  std::vector<std::pair<ValueId, std::vector<float>>> accum_;  // grad -> accumulator (m > 1)
  bool language_model_ = true;
  int64_t num_params_ = 0;
  int micro_batch_ = 0;
  double flops_per_micro_ = 0, flops_optimizer_ = 0;
  int step_ = 0;
};

// Builds the model named by a model JSON ("model_type": "gpt2"|"llama", or
// "type": "mlp"|"gpt"|"llama") for a batch and sequence length.
Result<ModelGraph> build_model_from_json(const json& model, int64_t batch, int64_t seq);

// The dataset a data config names, for a model (language model or classifier).
Result<std::unique_ptr<Dataset>> make_dataset(const DataConfig& d, bool language_model, int seq_len,
                                              uint64_t seed);

// Sets the number of threads for this thread's kernels and BLAS calls (0 = all cores).
void set_compute_threads(int threads);

}  // namespace meshflow
