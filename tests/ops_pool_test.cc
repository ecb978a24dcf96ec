// max_pool2d / avg_pool2d and their gradients: shapes, kernels against naive
// double references (stride, padding, dilation, rectangular windows),
// finite-difference gradients, and errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "grad_check.h"
#include "meshflow/ops/builder.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/runtime/executor.h"

namespace meshflow {
namespace {

using testing::check_gradients;
using testing::GradCase;
using testing::random_tensor;

struct PoolCase {
  int64_t N, C, H, W;
  Pool2dOpts o;
  Shape x() const { return Shape{{"batch", N}, {"channels", C}, {"height", H}, {"width", W}}; }
  int64_t stride(int d) const { return o.stride[d] > 0 ? o.stride[d] : o.kernel[d]; }
  int64_t out(int d) const {
    const int64_t in = d == 0 ? H : W;
    return (in + 2 * o.padding[d] - o.dilation[d] * (o.kernel[d] - 1) - 1) / stride(d) + 1;
  }
  Shape y() const {
    return Shape{{"batch", N}, {"channels", C}, {"height", out(0)}, {"width", out(1)}};
  }
};

const std::vector<PoolCase>& cases() {
  static const std::vector<PoolCase> c = {
      {2, 3, 8, 8, {{2, 2}, {0, 0}, {0, 0}, {1, 1}}},  // 2x2 / 2
      {2, 2, 9, 7, {{3, 3}, {2, 2}, {1, 1}, {1, 1}}},  // ResNet's stem pool: 3x3 / 2, pad 1
      {1, 3, 7, 8, {{3, 2}, {1, 2}, {1, 0}, {1, 1}}},  // rectangular, overlapping
      {1, 2, 9, 9, {{2, 2}, {1, 1}, {0, 1}, {2, 2}}},  // dilated (max only)
  };
  return c;
}

// Naive max / avg over each window, and dx of sum(y * dy).
void naive(const PoolCase& k, bool max, const Tensor& x, const Tensor& dy, std::vector<double>* y,
           std::vector<double>* dx) {
  const int64_t OH = k.out(0), OW = k.out(1);
  y->assign(k.N * k.C * OH * OW, 0.0);
  dx->assign(x.numel(), 0.0);
  const float* xp = x.data<float>();
  const float* gp = dy.data<float>();
  for (int64_t p = 0; p < k.N * k.C; ++p)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        double best = -std::numeric_limits<double>::infinity(), sum = 0;
        int64_t at = -1;
        for (int64_t i = 0; i < k.o.kernel[0]; ++i)
          for (int64_t j = 0; j < k.o.kernel[1]; ++j) {
            const int64_t ih = oh * k.stride(0) - k.o.padding[0] + i * k.o.dilation[0];
            const int64_t iw = ow * k.stride(1) - k.o.padding[1] + j * k.o.dilation[1];
            if (ih < 0 || ih >= k.H || iw < 0 || iw >= k.W) continue;
            const int64_t xi = (p * k.H + ih) * k.W + iw;
            sum += xp[xi];
            if (at < 0 || xp[xi] > best) best = xp[xi], at = xi;
          }
        const int64_t yi = (p * OH + oh) * OW + ow;
        const double area = double(k.o.kernel[0] * k.o.kernel[1]);
        (*y)[yi] = max ? best : sum / area;
        for (int64_t i = 0; i < k.o.kernel[0] && !max; ++i)
          for (int64_t j = 0; j < k.o.kernel[1]; ++j) {
            const int64_t ih = oh * k.stride(0) - k.o.padding[0] + i;
            const int64_t iw = ow * k.stride(1) - k.o.padding[1] + j;
            if (ih >= 0 && ih < k.H && iw >= 0 && iw < k.W)
              (*dx)[(p * k.H + ih) * k.W + iw] += gp[yi] / area;
          }
        if (max) (*dx)[at] += gp[yi];
      }
}

double max_rel(const float* got, const std::vector<double>& want) {
  double scale = 1e-6, err = 0;
  for (double v : want) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < want.size(); ++i) err = std::max(err, std::fabs(got[i] - want[i]));
  return err / scale;
}

TEST(OpsPool, KernelsMatchNaiveReferences) {
  for (bool max : {true, false}) {
    for (const PoolCase& k : cases()) {
      if (!max && k.o.dilation[0] > 1) continue;
      SCOPED_TRACE(std::string(max ? "max " : "avg ") + k.x().to_string() + " -> " +
                   k.y().to_string());
      Graph g;
      Builder b(g);
      const ValueId xv = b.input("x", k.x());
      const ValueId y = max ? b.max_pool2d(xv, k.o) : b.avg_pool2d(xv, k.o);
      ASSERT_TRUE(g.shape(y).same_sizes(k.y())) << g.shape(y).to_string();
      const ValueId dyv = b.input("dy", k.y());
      Attrs a = g.producer(y).attrs;
      ValueId dx;
      if (max) {
        dx = b.op1(OpKind::kMaxPool2dGrad, {dyv, xv}, a, "dx");
      } else {
        a.shape = k.x();
        dx = b.op1(OpKind::kAvgPool2dGrad, {dyv}, a, "dx");
      }
      // Random values, then values from {-1, 0, 1}: ties in most windows,
      // where the gradient goes to the first maximum in row-major order.
      for (bool ties : {false, true}) {
        SCOPED_TRACE(ties ? "ties" : "distinct");
        Tensor x = random_tensor(k.x(), 1);
        if (ties)
          for (int64_t i = 0; i < x.numel(); ++i)
            x.data<float>()[i] = std::round(std::clamp(x.data<float>()[i] * 2.f, -1.f, 1.f));
        const Tensor dy = random_tensor(k.y(), 2);
        Executor ex(g, {.seed = 0, .fetch = {y, dx}, .run_elsewhere = {}, .offload = {}});
        ASSERT_TRUE(ex.feed("x", x).is_ok());
        ASSERT_TRUE(ex.feed("dy", dy).is_ok());
        ex.run(ex.eval_order());
        std::vector<double> want_y, want_dx;
        naive(k, max, x, dy, &want_y, &want_dx);
        EXPECT_LT(max_rel(ex.data_f(y), want_y), 1e-6);
        EXPECT_LT(max_rel(ex.data_f(dx), want_dx), 1e-6);
      }
    }
  }
}

