// batch_norm and its gradient and running-statistics update on the CPU. The
// channels are split over the threads; each channel's sums run in a fixed
// order in double, so the result does not depend on the thread count. With
// the batch or spatial dims split over ranks (attrs.ints: the mesh axes), the
// per-channel sums are all-reduced over those axes before they are used
// (synchronized batch norm).
#include <cmath>
#include <vector>

#include "meshflow/comm/mesh_comms.h"
#include "meshflow/core/check.h"
#include "meshflow/kernels/cpu/parallel.h"
#include "meshflow/kernels/kernel.h"
#include "meshflow/ops/op_def.h"

namespace meshflow {

namespace {

// x [N, C, S..] as (N, C, S).
struct Planes {
  int64_t N, C, S;
  explicit Planes(const Shape& x) : N(x.size(0)), C(x.size(1)), S(x.numel() / (N * C)) {}
  int64_t count() const { return N * S; }
};

// Sums `data` over the ranks of every mesh axis in attrs.ints.
void all_reduce_sums(const KernelCall& c, std::vector<float>* data) {
  if (c.attrs().ints.empty()) return;
  MF_CHECK(c.comms != nullptr) << node_label(c.n)
                               << ": split batch norm needs the mesh's communicators";
  for (int64_t a : c.attrs().ints) {
    Status s = c.comms->axis(static_cast<int>(a))
                   .all_reduce(data->data(), static_cast<int64_t>(data->size()), ReduceOp::kSum);
    if (!s.is_ok()) throw StatusError(s.with_context(node_label(c.n)));
  }
}

// f(0) + ... + f(n - 1) in double, in eight chains (i mod 8) added pairwise
// at the end: a fixed order, which the compiler vectorizes, where one chain
// waits on each add's latency (four cycles an element).
template <class F>
double lane_sum(int64_t n, F f) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += f(i + j);
  for (int j = 0; i < n; ++i, ++j) acc[j] += f(i);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// Per channel: fn(c, plane offset of (n, c)) summed over n and s, in double.
template <class Fn>
void per_channel(const Planes& p, std::vector<float>* out, Fn fn) {
  cpu::parallel_for(p.C, p.count(), [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      double acc = 0;
      for (int64_t n = 0; n < p.N; ++n) acc += fn(c, (n * p.C + c) * p.S);
      (*out)[c] = static_cast<float>(acc);
    }
  });
}

// inputs: x, gamma, beta, running_mean, running_var, rng_offset -> y, mean, rstd
// (x, gamma, beta alone: training)
void batch_norm_kernel(const KernelCall& c) {
  const Planes p(c.in_shape(0));
  const float* x = c.in_f(0);
  const float* gamma = c.in_f(1);
  const float* beta = c.in_f(2);
  float* y = c.out_f(0);
  float* mean = c.out_f(1);
  float* rstd = c.out_f(2);
  const float eps = c.attrs().eps;
  if (c.in.size() == 6 && c.in_i(5)[0] < 0) {  // evaluation: the running statistics
    for (int64_t ch = 0; ch < p.C; ++ch) {
      mean[ch] = c.in_f(3)[ch];
      rstd[ch] = 1.f / std::sqrt(c.in_f(4)[ch] + eps);
    }
  } else {
    std::vector<float> sums(p.C + 1);
    per_channel(p, &sums, [&](int64_t, int64_t at) {
      const float* xp = x + at;
      return lane_sum(p.S, [&](int64_t i) { return double(xp[i]); });
    });
    sums[p.C] = static_cast<float>(p.count());
    all_reduce_sums(c, &sums);
    const double count = sums[p.C];
    for (int64_t ch = 0; ch < p.C; ++ch) mean[ch] = static_cast<float>(sums[ch] / count);
    std::vector<float> sq(p.C);
    per_channel(p, &sq, [&](int64_t ch, int64_t at) {
      const float* xp = x + at;
      const double m = mean[ch];
      return lane_sum(p.S, [&](int64_t i) {
        const double d = double(xp[i]) - m;
        return d * d;
      });
    });
    all_reduce_sums(c, &sq);
    for (int64_t ch = 0; ch < p.C; ++ch)
      rstd[ch] = static_cast<float>(1.0 / std::sqrt(double(sq[ch]) / count + eps));
  }
  cpu::parallel_for(p.N * p.C, p.S, [&](int64_t b, int64_t e) {
    for (int64_t nc = b; nc < e; ++nc) {
      const int64_t ch = nc % p.C;
      const float scale = rstd[ch] * gamma[ch], shift = beta[ch] - mean[ch] * scale;
      const float* xp = x + nc * p.S;
      float* yp = y + nc * p.S;
      for (int64_t i = 0; i < p.S; ++i) yp[i] = xp[i] * scale + shift;
    }
  });
}

// inputs: dy, x, gamma, mean, rstd -> dx, dgamma, dbeta
//   xhat = (x - mean) rstd;  dbeta = sum dy;  dgamma = sum dy xhat
//   dx = gamma rstd (dy - dbeta / M - xhat dgamma / M)
void batch_norm_grad_kernel(const KernelCall& c) {
  const Planes p(c.in_shape(1));
  const float* dy = c.in_f(0);
  const float* x = c.in_f(1);
  const float* gamma = c.in_f(2);
  const float* mean = c.in_f(3);
  const float* rstd = c.in_f(4);
  float* dx = c.out_f(0);
  float* dgamma = c.out_f(1);
  float* dbeta = c.out_f(2);
  std::vector<float> sums(2 * p.C + 1);
  cpu::parallel_for(p.C, 2 * p.count(), [&](int64_t b, int64_t e) {
    for (int64_t ch = b; ch < e; ++ch) {
      double sb = 0, sg = 0;
      const double m = mean[ch], r = rstd[ch];
      for (int64_t n = 0; n < p.N; ++n) {
        const int64_t at = (n * p.C + ch) * p.S;
        const float* dyp = dy + at;
        const float* xp = x + at;
        sb += lane_sum(p.S, [&](int64_t i) { return double(dyp[i]); });
        sg += lane_sum(p.S, [&](int64_t i) { return double(dyp[i]) * ((double(xp[i]) - m) * r); });
      }
      sums[ch] = static_cast<float>(sb);
      sums[p.C + ch] = static_cast<float>(sg);
    }
  });
  sums[2 * p.C] = static_cast<float>(p.count());
  all_reduce_sums(c, &sums);
  const float inv_m = 1.f / sums[2 * p.C];
  for (int64_t ch = 0; ch < p.C; ++ch) dbeta[ch] = sums[ch], dgamma[ch] = sums[p.C + ch];
  cpu::parallel_for(p.N * p.C, p.S, [&](int64_t b, int64_t e) {
    for (int64_t nc = b; nc < e; ++nc) {
      const int64_t ch = nc % p.C;
      const float k = gamma[ch] * rstd[ch], mb = dbeta[ch] * inv_m, mg = dgamma[ch] * inv_m;
      const float* dyp = dy + nc * p.S;
      const float* xp = x + nc * p.S;
      float* dxp = dx + nc * p.S;
      for (int64_t i = 0; i < p.S; ++i) {
        const float xhat = (xp[i] - mean[ch]) * rstd[ch];
        dxp[i] = k * (dyp[i] - mb - xhat * mg);
      }
    }
  });
}

// inputs: running_mean, running_var (updated in place), mean, rstd
void batch_norm_update_kernel(const KernelCall& c) {
  const int64_t C = c.in_shape(0).numel();
  float* rm = c.in_mut_f(0);
  float* rv = c.in_mut_f(1);
  const float* mean = c.in_f(2);
  const float* rstd = c.in_f(3);
  const float m = c.attrs().momentum, unbias = c.attrs().alpha, eps = c.attrs().eps;
  for (int64_t ch = 0; ch < C; ++ch) {
    const float var = 1.f / (rstd[ch] * rstd[ch]) - eps;
    rm[ch] = (1.f - m) * rm[ch] + m * mean[ch];
    rv[ch] = (1.f - m) * rv[ch] + m * var * unbias;
  }
}

}  // namespace

void register_batch_norm_kernels(KernelTable& t) {
  t[static_cast<int>(OpKind::kBatchNorm)] = batch_norm_kernel;
  t[static_cast<int>(OpKind::kBatchNormGrad)] = batch_norm_grad_kernel;
  t[static_cast<int>(OpKind::kBatchNormUpdate)] = batch_norm_update_kernel;
}

}  // namespace meshflow
