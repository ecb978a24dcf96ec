#include "meshflow/plan/calibrate.h"

#include <cblas.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <vector>

#include "meshflow/comm/communicator.h"
#include "meshflow/comm/local_world.h"
#include "meshflow/kernels/cpu/blas_core.h"
#include "meshflow/kernels/kernel.h"
#include "meshflow/ops/builder.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/plan/cost_model.h"

namespace meshflow::plan {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Best time of one call of fn: at least min_reps calls, and more until
// min_total_s has passed (at most max_reps).
double best_time(const std::function<void()>& fn, int min_reps, int max_reps, double min_total_s) {
  double best = 1e300;
  auto start = Clock::now();
  for (int rep = 0; rep < max_reps; ++rep) {
    auto t0 = Clock::now();
    fn();
    best = std::min(best, seconds_since(t0));
    if (rep + 1 >= min_reps && seconds_since(start) >= min_total_s) break;
  }
  return best;
}

std::string cpu_model_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    size_t colon = line.find(':');
    if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
  }
  return "CPU";
}

// Square SGEMMs of each size, measured in rounds: every round calls each size
// in turn (a burst of calls, at least one), and a size keeps its best call
// over all rounds. A change in the machine's speed while it measures (another
// process, a VM's neighbour) then falls on every size alike, so the curve's
// shape, the ratios between sizes that the planner prices plans by (a
// micro-batch of one sequence against one of sixteen), does not depend on
// when each size happened to run. (Size after size, one window each, a
// 2-core VM gave curves whose sizes disagreed by 30-40% from one calibration
// to the next; docs/planner.md.)
std::vector<GemmSample> measure_sgemm(bool quick) {
  const std::vector<int64_t> sizes = quick ? std::vector<int64_t>{64, 128, 256, 512}
                                           : std::vector<int64_t>{64, 128, 256, 512, 1024, 2048};
  struct Size {
    int64_t n;
    std::vector<float> a, b, c;
    double best = 1e300;
  };
  std::vector<Size> all;
  for (int64_t n : sizes) {
    Size s{n, std::vector<float>(n * n), std::vector<float>(n * n),
           std::vector<float>(n * n, 0.0f)};
    for (int64_t i = 0; i < n * n; ++i) {
      s.a[i] = static_cast<float>((i * 7) % 13) * 0.01f;
      s.b[i] = static_cast<float>((i * 5) % 11) * 0.01f;
    }
    all.push_back(std::move(s));
  }
  auto call = [](Size& s) {
    const int ni = static_cast<int>(s.n);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ni, ni, ni, 1.0f, s.a.data(), ni,
                s.b.data(), ni, 0.0f, s.c.data(), ni);
  };
  for (Size& s : all) call(s);  // warm up (threads, caches)
  // As long in all as the sizes' windows were (0.2 s each, 0.03 quick), in
  // at least 3 rounds; a burst per size and round of a few ms.
  const double total_s = (quick ? 0.03 : 0.2) * double(sizes.size());
  const double burst_s = quick ? 0.001 : 0.005;
  const Clock::time_point start = Clock::now();
  for (int round = 0; round < 500 && (round < 3 || seconds_since(start) < total_s); ++round) {
    for (Size& s : all) {
      const Clock::time_point b0 = Clock::now();
      for (int calls = 0; calls < 200 && (calls == 0 || seconds_since(b0) < burst_s); ++calls) {
        const Clock::time_point t0 = Clock::now();
        call(s);
        s.best = std::min(s.best, seconds_since(t0));
      }
    }
  }
  std::vector<GemmSample> out;
  for (const Size& s : all) {
    const double flops = 2.0 * static_cast<double>(s.n) * s.n * s.n;
    out.push_back({s.n, flops / 1e9, flops / s.best});
  }
  return out;
}

