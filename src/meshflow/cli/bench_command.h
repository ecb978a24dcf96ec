// `meshflow bench`: measurements of this machine for the planner.
//
//   meshflow bench --calibrate [--out FILE] [--quick]
//
// --calibrate measures the SGEMM rate, memory bandwidth and local all_reduce
// alpha-beta (plan/calibrate.h), prints them, and writes the Cluster JSON to
// FILE, or prints it when no --out is given (so the shipped
// configs/clusters/local_cpu.json changes only when --out names it).
#pragma once

#include <string>

namespace meshflow::cli {

struct BenchOptions {
  bool calibrate = false;
  std::string out;     // Cluster JSON destination; empty: print it
  bool quick = false;  // smaller sizes (about a second)
  int ranks = 2;       // local ranks of the all_reduce fit
};
// Returns the exit code: 0 ok, 2 user error, 1 a failure while measuring.
int run_bench(const BenchOptions& o);

}  // namespace meshflow::cli
