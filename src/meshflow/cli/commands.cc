#include "meshflow/cli/commands.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <optional>
#include <stdexcept>

#include "meshflow/autodiff/autodiff.h"
#include "meshflow/cli/errors.h"
#include "meshflow/cli/plan_check.h"
#include "meshflow/comm/local_world.h"
#include "meshflow/comm/mpi_transport.h"
#include "meshflow/core/file_io.h"
#include "meshflow/engine/faults.h"
#include "meshflow/engine/job.h"
#include "meshflow/engine/pipeline_trainer.h"
#include "meshflow/engine/state_checkpoint.h"
#include "meshflow/engine/trainer.h"
#include "meshflow/io/checkpoint.h"
#include "meshflow/optim/optimizer.h"
#include "meshflow/plan/auto_plan.h"
#include "meshflow/plan/cluster.h"
#include "meshflow/runtime/progress.h"

namespace meshflow::cli {

namespace {

int user_error(const Status& s) {
  return print_error(s.message(), 2);
}

Result<RunConfig> load(const std::string& path, std::vector<std::string> overrides) {
  return load_run_config(path, overrides);
}

// Fault injection for testing failure handling end to end:
//   MESHFLOW_INJECT_FAULT=RANK:STEP:throw   rank RANK throws before step STEP
//   MESHFLOW_INJECT_FAULT=RANK:STEP:kill    rank RANK kills its own process (SIGKILL)
//   (the kinds "save" and "nan" are the engines': engine/faults.h)
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
  f.kill = injected_fault_step("kill", rank) >= 0;
  f.step = static_cast<int>(injected_fault_step(f.kill ? "kill" : "throw", rank));
  return f;
}

// train.checkpoint names one file of weights when it ends in .safetensors,
// else a directory of full-state checkpoints.
bool is_weights_file(const std::string& path) {
  const std::string ext = ".safetensors";
  return path.size() >= ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0;
}

// A checkpoint directory can be made and written: it exists as a directory
// this process can write, or can be created (it is, here, so a typo fails now).
Status check_checkpoint_dir(const std::string& path, const std::string& what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && !S_ISDIR(st.st_mode))
    return Status::invalid(what + " '" + path + "' is " + file_kind_name(st.st_mode) +
                           ", not a directory: full-state checkpoints go in a directory (a "
                           "path ending in .safetensors writes the weights alone)");
  fs::create_directories(path, ec);
  if (ec)
    return Status::invalid(what + ": cannot create directory '" + path + "': " + ec.message());
  if (::access(path.c_str(), W_OK | X_OK) != 0)
    return Status::invalid(what + ": directory '" + path +
                           "' is not writable: " + std::strerror(errno));
  return Status::ok();
}

// The plan check's prediction (--check-plan, --calibrate-from-run; auto mode
// has it already), priced on `local`; --calibrate-from-run refits into a
// file it can write.
Status prepare_plan_check(const TrainOptions& o, Job* job, const Result<plan::Cluster>& local) {
  if (!o.check_plan && o.calibrate_from_run.empty()) return Status::ok();
  const char* flag = o.calibrate_from_run.empty() ? "--check-plan" : "--calibrate-from-run";
  if (!job->plan_check) {
    if (!local.is_ok()) return local.status().with_context(flag);
    if (Status s = price_job_plan(job, *local); !s.is_ok()) return s.with_context(flag);
  }
  if (o.calibrate_from_run.empty()) return Status::ok();
  if (job->rc.offload.active())
    return Status::invalid(
        "--calibrate-from-run: the run offloads to disk (" + job->rc.offload.key() +
        "), which its prediction does not price: a refit would count the file streaming as "
        "compute; calibrate from a run without offload");
  if (job->rc.train.steps < 2)
    return Status::invalid(
        "--calibrate-from-run needs at least two steps (the first one warms "
        "up), train.steps is " +
        std::to_string(job->rc.train.steps) + "; raise --steps");
  return check_output_file(o.calibrate_from_run, "--calibrate-from-run");
}