// GEMMs with one thin side (kernel efficiency by shape): big x big x dim
// with the thin side as m, as n and as k in turn (the training program's
// projections, their gradients and small heads), their mean time against a
// square GEMM of the same FLOPs, on a grid of big and dim; a dim >= big is
// not thin (1).
ThinGrid measure_thin_sgemm(bool quick) {
  ThinGrid g;
  g.big = quick ? std::vector<double>{512, 2048} : std::vector<double>{256, 512, 1024, 2048};
  g.dim = quick ? std::vector<double>{16, 64, 256} : std::vector<double>{16, 32, 64, 128, 256};
  const int64_t most = static_cast<int64_t>(g.big.back());
  std::vector<float> a(most * most), b(most * most), c(most * most, 0.0f);
  for (int64_t i = 0; i < most * most; ++i) {
    a[i] = static_cast<float>((i * 7) % 13) * 0.01f;
    b[i] = static_cast<float>((i * 5) % 11) * 0.01f;
  }
  auto gemm_s = [&](int m, int n, int k) {
    auto call = [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a.data(), k, b.data(),
                  n, 0.0f, c.data(), n);
    };
    call();
    return best_time(call, 3, 200, quick ? 0.01 : 0.05);
  };
  for (double bd : g.big) {
    std::vector<double> row;
    for (double dd : g.dim) {
      if (dd >= bd) {
        row.push_back(1.0);
        continue;
      }
      const int big = static_cast<int>(bd), d = static_cast<int>(dd);
      const double thin_s = (gemm_s(d, big, big) + gemm_s(big, d, big) + gemm_s(big, big, d)) / 3;
      const int n = static_cast<int>(std::lround(std::cbrt(bd * bd * dd)));
      const double square_s = gemm_s(n, n, n) * (bd * bd * dd) / (double(n) * n * n);
      row.push_back(std::round(std::clamp(square_s / thin_s, 1e-3, 1.0) * 1000) / 1000);
    }
    g.factor.push_back(std::move(row));
  }
  return g;
}

// STREAM triad a = b + s * c; counts 3 * n * 4 bytes per pass.
double measure_triad(bool quick) {
  const int64_t n = quick ? (int64_t{1} << 24) : (int64_t{1} << 25);
  std::unique_ptr<float[]> a(new float[n]), b(new float[n]), c(new float[n]);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    a[i] = 0.0f;
    b[i] = 1.0f;
    c[i] = 2.0f;
  }
  float* pa = a.get();
  const float* pb = b.get();
  const float* pc = c.get();
  auto triad = [&] {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) pa[i] = pb[i] + 0.5f * pc[i];
  };
  triad();
  const double t = best_time(triad, 3, 50, quick ? 0.05 : 0.3);
  return 3.0 * 4.0 * static_cast<double>(n) / t;
}

// x to 4 significant digits: the measurements are not better than that.
double sig4(double x) {
  if (x <= 0) return x;
  const double scale = std::pow(10.0, 3 - std::floor(std::log10(x)));
  return std::round(x * scale) / scale;
}

