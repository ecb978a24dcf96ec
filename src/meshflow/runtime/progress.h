// Progress reporting for training: a one-line progress bar on a terminal,
// plain log lines otherwise, and a JSON-lines metrics file (--metrics FILE).
//
// Metrics file keys (other tools read them; keep them stable):
//   {"step", "loss", "lr", "tokens_per_s" | "samples_per_s", "gflops", "peak_bytes", "grad_norm"}
//   (+ "comm_wait_fraction" under data parallel)
//   {"eval": {"step", "loss", "accuracy"}}            (accuracy for classifiers)
#pragma once

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>

#include "meshflow/core/status.h"

namespace meshflow {

struct StepReport {
  int step = 0;  // 1-based, the step just finished
  int total_steps = 0;
  float loss = 0;
  float lr = 0;
  float grad_norm = 0;
  double items_per_s = 0;  // tokens/s for language models, samples/s otherwise
  bool items_are_tokens = true;
  double gflops = 0;  // achieved GFLOP/s
  int64_t peak_bytes = 0;
  double comm_wait_fraction =
      -1;  // data parallel: share of step time blocked on all-reduce; < 0: n/a
};

struct EvalReport {
  int step = 0;
  float loss = 0;
  std::optional<float> accuracy;
};

class ProgressReporter {
 public:
  // quiet: no console output except errors.
  ProgressReporter(bool quiet, FILE* console = stderr);
  // path: a regular file (truncated; appended to with `append`: a restarted
  // job's) or a character device (/dev/stdout).
  Status open_metrics(const std::string& path, bool append = false);
  // step, eval and finish return the first error writing the metrics file
  // ("--metrics '/dev/full': cannot write: No space left on device"); the
  // console output is best effort.
  Status step(const StepReport& r);
  Status eval(const EvalReport& r);
  Status finish();
  void message(const std::string& line);

 private:
  bool quiet_;
  bool tty_;
  FILE* console_;
  Status write_metrics(const std::string& line);

  std::ofstream metrics_;
  std::string metrics_path_;
  Status metrics_error_;  // the first failed write; later records are not attempted
  bool bar_open_ = false;
};

std::string format_bytes(int64_t bytes);

}  // namespace meshflow
