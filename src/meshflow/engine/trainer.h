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
#include <set>
#include <string>
#include <vector>

#include "meshflow/comm/communicator.h"
#include "meshflow/core/trace.h"
#include "meshflow/data/dataset.h"
#include "meshflow/engine/engine.h"
#include "meshflow/engine/job.h"
#include "meshflow/engine/state_checkpoint.h"
#include "meshflow/io/safetensors.h"
#include "meshflow/models/model.h"
#include "meshflow/parallel/configured.h"
#include "meshflow/parallel/partition.h"
#include "meshflow/parallel/reshard_exec.h"
#include "meshflow/runtime/executor.h"
#include "meshflow/runtime/grad_buckets.h"
#include "meshflow/runtime/run_config.h"

namespace meshflow {

class Trainer : public Engine {
 public:
  // comm: all ranks of the job; null for one rank.
  // One rank with no "parallel" section (or mode "data"): the training graph
  // as it is. Otherwise the whole training graph is annotated and lowered to
  // this rank's program (parallel/partition.h) on the mesh of rc.parallel;
  // the collectives are nodes of that program. Data parallel (mode "data" on
  // several ranks, as resolve_job does) is the plan "batch on dp"; the
  // gradient all_reduces of any plan run in buckets overlapped with the
  // backward (runtime/grad_buckets.h).
  // partition (optional, C++ API of semi-auto): strategies and layouts given
  // directly (PartitionOptions::fixed / source_layouts); used with
  // rc.parallel's mesh, instead of its rules and split tuples.
  // The job is resolved (engine/job.h: resolve_job) and not pipelined; the
  // trainer checks none of it again.
  static Result<std::unique_ptr<Trainer>> create(const Job& job,
                                                 std::shared_ptr<Communicator> comm = nullptr,
                                                 const PartitionOptions* partition = nullptr);
  // The same from a run config: resolve_job(rc, ranks of comm), then the above.
  static Result<std::unique_ptr<Trainer>> create(const RunConfig& rc,
                                                 std::shared_ptr<Communicator> comm = nullptr,
                                                 const PartitionOptions* partition = nullptr);

  StepResult step() override;
  EvalResult evaluate() override;
  Status save_checkpoint(const std::string& path) override;
  Status load_checkpoint(const std::string& path) override;
  Status save_state(const std::string& root, int keep) override;
  Result<std::unique_ptr<BackgroundSave>> start_save_state(const std::string& root,
                                                           int keep) override;
  Status load_state(const std::string& path) override;

  const RunConfig& config() const { return rc_; }
  const Graph& graph() const { return model_.graph; }  // the whole (global) training graph
  // The graph this rank runs: its partitioned program, or graph().
  const Graph& program_graph() const { return program_ ? program_->graph : model_.graph; }
  const LocalProgram* program() const { return program_.get(); }
  const Annotation* annotation() const { return program_ ? &annotation_ : nullptr; }
  // Every parameter whole (gathered from the shards when partitioned), by name.
  Result<std::map<std::string, Tensor>> gather_parameters();
  Executor& executor() { return *executor_; }
  bool is_language_model() const override { return language_model_; }
  int rank() const { return rank_; }
  int world_size() const { return world_; }
  int64_t num_parameters() const override { return num_params_; }
  int64_t peak_bytes() const override { return executor_->memory().total(); }
  // Every rank runs the same program on its share: the job's FLOPs are world x.
  double flops_scale() const override { return world_; }
  std::string profile_report() const override { return executor_->profile_report(); }
  std::vector<double> seconds_by_kind() const override { return executor_->seconds_by_kind(); }
  double grad_accumulate_seconds() const override {
    return buckets_ ? buckets_->accumulate_seconds() : 0.0;
  }
  int steps_done() const override { return step_; }
  // Chrome trace of each step (meshflow train --trace): per micro-batch a
  // forward and a backward span, one span per collective node, the gradient
  // all-reduce wait and the optimizer, on track "rank <r>". Not owned; null
  // turns it off. One writer per rank (merge them at the end).
  void set_trace(TraceWriter* trace);