// Device::kernel_time_scale: the kinds whose CPU kernels are neither a
// streaming pass nor a GEMM, each called as the executor calls it at a ResNet
// stem's shape (configs/models/resnet_fashion.json: batch 32, 32 channels,
// 28 x 28; 3x3 convolutions, pool 3x3 stride 2), its median time over the
// roofline the cost model gives the node on `c` (cost_model_ops.cc
// node_time_s with meshflow_cpu_constants()).
std::map<std::string, double, std::less<>> measure_kernel_scales(const Cluster& c, bool quick) {
  Graph g;
  Builder b(g);
  const Shape xs{{"batch", 32}, {"channels", 32}, {"height", 28}, {"width", 28}};
  const Shape cs{{"channels", 32}};
  const ValueId x = b.input("x", xs);
  const ValueId w = b.input("w", Shape{{"out", 32}, {"channels", 32}, {"kh", 3}, {"kw", 3}});
  Conv2dOpts co;
  co.stride = {1, 1}, co.padding = {1, 1};
  const ValueId conv = b.conv2d(x, w, co, "conv");
  Attrs ca = g.producer(conv).attrs;
  ca.shape = xs;
  const ValueId conv_dx = b.op1(OpKind::kConv2dGradInput, {x, w}, ca, "conv_dx");
  ca.shape = g.shape(w);
  const ValueId conv_dw = b.op1(OpKind::kConv2dGradWeight, {x, x}, ca, "conv_dw");
  const ValueId maxp = b.max_pool2d(x, {{3, 3}, {2, 2}, {1, 1}, {1, 1}}, "max");
  const ValueId maxp_dx = b.op1(OpKind::kMaxPool2dGrad, {b.input("dmax", g.shape(maxp)), x},
                                g.producer(maxp).attrs, "max_dx");
  const ValueId avgp = b.avg_pool2d(x, {{2, 2}, {2, 2}, {0, 0}, {1, 1}}, "avg");
  Attrs aa = g.producer(avgp).attrs;
  aa.shape = xs;
  const ValueId avgp_dx =
      b.op1(OpKind::kAvgPool2dGrad, {b.input("davg", g.shape(avgp))}, aa, "avg_dx");
  const ValueId gamma = b.input("gamma", cs), beta = b.input("beta", cs);
  const ValueId bn =
      b.batch_norm(x, gamma, beta, b.input("running_mean", cs), b.input("running_var", cs));
  const ValueId mean = b.input("mean", cs), rstd = b.input("rstd", cs);
  const ValueId bn_dx =
      b.op(OpKind::kBatchNormGrad, {x, x, gamma, mean, rstd}, g.producer(bn).attrs)[0];

  // Every value's buffer, filled alike with values in [0.5, 1.5) (batch
  // norm's training statistics: an i64 rng_offset of 0).
  std::vector<std::vector<float>> buf(g.num_values());
  for (ValueId v = 0; v < g.num_values(); ++v) {
    buf[v].resize(static_cast<size_t>(std::max<int64_t>(g.shape(v).numel(), 2)));
    for (size_t i = 0; i < buf[v].size(); ++i) buf[v][i] = float((i * 7919) % 1000) * 1e-3f + 0.5f;
  }
  int64_t training = 0;
  const CostConstants k = meshflow_cpu_constants();
  std::map<std::string, double, std::less<>> scales;
  for (ValueId out : {conv, conv_dx, conv_dw, maxp, maxp_dx, avgp, avgp_dx, bn, bn_dx}) {
    const Node& n = g.producer(out);
    std::vector<void*> in, outs;
    for (ValueId v : n.inputs) in.push_back(buf[v].data());
    if (n.kind == OpKind::kBatchNorm) {
      in.resize(6, nullptr);
      in[5] = &training;
    }
    for (ValueId v : n.outputs) outs.push_back(buf[v].data());
    const KernelFn fn = cpu_kernel(n.kind);
    auto call = [&] {
      KernelCall kc{g, n, in, outs};
      fn(kc);
    };
    call();
    // The median call, not the best: in a step the kernel meets the caches
    // and threads its neighbours leave (the best of 5 gave batch norm 1.7x
    // where a ResNet step's profile shows 2.5-3x).
    std::vector<double> t(quick ? 3 : 15);
    for (double& one : t) {
      const auto t0 = Clock::now();
      call();
      one = seconds_since(t0);
    }
    std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
    const double median = t[t.size() / 2];
    const OpCost cost = op_cost(g, n);
    const double roofline = roofline_time_s(c, k, DType::F32, cost.flops, cost.bytes);
    if (roofline > 0)
      scales[std::string(op_name(n.kind))] = sig4(std::clamp(median / roofline, 0.01, 1000.0));
  }
  return scales;
}

Status measure_all_reduce(bool quick, int ranks, std::vector<CollectiveSample>* out) {
  const std::vector<int64_t> counts =
      quick ? std::vector<int64_t>{1 << 8, 1 << 12, 1 << 16, 1 << 19}
            : std::vector<int64_t>{1 << 8,  1 << 10, 1 << 12, 1 << 14,
                                   1 << 16, 1 << 18, 1 << 20, 1 << 22};
  const int reps = quick ? 5 : 15;
  std::vector<double> best(counts.size(), 1e300);
  Status s = run_local_ranks(ranks, [&](const std::shared_ptr<Transport>& t) -> Status {
    auto comm = Communicator::world(t);
    std::vector<float> buf(counts.back(), 1.0f);
    for (size_t i = 0; i < counts.size(); ++i) {
      MF_RETURN_IF_ERROR(comm->all_reduce(buf.data(), counts[i], ReduceOp::kSum));  // warm up
      for (int rep = 0; rep < reps; ++rep) {
        MF_RETURN_IF_ERROR(comm->barrier());
        auto t0 = Clock::now();
        MF_RETURN_IF_ERROR(comm->all_reduce(buf.data(), counts[i], ReduceOp::kSum));
        double dt = seconds_since(t0);
        if (comm->rank() == 0) best[i] = std::min(best[i], dt);
        std::fill(buf.begin(), buf.begin() + counts[i], 1.0f);  // keep values bounded
      }
    }
    return Status::ok();
  });
  MF_RETURN_IF_ERROR(s);
  out->clear();
  for (size_t i = 0; i < counts.size(); ++i) out->push_back({4.0 * counts[i], best[i]});
  return Status::ok();
}

