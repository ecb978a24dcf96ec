#include "meshflow/engine/state_checkpoint.h"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "meshflow/core/check.h"
#include "meshflow/engine/faults.h"

namespace meshflow {

namespace {

// Every rank's verdict: true when all of them succeeded (a max-reduce of
// failure flags; one rank: its own).
bool all_ok(Communicator* comm, bool ok) {
  if (!comm || comm->size() == 1) return ok;
  float failed = ok ? 0.f : 1.f;
  if (!comm->all_reduce(&failed, 1, ReduceOp::kMax).is_ok()) return false;
  return failed == 0.f;
}

// all_ok, with a failed reduction an error rather than a "no".
Result<bool> all_true(Communicator* comm, bool ok) {
  if (!comm || comm->size() == 1) return ok;
  float not_ok = ok ? 0.f : 1.f;
  MF_RETURN_IF_ERROR(comm->all_reduce(&not_ok, 1, ReduceOp::kMax));
  return not_ok == 0.f;
}

// Rank 0 prepares the step's directory; every rank agrees on it.
Status prepare_agreed(Communicator* comm, const std::string& root, int64_t step) {
  const int rank = comm ? comm->rank() : 0;
  Status s = rank == 0 ? prepare_checkpoint(root, step) : Status::ok();
  if (!all_ok(comm, s.is_ok()))
    return s.is_ok() ? Status::unavailable("checkpoint of step " + std::to_string(step) + " in '" +
                                           root + "': rank 0 could not prepare it")
                     : s;
  return Status::ok();
}

// After every rank wrote its shard (`written`: this rank's outcome): agrees
// on the writes, then rank 0 commits, and agrees on that.
Status commit_written(Communicator* comm, const std::string& root, int64_t step,
                      const nlohmann::json& info, int keep, const Status& written) {
  const int rank = comm ? comm->rank() : 0, world = comm ? comm->size() : 1;
  const std::string what = "checkpoint of step " + std::to_string(step) + " in '" + root + "'";
  if (!all_ok(comm, written.is_ok()))
    return written.is_ok() ? Status::unavailable(what +
                                                 " failed on another rank; the previous "
                                                 "checkpoints are intact")
                           : written.with_context(what + " (the previous checkpoints are intact)");
  Status s = rank == 0 ? commit_checkpoint(root, step, world, info, keep) : Status::ok();
  if (!all_ok(comm, s.is_ok()))
    return s.is_ok() ? Status::unavailable(what + ": rank 0 could not commit it") : s;
  return Status::ok();
}

}  // namespace

nlohmann::json state_info(const RunConfig& rc, int step, int world, const std::string& plan) {
  const TrainConfig& tc = rc.train;
  return {{"model", rc.model},
          {"model_source", rc.model_source},
          {"config", rc.document},
          {"plan", plan},
          {"world", world},
          {"data",
           {{"seed", tc.seed},
            {"batch_size", tc.batch_size},
            {"examples_seen", static_cast<int64_t>(step) * tc.batch_size}}},
          {"schedule", {{"step", step}, {"next_lr", rc.schedule.at(step)}}}};
}

std::vector<ValueId> persistent_values(const Graph& g) {
  std::vector<ValueId> v = g.parameters();
  for (ValueId s : g.states()) v.push_back(s);
  return v;
}

std::string state_kind(const Graph& g, ValueId v, const std::set<ValueId>& buffers) {
  if (g.producer(v).kind == OpKind::kParameter) return "parameter";
  return buffers.count(v) ? "buffer" : "optimizer";
}

std::set<std::string> state_names(const Graph& global) {
  std::set<std::string> names;
  for (ValueId v : persistent_values(global)) names.insert(global.value(v).name);
  return names;
}

StateBlock state_block(const std::string& name, const std::string& kind, const Shape& global,
                       const Mesh& mesh, const Layout& layout, int rank, Tensor* storage,
                       int sole_axis) {
  MF_CHECK(!layout.has_partial()) << "checkpoint: '" << name << "' is a partial sum";
  StateBlock b;
  b.block.name = name;
  b.block.kind = kind;
  b.block.global = global;
  b.block.ranges = local_ranges(global, mesh, layout, rank);
  b.block.data = storage;
  b.storage = storage;
  const std::vector<int> coords = mesh.coords(rank);
  b.write = true;
  for (int a = 0; a < mesh.num_axes(); ++a)
    if (a != sole_axis && !layout.at(a).is_shard() && coords[static_cast<size_t>(a)] != 0)
      b.write = false;
  return b;
}

Status save_state(Communicator* comm, const std::string& root, int64_t step,
                  const std::vector<StateBlock>& blocks, const nlohmann::json& info, int keep) {
  const int rank = comm ? comm->rank() : 0;
  MF_RETURN_IF_ERROR(prepare_agreed(comm, root, step));
  std::vector<CheckpointBlock> mine;
  for (const StateBlock& b : blocks)
    if (b.write) mine.push_back(b.block);
  const Status s = write_checkpoint_shard(root, step, rank, mine);
  kill_if_injected(rank, step);
  return commit_written(comm, root, step, info, keep, s);
}

Result<std::unique_ptr<BackgroundSave>> BackgroundSave::start(Communicator* comm,
                                                              const std::string& root, int64_t step,
                                                              const std::vector<StateBlock>& blocks,
                                                              nlohmann::json info, int keep) {
  const int rank = comm ? comm->rank() : 0;
  MF_RETURN_IF_ERROR(prepare_agreed(comm, root, step));
  std::unique_ptr<BackgroundSave> b(new BackgroundSave());
  b->comm_ = comm;
  b->root_ = root;
  b->step_ = step;
  b->info_ = std::move(info);
  b->keep_ = keep;
  for (const StateBlock& sb : blocks)
    if (sb.write) b->copies_.push_back(sb.storage->clone());
  size_t i = 0;
  for (const StateBlock& sb : blocks) {
    if (!sb.write) continue;
    CheckpointBlock cb = sb.block;
    cb.data = &b->copies_[i++];
    b->bytes_ += static_cast<int64_t>(cb.data->nbytes());
    b->blocks_.push_back(std::move(cb));
  }
  BackgroundSave* self = b.get();
  b->writer_ = std::thread([self, rank] {
    self->status_ = write_checkpoint_shard(self->root_, self->step_, rank, self->blocks_);
    kill_if_injected(rank, self->step_);
    self->written_.store(true, std::memory_order_release);
  });
  return b;
}

BackgroundSave::~BackgroundSave() {
  if (writer_.joinable()) writer_.join();
}

Result<bool> BackgroundSave::poll(bool wait) {
  if (wait && writer_.joinable()) writer_.join();
  MF_ASSIGN_OR_RETURN(const bool all_written,
                      all_true(comm_, written_.load(std::memory_order_acquire)));
  if (!all_written) return false;  // some rank is still writing
  if (writer_.joinable()) writer_.join();
  MF_RETURN_IF_ERROR(commit_written(comm_, root_, step_, info_, keep_, status_));
  copies_.clear();
  return true;
}

Result<CheckpointManifest> load_state(Communicator* comm, const std::string& path,
                                      const std::vector<StateBlock>& blocks,
                                      const std::set<std::string>& model_names) {
  Result<CheckpointManifest> m = open_checkpoint(path);
  Status s = m.status();
  if (s.is_ok()) {
    // Another model's or optimizer's tensors; then every tensor this rank needs.
    for (const auto& [name, t] : m->tensors)
      if (!model_names.count(name)) {
        s = Status::invalid("checkpoint '" + m->dir + "' holds " + t.kind + " '" + name +
                            "', which this model and optimizer do not have (a checkpoint of "
                            "another model or optimizer?)");
        break;
      }
    for (size_t i = 0; s.is_ok() && i < blocks.size(); ++i) {
      const CheckpointBlock& b = blocks[i].block;
      auto it = m->tensors.find(b.name);
      if (it == m->tensors.end())
        s = Status::not_found("checkpoint '" + m->dir + "' has no " + b.kind + " '" + b.name +
                              "' (a checkpoint of another model or optimizer?)");
      else if (!it->second.global.same_sizes(b.global))
        s = Status::invalid("checkpoint '" + m->dir + "': " + b.kind + " '" + b.name + "' is " +
                            it->second.global.to_string() + " in the checkpoint but " +
                            b.global.to_string() + " in the model");
    }
  }
  if (!all_ok(comm, s.is_ok()))
    return s.is_ok() ? Status::invalid("checkpoint '" + path + "' does not fit another rank's plan")
                     : s;
  // Read into copies, so a failure part-way changes nothing.
  CheckpointReader reader(*m);
  std::vector<Tensor> read;
  for (size_t i = 0; s.is_ok() && i < blocks.size(); ++i) {
    const StateBlock& b = blocks[i];
    Tensor t(b.storage->shape(), b.storage->dtype());
    s = reader.read(b.block.name, b.block.global, b.block.ranges, &t);
    read.push_back(std::move(t));
  }
  if (!all_ok(comm, s.is_ok()))
    return s.is_ok() ? Status::invalid("checkpoint '" + m->dir + "' failed to load on another rank")
                     : s;
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i].storage->copy_from(read[i].raw());
  return m;
}

}  // namespace meshflow