 private:
  Trainer() = default;
  void feed_batch(const Batch& b);
  // Every persistent value of this rank's program as a block of its global
  // tensor (engine/state_checkpoint.h).
  std::vector<StateBlock> state_blocks();
  void split_optimizer_order();
  // train.on_nonfinite "stop": the step's micro-batches run again, in order,
  // with every node's f32 outputs checked; the first node (program order) of
  // the first micro-batch whose output is not finite, described ("" when
  // none is on this rank).
  std::string first_nonfinite_node();
  // Feeds micro-batch `micro` of this step: its batch, its dropout stream and
  // its backward seed (1/m).
  void feed_micro_batch(int micro);
  Status init_one_rank();
  Status init_partitioned(const Mesh& mesh, const ReshardCostModel& cost,
                          const PartitionOptions* given);
  Status init_executor(const Graph& program, const MeshComms* comms);
  // Trace hook: ex.run(order, after_node) with spans when a trace is set.
  void run_traced(const std::vector<NodeId>& order, const std::function<void(NodeId)>& after_node,
                  int micro);
  void trace_span(const std::string& name, const char* category, double start_us, int micro);

  RunConfig rc_;
  ModelGraph model_;
  std::unique_ptr<Dataset> data_;
  std::unique_ptr<Executor> executor_;
  std::shared_ptr<Communicator> comm_;
  std::unique_ptr<GradientBuckets> buckets_;  // null: no accumulation and no reduction
  int rank_ = 0, world_ = 1;
  int64_t seq_zigzag_ = 0;  // Job::seq_zigzag
  bool language_model_ = true;
  int64_t num_params_ = 0;
  int micro_batch_ = 0;  // rows per micro-batch over all ranks (the global graph's)
  double flops_per_micro_ = 0, flops_optimizer_ = 0;
  int step_ = 0;
  std::string describe_;                           // Job::describe(), for checkpoints' manifests
  std::vector<NodeId> norm_order_, update_order_;  // the optimizer's, split at the clip node
  // Partitioned (semi / auto) runs.
  std::unique_ptr<LocalProgram> program_;
  Annotation annotation_;
  std::unique_ptr<MeshComms> mesh_comms_;
  std::shared_ptr<Communicator> self_comm_;  // one rank run partitioned: a world of one
  TraceWriter* trace_ = nullptr;             // set_trace
  int trace_track_ = -1;
  std::string count_targets_;  // the input whose valid entries "loss_count" counts
};

// Builds the model named by a model JSON ("model_type": "gpt2"|"llama", or
// "type": "mlp"|"gpt"|"llama") for a batch and sequence length.
Result<ModelGraph> build_model_from_json(const json& model, int64_t batch, int64_t seq);

// The whole training graph of a run config (model + backward + optimizer) for
// micro-batches of `micro_batch` rows; seq_zigzag > 1: with its sequence in
// zigzag order over that many ranks (Job::seq_zigzag, parallel/seq_balance.h).
Result<ModelGraph> build_training_graph(const RunConfig& rc, int64_t micro_batch,
                                        int64_t seq_zigzag = 0);

// What a rank of a partitioned program feeds for the data input `name`: the
// whole tensor in the model's sequence order (ModelGraph::zigzag_inputs
// reordered), then its block of `layout`.
Tensor feed_block(const ModelGraph& m, const std::string& name, const Tensor& whole,
                  const Mesh& mesh, const Layout& layout, int rank);

// A weights file (--init) for rc's model: meshflow's names as they are, or a
// Hugging Face transformers state dict (GPT-2, LLaMA: models/hf_weights.h)
// converted to them (*converted). `global`: the whole training graph.
// Errors name the file and the tensor.
Result<SafetensorsFile> read_weights(const std::string& path, const RunConfig& rc,
                                     const Graph& global, bool* converted);

// The dataset a data config names, for a model (language model or classifier).
Result<std::unique_ptr<Dataset>> make_dataset(const DataConfig& d, bool language_model, int seq_len,
                                              uint64_t seed);

// The data fits the model: every input the dataset feeds is one the model
// takes, with the model's sizes per example (a ResNet's image_size and
// num_channels against the images); an error names both and what is valid.
Status check_dataset_fits(const Dataset& data, const Graph& g, const DataConfig& d,
                          const std::string& model_source, bool language_model);

// How many ranks of the job share this machine's cores (local: all of them;
// mpi: Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE).
int ranks_on_this_machine(const Communicator* comm);

// Sets the number of threads for this thread's kernels and BLAS calls (0 = all cores).
void set_compute_threads(int threads);

}  // namespace meshflow
