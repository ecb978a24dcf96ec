// Calibration: measures this machine so the planner can price plans for it:
// the SGEMM rate at a few sizes (peak and efficiency curve), the streaming
// memory bandwidth (a triad), the alpha-beta of the local backend's
// all_reduce at 2 in-process ranks, and the time the kernels the roofline
// misses (pooling, batch norm, convolutions) take over it. `meshflow bench --calibrate` runs it and
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
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "meshflow/core/status.h"
#include "meshflow/plan/cluster.h"

namespace meshflow::plan {

// Busy and total CPU ticks of the machine (/proc/stat) and of this process
// (/proc/self/stat), to tell whether other processes took CPU meanwhile (the
// calibration and bench/plan_accuracy discard what was measured beside them).
//
//   const CpuSample before = cpu_sample();  ...  measure ...
//   if (cpu_sample().others_busy_fraction(before) > 0.10) ...  // disturbed
struct CpuSample {
  long long busy = 0, total = 0, self = 0;
  // The fraction of the machine's CPU time since `before` that other
  // processes used (0 where /proc is not readable).
  double others_busy_fraction(const CpuSample& before) const;
};
CpuSample cpu_sample();
// A measurement beside other processes that used more than this share of the
// CPU measured part of the machine (the calibration is not cached, a bench
// step is not counted).
inline constexpr double kDisturbedShare = 0.10;

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
  // SGEMMs with one thin side against square ones of the same FLOPs, on all
  // threads and on one (Device::matmul_thin_efficiency, ..._one_thread).
  ThinGrid thin_gemm, thin_gemm_one_thread;
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
  // Cluster::time_shared_latency_s: a ring collective's message step with
  // two local ranks a core (time_shared_ranks of them), each rank's mean over
  // back-to-back small reduce_scatters, the slowest rank's.
  int time_shared_ranks = 0;
  double time_shared_latency_s = 0;
  // Device::kernel_time_scale: each measured kind's best time over its
  // roofline on the cluster the numbers above make.
  std::map<std::string, double, std::less<>> kernel_time_scale;
  double wall_s = 0;  // how long the calibration took
  // The fraction of the machine other processes used while it measured: a
  // calibration beside other work (above ~10%) measured a share of the
  // machine, not the machine.
  double others_busy = 0;
};

Result<Calibration> calibrate(const CalibrationOptions& options = {});

// A one-node, one-device cluster (the CPU socket) with the measured numbers:
// peak f32 = the best SGEMM rate, the efficiency curve = each size's rate over
// it, both links = the fitted local all_reduce link (efficiency 1).
Cluster cluster_from_calibration(const Calibration& cal, const std::string& name);

// The device name cluster_from_calibration writes for this machine (its CPU
// model and processor count, omp_get_num_procs: the threads the trainer
// shares among its ranks; calibrate measures with that many), known without measuring:
// load_local_cluster tells a calibration of this machine from one of another by it.
std::string this_machine_device_name();

// What measured a calibration, beside the machine: the calibration's own
// version (kCalibrationVersion, raised when calibrate() measures something
// else), OpenBLAS's build (openblas_get_config: its version and kernel set)
// and oneDNN's version, the libraries whose kernels it timed. Recorded in the
// cluster file (Cluster::calibrated_with); load_local_cluster measures again
// when a cached calibration's differs (a library upgraded, a new meshflow).
//   "meshflow calibration 1; OpenBLAS 0.3.21 DYNAMIC_ARCH ... SkylakeX ...; oneDNN 3.0.0"
std::string calibration_software();

// Human-readable table of the measurements.
std::string format_calibration(const Calibration& cal);

}  // namespace meshflow::plan
