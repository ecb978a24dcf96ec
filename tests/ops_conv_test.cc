// conv2d and its gradients: shape rules and their errors, the forward and
// both backward kernels against double-precision naive references (stride,
// padding, dilation, groups, rectangular kernels, the 1x1 fast path),
// finite-difference gradients, and agreement across thread counts.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <string>
#include <vector>

#include "grad_check.h"
#include "meshflow/kernels/cpu/conv.h"
#include "meshflow/ops/builder.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/runtime/executor.h"

namespace meshflow {
namespace {

using testing::check_gradients;
using testing::GradCase;
using testing::random_tensor;

struct ConvCase {
  int64_t N, C, H, W, O, KH, KW;
  Conv2dOpts o;
  std::string label() const {
    return "N" + std::to_string(N) + " C" + std::to_string(C) + " " + std::to_string(H) + "x" +
           std::to_string(W) + " O" + std::to_string(O) + " k" + std::to_string(KH) + "x" +
           std::to_string(KW) + " s" + std::to_string(o.stride[0]) + "," +
           std::to_string(o.stride[1]) + " p" + std::to_string(o.padding[0]) + "," +
           std::to_string(o.padding[1]) + " d" + std::to_string(o.dilation[0]) + "," +
           std::to_string(o.dilation[1]) + " g" + std::to_string(o.groups);
  }
  Shape x() const { return Shape{{"batch", N}, {"channels", C}, {"height", H}, {"width", W}}; }
  Shape w() const { return Shape{{"out", O}, {"channels", C / o.groups}, {"kh", KH}, {"kw", KW}}; }
  int64_t out(int d) const {
    const int64_t in = d == 0 ? H : W, k = d == 0 ? KH : KW;
    return (in + 2 * o.padding[d] - o.dilation[d] * (k - 1) - 1) / o.stride[d] + 1;
  }
};

const std::vector<ConvCase>& cases() {
  static const std::vector<ConvCase> c = {
      {2, 3, 7, 6, 4, 3, 3, {{1, 1}, {1, 1}, {1, 1}, 1}},    // same padding
      {2, 4, 9, 8, 6, 3, 3, {{2, 2}, {0, 0}, {2, 2}, 1}},    // stride 2, dilation 2
      {3, 4, 6, 7, 6, 3, 2, {{2, 1}, {1, 0}, {1, 1}, 2}},    // groups 2, rectangular kernel
      {2, 6, 5, 5, 6, 3, 3, {{1, 1}, {1, 1}, {1, 1}, 6}},    // depthwise
      {2, 5, 4, 6, 3, 1, 1, {{1, 1}, {0, 0}, {1, 1}, 1}},    // 1x1: the direct path
      {2, 4, 8, 8, 4, 1, 1, {{2, 2}, {0, 0}, {1, 1}, 1}},    // 1x1 stride 2 (ResNet downsample)
      {1, 3, 11, 11, 5, 7, 7, {{2, 2}, {3, 3}, {1, 1}, 1}},  // ResNet's 7x7 stem
  };
  return c;
}

// y[n][o][oh][ow] = sum x[n][g Cg + c][oh s - p + i d][ow s - p + j d] w[o][c][i][j]
std::vector<double> naive_conv(const ConvCase& k, const Tensor& x, const Tensor& w) {
  const int64_t OH = k.out(0), OW = k.out(1), G = k.o.groups, Cg = k.C / G, Og = k.O / G;
  std::vector<double> y(k.N * k.O * OH * OW, 0.0);
  const float* xp = x.data<float>();
  const float* wp = w.data<float>();
  for (int64_t n = 0; n < k.N; ++n)
    for (int64_t o = 0; o < k.O; ++o)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double acc = 0;
          const int64_t g = o / Og;
          for (int64_t c = 0; c < Cg; ++c)
            for (int64_t i = 0; i < k.KH; ++i)
              for (int64_t j = 0; j < k.KW; ++j) {
                const int64_t ih = oh * k.o.stride[0] - k.o.padding[0] + i * k.o.dilation[0];
                const int64_t iw = ow * k.o.stride[1] - k.o.padding[1] + j * k.o.dilation[1];
                if (ih < 0 || ih >= k.H || iw < 0 || iw >= k.W) continue;
                acc += double(xp[((n * k.C + g * Cg + c) * k.H + ih) * k.W + iw]) *
                       double(wp[((o * Cg + c) * k.KH + i) * k.KW + j]);
              }
          y[((n * k.O + o) * OH + oh) * OW + ow] = acc;
        }
  return y;
}

// dx and dw of loss = sum(y * dy), naively (the transposes of naive_conv).
void naive_grads(const ConvCase& k, const Tensor& x, const Tensor& w, const Tensor& dy,
                 std::vector<double>* dx, std::vector<double>* dw) {
  const int64_t OH = k.out(0), OW = k.out(1), G = k.o.groups, Cg = k.C / G, Og = k.O / G;
  dx->assign(x.numel(), 0.0);
  dw->assign(w.numel(), 0.0);
  const float* xp = x.data<float>();
  const float* wp = w.data<float>();
  const float* gp = dy.data<float>();
  for (int64_t n = 0; n < k.N; ++n)
    for (int64_t o = 0; o < k.O; ++o)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          const double gy = gp[((n * k.O + o) * OH + oh) * OW + ow];
          const int64_t g = o / Og;
          for (int64_t c = 0; c < Cg; ++c)
            for (int64_t i = 0; i < k.KH; ++i)
              for (int64_t j = 0; j < k.KW; ++j) {
                const int64_t ih = oh * k.o.stride[0] - k.o.padding[0] + i * k.o.dilation[0];
                const int64_t iw = ow * k.o.stride[1] - k.o.padding[1] + j * k.o.dilation[1];
                if (ih < 0 || ih >= k.H || iw < 0 || iw >= k.W) continue;
                const int64_t xi = ((n * k.C + g * Cg + c) * k.H + ih) * k.W + iw;
                const int64_t wi = ((o * Cg + c) * k.KH + i) * k.KW + j;
                (*dx)[xi] += gy * wp[wi];
                (*dw)[wi] += gy * xp[xi];
              }
        }
}

