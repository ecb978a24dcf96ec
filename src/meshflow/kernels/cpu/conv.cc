// conv2d and its gradients on the CPU.
//
// With oneDNN (Debian's libdnnl-dev, found at configure time): its
// convolution primitives, in the memory layouts it chooses (blocked), with
// reorders from and to meshflow's NCHW / OIHW buffers around each call; the
// primitives are built once per geometry and cached. Measured against the
// im2col path below on ResNet-18's convolutions (bench/conv_compare.sh):
// 0.36x its time at 1 thread, 0.32x at 2, reorders included.
//
// Without oneDNN: im2col + one SGEMM per (image, group) (cpu::sgemm,
// kernels/cpu/gemm.h), the images split over the threads, each with its own
// column buffer (BLAS runs one thread inside our parallel region). A 1x1
// kernel with stride 1 and no padding reads x as its own column matrix.
#include <cstring>
#include <vector>

#ifdef MESHFLOW_HAVE_DNNL_CONV
#include <map>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#endif

#include "meshflow/kernels/cpu/conv.h"
#include "meshflow/kernels/cpu/gemm.h"
#include "meshflow/kernels/cpu/halo.h"
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

void im2col_forward(const Geom& g, const float* x, const float* w, float* y) {
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

void im2col_backward_data(const Geom& g, const float* dy, const float* w, float* dx) {
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
void im2col_backward_weights(const Geom& g, const float* dy, const float* x, float* dw) {
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

#ifdef MESHFLOW_HAVE_DNNL_CONV

// oneDNN's three convolution primitives for one geometry, in the layouts it
// prefers, built once and shared (primitives are stateless; each call binds
// its own memory).
struct DnnlConv {
  dnnl::convolution_forward::primitive_desc fwd_pd;
  dnnl::convolution_backward_data::primitive_desc bwd_data_pd;
  dnnl::convolution_backward_weights::primitive_desc bwd_weights_pd;
  dnnl::convolution_forward fwd;
  dnnl::convolution_backward_data bwd_data;
  dnnl::convolution_backward_weights bwd_weights;
  dnnl::memory::desc x_plain, w_plain, y_plain;  // meshflow's NCHW / (G)OIHW
};

dnnl::engine& dnnl_engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

const DnnlConv& dnnl_conv(const Geom& g) {
  using dnnl::memory;
  using tag = memory::format_tag;
  using dt = memory::data_type;
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                         int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>;
  static std::mutex mu;
  static std::map<Key, std::unique_ptr<DnnlConv>> cache;
  const Key key{g.N, g.C, g.H, g.W, g.O, g.KH, g.KW, g.groups, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw};
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(key); it != cache.end()) return *it->second;
  dnnl::engine& eng = dnnl_engine();
  const memory::dims x{g.N, g.C, g.H, g.W}, y{g.N, g.O, g.OH, g.OW}, strides{g.sh, g.sw},
      dil{g.dh - 1, g.dw - 1}, pad{g.ph, g.pw};
  const memory::dims w = g.groups > 1 ? memory::dims{g.groups, g.Og, g.Cg, g.KH, g.KW}
                                      : memory::dims{g.O, g.C, g.KH, g.KW};
  const memory::desc x_any(x, dt::f32, tag::any), w_any(w, dt::f32, tag::any),
      y_any(y, dt::f32, tag::any);
  auto c = std::make_unique<DnnlConv>();
  c->x_plain = memory::desc(x, dt::f32, tag::nchw);
  c->w_plain = memory::desc(w, dt::f32, g.groups > 1 ? tag::goihw : tag::oihw);
  c->y_plain = memory::desc(y, dt::f32, tag::nchw);
  const auto algo = dnnl::algorithm::convolution_direct;
  // Each call brings its own scratchpad: in-process ranks run the same cached
  // primitive at once, and oneDNN's library-owned scratchpad would be shared.
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  c->fwd_pd = dnnl::convolution_forward::primitive_desc(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algo, x_any, w_any, y_any,
                                      strides, dil, pad, pad),
      attr, eng);
  c->bwd_data_pd = dnnl::convolution_backward_data::primitive_desc(
      dnnl::convolution_backward_data::desc(algo, x_any, w_any, y_any, strides, dil, pad, pad),
      attr, eng, c->fwd_pd);
  c->bwd_weights_pd = dnnl::convolution_backward_weights::primitive_desc(
      dnnl::convolution_backward_weights::desc(algo, x_any, w_any, y_any, strides, dil, pad, pad),
      attr, eng, c->fwd_pd);
  c->fwd = dnnl::convolution_forward(c->fwd_pd);
  c->bwd_data = dnnl::convolution_backward_data(c->bwd_data_pd);
  c->bwd_weights = dnnl::convolution_backward_weights(c->bwd_weights_pd);
  return *cache.emplace(key, std::move(c)).first->second;
}

// A primitive's argument: the caller's plain buffer, or a buffer in the
// primitive's layout filled from it (in) / copied back to it (out).
struct Arg {
  dnnl::memory plain, used;
  Arg(const dnnl::memory::desc& plain_md, const dnnl::memory::desc& want, void* data,
      dnnl::stream& s, bool in)
      : plain(plain_md, dnnl_engine(), data) {
    used = want == plain_md ? plain : dnnl::memory(want, dnnl_engine());
    if (in && used != plain) dnnl::reorder(plain, used).execute(s, plain, used);
  }
  void write_back(dnnl::stream& s) {
    if (used != plain) dnnl::reorder(used, plain).execute(s, used, plain);
  }
};

void dnnl_forward(const Geom& g, const float* xp, const float* wp, float* yp) {
  const DnnlConv& p = dnnl_conv(g);
  dnnl::stream s(dnnl_engine());
  Arg x(p.x_plain, p.fwd_pd.src_desc(), const_cast<float*>(xp), s, true);
  Arg w(p.w_plain, p.fwd_pd.weights_desc(), const_cast<float*>(wp), s, true);
  Arg y(p.y_plain, p.fwd_pd.dst_desc(), yp, s, false);
  dnnl::memory scratch(p.fwd_pd.scratchpad_desc(), dnnl_engine());
  p.fwd.execute(s, {{DNNL_ARG_SRC, x.used},
                    {DNNL_ARG_WEIGHTS, w.used},
                    {DNNL_ARG_DST, y.used},
                    {DNNL_ARG_SCRATCHPAD, scratch}});
  y.write_back(s);
  s.wait();
}

void dnnl_backward_data(const Geom& g, const float* dyp, const float* wp, float* dxp) {
  const DnnlConv& p = dnnl_conv(g);
  dnnl::stream s(dnnl_engine());
  Arg dy(p.y_plain, p.bwd_data_pd.diff_dst_desc(), const_cast<float*>(dyp), s, true);
  Arg w(p.w_plain, p.bwd_data_pd.weights_desc(), const_cast<float*>(wp), s, true);
  Arg dx(p.x_plain, p.bwd_data_pd.diff_src_desc(), dxp, s, false);
  dnnl::memory scratch(p.bwd_data_pd.scratchpad_desc(), dnnl_engine());
  p.bwd_data.execute(s, {{DNNL_ARG_DIFF_DST, dy.used},
                         {DNNL_ARG_WEIGHTS, w.used},
                         {DNNL_ARG_DIFF_SRC, dx.used},
                         {DNNL_ARG_SCRATCHPAD, scratch}});
  dx.write_back(s);
  s.wait();
}

void dnnl_backward_weights(const Geom& g, const float* dyp, const float* xp, float* dwp) {
  const DnnlConv& p = dnnl_conv(g);
  dnnl::stream s(dnnl_engine());
  Arg dy(p.y_plain, p.bwd_weights_pd.diff_dst_desc(), const_cast<float*>(dyp), s, true);
  Arg x(p.x_plain, p.bwd_weights_pd.src_desc(), const_cast<float*>(xp), s, true);
  Arg dw(p.w_plain, p.bwd_weights_pd.diff_weights_desc(), dwp, s, false);
  dnnl::memory scratch(p.bwd_weights_pd.scratchpad_desc(), dnnl_engine());
  p.bwd_weights.execute(s, {{DNNL_ARG_DIFF_DST, dy.used},
                            {DNNL_ARG_SRC, x.used},
                            {DNNL_ARG_DIFF_WEIGHTS, dw.used},
                            {DNNL_ARG_SCRATCHPAD, scratch}});
  dw.write_back(s);
  s.wait();
}

#endif  // MESHFLOW_HAVE_DNNL_CONV

// The kernels: a spatially split x goes through the halo exchange
// (kernels/cpu/halo.h), then one of the backends above runs on the grown block.
using Conv = void (*)(const Geom&, const float*, const float*, float*);

template <Conv forward>
void conv2d_kernel(const KernelCall& c) {
  const Shape& w = c.in_shape(1);
  const cpu::HaloInput x(c, c.in_f(0), c.in_shape(0), {w.size(2), w.size(3)}, 0.f);
  forward(Geom(x.shape(), w, c.out_shape(0), x.attrs()), x.data, c.in_f(1), c.out_f(0));
}

// inputs: dy, w -> dx.
template <Conv backward_data>
void conv2d_grad_input_kernel(const KernelCall& c) {
  const Shape& w = c.in_shape(1);
  cpu::HaloOutput dx(c, c.out_f(0), c.out_shape(0), {w.size(2), w.size(3)});
  backward_data(Geom(dx.shape(), w, c.in_shape(0), dx.attrs()), c.in_f(0), c.in_f(1), dx.data);
  dx.fold();
}

// inputs: dy, x -> dw (Partial over the ranks of a split spatial dim).
template <Conv backward_weights>
void conv2d_grad_weight_kernel(const KernelCall& c) {
  const Shape& w = c.out_shape(0);
  const cpu::HaloInput x(c, c.in_f(1), c.in_shape(1), {w.size(2), w.size(3)}, 0.f);
  backward_weights(Geom(x.shape(), w, c.in_shape(0), x.attrs()), c.in_f(0), x.data, c.out_f(0));
}

}  // namespace

