// The CLI's commands, one function each, callable from tests. Each returns the
// process exit code: 0 ok, 2 user error (message printed), 1 runtime failure.
#pragma once

#include <string>
#include <vector>

namespace meshflow::cli {

struct TrainOptions {
  std::string config;
  int steps = 0;  // 0: from the config
  std::vector<std::string> overrides;
  std::string metrics;
  int threads = -1;        // -1: from the config
  std::string checkpoint;  // overrides train.checkpoint
  std::string init;        // weights (.safetensors) to start from
  std::string resume;      // a full-state checkpoint (directory) to continue, or "latest"
  bool quiet = false;
  bool profile = false;
  int ranks = 1;      // in-process ranks (local backend); under mpirun the job's processes
  std::string trace;  // Chrome trace of every rank, merged into this file
  // In-process ranks: a failed job restarts (up to max_restarts times) from
  // train.checkpoint's latest full-state checkpoint (or the start); elastic:
  // on fewer ranks (the most below the failed job's the job resolves for).
  int max_restarts = 0;
  bool elastic = false;
  int attempt = 0;  // set by the restart loop: 0 is the first run
  // Compare the run with the planner's prediction for its layout
  // (cli/plan_check.h); a run auto mode planned always is.
  bool check_plan = false;
  // Write the local cluster file refitted by the plan check's corrections
  // here (implies check_plan).
  std::string calibrate_from_run;
};
int run_train(const TrainOptions& o);

struct GraphOptions {
  std::string config;
  std::vector<std::string> overrides;
  std::string phase = "all";
};
int run_graph(const GraphOptions& o);

}  // namespace meshflow::cli
