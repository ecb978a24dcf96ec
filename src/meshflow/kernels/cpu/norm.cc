// Layer norm and RMS norm on the CPU, over the last dim.
//
// Legend: R = rows (product of the leading dims), C = channels (the last dim).
//   x, y, dy, dx are (R, C); gamma, beta, dgamma, dbeta are (C); mean, rstd are (R).
//
// Row sums (forward and backward) run in 32 float lanes (8 independent vector
// chains, so the add latency is hidden; each lane adds only C/32 terms) and the
// lanes are combined in double.
// Forward: one row per iteration, threads over rows. The variance takes a
// second pass over (x - mean)^2: no cancellation.
// Backward: dx is per row; dgamma/dbeta are sums over all rows. Rows are cut
// into fixed blocks of kRowsPerBlock, each block writes its own partial sums,
// and the partials are added in block order. The block size does not depend on
// the thread count, so the gradients are bit-identical for any thread count.
#include <cmath>
#include <vector>

#include "meshflow/kernels/cpu/parallel.h"
#include "meshflow/kernels/kernel.h"

namespace meshflow {

namespace {

constexpr int64_t kRowsPerBlock = 32;
constexpr int kLanes = 32;
constexpr int64_t kPad = 16;  // floats between partial-sum rows (one cache line)

// Sum of f(j) over j in [0, n): kLanes float partial sums, combined in double.
template <class F>
inline double lane_sum(int64_t n, F f) {
  float acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
#pragma omp simd
    for (int k = 0; k < kLanes; ++k) acc[k] += f(j + k);
  }
  double s = 0;
  for (; j < n; ++j) s += f(j);
  for (int k = 0; k < kLanes; ++k) s += acc[k];
  return s;
}

// Both sums of (g, g * xhat) over a row, g = dy * gamma, xhat = (x - m) * rs
// (m = 0 for rms norm), in kLanes float partial sums each.
inline void grad_row_sums(const float* dy, const float* x, const float* gamma, float m, float rs,
                          int64_t n, double* sum_g, double* sum_gx) {
  float ag[kLanes] = {}, agx[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
#pragma omp simd
    for (int k = 0; k < kLanes; ++k) {
      const float g = dy[j + k] * gamma[j + k];
      ag[k] += g;
      agx[k] += g * ((x[j + k] - m) * rs);
    }
  }
  double sg = 0, sgx = 0;
  for (; j < n; ++j) {
    const float g = dy[j] * gamma[j];
    sg += g;
    sgx += g * ((x[j] - m) * rs);
  }
  for (int k = 0; k < kLanes; ++k) {
    sg += ag[k];
    sgx += agx[k];
  }
  *sum_g = sg;
  *sum_gx = sgx;
}

struct RowsByChannels {
  int64_t rows, ch;
};

RowsByChannels rows_by_channels(const Shape& x) {
  return {x.prod(0, x.rank() - 1), x.size(-1)};
}

// Scratch for the per-block partial sums, reused across calls on this thread
// (grows, never shrinks): a training step allocates nothing after the first.
float* partial_scratch(int64_t floats) {
  thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < floats) buf.resize(floats);
  return buf.data();
}

// out[j] = sum over blocks b (in order) of part[b * stride + j], j < ch.
void sum_partials(const float* part, int64_t blocks, int64_t stride, int64_t ch, float* out) {
  cpu::parallel_for(ch, blocks, [&](int64_t lo, int64_t hi) {
#pragma omp simd
    for (int64_t j = lo; j < hi; ++j) out[j] = part[j];
    for (int64_t b = 1; b < blocks; ++b) {
      const float* p = part + b * stride;
#pragma omp simd
      for (int64_t j = lo; j < hi; ++j) out[j] += p[j];
    }
  });
}

// layer_norm: x (R,C), gamma (C), beta (C) -> y (R,C), mean (R), rstd (R)
void layer_norm_kernel(const KernelCall& c) {
  const float* x = c.in_f(0);
  const float* gamma = c.in_f(1);
  const float* beta = c.in_f(2);
  float* y = c.out_f(0);
  float* mean = c.out_f(1);
  float* rstd = c.out_f(2);
  const auto [R, C] = rows_by_channels(c.in_shape(0));
  const double eps = c.attrs().eps;
  cpu::parallel_for(R, 6 * C, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* xr = x + r * C;
      float* yr = y + r * C;
      const float mf = static_cast<float>(lane_sum(C, [&](int64_t j) { return xr[j]; }) / C);
      const double sq = lane_sum(C, [&](int64_t j) {
        const float d = xr[j] - mf;
        return d * d;
      });
      const float rs = static_cast<float>(1.0 / std::sqrt(sq / C + eps));
      mean[r] = mf;
      rstd[r] = rs;
#pragma omp simd
      for (int64_t j = 0; j < C; ++j) yr[j] = (xr[j] - mf) * rs * gamma[j] + beta[j];
    }
  });
}