double max_rel(const float* got, const std::vector<double>& want) {
  double scale = 1e-6, err = 0;
  for (double v : want) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < want.size(); ++i) err = std::max(err, std::fabs(got[i] - want[i]));
  return err / scale;
}

// Runs conv2d, conv2d_grad_input and conv2d_grad_weight on (x, w, dy).
struct Ran {
  std::vector<float> y, dx, dw;
};
Ran run_conv(const ConvCase& k, const Tensor& x, const Tensor& w, const Tensor& dy) {
  Graph g;
  Builder b(g);
  const ValueId xv = b.input("x", k.x()), wv = b.input("w", k.w());
  const ValueId y = b.conv2d(xv, wv, k.o, "conv");
  const ValueId dyv = b.input("dy", g.shape(y));
  Attrs a;
  a.stride = k.o.stride, a.padding = k.o.padding, a.dilation = k.o.dilation, a.groups = k.o.groups;
  a.shape = k.x();
  const ValueId dx = b.op1(OpKind::kConv2dGradInput, {dyv, wv}, a, "dx");
  a.shape = k.w();
  const ValueId dw = b.op1(OpKind::kConv2dGradWeight, {dyv, xv}, a, "dw");
  Executor ex(g, {.seed = 0, .fetch = {y, dx, dw}, .run_elsewhere = {}, .offload = {}});
  EXPECT_TRUE(ex.feed("x", x).is_ok());
  EXPECT_TRUE(ex.feed("w", w).is_ok());
  EXPECT_TRUE(ex.feed("dy", dy).is_ok());
  ex.run(ex.eval_order());
  Ran r;
  r.y.assign(ex.data_f(y), ex.data_f(y) + g.shape(y).numel());
  r.dx.assign(ex.data_f(dx), ex.data_f(dx) + g.shape(dx).numel());
  r.dw.assign(ex.data_f(dw), ex.data_f(dw) + g.shape(dw).numel());
  return r;
}

TEST(OpsConv, ShapesFollowTorch) {
  for (const ConvCase& k : cases()) {
    Graph g;
    Builder b(g);
    const ValueId y = b.conv2d(b.input("x", k.x()), b.input("w", k.w()), k.o);
    EXPECT_EQ(g.shape(y).to_string(),
              Shape({{"batch", k.N}, {"out", k.O}, {"height", k.out(0)}, {"width", k.out(1)}})
                  .to_string())
        << k.label();
  }
}

TEST(OpsConv, KernelsMatchNaiveReferences) {
  for (const ConvCase& k : cases()) {
    SCOPED_TRACE(k.label());
    const Tensor x = random_tensor(k.x(), 1), w = random_tensor(k.w(), 2);
    const Tensor dy = random_tensor(
        Shape{{"batch", k.N}, {"out", k.O}, {"height", k.out(0)}, {"width", k.out(1)}}, 3);
    const Ran r = run_conv(k, x, w, dy);
    std::vector<double> dx, dw;
    naive_grads(k, x, w, dy, &dx, &dw);
    EXPECT_LT(max_rel(r.y.data(), naive_conv(k, x, w)), 1e-5);
    EXPECT_LT(max_rel(r.dx.data(), dx), 1e-5);
    EXPECT_LT(max_rel(r.dw.data(), dw), 1e-5);
  }
}

