// Optimizer kernels: fused, one pass over each parameter's tensors.
#include <cmath>
#include <vector>

#include "meshflow/kernels/cpu/parallel.h"
#include "meshflow/kernels/kernel.h"

namespace meshflow {

namespace {

// Sum of squares in double, over fixed chunks combined in order: the same
// result for any thread count.
void sum_squares_kernel(const KernelCall& c) {
  const float* x = c.in_f(0);
  const int64_t n = c.in_shape(0).numel();
  constexpr int64_t kChunk = 1 << 14;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> part(chunks, 0.0);
  cpu::parallel_for(chunks, kChunk, [&](int64_t lo, int64_t hi) {
    for (int64_t ch = lo; ch < hi; ++ch) {
      const int64_t b = ch * kChunk, e = std::min(n, b + kChunk);
      float acc[16] = {};
      int64_t i = b;
      for (; i + 16 <= e; i += 16)
#pragma omp simd
        for (int j = 0; j < 16; ++j) acc[j] += x[i + j] * x[i + j];
      double s = 0;
      for (int j = 0; j < 16; ++j) s += acc[j];
      for (; i < e; ++i) s += double(x[i]) * x[i];
      part[ch] = s;
    }
  });
  double total = 0;
  for (double p : part) total += p;
  *c.out_f(0) = static_cast<float>(total);
}

void clip_coef_kernel(const KernelCall& c) {
  double total = 0;
  for (size_t i = 0; i < c.in.size(); ++i) total += *c.in_f(static_cast<int>(i));
  const double norm = std::sqrt(total);
  const float max_norm = c.attrs().max_norm;
  double coef = 1.0;
  if (max_norm > 0) coef = std::min(1.0, max_norm / (norm + 1e-6));
  *c.out_f(0) = static_cast<float>(coef);
  *c.out_f(1) = static_cast<float>(norm);
}

// p -= lr (g coef + wd p)
void sgd_plain(float* __restrict p, const float* __restrict g, int64_t n, float lr, float coef,
               float wd) {
  for (int64_t i = 0; i < n; ++i) p[i] -= lr * (g[i] * coef + wd * p[i]);
}

// d = g coef + wd p; buf = mom buf + d; p -= lr (nesterov ? d + mom buf : buf)
void sgd_momentum(float* __restrict p, const float* __restrict g, float* __restrict buf, int64_t n,
                  float lr, float coef, float wd, float mom, bool nesterov) {
  const float keep_d = nesterov ? 1.f : 0.f, mom_b = nesterov ? mom : 1.f;
  for (int64_t i = 0; i < n; ++i) {
    const float pi = p[i];
    const float d = g[i] * coef + wd * pi;
    const float b = mom * buf[i] + d;
    buf[i] = b;
    p[i] = pi - lr * (keep_d * d + mom_b * b);
  }
}

void sgd_kernel(const KernelCall& c) {
  float* p = c.in_mut_f(0);
  const float* g = c.in_f(1);
  float* buf = c.in_mut_f(2);
  const float lr = *c.in_f(3), coef = *c.in_f(4);
  const Attrs& a = c.attrs();
  const float mom = a.momentum, wd = a.weight_decay;
  const bool nesterov = a.nesterov;
  // One branch-free loop per form, each in its own function over restrict
  // pointers so that it vectorizes.
  cpu::parallel_for(c.in_shape(0).numel(), 4, [=](int64_t lo, int64_t hi) {
    if (mom == 0.f)
      sgd_plain(p + lo, g + lo, hi - lo, lr, coef, wd);
    else
      sgd_momentum(p + lo, g + lo, buf + lo, hi - lo, lr, coef, wd, mom, nesterov);
  });
}

void adamw_kernel(const KernelCall& c) {
  float* p = c.in_mut_f(0);
  const float* g = c.in_f(1);
  float* m = c.in_mut_f(2);
  float* v = c.in_mut_f(3);
  const float lr = *c.in_f(4), step = *c.in_f(5), coef = *c.in_f(6);
  const Attrs& a = c.attrs();
  const float b1 = a.beta1, b2 = a.beta2, eps = a.eps;
  const float decay = 1.f - lr * a.weight_decay;
  const double bc1 = 1.0 - std::pow(double(b1), double(step));
  const double bc2 = 1.0 - std::pow(double(b2), double(step));
  const float step_size = static_cast<float>(lr / bc1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  cpu::parallel_for(c.in_shape(0).numel(), 8, [=](int64_t lo, int64_t hi) {
    float* __restrict pp = p;
    const float* __restrict gg = g;
    float* __restrict mm = m;
    float* __restrict vv = v;
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) {
      const float gi = gg[i] * coef;
      const float mi = b1 * mm[i] + (1.f - b1) * gi;
      const float vi = b2 * vv[i] + (1.f - b2) * gi * gi;
      mm[i] = mi;
      vv[i] = vi;
      const float denom = std::sqrt(vi) * inv_sqrt_bc2 + eps;
      pp[i] = pp[i] * decay - step_size * mi / denom;
    }
  });
}

}  // namespace

void register_optimizer_kernels(KernelTable& t) {
  t[static_cast<int>(OpKind::kSumSquares)] = sum_squares_kernel;
  t[static_cast<int>(OpKind::kClipCoef)] = clip_coef_kernel;
  t[static_cast<int>(OpKind::kSgdUpdate)] = sgd_kernel;
  t[static_cast<int>(OpKind::kAdamWUpdate)] = adamw_kernel;
}

}  // namespace meshflow
