// Full-state checkpoints of a training run (io/checkpoint.h's directories),
// written and read collectively by the engines: every rank lists the blocks
// of the persistent values it holds (parameters, model buffers, optimizer
// state, each a block of the global tensor under its plan's layout), writes
// those it is the first holder of, and on load reads the blocks its own plan
// needs, whatever plan wrote them. With the step, that is all a run's state:
// batches are drawn by (seed, step, micro-batch), dropout by (node seed,
// step * m + micro), the learning rate by the schedule at the step.
//
//   std::vector<StateBlock> blocks = ...;   // Trainer / PipelineTrainer::state_blocks
//   MF_RETURN_IF_ERROR(save_state(comm, root, step, blocks, info, keep));
//   MF_ASSIGN_OR_RETURN(CheckpointManifest m, load_state(comm, path, blocks, model_names));
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "meshflow/comm/communicator.h"
#include "meshflow/core/layout.h"
#include "meshflow/core/mesh.h"
#include "meshflow/io/checkpoint.h"
#include "meshflow/ir/graph.h"
#include "meshflow/runtime/run_config.h"

namespace meshflow {

struct StateBlock {
  CheckpointBlock block;  // name, kind, global shape, ranges; block.data = storage
  Tensor* storage = nullptr;
  bool write = false;  // this rank is the first holder of the block: it writes it
};

// A graph's persistent values, parameters then states (buffers and
// optimizer state): what a full-state checkpoint holds.
std::vector<ValueId> persistent_values(const Graph& g);
// Their kinds in a manifest: "parameter", "buffer" (a state a forward node
// reads, Graph::buffers) or "optimizer". `buffers`: g.buffers().
std::string state_kind(const Graph& g, ValueId v, const std::set<ValueId>& buffers);
// The names of the whole training graph's persistent values (what a
// checkpoint of this model and optimizer may hold).
std::set<std::string> state_names(const Graph& global);

// The block of a global tensor a rank of `mesh` holds under `layout`, and
// whether it is that block's first holder (coordinate 0 on every mesh axis
// that does not split it). `sole_axis` (>= 0): the axis along which one
// coordinate alone holds the value (a weights group's optimizer state, on
// its owner), so that coordinate writes it. REQUIRES: no Partial placement.
StateBlock state_block(const std::string& name, const std::string& kind, const Shape& global,
                       const Mesh& mesh, const Layout& layout, int rank, Tensor* storage,
                       int sole_axis = -1);

// What a manifest records beside the tensors after `step` steps: the model,
// the plan (`plan`: Job::describe) and world, the data cursor (seed, batch,
// examples seen) and the schedule's position (the next step's learning rate).
nlohmann::json state_info(const RunConfig& rc, int step, int world, const std::string& plan);

// Collective over `comm` (null: one rank). Writes the blocks marked `write`
// to a checkpoint of `step` under `root`, with `info` in its manifest, then
// keeps the newest `keep` (0: all). Every rank returns the same outcome: if
// any rank fails (disk full, unwritable), no rank commits, the previous
// checkpoints stay, and each returns an error (the failing rank's own).
// Tests: MESHFLOW_INJECT_FAULT=RANK:STEP:save kills rank RANK's process after
// it wrote its shard of step STEP, before the commit.
Status save_state(Communicator* comm, const std::string& root, int64_t step,
                  const std::vector<StateBlock>& blocks, const nlohmann::json& info, int keep);

// save_state in the background (train.async_save; PyTorch DCP's async_save,
// Orbax's async checkpointing): start() prepares the step's directory
// (agreed, as save_state does), copies this rank's blocks (the only stall:
// a memcpy of the bytes it writes) and writes the copies on a thread while
// training goes on. poll() is collective, called by every rank at the same
// step boundary: it agrees whether every rank has written, and if so
// commits (rank 0) and agrees on the outcome, as save_state does; until
// then the previous checkpoints are the latest. A job that ends or dies
// before the commit leaves an uncommitted directory, which is no checkpoint.
class BackgroundSave {
 public:
  static Result<std::unique_ptr<BackgroundSave>> start(Communicator* comm, const std::string& root,
                                                       int64_t step,
                                                       const std::vector<StateBlock>& blocks,
                                                       nlohmann::json info, int keep);
  ~BackgroundSave();
  // True once committed (then the save is over); false: some rank is still
  // writing (wait: block until this rank has written, then agree). Errors as
  // save_state's, the same on every rank.
  Result<bool> poll(bool wait);
  int64_t step() const { return step_; }
  // Bytes this rank copied and writes.
  int64_t bytes() const { return bytes_; }

 private:
  BackgroundSave() = default;
  Communicator* comm_ = nullptr;
  std::string root_;
  int64_t step_ = 0, bytes_ = 0;
  nlohmann::json info_;
  int keep_ = 0;
  std::vector<Tensor> copies_;
  std::vector<CheckpointBlock> blocks_;
  std::thread writer_;
  std::atomic<bool> written_{false};
  Status status_;  // the writer's, read after written_
};

// Collective: opens the checkpoint at `path` (a step directory, or a root's
// latest), checks it holds every tensor of `blocks` at its global shape and
// no tensor outside `model_names` (the whole model's persistent values: a
// checkpoint of another model or optimizer is refused), then fills every
// block's storage. Nothing is changed unless every rank read everything.
Result<CheckpointManifest> load_state(Communicator* comm, const std::string& path,
                                      const std::vector<StateBlock>& blocks,
                                      const std::set<std::string>& model_names);

}  // namespace meshflow