// This machine's cluster for every process of an MPI job: rank 0's
// (plan::load_local_cluster, measured there if need be), broadcast, so every
// process resolves the same job (a cluster measured per process would differ
// and could choose another plan). An error on rank 0 is every process's.
Result<plan::Cluster> local_cluster_of_rank0(const std::shared_ptr<Transport>& t) {
  std::shared_ptr<Communicator> world = Communicator::world(t);
  std::string text;  // "C" + the cluster JSON, or "E" + the error
  if (world->rank() == 0) {
    Result<plan::Cluster> c = plan::load_local_cluster();
    text = c.is_ok() ? "C" + plan::cluster_to_json(*c).dump() : "E" + c.status().message();
  }
  int64_t size = static_cast<int64_t>(text.size());
  MF_RETURN_IF_ERROR(world->broadcast(&size, 1, DType::I64, 0));
  std::vector<int32_t> words(static_cast<size_t>((size + 3) / 4), 0);  // the bytes, as 4-byte words
  std::memcpy(words.data(), text.data(), text.size());
  MF_RETURN_IF_ERROR(
      world->broadcast(words.data(), static_cast<int64_t>(words.size()), DType::I32, 0));
  text.assign(reinterpret_cast<const char*>(words.data()), static_cast<size_t>(size));
  if (text.empty() || text[0] != 'C')
    return Status::not_found(text.empty() ? "no local cluster" : text.substr(1));
  const nlohmann::json j =
      nlohmann::json::parse(text.substr(1), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::internal("rank 0's local cluster arrived garbled");
  return plan::parse_cluster(j);
}

// One rank's training run. Rank 0 (the main rank) reports progress and
// writes metrics and checkpoints; every rank computes. trace: optional, this
// rank's writer.
Status train_rank(const TrainOptions& o, const Job& job, std::shared_ptr<Communicator> comm,
                  TraceWriter* trace) {
  const RunConfig& rc = job.rc;
  const bool main_rank = !comm || comm->rank() == 0;
  const int world = comm ? comm->size() : 1;
  ProgressReporter progress(o.quiet || !main_rank);
  if (main_rank && !o.metrics.empty())
    MF_RETURN_IF_ERROR(progress.open_metrics(o.metrics, /*append=*/o.attempt > 0));
  for (const std::string& note : job.notes) progress.message("meshflow: " + note);
  // A run with a prediction (auto mode's, or --check-plan's) is profiled: the
  // plan check compares its kernels with it (cli/plan_check.h). Every rank
  // measures (a pipeline's slowest stage may be any rank's); rank 0 reports.
  const bool check = job.plan_check != nullptr;
  MF_ASSIGN_OR_RETURN(std::unique_ptr<Engine> trainer,
                      make_engine(job, comm, trace, o.profile || job.plan_check != nullptr));
  const TrainConfig& tc = rc.train;
  if (!o.resume.empty()) {
    const std::string from = o.resume == "latest" ? tc.checkpoint : o.resume;
    MF_RETURN_IF_ERROR(trainer->load_state(from));
    if (trainer->steps_done() >= tc.steps)
      return Status::invalid("--resume: the checkpoint in '" + from + "' is at step " +
                             std::to_string(trainer->steps_done()) + ", train.steps is " +
                             std::to_string(tc.steps) + ": raise --steps to train further");
    progress.message("meshflow: resumed from " + from + " at step " +
                     std::to_string(trainer->steps_done()));
  }
  // A full-state checkpoint directory, or the weights alone in one file.
  auto save = [&]() -> Status {
    if (is_weights_file(tc.checkpoint)) return trainer->save_checkpoint(tc.checkpoint);
    return trainer->save_state(tc.checkpoint, tc.keep_checkpoints);
  };
  // train.async_save: the save_every checkpoint being written in the
  // background, polled by every rank after every step (collectively), and
  // waited for before the next save and at the end.
  std::unique_ptr<BackgroundSave> pending;
  auto settle = [&](bool wait) -> Status {
    if (!pending) return Status::ok();
    MF_ASSIGN_OR_RETURN(const bool committed, pending->poll(wait));
    if (!committed) return Status::ok();
    progress.message("meshflow: wrote checkpoint " +
                     checkpoint_dir(tc.checkpoint, pending->step()) + " (in the background)");
    pending.reset();
    return Status::ok();
  };
  const std::optional<PipelineConfig>& pc = job.pipeline;
  const int micro_batches = job.micro_batches;
  const double flops_scale = trainer->flops_scale();  // StepResult::flops -> the whole job's
  const std::string how = job.describe();
  if (!o.init.empty()) MF_RETURN_IF_ERROR(trainer->load_checkpoint(o.init));
  progress.message(
      "meshflow: " + rc.model_source + ": " + std::to_string(trainer->num_parameters()) +
      " parameters; " + std::to_string(tc.steps) + " steps of batch " +
      std::to_string(tc.batch_size) +
      (micro_batches > 1 ? " (" + std::to_string(micro_batches) + " micro-batches)" : "") +
      (world > 1 || pc ? " on " + std::to_string(world) + " ranks (" +
                             std::string(comm->transport().backend()) + ", " + how + ")"
                       : "") +
      "; memory planned " + format_bytes(trainer->peak_bytes()) +
      (world > 1 ? (pc ? " on rank 0 (stage 0)" : " per rank") : ""));

  double window_s = 0, window_flops = 0, window_wait = 0;
  int64_t window_items = 0;
  int steps_done = 0;
  // The plan check's measurements: kernels after this run's first step, the
  // later steps' wall times and waits.
  std::vector<double> kernels_after_first, later_steps;
  double later_wait = 0, accumulate_after_first = 0, copies_after_first = 0;
  const int first_step = trainer->steps_done();
  // Injected faults fire in the first run only (a restart would meet them again).
  const FaultInjection fault =
      o.attempt == 0 ? fault_from_env(comm ? comm->rank() : 0) : FaultInjection{};
  for (int s = trainer->steps_done(); s < tc.steps; ++s) {
    if (fault.step == s) fault.trigger();
    StepResult r = trainer->step();
    steps_done = r.step;
    MF_RETURN_IF_ERROR(settle(false));
    if (check) {
      if (s == first_step) {
        kernels_after_first = trainer->seconds_by_kind();
        accumulate_after_first = trainer->grad_accumulate_seconds();
        copies_after_first = trainer->stash_copy_seconds();
      } else {
        later_steps.push_back(r.seconds);
        later_wait += r.comm_wait_seconds;
      }
    }
    window_s += r.seconds;
    window_flops += r.flops * flops_scale;
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
      rep.items_are_tokens = trainer->is_language_model();
      rep.gflops = window_s > 0 ? window_flops / window_s / 1e9 : 0;
      rep.peak_bytes = trainer->peak_bytes();
      rep.comm_wait_fraction = window_s > 0 && world > 1 ? window_wait / window_s : -1;
      MF_RETURN_IF_ERROR(progress.step(rep));
      window_s = window_flops = window_wait = 0;
      window_items = 0;
    }
    if (r.skipped) progress.message("meshflow: skipped the update of " + r.nonfinite);
    if (!r.skipped && !std::isfinite(r.loss))
      return Status::failed_precondition("loss is " + std::to_string(r.loss) + " at step " +
                                         std::to_string(r.step) +
                                         "; lower optimizer.lr or set optimizer.grad_clip");
    if (tc.eval_every > 0 && r.step % tc.eval_every == 0 && !last) {
      EvalResult e = trainer->evaluate();
      MF_RETURN_IF_ERROR(progress.eval({r.step, e.loss, e.accuracy}));
    }
    if (tc.save_every > 0 && !tc.checkpoint.empty() && r.step % tc.save_every == 0 && !last) {
      if (tc.async_save && !is_weights_file(tc.checkpoint)) {
        MF_RETURN_IF_ERROR(settle(true));
        MF_ASSIGN_OR_RETURN(pending, trainer->start_save_state(tc.checkpoint, tc.keep_checkpoints));
      } else {
        MF_RETURN_IF_ERROR(save());
      }
    }
  }
  MF_RETURN_IF_ERROR(settle(true));
  if (check) {
    RunMeasurement m = measure_run(
        kernels_after_first, trainer->seconds_by_kind(), static_cast<int>(later_steps.size()),
        later_steps, later_wait, trainer->grad_accumulate_seconds() - accumulate_after_first,
        trainer->stash_copy_seconds() - copies_after_first, trainer->peak_bytes());
    // Every rank's measurement to rank 0, which compares the slowest one's
    // (the most compute; rank 0's peak memory stays).
    if (comm && world > 1) {
      MF_ASSIGN_OR_RETURN(m, slowest_rank_measurement(*comm, m));
    }
    if (main_rank && m.steps < 1) {
      progress.message("meshflow: plan check: needs two steps or more (measured after the first)");
      if (!o.calibrate_from_run.empty())
        return Status::invalid(
            "--calibrate-from-run needs at least two steps (the first one "
            "warms up); raise --steps");
    } else if (main_rank) {
      const PlanCheck pc = check_plan(*job.plan_check, m);
      if (!o.quiet) std::fputs(pc.report.c_str(), stderr);
      if (!o.calibrate_from_run.empty()) {
        MF_ASSIGN_OR_RETURN(const plan::Cluster local, plan::load_local_cluster());
        const plan::Cluster refit = refit_cluster(local, pc);
        MF_RETURN_IF_ERROR(write_file_atomic(o.calibrate_from_run,
                                             plan::cluster_to_json(refit).dump(2) + "\n",
                                             "--calibrate-from-run"));
        progress.message("meshflow: wrote the refitted cluster file " + o.calibrate_from_run +
                         " (use it with MESHFLOW_LOCAL_CLUSTER=" + o.calibrate_from_run + ")");
      }
    }
  }
  EvalResult e = trainer->evaluate();
  MF_RETURN_IF_ERROR(progress.eval({steps_done, e.loss, e.accuracy}));
  if (!tc.checkpoint.empty()) {
    MF_RETURN_IF_ERROR(save());
    progress.message("meshflow: wrote checkpoint " +
                     (is_weights_file(tc.checkpoint) ? tc.checkpoint
                                                     : checkpoint_dir(tc.checkpoint, steps_done)));
  }
  MF_RETURN_IF_ERROR(progress.finish());
  if (o.profile && main_rank)
    std::fprintf(stderr, "kernel time by op:\n%s", trainer->profile_report().c_str());
  return Status::ok();
}