TEST(OpsPool, FiniteDifferenceGradients) {
  for (bool max : {true, false}) {
    for (const PoolCase& k : cases()) {
      if (!max && k.o.dilation[0] > 1) continue;
      GradCase c;
      c.params = {k.x()};
      // Distinct values 0.1 apart (shuffled): no window's maximum is within a
      // finite-difference step of another element.
      Tensor x(k.x(), DType::F32);
      std::vector<float> v(static_cast<size_t>(x.numel()));
      std::iota(v.begin(), v.end(), 0.f);
      std::shuffle(v.begin(), v.end(), std::mt19937(5));
      for (size_t i = 0; i < v.size(); ++i) x.data<float>()[i] = 0.1f * v[i];
      c.param_values = {x};
      c.build = [&](Builder& b, const std::vector<ValueId>& p) {
        return max ? b.max_pool2d(p[0], k.o) : b.avg_pool2d(p[0], k.o);
      };
      EXPECT_TRUE(check_gradients(c)) << (max ? "max " : "avg ") << k.x().to_string();
    }
  }
}

// A NaN in a window is that window's maximum, as in PyTorch, and the
// gradient goes to it; the windows without one are untouched. The forward
// pools rows then columns, the backward finds each window's first maximum:
// they agree.
TEST(OpsPool, MaxPoolPropagatesNaN) {
  const Shape xs{{"batch", 1}, {"channels", 2}, {"height", 5}, {"width", 6}};
  Graph g;
  Builder b(g);
  const ValueId xv = b.input("x", xs);
  const ValueId y = b.max_pool2d(xv, {{3, 3}, {2, 2}, {1, 1}, {1, 1}});
  const ValueId dyv = b.input("dy", g.shape(y));
  const ValueId dx = b.op1(OpKind::kMaxPool2dGrad, {dyv, xv}, g.producer(y).attrs, "dx");
  Tensor x = random_tensor(xs, 3);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  x.data<float>()[2 * 6 + 3] = nan;  // plane 0, row 2, column 3
  x.data<float>()[30 + 0] = nan;     // plane 1, row 0, column 0 (a padded corner)
  Tensor dy(g.shape(y), DType::F32);
  for (int64_t i = 0; i < dy.numel(); ++i) dy.data<float>()[i] = 1.f;
  Executor ex(g, {.seed = 0, .fetch = {y, dx}, .run_elsewhere = {}, .offload = {}});
  ASSERT_TRUE(ex.feed("x", x).is_ok());
  ASSERT_TRUE(ex.feed("dy", dy).is_ok());
  ex.run(ex.eval_order());
  const float* out = ex.data_f(y);  // [1, 2, 3, 3]
  const float* grad = ex.data_f(dx);
  for (int64_t p = 0; p < 2; ++p)
    for (int64_t oh = 0; oh < 3; ++oh)
      for (int64_t ow = 0; ow < 3; ++ow) {
        // Windows rows 2oh-1..2oh+1, columns 2ow-1..2ow+1.
        const bool has_nan = p == 0 ? (oh == 1 && (ow == 1 || ow == 2)) : (oh == 0 && ow == 0);
        EXPECT_EQ(std::isnan(out[(p * 3 + oh) * 3 + ow]), has_nan) << p << " " << oh << " " << ow;
      }
  EXPECT_EQ(grad[2 * 6 + 3], 2.f);  // both windows that hold it
  EXPECT_EQ(grad[30 + 0], 1.f);
}

std::string pool_error(const Shape& x, Pool2dOpts o, bool max = true) {
  Graph g;
  Builder b(g);
  try {
    const ValueId in = b.input("x", x);
    if (max)
      b.max_pool2d(in, o, "p");
    else
      b.avg_pool2d(in, o, "p");
  } catch (const StatusError& e) {
    return e.status().message();
  }
  return "";
}

TEST(OpsPool, ErrorsNameTheSizesAndWhatIsValid) {
  const Shape x{{"batch", 1}, {"channels", 2}, {"height", 4}, {"width", 4}};
  std::string m = pool_error(x, {.kernel = {5, 2}});
  EXPECT_NE(m.find("max_pool2d 'p': the window spans 5 along height but the padded input has 4"),
            std::string::npos)
      << m;
  m = pool_error(x, {.kernel = {3, 3}, .stride = {1, 1}, .padding = {2, 0}});
  EXPECT_NE(m.find("padding 2 along height is more than half the window (3); use at most 1"),
            std::string::npos)
      << m;
  m = pool_error(x, {.kernel = {2, 2}, .stride = {0, 0}, .padding = {0, 0}, .dilation = {2, 1}},
                 false);
  EXPECT_NE(m.find("average pooling has no dilation"), std::string::npos) << m;
  m = pool_error(Shape{{"batch", 1}, {"channels", 2}}, {});
  EXPECT_NE(m.find("must have 4 dims"), std::string::npos) << m;
}

}  // namespace
}  // namespace meshflow
