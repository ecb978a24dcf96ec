// Executor: runs a Graph (or a part of it) on the CPU.
//
// Sources own persistent storage: parameters and optimizer state (initialized
// from their Init, seeded by name), and inputs (fed before each run). Every
// other value lives in one arena laid out by the static memory plan
// (memory_plan.h); nothing is allocated per step.
//
//   Executor ex(g, {.seed = 1});
//   ex.feed("tokens", batch);  ex.feed_scalar("loss_scale", 1.f);
//   ex.run(ex.training_order());
//   float loss = ex.scalar(g.loss);
//
// Memory accounting splits persistent bytes into parameters, gradients
// (accumulation buffers), optimizer state and inputs, and the arena into
// activations + temporaries (its high-water mark is arena_bytes()).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "meshflow/core/tensor.h"
#include "meshflow/io/safetensors.h"
#include "meshflow/ir/graph.h"
#include "meshflow/runtime/memory_plan.h"
#include "meshflow/runtime/offload.h"

namespace meshflow {

class MeshComms;  // parallel/reshard_exec.h

struct ExecutorOptions {
  uint64_t seed = 0;  // parameter init
  // Values that must stay readable after run() (besides loss and g.outputs).
  std::vector<ValueId> fetch;
  // Nodes another part of the runtime runs instead (the gradient all_reduces
  // GradientBuckets runs): left out of the orders, their outputs get no arena
  // bytes and must be bound (bind) before anything reads them.
  std::vector<NodeId> run_elsewhere;
  // Optimizer state (and parameters) in a memory-mapped file on disk,
  // streamed around each run (runtime/offload.h). The caller checks the
  // directory first (check_offload); a failure here throws StatusError.
  OffloadOptions offload;
};

struct MemoryStats {
  int64_t params = 0;
  int64_t grads = 0;      // persistent gradient accumulators (micro-batching)
  int64_t optimizer = 0;  // optimizer state
  int64_t inputs = 0;
  int64_t arena = 0;      // activations, gradients in flight, temporaries
  int64_t offloaded = 0;  // on disk (offload): not in params / optimizer, not in total()
  int64_t total() const { return params + grads + optimizer + inputs + arena; }
};

class Executor : public ParameterStore {
 public:
  explicit Executor(const Graph& g, ExecutorOptions options = {});
  ~Executor() override;
  // Before building one: do the graph's parameters, optimizer state and inputs
  // (allocated whole by the constructor), and its largest single value, fit in
  // this machine's memory? The error names the biggest tensors (a user's
  // mistake: sizes no machine here can hold), instead of a failed allocation.
  // Values an offload puts on disk do not count (check_offload checks the disk).
  static Status check_fits_in_memory(const Graph& g, const OffloadOptions& offload = {});

  const Graph& graph() const override { return g_; }

  // Node orders: forward + backward (one micro-batch), optimizer, and eval
  // (forward + metrics, no backward).
  const std::vector<NodeId>& forward_backward_order() const { return fwd_bwd_; }
  const std::vector<NodeId>& optimizer_order() const { return opt_; }
  const std::vector<NodeId>& eval_order() const { return eval_; }
  std::vector<NodeId> training_order() const;

  // Runs the nodes in order; after_node (optional) is called after each one
  // (the data-parallel trainer uses it to launch gradient all-reduces as soon
  // as a gradient is final, overlapping them with the rest of the backward).
  void run(const std::vector<NodeId>& nodes, const std::function<void(NodeId)>& after_node = {});

  // Inputs: copy into the input's own buffer. Shapes must match exactly.
  Status feed(const std::string& name, const Tensor& t);
  Status feed_data(const std::string& name, const void* data, size_t bytes);
  void feed_scalar(const std::string& name, float v);  // no-op if the graph has no such input
  void feed_scalar_i32(const std::string& name, int32_t v);

  // Any persistent value (parameter, state, input) by id.
  Tensor& storage(ValueId v) override;
  // Pointer to any value's current data (persistent or in the arena).
  void* data(ValueId v);
  const float* data_f(ValueId v) { return static_cast<const float*>(data(v)); }
  float scalar(ValueId v) { return *data_f(v); }

  // Rebinds a transient value to external storage for later reads (used by
  // gradient accumulation: the optimizer reads the accumulators).
  // (nullptr: back to its own storage.)
  void bind(ValueId v, void* ptr) { override_[v] = ptr; }
  // Does v live in the arena (not persistent, not run elsewhere)?
  bool in_arena(ValueId v) const { return !persistent_[v].defined() && plan_.offset[v] >= 0; }
  void unbind_all();

  // Per-op-kind wall time of the kernels run so far (when profiling is on).
  void set_profiling(bool on) { profiling_ = on; }
  const std::vector<double>& seconds_by_kind() const { return seconds_by_kind_; }
  std::string profile_report() const;

  // A partitioned program (parallel/partition.h): the communicators its
  // collective nodes run on. Not owned; must outlive run().
  void set_mesh_comms(const MeshComms* comms) { comms_ = comms; }

  const MemoryPlan& memory_plan() const { return plan_; }
  const OffloadStreamer* offload_streamer() const { return streamer_.get(); }
  MemoryStats memory() const { return stats_; }
  void add_grad_accumulator_bytes(int64_t b) { stats_.grads += b; }

 private:
  const Graph& g_;
  std::vector<NodeId> fwd_bwd_, opt_, eval_;
  std::vector<Tensor> persistent_;  // indexed by value id; undefined for transients
  std::vector<void*> override_;
  std::shared_ptr<void> arena_;
  MemoryPlan plan_;
  MemoryStats stats_;
  bool profiling_ = false;
  const MeshComms* comms_ = nullptr;
  std::vector<double> seconds_by_kind_;
  std::unique_ptr<OffloadFile> offload_file_;
  std::unique_ptr<OffloadStreamer> streamer_;
};

// Fills a tensor from its Init, seeded by (name, seed). A shard of a larger
// tensor (global_dims non-empty: the whole tensor's sizes, global_offset: the
// shard's start per dim) gets exactly the elements the whole tensor has there.
void initialize(Tensor& t, const Init& init, const std::string& name, uint64_t seed,
                const std::vector<int64_t>& global_dims = {},
                const std::vector<int64_t>& global_offset = {});

}  // namespace meshflow