// Seconds per message step of a ring collective when `ranks` in-process ranks
// time-share fewer cores: back-to-back reduce_scatters of 256 floats a rank
// (ring: ranks - 1 steps each), each rank's mean per call, the slowest's.
// A waiting rank polls yielding its core (the transport's spin), so the peer
// it waits for runs meanwhile: a step costs the switches, not the spin.
Result<double> measure_time_shared_step(bool quick, int ranks) {
  const int calls = quick ? 200 : 2000;
  const int64_t per_rank = 256;
  std::vector<double> mean(static_cast<size_t>(ranks), 0.0);
  Status s = run_local_ranks(ranks, [&](const std::shared_ptr<Transport>& t) -> Status {
    auto comm = Communicator::world(t);
    std::vector<float> in(static_cast<size_t>(per_rank * ranks), 1.0f), out(per_rank);
    for (int i = 0; i < 20; ++i)  // warm up
      MF_RETURN_IF_ERROR(comm->reduce_scatter(in.data(), per_rank, out.data(), ReduceOp::kSum));
    MF_RETURN_IF_ERROR(comm->barrier());
    const auto t0 = Clock::now();
    for (int i = 0; i < calls; ++i)
      MF_RETURN_IF_ERROR(comm->reduce_scatter(in.data(), per_rank, out.data(), ReduceOp::kSum));
    mean[static_cast<size_t>(comm->rank())] = seconds_since(t0) / calls;
    return Status::ok();
  });
  MF_RETURN_IF_ERROR(s);
  return *std::max_element(mean.begin(), mean.end()) / double(ranks - 1);
}

// Least squares of t = a + b * x, weighted by 1/t^2 (relative error), so the
// small sizes set the intercept and the large ones the slope.
void fit_alpha_beta(const std::vector<CollectiveSample>& s, double* a, double* b) {
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const CollectiveSample& p : s) {
    const double w = 1.0 / (p.seconds * p.seconds);
    sw += w;
    sx += w * p.bytes;
    sy += w * p.seconds;
    sxx += w * p.bytes * p.bytes;
    sxy += w * p.bytes * p.seconds;
  }
  const double det = sw * sxx - sx * sx;
  *b = det > 0 ? (sw * sxy - sx * sy) / det : 0;
  *a = det > 0 ? (sy - *b * sx) / sw : 0;
  if (!(*b > 0)) *b = s.back().seconds / s.back().bytes;  // degenerate: through the largest
  if (!(*a > 0)) *a = std::max(1e-9, s.front().seconds - *b * s.front().bytes);
}

}  // namespace

double CpuSample::others_busy_fraction(const CpuSample& before) const {
  const double t = double(total - before.total);
  if (t <= 0) return 0;
  return std::max(0.0, double((busy - before.busy) - (self - before.self)) / t);
}

CpuSample cpu_sample() {
  CpuSample s;
  if (std::FILE* f = std::fopen("/proc/stat", "r")) {
    long long v[8] = {0};
    if (std::fscanf(f, "cpu %lld %lld %lld %lld %lld %lld %lld %lld", &v[0], &v[1], &v[2], &v[3],
                    &v[4], &v[5], &v[6], &v[7]) == 8) {
      for (long long x : v) s.total += x;
      s.busy = s.total - v[3] - v[4];  // less idle and iowait
    }
    std::fclose(f);
  }
  if (std::FILE* f = std::fopen("/proc/self/stat", "r")) {
    char buf[2048];
    const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    std::fclose(f);
    // Fields after the ")" closing the command name: state is field 3; utime, stime 14, 15.
    if (const char* p = std::strrchr(buf, ')')) {
      long long ut = 0, st = 0;
      if (std::sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lld %lld", &ut, &st) ==
          2)
        s.self = ut + st;
    }
  }
  return s;
}

