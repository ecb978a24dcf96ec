#include "meshflow/cli/launch_command.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <sstream>

#include "meshflow/cli/errors.h"
#include "meshflow/core/status.h"
#include "meshflow/engine/job.h"
#include "meshflow/runtime/run_config.h"

namespace meshflow::cli {

namespace {

std::string self_path() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "meshflow";
  buf[n] = '\0';
  return buf;
}

// Runs argv, waits; its exit code (128 + the signal that ended it), or -1
// with *error when it could not start.
int run_and_wait(const std::vector<std::string>& argv, std::string* error) {
  std::vector<char*> c;
  for (const std::string& a : argv) c.push_back(const_cast<char*>(a.c_str()));
  c.push_back(nullptr);
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {  // closed by a successful exec
    *error = std::strerror(errno);
    return -1;
  }
  const pid_t pid = ::fork();
  if (pid < 0) {
    *error = std::strerror(errno);
    return -1;
  }
  if (pid == 0) {
    ::close(fds[0]);
    ::execvp(c[0], c.data());
    const int err = errno;  // exec failed: tell the parent why
    (void)!::write(fds[1], &err, sizeof err);
    ::_exit(127);
  }
  ::close(fds[1]);
  int err = 0;
  const bool exec_failed = ::read(fds[0], &err, sizeof err) == sizeof err;
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (exec_failed) {
    *error = std::strerror(err);
    return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The most ranks below `np` that the train command's config resolves for
// (its --set and --steps applied); np when none does.
int fewer_ranks(const std::vector<std::string>& args, int np) {
  if (args.size() < 2) return np;
  std::vector<std::string> overrides;
  for (size_t i = 2; i < args.size(); ++i) {
    const std::string& a = args[i];
    const bool next = i + 1 < args.size();
    if (a == "--set" && next) overrides.push_back(args[++i]);
    if (a.rfind("--set=", 0) == 0) overrides.push_back(a.substr(6));
    if (a == "--steps" && next) overrides.push_back("train.steps=" + args[++i]);
  }
  Result<RunConfig> rc = load_run_config(args[1], overrides);
  if (!rc.is_ok()) return np;
  for (int w = np - 1; w >= 1; --w)
    if (resolve_job(*rc, w).is_ok()) return w;
  return np;
}

}  // namespace

int run_launch(const LaunchOptions& o) {
  if (o.args.empty() || o.args[0] != "train")
    return report(Status::invalid(
        "launch runs `meshflow train CONFIG [options]` under mpirun: give `train CONFIG ...` "
        "after launch's own options"));
  for (const std::string& a : o.args)
    if (a == "--ranks" || a == "--max-restarts" || a == "--elastic" || a == "--restart-attempt")
      return report(Status::invalid("launch ... train " + a +
                                    ": under launch the ranks are mpirun's -np processes and the "
                                    "restarts launch's own --max-restarts; drop " +
                                    a));
  std::vector<std::string> base = {o.mpirun};
  std::istringstream extra(o.mpirun_args);
  for (std::string a; extra >> a;) base.push_back(a);
  int np = o.np;
  for (int attempt = 0;; ++attempt) {
    std::vector<std::string> argv = base;
    argv.insert(argv.end(), {"-np", std::to_string(np), self_path()});
    argv.insert(argv.end(), o.args.begin(), o.args.end());
    if (attempt > 0) argv.insert(argv.end(), {"--restart-attempt", std::to_string(attempt)});
    std::string error;
    const int code = run_and_wait(argv, &error);
    if (code < 0)
      return report(Status::invalid("launch: cannot run '" + o.mpirun + "' (" + error +
                                    "); give --mpirun PATH of Open MPI's mpirun"));
    if (code == 0 || code == 2 || attempt >= o.max_restarts) return code;
    if (o.elastic) np = fewer_ranks(o.args, np);
    std::fprintf(stderr,
                 "meshflow launch: mpirun exited with %d; restart %d of %d from train.checkpoint's "
                 "latest checkpoint (or the start) on %d processes\n",
                 code, attempt + 1, o.max_restarts, np);
  }
}

void add_launch_command(CLI::App& app) {
  auto o = std::make_shared<LaunchOptions>();
  CLI::App* l = app.add_subcommand(
      "launch", "Run `train` under mpirun, restarting the job when it fails (torchrun-style)");
  l->add_option("--np", o->np, "MPI processes (ranks)")->required()->check(CLI::Range(1, 1 << 20));
  l->add_option("--max-restarts", o->max_restarts,
                "Rerun a failed job up to N times, from train.checkpoint's latest checkpoint")
      ->check(CLI::Range(0, 1000));
  l->add_option("--mpirun", o->mpirun, "The mpirun to run (default: mpirun on PATH)");
  l->add_flag("--elastic", o->elastic,
              "Restart on the most processes below the failed run's that the config fits");
  l->add_option(
      "--mpirun-args", o->mpirun_args,
      "Arguments for mpirun before -np, one string (\"--hostfile hosts --bind-to none\")");
  l->prefix_command();
  l->callback([o, l]() {
    o->args = l->remaining();
    std::exit(run_launch(*o));
  });
}

}  // namespace meshflow::cli
