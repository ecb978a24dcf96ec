// conv2d kernels side by side, in one run: meshflow's im2col + SGEMM
// (kernels/cpu/conv.cc, the path without oneDNN), the kernels meshflow
// registered (oneDNN when built with it: cached primitives, reorders from and
// to NCHW), and oneDNN's primitives called directly, forward, backward-data
// and backward-weights, on the convolutions of a ResNet-18 step at batch 32
// with 32x32 inputs.
// oneDNN runs twice: on plain NCHW memory (what meshflow's tensors are), and
// with the layouts it picks itself ("any", blocked) plus the reorders to and
// from NCHW that a plain-layout engine would pay around it.
//   OMP_NUM_THREADS=T build/bench/conv_compare T        (bench/conv_compare.sh: T = 1, 2)
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <vector>

#include "meshflow/kernels/cpu/blas_core.h"
#include "meshflow/kernels/cpu/conv.h"
#include "meshflow/kernels/kernel.h"
#include "meshflow/ops/builder.h"

namespace {

using Clock = std::chrono::steady_clock;
using meshflow::Shape;

struct Conv {
  const char* name;
  int64_t C, H, O, K, stride, pad;
};

// ResNet-18 (torchvision layout) on 32x32 inputs: one of each distinct conv.
const std::vector<Conv> kConvs = {
    {"stem 7x7/2", 3, 32, 64, 7, 2, 3},         {"layer1 3x3", 64, 8, 64, 3, 1, 1},
    {"layer2 3x3/2", 64, 8, 128, 3, 2, 1},      {"layer2 3x3", 128, 4, 128, 3, 1, 1},
    {"layer2 down 1x1/2", 64, 8, 128, 1, 2, 0}, {"layer3 3x3/2", 128, 4, 256, 3, 2, 1},
    {"layer3 3x3", 256, 2, 256, 3, 1, 1},       {"layer4 3x3/2", 256, 2, 512, 3, 2, 1},
    {"layer4 3x3", 512, 1, 512, 3, 1, 1},
};
constexpr int64_t kBatch = 32;

// Median seconds of fn over enough repetitions (>= 5, >= 0.2 s).
double time_s(const std::function<void()>& fn) {
  fn();
  std::vector<double> t;
  const auto start = Clock::now();
  while (t.size() < 5 || std::chrono::duration<double>(Clock::now() - start).count() < 0.2) {
    const auto t0 = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

std::vector<float> filled(int64_t n, float seed) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = 0.01f * float((i * 37 + int64_t(seed * 11)) % 97 - 48);
  return v;
}

struct Times {
  double fwd = 0, bwd_data = 0, bwd_weights = 0;
  double total() const { return fwd + bwd_data + bwd_weights; }
};

// meshflow's kernels, called as the executor calls them: the registered ones
// (cpu_kernel) or the im2col + SGEMM ones.
Times meshflow_times(const Conv& c, bool im2col) {
  using namespace meshflow;
  Graph g;
  Builder b(g);
  const Shape xs{{"batch", kBatch}, {"channels", c.C}, {"height", c.H}, {"width", c.H}};
  const Shape ws{{"out", c.O}, {"channels", c.C}, {"kh", c.K}, {"kw", c.K}};
  Conv2dOpts o;
  o.stride = {c.stride, c.stride}, o.padding = {c.pad, c.pad};
  const ValueId x = b.input("x", xs), w = b.input("w", ws);
  const ValueId y = b.conv2d(x, w, o, "conv");
  const ValueId dy = b.input("dy", g.shape(y));
  Attrs a = g.producer(y).attrs;
  a.shape = xs;
  const ValueId dx = b.op1(OpKind::kConv2dGradInput, {dy, w}, a, "dx");
  a.shape = ws;
  const ValueId dw = b.op1(OpKind::kConv2dGradWeight, {dy, x}, a, "dw");
  std::vector<float> X = filled(xs.numel(), 1), W = filled(ws.numel(), 2), Y(g.shape(y).numel()),
                     DY = filled(g.shape(y).numel(), 3), DX(xs.numel()), DW(ws.numel());
  auto call = [&](ValueId out, std::vector<void*> in, void* o) {
    KernelCall k{g, g.producer(out), std::move(in), {o}};
    const OpKind kind = g.producer(out).kind;
    (im2col ? cpu::im2col_conv_kernel(kind) : cpu_kernel(kind))(k);
  };
  Times t;
  t.fwd = time_s([&] { call(y, {X.data(), W.data()}, Y.data()); });
  t.bwd_data = time_s([&] { call(dx, {DY.data(), W.data()}, DX.data()); });
  t.bwd_weights = time_s([&] { call(dw, {DY.data(), X.data()}, DW.data()); });
  return t;
}

// oneDNN's primitives; blocked: format_tag::any plus reorders from/to NCHW.
Times onednn_times(const Conv& c, bool blocked, std::string* impl) {
  using namespace dnnl;
  using tag = memory::format_tag;
  using dt = memory::data_type;
  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  const int64_t OH = (c.H + 2 * c.pad - c.K) / c.stride + 1;
  const memory::dims src{kBatch, c.C, c.H, c.H}, wei{c.O, c.C, c.K, c.K}, dst{kBatch, c.O, OH, OH},
      strides{c.stride, c.stride}, dil{0, 0}, pad{c.pad, c.pad};
  const tag act = blocked ? tag::any : tag::nchw, wt = blocked ? tag::any : tag::oihw;
  const memory::desc src_md(src, dt::f32, act), wei_md(wei, dt::f32, wt), dst_md(dst, dt::f32, act);
  convolution_forward::primitive_desc fwd_pd(
      convolution_forward::desc(prop_kind::forward_training, algorithm::convolution_direct, src_md,
                                wei_md, dst_md, strides, dil, pad, pad),
      eng);
  convolution_backward_data::primitive_desc bwd_d_pd(
      convolution_backward_data::desc(algorithm::convolution_direct, src_md, wei_md, dst_md,
                                      strides, dil, pad, pad),
      eng, fwd_pd);
  convolution_backward_weights::primitive_desc bwd_w_pd(
      convolution_backward_weights::desc(algorithm::convolution_direct, src_md, wei_md, dst_md,
                                         strides, dil, pad, pad),
      eng, fwd_pd);
  *impl = std::string(fwd_pd.impl_info_str()) + " / " + bwd_d_pd.impl_info_str() + " / " +
          bwd_w_pd.impl_info_str();
  // Plain NCHW buffers, as meshflow holds them.
  std::vector<float> X = filled(kBatch * c.C * c.H * c.H, 1), W = filled(c.O * c.C * c.K * c.K, 2),
                     DY = filled(kBatch * c.O * OH * OH, 3);
  memory x_plain({src, dt::f32, tag::nchw}, eng, X.data()),
      w_plain({wei, dt::f32, tag::oihw}, eng, W.data()),
      dy_plain({dst, dt::f32, tag::nchw}, eng, DY.data()), y_plain({dst, dt::f32, tag::nchw}, eng),
      dx_plain({src, dt::f32, tag::nchw}, eng), dw_plain({wei, dt::f32, tag::oihw}, eng);
  // The primitives' own layouts (the plain ones when not blocked).
  memory x(fwd_pd.src_desc(), eng), w(fwd_pd.weights_desc(), eng), y(fwd_pd.dst_desc(), eng),
      dy(bwd_d_pd.diff_dst_desc(), eng), dx(bwd_d_pd.diff_src_desc(), eng),
      dyw(bwd_w_pd.diff_dst_desc(), eng), xw(bwd_w_pd.src_desc(), eng),
      dw(bwd_w_pd.diff_weights_desc(), eng);
  auto to = [&](memory& from, memory& into) {
    if (from.get_desc() != into.get_desc()) reorder(from, into).execute(s, from, into);
  };
  convolution_forward fwd(fwd_pd);
  convolution_backward_data bwd_d(bwd_d_pd);
  convolution_backward_weights bwd_w(bwd_w_pd);
  Times t;
  t.fwd = time_s([&] {
    to(x_plain, x), to(w_plain, w);
    fwd.execute(s, {{DNNL_ARG_SRC, x}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DST, y}});
    to(y, y_plain);
    s.wait();
  });
  t.bwd_data = time_s([&] {
    to(dy_plain, dy), to(w_plain, w);
    bwd_d.execute(s, {{DNNL_ARG_DIFF_DST, dy}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DIFF_SRC, dx}});
    to(dx, dx_plain);
    s.wait();
  });
  t.bwd_weights = time_s([&] {
    to(dy_plain, dyw), to(x_plain, xw);
    bwd_w.execute(s, {{DNNL_ARG_SRC, xw}, {DNNL_ARG_DIFF_DST, dyw}, {DNNL_ARG_DIFF_WEIGHTS, dw}});
    to(dw, dw_plain);
    s.wait();
  });
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  meshflow::cpu::use_supported_blas_kernels(argv);  // kernels/cpu/blas_core.h
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  omp_set_num_threads(threads);
  meshflow::Graph probe;
  std::printf("threads=%d batch=%lld (ms per call: forward / backward-data / backward-weights)\n",
              threads, static_cast<long long>(kBatch));
  std::printf("meshflow's conv2d kernels: %s\n", meshflow::cpu::conv_library());
  std::printf("%-18s %-22s %-22s %-22s %-22s %s\n", "conv", "im2col+sgemm", "meshflow (registered)",
              "oneDNN nchw", "oneDNN blocked+reorder", "oneDNN impl (blocked)");
  Times sum_m, sum_r, sum_p, sum_b;
  for (const Conv& c : kConvs) {
    std::string impl_p, impl_b;
    const Times m = meshflow_times(c, true), r = meshflow_times(c, false),
                p = onednn_times(c, false, &impl_p), b = onednn_times(c, true, &impl_b);
    auto f = [](const Times& t) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%6.2f/%6.2f/%6.2f", 1e3 * t.fwd, 1e3 * t.bwd_data,
                    1e3 * t.bwd_weights);
      return std::string(buf);
    };
    std::printf("%-18s %-22s %-22s %-22s %-22s %s\n", c.name, f(m).c_str(), f(r).c_str(),
                f(p).c_str(), f(b).c_str(), impl_b.c_str());
    for (auto [acc, t] :
         {std::pair{&sum_m, m}, std::pair{&sum_r, r}, std::pair{&sum_p, p}, std::pair{&sum_b, b}}) {
      acc->fwd += t.fwd, acc->bwd_data += t.bwd_data, acc->bwd_weights += t.bwd_weights;
    }
  }
  std::printf("%-18s %-22.2f %-22.2f %-22.2f %-22.2f (ms, the three summed over the list)\n",
              "total", 1e3 * sum_m.total(), 1e3 * sum_r.total(), 1e3 * sum_p.total(),
              1e3 * sum_b.total());
  std::printf("time / im2col+sgemm: registered %.2f, oneDNN nchw %.2f, oneDNN blocked %.2f\n",
              sum_r.total() / sum_m.total(), sum_p.total() / sum_m.total(),
              sum_b.total() / sum_m.total());
  return 0;
}
