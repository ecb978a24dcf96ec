// max_pool2d / avg_pool2d and their gradients on the CPU. Each (image,
// channel) plane is independent: the planes are split over the threads;
// max_pool2d's forward pools rows then columns, the rest reads each output's
// window directly (a window is a handful of elements; there is nothing for a
// GEMM here).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "meshflow/kernels/cpu/halo.h"
#include "meshflow/kernels/cpu/parallel.h"
#include "meshflow/kernels/kernel.h"

namespace meshflow {

namespace {

struct PoolGeom {
  int64_t planes, H, W, OH, OW, KH, KW, sh, sw, ph, pw, dh, dw;
  PoolGeom(const Shape& x, const Shape& y, const Attrs& a) {
    planes = x.size(0) * x.size(1), H = x.size(2), W = x.size(3), OH = y.size(2), OW = y.size(3);
    KH = a.kernel[0], KW = a.kernel[1], sh = a.stride[0], sw = a.stride[1];
    ph = a.padding[0], pw = a.padding[1], dh = a.dilation[0], dw = a.dilation[1];
    K = static_cast<int>(KH * KW);
    off.resize(K);
    for (int64_t i = 0; i < KH; ++i)
      for (int64_t j = 0; j < KW; ++j) off[i * KW + j] = i * dh * W + j * dw;
  }
  int K;                     // window elements
  std::vector<int64_t> off;  // each one's offset from the window's corner, row-major
  int64_t work() const { return OH * OW * KH * KW; }
};

// The flat index in its plane of the window's first maximum (-1: the window
// covers padding only, which pooled() rules out).
int64_t argmax(const PoolGeom& g, const float* x, int64_t oh, int64_t ow) {
  const int64_t h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw;
  if (h0 >= 0 && w0 >= 0 && h0 + (g.KH - 1) * g.dh < g.H && w0 + (g.KW - 1) * g.dw < g.W) {
    // Inside the plane (most windows): no bounds tests, and selects instead of
    // branches on the data (a compare per element mispredicts half the time).
    const float* base = x + h0 * g.W + w0;
    float best = base[0];
    int32_t at = 0;
    for (int k = 1; k < g.K; ++k) {
      const float v = base[g.off[k]];
      const bool take = !(v <= best) && best == best;  // larger, or the first NaN
      at = take ? k : at;
      best = take ? v : best;
    }
    return h0 * g.W + w0 + g.off[at];
  }
  float best = -std::numeric_limits<float>::infinity();
  int64_t at = -1;
  for (int64_t i = 0; i < g.KH; ++i) {
    const int64_t ih = oh * g.sh - g.ph + i * g.dh;
    if (ih < 0 || ih >= g.H) continue;
    for (int64_t j = 0; j < g.KW; ++j) {
      const int64_t iw = ow * g.sw - g.pw + j * g.dw;
      if (iw < 0 || iw >= g.W) continue;
      const float v = x[ih * g.W + iw];
      if (at < 0 || v > best || (v != v && best == best)) best = v, at = ih * g.W + iw;  // NaN wins
    }
  }
  return at;
}

// A spatially split x is grown by its neighbours' rows first (kernels/cpu/halo.h):
// -inf at the ends for max (padding never wins), zeros for average.
constexpr float kNoMax = -std::numeric_limits<float>::infinity();

std::array<int64_t, 2> window(const KernelCall& c) {
  return {c.attrs().kernel[0], c.attrs().kernel[1]};
}

// The larger of a running maximum and v; a NaN wins and stays (the value
// argmax's first NaN gives). Spelled so that it compiles to compares and
// blends (`v > best || v != v` ran three times slower on AVX-512).
inline float nan_max(float best, float v) {
  return std::isnan(best) ? best : (best > v ? best : v);
}

// The forward needs the maximum, not where it is: separably, each input
// row's maximum over the window's columns at every column a window starts
// on (stride 1, over the row with its padding: contiguous loads the compiler
// vectorizes), of which every stride-th is kept; then each output's maximum
// over its window's rows.
void max_pool2d_kernel(const KernelCall& c) {
  const cpu::HaloInput xin(c, c.in_f(0), c.in_shape(0), window(c), kNoMax);
  const PoolGeom g(xin.shape(), c.out_shape(0), xin.attrs());
  const float* x = xin.data;
  float* y = c.out_f(0);
  const int64_t span = (g.OW - 1) * g.sw + 1;       // the columns a window starts on
  const int64_t padded = span + (g.KW - 1) * g.dw;  // the row those windows cover
  const int64_t copied = std::max<int64_t>(0, std::min(g.W, padded - g.pw));  // the row's own
  cpu::parallel_for(g.planes, g.work(), [&](int64_t b, int64_t e) {
    std::vector<float> rows(static_cast<size_t>(g.H * g.OW));
    std::vector<float> row(static_cast<size_t>(padded), kNoMax), m(static_cast<size_t>(span));
    for (int64_t p = b; p < e; ++p) {
      const float* xp = x + p * g.H * g.W;
      float* yp = y + p * g.OH * g.OW;
      for (int64_t h = 0; h < g.H; ++h) {
        std::copy(xp + h * g.W, xp + h * g.W + copied, row.begin() + g.pw);
        std::copy(row.begin(), row.begin() + span, m.begin());
        for (int64_t j = 1; j < g.KW; ++j) {
          const float* shifted = row.data() + j * g.dw;
          for (int64_t t = 0; t < span; ++t) m[t] = nan_max(m[t], shifted[t]);
        }
        float* rr = rows.data() + h * g.OW;
        for (int64_t ow = 0; ow < g.OW; ++ow) rr[ow] = m[ow * g.sw];
      }
      for (int64_t oh = 0; oh < g.OH; ++oh) {
        float* yr = yp + oh * g.OW;
        std::fill(yr, yr + g.OW, kNoMax);
        for (int64_t i = 0; i < g.KH; ++i) {
          const int64_t ih = oh * g.sh - g.ph + i * g.dh;
          if (ih < 0 || ih >= g.H) continue;
          const float* rr = rows.data() + ih * g.OW;
          for (int64_t ow = 0; ow < g.OW; ++ow) yr[ow] = nan_max(yr[ow], rr[ow]);
        }
      }
    }
  });
}

// inputs: dy, x.
void max_pool2d_grad_kernel(const KernelCall& c) {
  const cpu::HaloInput xin(c, c.in_f(1), c.in_shape(1), window(c), kNoMax);
  cpu::HaloOutput dxo(c, c.out_f(0), c.out_shape(0), window(c));
  const PoolGeom g(xin.shape(), c.in_shape(0), xin.attrs());
  const float* dy = c.in_f(0);
  const float* x = xin.data;
  float* dx = dxo.data;
  cpu::parallel_for(g.planes, g.work(), [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      const float* xp = x + p * g.H * g.W;
      const float* dyp = dy + p * g.OH * g.OW;
      float* dxp = dx + p * g.H * g.W;
      std::memset(dxp, 0, sizeof(float) * g.H * g.W);
      for (int64_t oh = 0; oh < g.OH; ++oh)
        for (int64_t ow = 0; ow < g.OW; ++ow) dxp[argmax(g, xp, oh, ow)] += dyp[oh * g.OW + ow];
    }
  });
  dxo.fold();
}

void avg_pool2d_kernel(const KernelCall& c) {
  const cpu::HaloInput xin(c, c.in_f(0), c.in_shape(0), window(c), 0.f);
  const PoolGeom g(xin.shape(), c.out_shape(0), xin.attrs());
  const float* x = xin.data;
  float* y = c.out_f(0);
  const float inv = 1.f / static_cast<float>(g.KH * g.KW);
  cpu::parallel_for(g.planes, g.work(), [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      const float* xp = x + p * g.H * g.W;
      float* yp = y + p * g.OH * g.OW;
      for (int64_t oh = 0; oh < g.OH; ++oh)
        for (int64_t ow = 0; ow < g.OW; ++ow) {
          float sum = 0.f;
          for (int64_t i = 0; i < g.KH; ++i) {
            const int64_t ih = oh * g.sh - g.ph + i;
            if (ih < 0 || ih >= g.H) continue;
            for (int64_t j = 0; j < g.KW; ++j) {
              const int64_t iw = ow * g.sw - g.pw + j;
              if (iw >= 0 && iw < g.W) sum += xp[ih * g.W + iw];
            }
          }
          yp[oh * g.OW + ow] = sum * inv;
        }
    }
  });
}