Result<Calibration> calibrate(const CalibrationOptions& options) {
  if (options.ranks < 2)
    return Status::invalid("calibration ranks must be >= 2, got " + std::to_string(options.ranks));
  auto t0 = Clock::now();
  const CpuSample before = cpu_sample();
  Calibration cal;
  cal.cpu_name = cpu_model_name();
  // The whole machine, as the trainer counts it (omp_get_num_procs), whatever
  // threads this process last gave its ranks; restored after.
  cal.threads = omp_get_num_procs();
  const int omp_before = omp_get_max_threads(), blas_before = openblas_get_num_threads();
  omp_set_num_threads(cal.threads);
  openblas_set_num_threads(cal.threads);
  struct Restore {
    int omp, blas;
    ~Restore() {
      omp_set_num_threads(omp);
      openblas_set_num_threads(blas);
    }
  } restore{omp_before, blas_before};
  cal.gemm = measure_sgemm(options.quick);
  cal.thin_gemm = measure_thin_sgemm(options.quick);
  openblas_set_num_threads(1);  // a local rank that has one core
  cal.thin_gemm_one_thread = measure_thin_sgemm(options.quick);
  openblas_set_num_threads(cal.threads);
  for (const GemmSample& g : cal.gemm) cal.peak_flops = std::max(cal.peak_flops, g.flops_per_s);
  cal.memory_bandwidth_bytes_per_s = measure_triad(options.quick);
  cal.memory_bytes = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  cal.ranks = options.ranks;
  MF_RETURN_IF_ERROR(measure_all_reduce(options.quick, options.ranks, &cal.all_reduce));
  fit_alpha_beta(cal.all_reduce, &cal.fit_intercept_s, &cal.fit_s_per_byte);
  const double n = options.ranks;
  cal.link_latency_s = cal.fit_intercept_s / (2 * (n - 1));
  cal.link_bandwidth_bytes_per_s = 2 * (n - 1) / n / cal.fit_s_per_byte;
  // Two ranks a core (at least 4): what share_machine prices for more ranks
  // than cores.
  cal.time_shared_ranks = std::clamp(2 * cal.threads, 4, 64);
  MF_ASSIGN_OR_RETURN(cal.time_shared_latency_s,
                      measure_time_shared_step(options.quick, cal.time_shared_ranks));
  cal.kernel_time_scale =
      measure_kernel_scales(cluster_from_calibration(cal, "calibrating"), options.quick);
  cal.wall_s = seconds_since(t0);
  cal.others_busy = cpu_sample().others_busy_fraction(before);
  return cal;
}

namespace {
// The kernel set OpenBLAS runs is part of the machine's identity: the same
// CPU runs SGEMM 4x slower on its generic fallback (kernels/cpu/blas_core.h).
std::string device_name(const std::string& cpu, int threads) {
  return cpu + " (" + std::to_string(threads) + " threads, OpenBLAS " + cpu::blas_core().running +
         " SGEMM)";
}

}  // namespace

std::string this_machine_device_name() {
  return device_name(cpu_model_name(), omp_get_num_procs());
}

namespace {
// Raise when calibrate() measures something else or otherwise (a cached
// calibration of an older one is then measured again): 1, 2026-11-28, the
// GEMM curve, the thin-GEMM grids on all threads and on one, the triad, the
// local all_reduce link; 2, 2026-11-28, and the kernel time scales; 3,
// 2026-11-29, the GEMM curve's sizes in rounds (measure_sgemm); 4,
// 2026-11-29, the time-shared ring step (measure_time_shared_step).
constexpr int kCalibrationVersion = 4;
}  // namespace

std::string calibration_software() {
  const dnnl_version_t* v = dnnl_version();
  const char* blas = openblas_get_config();
  std::string s = "meshflow calibration " + std::to_string(kCalibrationVersion) + "; " +
                  (blas ? std::string(blas) : std::string("OpenBLAS (no config)"));
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s + "; oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
         std::to_string(v->patch);
}

Cluster cluster_from_calibration(const Calibration& cal, const std::string& name) {
  Cluster c;
  c.name = name;
  c.nodes = 1;
  c.devices_per_node = 1;
  c.device.name = device_name(cal.cpu_name, cal.threads);
  c.calibrated_with = calibration_software();
  c.device.peak_flops.f32 = sig4(cal.peak_flops);
  c.device.memory_bytes = cal.memory_bytes;
  c.device.memory_bandwidth_bytes_per_s = sig4(cal.memory_bandwidth_bytes_per_s);
  c.device.memory_efficiency = 1.0;  // the triad rate is already what is achieved
  for (const GemmSample& g : cal.gemm) {
    const double e = std::clamp(g.flops_per_s / cal.peak_flops, 1e-3, 1.0);  // of the best
    c.device.matmul_efficiency.push_back({g.gflop_per_call, std::round(e * 1000) / 1000});
  }
  c.device.matmul_thin_efficiency = cal.thin_gemm;
  c.device.matmul_thin_efficiency_one_thread = cal.thin_gemm_one_thread;
  c.device.kernel_time_scale = cal.kernel_time_scale;
  c.intra_node = {sig4(cal.link_bandwidth_bytes_per_s), sig4(cal.link_latency_s), 1.0};
  c.inter_node = c.intra_node;
  c.time_shared_latency_s = sig4(cal.time_shared_latency_s);
  return c;
}

