// `meshflow launch`: the outer launcher that restarts an mpirun job (what
// torchrun's --max-restarts does for a torch.distributed job). A process of
// an MPI job cannot restart the job it belongs to (a dead rank ends it), so
// this one stays outside: it runs
//
//   MPIRUN [MPIRUN_ARGS] -np N <this meshflow> train CONFIG [options]
//
// and when mpirun ends with a failure while running (exit code other than 0
// and 2, a user error that a restart would repeat), runs it again, up to
// --max-restarts times, with `--restart-attempt K`: the ranks then resume
// from train.checkpoint's latest full-state checkpoint if it has one (else
// from where the first run started), append to --metrics, and skip injected
// test faults, exactly as in-process restarts do. --elastic: each restart
// runs on the most processes below the last run's that the config (with the
// train command's --set and --steps) resolves for, as `train --elastic`.
//
//   meshflow launch --np 4 --max-restarts 2 --mpirun-args "--hostfile hosts"
//                   train run.json --set train.save_every=100 --checkpoint ck/
#pragma once

#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace meshflow::cli {

struct LaunchOptions {
  int np = 0;
  int max_restarts = 0;
  std::string mpirun = "mpirun";
  std::string mpirun_args;        // split on spaces, before -np
  bool elastic = false;           // restart on the most processes below np the job resolves for
  std::vector<std::string> args;  // the meshflow command: "train" CONFIG [options]
};
int run_launch(const LaunchOptions& o);

// Adds `launch` to the CLI.
void add_launch_command(CLI::App& app);

}  // namespace meshflow::cli