// inputs: dy; the output is x-shaped.
void avg_pool2d_grad_kernel(const KernelCall& c) {
  cpu::HaloOutput dxo(c, c.out_f(0), c.out_shape(0), window(c));
  const PoolGeom g(dxo.shape(), c.in_shape(0), dxo.attrs());
  const float* dy = c.in_f(0);
  float* dx = dxo.data;
  const float inv = 1.f / static_cast<float>(g.KH * g.KW);
  cpu::parallel_for(g.planes, g.work(), [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      const float* dyp = dy + p * g.OH * g.OW;
      float* dxp = dx + p * g.H * g.W;
      std::memset(dxp, 0, sizeof(float) * g.H * g.W);
      for (int64_t oh = 0; oh < g.OH; ++oh)
        for (int64_t ow = 0; ow < g.OW; ++ow) {
          const float v = dyp[oh * g.OW + ow] * inv;
          for (int64_t i = 0; i < g.KH; ++i) {
            const int64_t ih = oh * g.sh - g.ph + i;
            if (ih < 0 || ih >= g.H) continue;
            for (int64_t j = 0; j < g.KW; ++j) {
              const int64_t iw = ow * g.sw - g.pw + j;
              if (iw >= 0 && iw < g.W) dxp[ih * g.W + iw] += v;
            }
          }
        }
    }
  });
  dxo.fold();
}

}  // namespace

void register_pool_kernels(KernelTable& t) {
  t[static_cast<int>(OpKind::kMaxPool2d)] = max_pool2d_kernel;
  t[static_cast<int>(OpKind::kMaxPool2dGrad)] = max_pool2d_grad_kernel;
  t[static_cast<int>(OpKind::kAvgPool2d)] = avg_pool2d_kernel;
  t[static_cast<int>(OpKind::kAvgPool2dGrad)] = avg_pool2d_grad_kernel;
}

}  // namespace meshflow