// layer_norm_grad: dy (R,C), x (R,C), gamma (C), mean (R), rstd (R)
//   -> dx (R,C), dgamma (C), dbeta (C)
// With xhat = (x - mean) * rstd and g = dy * gamma:
//   dx = rstd * (g - mean_j(g) - xhat * mean_j(g * xhat)),
//   dgamma = sum_rows dy * xhat,  dbeta = sum_rows dy.
void layer_norm_grad_kernel(const KernelCall& c) {
  const float* dy = c.in_f(0);
  const float* x = c.in_f(1);
  const float* gamma = c.in_f(2);
  const float* mean = c.in_f(3);
  const float* rstd = c.in_f(4);
  float* dx = c.out_f(0);
  float* dgamma = c.out_f(1);
  float* dbeta = c.out_f(2);
  const auto [R, C] = rows_by_channels(c.in_shape(1));
  const int64_t blocks = (R + kRowsPerBlock - 1) / kRowsPerBlock;
  // Block b's partials: dgamma at part[b*stride], dbeta kPad floats after the
  // dgamma row (the pad keeps the two rows off the same 4 KiB offsets).
  const int64_t beta_off = C + kPad, stride = 2 * beta_off;
  float* part = partial_scratch(std::max<int64_t>(blocks, 1) * stride);
  cpu::parallel_for(blocks, kRowsPerBlock * 12 * C, [&](int64_t blo, int64_t bhi) {
    for (int64_t b = blo; b < bhi; ++b) {
      float* pg = part + b * stride;
      float* pb = pg + beta_off;
#pragma omp simd
      for (int64_t j = 0; j < C; ++j) pg[j] = pb[j] = 0.f;
      const int64_t r_end = std::min(R, (b + 1) * kRowsPerBlock);
      for (int64_t r = b * kRowsPerBlock; r < r_end; ++r) {
        const float* dyr = dy + r * C;
        const float* xr = x + r * C;
        float* dxr = dx + r * C;
        const float m = mean[r], rs = rstd[r];
        double sum_g, sum_gx;
        grad_row_sums(dyr, xr, gamma, m, rs, C, &sum_g, &sum_gx);
        const float a = static_cast<float>(sum_g / C);
        const float bb = static_cast<float>(sum_gx / C);
#pragma omp simd
        for (int64_t j = 0; j < C; ++j) {
          const float xhat = (xr[j] - m) * rs;
          dxr[j] = rs * (dyr[j] * gamma[j] - a - xhat * bb);
          pg[j] += dyr[j] * xhat;
          pb[j] += dyr[j];
        }
      }
    }
  });
  sum_partials(part, blocks, stride, C, dgamma);
  sum_partials(part + beta_off, blocks, stride, C, dbeta);
}

// rms_norm: x (R,C), gamma (C) -> y (R,C), rstd (R);  y = (x * rstd) * gamma
void rms_norm_kernel(const KernelCall& c) {
  const float* x = c.in_f(0);
  const float* gamma = c.in_f(1);
  float* y = c.out_f(0);
  float* rstd = c.out_f(1);
  const auto [R, C] = rows_by_channels(c.in_shape(0));
  const double eps = c.attrs().eps;
  cpu::parallel_for(R, 4 * C, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* xr = x + r * C;
      float* yr = y + r * C;
      const double sq = lane_sum(C, [&](int64_t j) { return xr[j] * xr[j]; });
      const float rs = static_cast<float>(1.0 / std::sqrt(sq / C + eps));
      rstd[r] = rs;
#pragma omp simd
      for (int64_t j = 0; j < C; ++j) yr[j] = (xr[j] * rs) * gamma[j];
    }
  });
}

// rms_norm_grad: dy (R,C), x (R,C), gamma (C), rstd (R) -> dx (R,C), dgamma (C)
// With xhat = x * rstd and g = dy * gamma:
//   dx = rstd * (g - xhat * mean_j(g * xhat)),  dgamma = sum_rows dy * xhat.
void rms_norm_grad_kernel(const KernelCall& c) {
  const float* dy = c.in_f(0);
  const float* x = c.in_f(1);
  const float* gamma = c.in_f(2);
  const float* rstd = c.in_f(3);
  float* dx = c.out_f(0);
  float* dgamma = c.out_f(1);
  const auto [R, C] = rows_by_channels(c.in_shape(1));
  const int64_t blocks = (R + kRowsPerBlock - 1) / kRowsPerBlock;
  const int64_t stride = C + kPad;
  float* part = partial_scratch(std::max<int64_t>(blocks, 1) * stride);
  cpu::parallel_for(blocks, kRowsPerBlock * 9 * C, [&](int64_t blo, int64_t bhi) {
    for (int64_t b = blo; b < bhi; ++b) {
      float* pg = part + b * stride;
#pragma omp simd
      for (int64_t j = 0; j < C; ++j) pg[j] = 0.f;
      const int64_t r_end = std::min(R, (b + 1) * kRowsPerBlock);
      for (int64_t r = b * kRowsPerBlock; r < r_end; ++r) {
        const float* dyr = dy + r * C;
        const float* xr = x + r * C;
        float* dxr = dx + r * C;
        const float rs = rstd[r];
        const double sum_gx =
            lane_sum(C, [&](int64_t j) { return dyr[j] * gamma[j] * (xr[j] * rs); });
        const float bb = static_cast<float>(sum_gx / C);
#pragma omp simd
        for (int64_t j = 0; j < C; ++j) {
          const float xhat = xr[j] * rs;
          dxr[j] = rs * (dyr[j] * gamma[j] - xhat * bb);
          pg[j] += dyr[j] * xhat;
        }
      }
    }
  });
  sum_partials(part, blocks, stride, C, dgamma);
}

}  // namespace

void register_norm_kernels(KernelTable& t) {
  t[static_cast<int>(OpKind::kLayerNorm)] = layer_norm_kernel;
  t[static_cast<int>(OpKind::kLayerNormGrad)] = layer_norm_grad_kernel;
  t[static_cast<int>(OpKind::kRmsNorm)] = rms_norm_kernel;
  t[static_cast<int>(OpKind::kRmsNormGrad)] = rms_norm_grad_kernel;
}

}  // namespace meshflow