std::string format_calibration(const Calibration& cal) {
  std::string s;
  char line[256];
  const char* wait = std::getenv("OMP_WAIT_POLICY");
  const cpu::BlasCore core = cpu::blas_core();
  std::snprintf(line, sizeof line,
                "device: %s, %d threads, OpenBLAS %s kernels (the CPU runs %s; "
                "OMP_WAIT_POLICY=%s)\n",
                cal.cpu_name.c_str(), cal.threads, core.running.c_str(),
                core.supported.empty() ? "no AVX2" : core.supported.c_str(), wait ? wait : "unset");
  s += line;
  s += "SGEMM (square, cblas_sgemm):\n";
  for (const GemmSample& g : cal.gemm) {
    std::snprintf(line, sizeof line, "  n=%-5lld %9.4f GFLOP/call  %8.1f GFLOP/s  (%.2f of best)\n",
                  static_cast<long long>(g.size), g.gflop_per_call, g.flops_per_s / 1e9,
                  g.flops_per_s / cal.peak_flops);
    s += line;
  }
  s += "SGEMM with one thin side (big x big x dim; m, n and k thin in turn) over a square "
       "GEMM of the same FLOPs, all threads | one thread:\n";
  for (size_t i = 0; i < cal.thin_gemm.big.size(); ++i) {
    std::snprintf(line, sizeof line, "  big=%-5.0f", cal.thin_gemm.big[i]);
    s += line;
    for (size_t k = 0; k < cal.thin_gemm.dim.size(); ++k) {
      std::snprintf(line, sizeof line, " dim %.0f: %.2f|%.2f", cal.thin_gemm.dim[k],
                    cal.thin_gemm.factor[i][k], cal.thin_gemm_one_thread.factor[i][k]);
      s += line;
    }
    s += "\n";
  }
  std::snprintf(line, sizeof line, "memory: triad %.2f GB/s, %.1f GiB physical\n",
                cal.memory_bandwidth_bytes_per_s / 1e9,
                static_cast<double>(cal.memory_bytes) / (1024.0 * 1024 * 1024));
  s += line;
  std::snprintf(line, sizeof line, "all_reduce, %d local ranks:\n", cal.ranks);
  s += line;
  for (const CollectiveSample& p : cal.all_reduce) {
    const double model = cal.fit_intercept_s + cal.fit_s_per_byte * p.bytes;
    std::snprintf(line, sizeof line, "  %10.0f bytes  %9.2f us  (fit %9.2f us)\n", p.bytes,
                  p.seconds * 1e6, model * 1e6);
    s += line;
  }
  std::snprintf(line, sizeof line,
                "fit: t = %.2f us + bytes / %.2f GB/s  ->  link latency %.2f us, bandwidth %.2f "
                "GB/s per rank\n",
                cal.fit_intercept_s * 1e6, 1e-9 / cal.fit_s_per_byte, cal.link_latency_s * 1e6,
                cal.link_bandwidth_bytes_per_s / 1e9);
  s += line;
  if (cal.time_shared_ranks > 0) {
    std::snprintf(line, sizeof line,
                  "time-shared: %d local ranks on %d threads, %.2f us a ring step "
                  "(reduce_scatter)\n",
                  cal.time_shared_ranks, cal.threads, cal.time_shared_latency_s * 1e6);
    s += line;
  }
  s += "kernels' measured time over their roofline (a ResNet stem's shape):\n";
  for (const auto& [kind, scale] : cal.kernel_time_scale) {
    std::snprintf(line, sizeof line, "  %-20s %7.2fx\n", kind.c_str(), scale);
    s += line;
  }
  std::snprintf(line, sizeof line, "calibration took %.2f s\n", cal.wall_s);
  s += line;
  return s;
}

}  // namespace meshflow::plan
