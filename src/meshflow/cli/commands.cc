#include "meshflow/cli/commands.h"

#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <stdexcept>

#include "meshflow/autodiff/autodiff.h"
#include "meshflow/optim/optimizer.h"
#include "meshflow/runtime/comm/local_world.h"
#include "meshflow/runtime/comm/mpi_transport.h"
#include "meshflow/runtime/progress.h"
#include "meshflow/runtime/trainer.h"

namespace meshflow::cli {

namespace {

int user_error(const Status& s) {
  std::fprintf(stderr, "meshflow: error: %s\n", s.message().c_str());
  return 2;
}

Result<RunConfig> load(const std::string& path, std::vector<std::string> overrides) {
  return load_run_config(path, overrides);
}

// Fault injection for testing failure handling end to end:
//   MESHFLOW_INJECT_FAULT=RANK:STEP:throw   rank RANK throws before step STEP
//   MESHFLOW_INJECT_FAULT=RANK:STEP:kill    rank RANK kills its own process (SIGKILL)
struct FaultInjection {
  int step = -1;
  bool kill = false;
  void trigger() const {
    if (kill) std::raise(SIGKILL);
    throw std::runtime_error("injected fault (MESHFLOW_INJECT_FAULT)");
  }
};

FaultInjection fault_from_env(int rank) {
  FaultInjection f;
  const char* e = std::getenv("MESHFLOW_INJECT_FAULT");
  int r = -1, step = -1;
  char kind[16] = {};
  if (e && std::sscanf(e, "%d:%d:%15s", &r, &step, kind) == 3 && r == rank) {
    f.step = step;
    f.kill = std::string(kind) == "kill";
  }
  return f;
}

// One rank's training run. Rank 0 (the main rank) reports progress and
// writes metrics and checkpoints; every rank computes.
Status train_rank(const TrainOptions& o, const RunConfig& rc, std::shared_ptr<Communicator> comm) {
  const bool main_rank = !comm || comm->rank() == 0;
  ProgressReporter progress(o.quiet || !main_rank);
  if (main_rank && !o.metrics.empty()) MF_RETURN_IF_ERROR(progress.open_metrics(o.metrics));
  MF_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> created, Trainer::create(rc, comm));
  Trainer& trainer = *created;
  trainer.executor().set_profiling(o.profile);
  if (!o.init.empty()) MF_RETURN_IF_ERROR(trainer.load_checkpoint(o.init));
  const TrainConfig& tc = rc.train;
  const int world = trainer.world_size();
  progress.message(
      "meshflow: " + rc.model_source + ": " + std::to_string(trainer.num_parameters()) +
      " parameters; " + std::to_string(tc.steps) + " steps of batch " +
      std::to_string(tc.batch_size) +
      (tc.micro_batches > 1 ? " (" + std::to_string(tc.micro_batches) + " micro-batches)" : "") +
      (world > 1 ? " on " + std::to_string(world) + " ranks (" +
                       std::string(comm->transport().backend()) + ", data parallel)"
                 : "") +
      "; memory planned " + format_bytes(trainer.peak_bytes()) + (world > 1 ? " per rank" : ""));

