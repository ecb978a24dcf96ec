// Calibration: measures this machine so the planner can price plans for it:
// the SGEMM rate at a few sizes (peak and efficiency curve), the streaming
// memory bandwidth (a triad), and the alpha-beta of the local backend's
// all_reduce at 2 in-process ranks. `meshflow bench --calibrate` runs it and
// writes the Cluster JSON (configs/clusters/local_cpu.json ships one result).
//
//   MF_ASSIGN_OR_RETURN(Calibration cal, calibrate({.quick = true}));
//   std::printf("%s", format_calibration(cal).c_str());
//   Cluster c = cluster_from_calibration(cal, "local_cpu");
//
// Each figure is the best of a few repetitions (the least disturbed run); the
// collective fit is least squares of time = a + b * bytes over the sizes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshflow/core/status.h"
#include "meshflow/plan/cluster.h"

namespace meshflow::plan {

struct CalibrationOptions {
  bool quick = false;  // smaller sizes, fewer repetitions: well under 3 s
  int ranks = 2;       // local ranks of the all_reduce fit (>= 2)
};

struct GemmSample {
  int64_t size = 0;  // square: m = n = k = size
  double gflop_per_call = 0;
  double flops_per_s = 0;
};

struct CollectiveSample {
  double bytes = 0;    // the all_reduce buffer
  double seconds = 0;  // best time of one call
};

struct Calibration {
  std::string cpu_name;
  int threads = 1;
  std::vector<GemmSample> gemm;
  double peak_flops = 0;  // the best SGEMM rate measured
  double memory_bandwidth_bytes_per_s = 0;
  int64_t memory_bytes = 0;  // physical memory
  int ranks = 2;
  std::vector<CollectiveSample> all_reduce;
  // Fit of all_reduce time = fit_intercept_s + bytes * fit_s_per_byte, read as
  // the ring model at n ranks: latency = intercept / (2(n-1)), bandwidth =
  // 2(n-1)/n / slope (the link bandwidth per rank that reproduces the timings).
  double fit_intercept_s = 0;
  double fit_s_per_byte = 0;
  double link_latency_s = 0;
  double link_bandwidth_bytes_per_s = 0;
  double wall_s = 0;  // how long the calibration took
};

Result<Calibration> calibrate(const CalibrationOptions& options = {});

// A one-node, one-device cluster (the CPU socket) with the measured numbers:
// peak f32 = the best SGEMM rate, the efficiency curve = each size's rate over
// it, both links = the fitted local all_reduce link (efficiency 1).
Cluster cluster_from_calibration(const Calibration& cal, const std::string& name);

// Human-readable table of the measurements.
std::string format_calibration(const Calibration& cal);

}  // namespace meshflow::plan
