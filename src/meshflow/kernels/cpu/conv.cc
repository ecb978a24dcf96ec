// conv2d and its gradients on the CPU: im2col + one SGEMM per (image, group)
// (cpu::sgemm: OpenBLAS or oneDNN, kernels/cpu/gemm.h), the images split
// over the threads, each with its own column buffer (BLAS runs one thread
// inside our parallel region). A 1x1 kernel with stride 1 and no padding
// reads x as its own column matrix.
//
//   col [K = Cg KH KW, P = OH OW]:  col[(c KH + i) KW + j][oh OW + ow] =
//       x[c][oh stride_h - pad_h + i dil_h][ow stride_w - pad_w + j dil_w]  (0 outside)
//   y_g  [Og, P]  = w_g [Og, K] col
//   dcol [K, P]   = w_g^T dy_g             -> dx by col2im (adding overlaps)
//   dw_g [Og, K] += dy_g col^T             (per-thread partial sums, added at the end)
#include <cstring>
#include <vector>

#include "meshflow/kernels/cpu/gemm.h"
#include "meshflow/kernels/cpu/parallel.h"
#include "meshflow/kernels/kernel.h"

namespace meshflow {

namespace {

// The loop sizes of one conv2d (of x, w, y in NCHW / OIHW).
struct Geom {
  int64_t N, C, H, W, O, KH, KW, OH, OW, groups, Cg, Og, K, P;
  int64_t sh, sw, ph, pw, dh, dw;
  bool direct;  // 1x1, stride 1, no padding: x is its own column matrix
  Geom(const Shape& x, const Shape& w, const Shape& y, const Attrs& a) {
    N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
    O = w.size(0), KH = w.size(2), KW = w.size(3), OH = y.size(2), OW = y.size(3);
    groups = a.groups, Cg = C / groups, Og = O / groups;
    K = Cg * KH * KW, P = OH * OW;
    sh = a.stride[0], sw = a.stride[1], ph = a.padding[0], pw = a.padding[1];
    dh = a.dilation[0], dw = a.dilation[1];
    direct = KH == 1 && KW == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0;
  }
};

// col [K, P] from x_g [Cg, H, W].
void im2col(const Geom& g, const float* x, float* col) {
  for (int64_t c = 0; c < g.Cg; ++c)
    for (int64_t i = 0; i < g.KH; ++i)
      for (int64_t j = 0; j < g.KW; ++j) {
        float* row = col + ((c * g.KH + i) * g.KW + j) * g.P;
        const float* xc = x + c * g.H * g.W;
        for (int64_t oh = 0; oh < g.OH; ++oh) {
          const int64_t ih = oh * g.sh - g.ph + i * g.dh;
          float* out = row + oh * g.OW;
          if (ih < 0 || ih >= g.H) {
            std::memset(out, 0, sizeof(float) * g.OW);
            continue;
          }
          const float* xr = xc + ih * g.W;
          for (int64_t ow = 0; ow < g.OW; ++ow) {
            const int64_t iw = ow * g.sw - g.pw + j * g.dw;
            out[ow] = iw >= 0 && iw < g.W ? xr[iw] : 0.f;
          }
        }
      }
}

// dx_g [Cg, H, W] += the columns of dcol [K, P] put back where im2col took them.
void col2im(const Geom& g, const float* dcol, float* dx) {
  for (int64_t c = 0; c < g.Cg; ++c)
    for (int64_t i = 0; i < g.KH; ++i)
      for (int64_t j = 0; j < g.KW; ++j) {
        const float* row = dcol + ((c * g.KH + i) * g.KW + j) * g.P;
        float* xc = dx + c * g.H * g.W;
        for (int64_t oh = 0; oh < g.OH; ++oh) {
          const int64_t ih = oh * g.sh - g.ph + i * g.dh;
          if (ih < 0 || ih >= g.H) continue;
          float* xr = xc + ih * g.W;
          const float* in = row + oh * g.OW;
          for (int64_t ow = 0; ow < g.OW; ++ow) {
            const int64_t iw = ow * g.sw - g.pw + j * g.dw;
            if (iw >= 0 && iw < g.W) xr[iw] += in[ow];
          }
        }
      }
}

// Runs fn(first, last, col) over the images, split over the threads; col is
// the thread's [K, P] buffer (empty when direct).
template <class Fn>
void over_images(const Geom& g, Fn fn) {
  const int64_t per_image = 2 * g.O * g.K * g.P;
  cpu::parallel_for(g.N, per_image, [&](int64_t b, int64_t e) {
    std::vector<float> col(g.direct ? 0 : g.K * g.P);
    fn(b, e, col.data());
  });
}

void conv2d_kernel(const KernelCall& c) {
  const Geom g(c.in_shape(0), c.in_shape(1), c.out_shape(0), c.attrs());
  const float* x = c.in_f(0);
  const float* w = c.in_f(1);
  float* y = c.out_f(0);
  over_images(g, [&](int64_t b, int64_t e, float* col) {
    for (int64_t n = b; n < e; ++n)
      for (int64_t gr = 0; gr < g.groups; ++gr) {
        const float* xg = x + (n * g.C + gr * g.Cg) * g.H * g.W;
        const float* cols = xg;
        if (!g.direct) {
          im2col(g, xg, col);
          cols = col;
        }
        cpu::sgemm(false, false, g.Og, g.P, g.K, 1.f, w + gr * g.Og * g.K, g.K, cols, g.P, 0.f,
                   y + (n * g.O + gr * g.Og) * g.P, g.P);
      }
  });
}

// inputs: dy, w -> dx.
void conv2d_grad_input_kernel(const KernelCall& c) {
  const Geom g(c.out_shape(0), c.in_shape(1), c.in_shape(0), c.attrs());
  const float* dy = c.in_f(0);
  const float* w = c.in_f(1);
  float* dx = c.out_f(0);
  over_images(g, [&](int64_t b, int64_t e, float* col) {
    for (int64_t n = b; n < e; ++n)
      for (int64_t gr = 0; gr < g.groups; ++gr) {
        float* dxg = dx + (n * g.C + gr * g.Cg) * g.H * g.W;
        const float* dyg = dy + (n * g.O + gr * g.Og) * g.P;
        const float* wg = w + gr * g.Og * g.K;
        if (g.direct) {  // dx_g [Cg, P] = w_g^T dy_g
          cpu::sgemm(true, false, g.K, g.P, g.Og, 1.f, wg, g.K, dyg, g.P, 0.f, dxg, g.P);
          continue;
        }
        cpu::sgemm(true, false, g.K, g.P, g.Og, 1.f, wg, g.K, dyg, g.P, 0.f, col, g.P);
        std::memset(dxg, 0, sizeof(float) * g.Cg * g.H * g.W);
        col2im(g, col, dxg);
      }
  });
}

// inputs: dy, x -> dw. Each thread sums its images' dw in its own buffer;
// the buffers are added in thread order (deterministic for a thread count).
void conv2d_grad_weight_kernel(const KernelCall& c) {
  const Geom g(c.in_shape(1), c.out_shape(0), c.in_shape(0), c.attrs());
  const float* dy = c.in_f(0);
  const float* x = c.in_f(1);
  float* dw = c.out_f(0);
  const int64_t wsize = g.O * g.K;
  const int threads = omp_in_parallel() ? 1 : std::max(1, omp_get_max_threads());
  const int64_t chunks = std::min<int64_t>(threads, g.N);
  std::vector<std::vector<float>> part(static_cast<size_t>(chunks));
  auto run = [&](int64_t chunk) {
    const int64_t b = g.N * chunk / chunks, e = g.N * (chunk + 1) / chunks;
    std::vector<float>& acc = part[static_cast<size_t>(chunk)];
    acc.assign(static_cast<size_t>(wsize), 0.f);
    std::vector<float> col(g.direct ? 0 : g.K * g.P);
    for (int64_t n = b; n < e; ++n)
      for (int64_t gr = 0; gr < g.groups; ++gr) {
        const float* xg = x + (n * g.C + gr * g.Cg) * g.H * g.W;
        const float* cols = xg;
        if (!g.direct) {
          im2col(g, xg, col.data());
          cols = col.data();
        }
        cpu::sgemm(false, true, g.Og, g.K, g.P, 1.f, dy + (n * g.O + gr * g.Og) * g.P, g.P, cols,
                   g.P, 1.f, acc.data() + gr * g.Og * g.K, g.K);
      }
  };
  if (chunks > 1) {
#pragma omp parallel for num_threads(static_cast <int>(chunks)) schedule(static)
    for (int64_t k = 0; k < chunks; ++k) run(k);
  } else if (chunks == 1) {
    run(0);
  }
  std::memset(dw, 0, sizeof(float) * wsize);
  for (const std::vector<float>& acc : part)
    for (int64_t i = 0; i < wsize; ++i) dw[i] += acc[i];
}

}  // namespace

void register_conv_kernels(KernelTable& t) {
  t[static_cast<int>(OpKind::kConv2d)] = conv2d_kernel;
  t[static_cast<int>(OpKind::kConv2dGradInput)] = conv2d_grad_input_kernel;
  t[static_cast<int>(OpKind::kConv2dGradWeight)] = conv2d_grad_weight_kernel;
}

}  // namespace meshflow
