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
  Status open_metrics(const std::string& path);
  void step(const StepReport& r);
  void eval(const EvalReport& r);
  void finish();
  void message(const std::string& line);

 private:
  bool quiet_;
  bool tty_;
  FILE* console_;
  std::ofstream metrics_;
  bool bar_open_ = false;
};

std::string format_bytes(int64_t bytes);

}  // namespace meshflow