// The im2col + SGEMM kernels (the path without oneDNN) called directly, so
// both paths stay checked whichever one is registered.
TEST(OpsConv, Im2colKernelsMatchNaiveReferences) {
  for (const ConvCase& k : cases()) {
    SCOPED_TRACE(k.label());
    const Tensor x = random_tensor(k.x(), 1), w = random_tensor(k.w(), 2);
    const Shape ys{{"batch", k.N}, {"out", k.O}, {"height", k.out(0)}, {"width", k.out(1)}};
    const Tensor dy = random_tensor(ys, 3);
    Graph g;
    Builder b(g);
    const ValueId xv = b.input("x", k.x()), wv = b.input("w", k.w());
    const ValueId y = b.conv2d(xv, wv, k.o, "conv");
    const ValueId dyv = b.input("dy", ys);
    Attrs a = g.producer(y).attrs;
    a.shape = k.x();
    const ValueId dx = b.op1(OpKind::kConv2dGradInput, {dyv, wv}, a, "dx");
    a.shape = k.w();
    const ValueId dw = b.op1(OpKind::kConv2dGradWeight, {dyv, xv}, a, "dw");
    std::vector<float> Y(ys.numel()), DX(x.numel()), DW(w.numel());
    auto call = [&](ValueId out, std::vector<void*> in, float* o) {
      KernelCall kc{g, g.producer(out), std::move(in), {o}};
      cpu::im2col_conv_kernel(g.producer(out).kind)(kc);
    };
    void* xp = const_cast<float*>(x.data<float>());
    void* wp = const_cast<float*>(w.data<float>());
    void* dyp = const_cast<float*>(dy.data<float>());
    call(y, {xp, wp}, Y.data());
    call(dx, {dyp, wp}, DX.data());
    call(dw, {dyp, xp}, DW.data());
    std::vector<double> ndx, ndw;
    naive_grads(k, x, w, dy, &ndx, &ndw);
    EXPECT_LT(max_rel(Y.data(), naive_conv(k, x, w)), 1e-5);
    EXPECT_LT(max_rel(DX.data(), ndx), 1e-5);
    EXPECT_LT(max_rel(DW.data(), ndw), 1e-5);
  }
}

TEST(OpsConv, DeterministicAndThreadCountIndependent) {
  const ConvCase k = cases()[2];
  const Tensor x = random_tensor(k.x(), 4), w = random_tensor(k.w(), 5);
  const Tensor dy = random_tensor(
      Shape{{"batch", k.N}, {"out", k.O}, {"height", k.out(0)}, {"width", k.out(1)}}, 6);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const Ran one = run_conv(k, x, w, dy);
  omp_set_num_threads(2);
  const Ran two = run_conv(k, x, w, dy);
  const Ran again = run_conv(k, x, w, dy);
  omp_set_num_threads(saved);
  // Run to run at one thread count: bit for bit (resume and replay rely on it).
  EXPECT_EQ(two.y, again.y);
  EXPECT_EQ(two.dx, again.dx);
  EXPECT_EQ(two.dw, again.dw);
  // Across thread counts the sums may group differently: f32 rounding only.
  for (const auto& [a, b] :
       {std::pair{&one.y, &two.y}, std::pair{&one.dx, &two.dx}, std::pair{&one.dw, &two.dw}})
    for (size_t i = 0; i < a->size(); ++i)
      EXPECT_NEAR((*a)[i], (*b)[i], 1e-5 * (1 + std::fabs((*a)[i])));
}

TEST(OpsConv, FiniteDifferenceGradients) {
  for (const ConvCase& k : cases()) {
    if (k.KH == 7) continue;  // the stem is large for central differences; covered above
    SCOPED_TRACE(k.label());
    GradCase c;
    c.params = {k.x(), k.w()};
    c.build = [&](Builder& b, const std::vector<ValueId>& p) { return b.conv2d(p[0], p[1], k.o); };
    EXPECT_TRUE(check_gradients(c));
  }
}

std::string conv_error(const Shape& x, const Shape& w, Conv2dOpts o) {
  Graph g;
  Builder b(g);
  try {
    b.conv2d(b.input("x", x), b.input("w", w), o, "c1");
  } catch (const StatusError& e) {
    return e.status().message();
  }
  return "";
}

TEST(OpsConv, ErrorsNameTheSizesAndWhatIsValid) {
  const Shape x{{"batch", 2}, {"channels", 4}, {"height", 5}, {"width", 5}};
  std::string m = conv_error(x, Shape{{"out", 3}, {"channels", 4}, {"kh", 7}, {"kw", 3}}, {});
  EXPECT_NE(m.find("conv2d 'c1': the kernel spans 7 rows"), std::string::npos) << m;
  EXPECT_NE(m.find("the padded input has 5"), std::string::npos) << m;
  m = conv_error(x, Shape{{"out", 3}, {"channels", 2}, {"kh", 3}, {"kw", 3}}, {.groups = 2});
  EXPECT_NE(m.find("groups=2 must divide"), std::string::npos) << m;
  m = conv_error(x, Shape{{"out", 4}, {"channels", 3}, {"kh", 3}, {"kw", 3}}, {});
  EXPECT_NE(m.find("takes 3 channels per group"), std::string::npos) << m;
  m = conv_error(Shape{{"batch", 2}, {"channels", 4}},
                 Shape{{"o", 4}, {"c", 4}, {"kh", 1}, {"kw", 1}}, {});
  EXPECT_NE(m.find("must have 4 dims (batch, channels, height, width)"), std::string::npos) << m;
  m = conv_error(x, Shape{{"out", 4}, {"channels", 4}, {"kh", 3}, {"kw", 3}}, {.stride = {0, 1}});
  EXPECT_NE(m.find("stride and dilation must be >= 1"), std::string::npos) << m;
}

}  // namespace
}  // namespace meshflow