void register_conv_kernels(KernelTable& t) {
#ifdef MESHFLOW_HAVE_DNNL_CONV
  t[static_cast<int>(OpKind::kConv2d)] = conv2d_kernel<dnnl_forward>;
  t[static_cast<int>(OpKind::kConv2dGradInput)] = conv2d_grad_input_kernel<dnnl_backward_data>;
  t[static_cast<int>(OpKind::kConv2dGradWeight)] = conv2d_grad_weight_kernel<dnnl_backward_weights>;
#else
  t[static_cast<int>(OpKind::kConv2d)] = conv2d_kernel<im2col_forward>;
  t[static_cast<int>(OpKind::kConv2dGradInput)] = conv2d_grad_input_kernel<im2col_backward_data>;
  t[static_cast<int>(OpKind::kConv2dGradWeight)] =
      conv2d_grad_weight_kernel<im2col_backward_weights>;
#endif
}

namespace cpu {

const char* conv_library() {
#ifdef MESHFLOW_HAVE_DNNL_CONV
  return "oneDNN";
#else
  return "im2col+sgemm";
#endif
}

KernelFn im2col_conv_kernel(OpKind kind) {
  switch (kind) {
    case OpKind::kConv2d:
      return conv2d_kernel<im2col_forward>;
    case OpKind::kConv2dGradInput:
      return conv2d_grad_input_kernel<im2col_backward_data>;
    case OpKind::kConv2dGradWeight:
      return conv2d_grad_weight_kernel<im2col_backward_weights>;
    default:
      return nullptr;
  }
}

}  // namespace cpu

}  // namespace meshflow