  double window_s = 0, window_flops = 0, window_wait = 0;
  int64_t window_items = 0;
  const FaultInjection fault = fault_from_env(trainer.rank());
  for (int s = 0; s < tc.steps; ++s) {
    if (fault.step == s) fault.trigger();
    StepResult r = trainer.step();
    window_s += r.seconds;
    window_flops += r.flops * world;
    window_items += r.items;
    window_wait += r.comm_wait_seconds;
    bool last = s + 1 == tc.steps;
    if (r.step % tc.log_every == 0 || last || r.step == 1) {
      StepReport rep;
      rep.step = r.step;
      rep.total_steps = tc.steps;
      rep.loss = r.loss;
      rep.lr = r.lr;
      rep.grad_norm = r.grad_norm;
      rep.items_per_s = window_s > 0 ? window_items / window_s : 0;
      rep.items_are_tokens = trainer.is_language_model();
      rep.gflops = window_s > 0 ? window_flops / window_s / 1e9 : 0;
      rep.peak_bytes = trainer.peak_bytes();
      rep.comm_wait_fraction = window_s > 0 && world > 1 ? window_wait / window_s : -1;
      progress.step(rep);
      window_s = window_flops = window_wait = 0;
      window_items = 0;
    }
    if (!std::isfinite(r.loss))
      return Status::failed_precondition("loss is " + std::to_string(r.loss) + " at step " +
                                         std::to_string(r.step) +
                                         "; lower optimizer.lr or set optimizer.grad_clip");
    if (tc.eval_every > 0 && r.step % tc.eval_every == 0 && !last) {
      EvalResult e = trainer.evaluate();
      progress.eval({r.step, e.loss, e.accuracy});
    }
    if (tc.save_every > 0 && !tc.checkpoint.empty() && r.step % tc.save_every == 0 && !last)
      MF_RETURN_IF_ERROR(trainer.save_checkpoint(tc.checkpoint));
  }
  EvalResult e = trainer.evaluate();
  progress.eval({trainer.steps_done(), e.loss, e.accuracy});
  if (!tc.checkpoint.empty()) {
    MF_RETURN_IF_ERROR(trainer.save_checkpoint(tc.checkpoint));
    progress.message("meshflow: wrote checkpoint " + tc.checkpoint);
  }
  progress.finish();
  if (o.profile && main_rank)
    std::fprintf(stderr, "kernel time by op:\n%s", trainer.executor().profile_report().c_str());
  return Status::ok();
}

// Exit code for a failed run: 2 for a user's mistake, 1 for a runtime failure.
int exit_code(const Status& s) {
  std::fprintf(stderr, "meshflow: error: %s\n", s.message().c_str());
  return s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kNotFound ? 2 : 1;
}

int train_impl(const TrainOptions& o) {
  std::vector<std::string> overrides = o.overrides;
  if (o.steps > 0) overrides.push_back("train.steps=" + std::to_string(o.steps));
  if (o.threads >= 0) overrides.push_back("train.threads=" + std::to_string(o.threads));
  Result<RunConfig> rc = load(o.config, overrides);
  if (!rc.is_ok()) return user_error(rc.status());
  if (!o.checkpoint.empty()) rc->train.checkpoint = o.checkpoint;
  // Fail before training, not after it, when the checkpoint cannot be written.
  if (!rc->train.checkpoint.empty()) {
    namespace fs = std::filesystem;
    fs::path dir = fs::absolute(rc->train.checkpoint).parent_path();
    if (!fs::is_directory(dir) || access(dir.c_str(), W_OK) != 0)
      return user_error(Status::invalid("checkpoint '" + rc->train.checkpoint + "': directory '" +
                                        dir.string() + "' does not exist or is not writable"));
  }

  if (launched_by_mpirun()) {
    if (o.ranks > 1)
      return user_error(
          Status::invalid("--ranks " + std::to_string(o.ranks) +
                          " with mpirun: the ranks are mpirun's processes (-np); drop --ranks"));
    Result<std::shared_ptr<Transport>> t = make_mpi_transport();
    if (!t.is_ok()) return exit_code(t.status());
    Status s;
    try {
      s = train_rank(o, *rc, Communicator::world(*t));
    } catch (const StatusError& e) {
      s = e.status();
    } catch (const std::exception& e) {
      s = Status::internal(e.what());
    }
    if (!s.is_ok() && (*t)->size() > 1)
      (*t)->abort(s.message());  // stops every rank, exits non-zero
    return s.is_ok() ? 0 : exit_code(s);
  }
  if (o.ranks <= 1) {
    Status s = train_rank(o, *rc, nullptr);
    return s.is_ok() ? 0 : exit_code(s);
  }
  Status s = run_local_ranks(o.ranks, [&](const std::shared_ptr<Transport>& t) -> Status {
    return train_rank(o, *rc, Communicator::world(t));
  });
  return s.is_ok() ? 0 : exit_code(s);
}

}  // namespace

int run_train(const TrainOptions& o) {
  try {
    return train_impl(o);
  } catch (const StatusError& e) {
    return user_error(e.status());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshflow: error: %s\n", e.what());
    return 1;
  }
}

int run_graph(const GraphOptions& o) {
  try {
    Result<RunConfig> rc = load_run_config(o.config, o.overrides);
    if (!rc.is_ok()) return user_error(rc.status());
    const TrainConfig& tc = rc->train;
    Result<ModelGraph> m = build_training_graph(*rc, tc.batch_size / tc.micro_batches);
    if (!m.is_ok()) return user_error(m.status());
    Graph& g = m->graph;
    for (const Node& n : g.nodes()) {
      bool show = o.phase == "all" || (o.phase == "forward" && n.phase == Phase::kForward) ||
                  (o.phase == "backward" && n.phase == Phase::kBackward) ||
                  (o.phase == "optimizer" && n.phase == Phase::kOptimizer);
      if (show) std::printf("%s\n", print_node(g, n).c_str());
    }
    return 0;
  } catch (const StatusError& e) {
    return user_error(e.status());
  }
}

}  // namespace meshflow::cli