// Under mpirun each process holds its rank's trace: ranks send theirs (JSON
// text, 4 bytes per float) to rank 0, which writes one file of all events.
Status write_trace_mpi(Communicator& comm, const TraceWriter& trace, const std::string& path) {
  std::string text = trace.to_json();
  if (comm.rank() != 0) {
    float len[2];
    const int64_t n = static_cast<int64_t>(text.size());
    std::memcpy(len, &n, sizeof n);
    MF_RETURN_IF_ERROR(comm.send(len, 2, 0));
    text.resize((text.size() + 3) / 4 * 4, ' ');
    return comm.send(reinterpret_cast<const float*>(text.data()),
                     static_cast<int64_t>(text.size() / 4), 0);
  }
  json merged = json::parse(text);
  for (int r = 1; r < comm.size(); ++r) {
    float len[2];
    MF_RETURN_IF_ERROR(comm.recv(len, 2, r));
    int64_t n = 0;
    std::memcpy(&n, len, sizeof n);
    std::vector<float> buf((n + 3) / 4);
    MF_RETURN_IF_ERROR(comm.recv(buf.data(), static_cast<int64_t>(buf.size()), r));
    json other = json::parse(std::string(reinterpret_cast<const char*>(buf.data()), n));
    for (json& e : other["traceEvents"]) merged["traceEvents"].push_back(std::move(e));
  }
  return write_file_atomic(path, merged.dump(), "--trace");
}

// Exit code for a failed run: 2 for a user's mistake, 1 for a runtime failure.
int exit_code(const Status& s) {
  return report(s);
}

// A restarted run continues from train.checkpoint's latest full-state
// checkpoint if it has one (and takes no --init), else from where the first
// run started (its --resume, or the start). Returns where, for messages.
std::string restart_from(const RunConfig& rc, const TrainOptions& first, TrainOptions* run) {
  const std::string& root = rc.train.checkpoint;
  const bool resumable = !root.empty() && !is_weights_file(root) && !list_checkpoints(root).empty();
  run->resume = resumable ? root : first.resume;
  if (resumable) run->init.clear();
  return resumable              ? "its latest checkpoint (" + list_checkpoints(root).back() + ")"
         : first.resume.empty() ? "the start"
                                : first.resume;
}

int train_impl(const TrainOptions& o) {
  std::vector<std::string> overrides = o.overrides;
  if (o.steps > 0) overrides.push_back("train.steps=" + std::to_string(o.steps));
  if (o.threads >= 0) overrides.push_back("train.threads=" + std::to_string(o.threads));
  Result<RunConfig> rc = load(o.config, overrides);
  if (!rc.is_ok()) return user_error(rc.status());
  if (!o.checkpoint.empty()) rc->train.checkpoint = o.checkpoint;
  // Fail before training, not after it, when an output cannot be written.
  if (!rc->train.checkpoint.empty()) {
    const char* what = o.checkpoint.empty() ? "train.checkpoint" : "--checkpoint";
    Status s = is_weights_file(rc->train.checkpoint)
                   ? check_output_file(rc->train.checkpoint, what)
                   : check_checkpoint_dir(rc->train.checkpoint, what);
    if (!s.is_ok()) return user_error(s);
  }
  if (!o.resume.empty() && !o.init.empty())
    return user_error(Status::invalid(
        "--resume and --init: a resumed run's weights are the checkpoint's; give one of them"));
  if (o.resume == "latest" && rc->train.checkpoint.empty())
    return user_error(Status::invalid(
        "--resume latest needs train.checkpoint (or --checkpoint): the directory to look in"));
  if (o.resume == "latest" && is_weights_file(rc->train.checkpoint))
    return user_error(Status::invalid("--resume latest: train.checkpoint '" + rc->train.checkpoint +
                                      "' is a weights file (it holds no optimizer state or step); "
                                      "give a directory"));
  if (!o.metrics.empty()) {
    Status s = check_output_file(o.metrics, "--metrics", OutputTarget::kStream);
    if (!s.is_ok()) return user_error(s);
  }
  if (!o.trace.empty()) {
    Status s = check_output_file(o.trace, "--trace");
    if (!s.is_ok()) return user_error(s);
  }

  if (launched_by_mpirun()) {
    if (o.ranks > 1)
      return user_error(
          Status::invalid("--ranks " + std::to_string(o.ranks) +
                          " with mpirun: the ranks are mpirun's processes (-np); drop --ranks"));
    if (o.max_restarts > 0)
      return user_error(Status::invalid(
          "--max-restarts with mpirun: a process cannot restart the job it belongs to; "
          "run it under `meshflow launch --np N --max-restarts K train ...` (or use in-process "
          "ranks, --ranks N)"));
    // A restart by `meshflow launch` (--restart-attempt K).
    TrainOptions run = o;
    const std::string where = o.attempt > 0 ? restart_from(*rc, o, &run) : "";
    Result<std::shared_ptr<Transport>> t = make_mpi_transport();
    if (!t.is_ok()) return exit_code(t.status());
    if (o.attempt > 0 && (*t)->rank() == 0)
      std::fprintf(stderr, "meshflow: restart %d continues from %s\n", o.attempt, where.c_str());
    // Resolved before any rank starts (every process resolves the same, on
    // rank 0's cluster).
    const Result<plan::Cluster> local = local_cluster_of_rank0(*t);
    Result<Job> job = resolve_job(*rc, (*t)->size(), nullptr, &local);
    if (!job.is_ok()) return user_error(job.status());
    if (Status c = prepare_plan_check(o, &*job, local); !c.is_ok()) return user_error(c);
    Status s;
    try {
      std::shared_ptr<Communicator> world = Communicator::world(*t);
      TraceWriter trace;
      s = train_rank(run, *job, world, o.trace.empty() ? nullptr : &trace);
      if (s.is_ok() && !o.trace.empty()) s = write_trace_mpi(*world, trace, o.trace);
    } catch (const StatusError& e) {
      s = e.status();
    } catch (const std::exception& e) {
      s = Status::internal(e.what());
    }
    if (!s.is_ok() && (*t)->size() > 1)
      (*t)->abort(s.message());  // stops every rank, exits non-zero
    return s.is_ok() ? 0 : exit_code(s);
  }
  if (o.elastic && o.max_restarts == 0)
    return user_error(Status::invalid("--elastic restarts: give --max-restarts N (N >= 1)"));
  TrainOptions run = o;
  run.ranks = std::max(1, o.ranks);
  std::vector<TraceWriter> traces;
  Status s;
  for (;; ++run.attempt) {
    Result<Job> job = resolve_job(*rc, run.ranks);  // before any rank starts
    if (!job.is_ok()) return user_error(job.status());
    if (run.check_plan || !run.calibrate_from_run.empty()) {
      if (Status c = prepare_plan_check(run, &*job, plan::load_local_cluster()); !c.is_ok())
        return user_error(c);
    }
    traces.assign(static_cast<size_t>(run.ranks), TraceWriter{});
    if (run.ranks <= 1) {
      s = train_rank(run, *job, nullptr, o.trace.empty() ? nullptr : &traces[0]);
    } else {
      s = run_local_ranks(run.ranks, [&](const std::shared_ptr<Transport>& t) -> Status {
        auto comm = Communicator::world(t);
        return train_rank(run, *job, comm, o.trace.empty() ? nullptr : &traces[comm->rank()]);
      });
    }
    // A failure while running (not the user's input, not a non-finite step,
    // which would fail the same way again) restarts, while restarts are left.
    if (s.is_ok() || run.attempt >= o.max_restarts || exit_code_of(s) != 1 ||
        s.code() == StatusCode::kFailedPrecondition)
      break;
    const std::string where = restart_from(*rc, o, &run);
    if (o.elastic) {
      for (int w = run.ranks - 1; w >= 1; --w)
        if (resolve_job(*rc, w).is_ok()) {
          run.ranks = w;
          break;
        }
    }
    std::fprintf(stderr, "meshflow: the job failed (%s); restart %d of %d from %s on %d rank%s\n",
                 s.message().c_str(), run.attempt + 1, o.max_restarts, where.c_str(), run.ranks,
                 run.ranks == 1 ? "" : "s");
  }
  if (s.is_ok() && !o.trace.empty()) {
    TraceWriter all;
    for (const TraceWriter& t : traces) all.merge(t);
    s = all.write(o.trace);
    if (s.is_ok() && !o.quiet)
      std::fprintf(stderr, "meshflow: wrote trace %s (%zu spans; open in ui.perfetto.dev)\n",
                   o.trace.c_str(), all.num_spans());
  }
  return s.is_ok() ? 0 : exit_code(s);
}

}  // namespace

int run_train(const TrainOptions& o) {
  return guard([&] { return train_impl(o); });
}

int run_graph(const GraphOptions& o) {
  return guard([&] {
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
  });
}

}  // namespace meshflow::cli
