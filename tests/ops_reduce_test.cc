// reduce_sum / reduce_mean / reduce_max (+ reduce_max_grad): every subset of
// axes of a rank-4 tensor against a naive reference, dim names, ties in the
// max gradient, finite-difference gradients, axis errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "grad_check.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/runtime/executor.h"

namespace meshflow {
namespace {

using testing::check_gradients;
using testing::GradCase;

using testing::S;

using testing::run_forward;

// Naive reduction: output index of each input element by dropping reduced dims.
std::vector<double> reduce_ref(const Tensor& x, const std::vector<int>& axes, OpKind kind) {
  const Shape& s = x.shape();
  std::vector<char> red(s.rank(), axes.empty() ? 1 : 0);
  for (int a : axes) red[a < 0 ? a + s.rank() : a] = 1;
  int64_t outputs = 1, count = 1;
  for (int i = 0; i < s.rank(); ++i) (red[i] ? count : outputs) *= s.size(i);
  std::vector<double> y(outputs, kind == OpKind::kReduceMax ? -INFINITY : 0.0);
  for (int64_t i = 0; i < x.numel(); ++i) {
    int64_t rest = i, o = 0, mul = 1;
    for (int d = s.rank() - 1; d >= 0; --d) {
      const int64_t idx = rest % s.size(d);
      rest /= s.size(d);
      if (!red[d]) {
        o += idx * mul;
        mul *= s.size(d);
      }
    }
    const double v = x.data<float>()[i];
    y[o] = kind == OpKind::kReduceMax ? std::max(y[o], v) : y[o] + v;
  }
  if (kind == OpKind::kReduceMean)
    for (double& v : y) v /= static_cast<double>(count);
  return y;
}

ValueId build_reduce(Builder& b, OpKind kind, ValueId x, std::vector<int64_t> axes, bool keep) {
  switch (kind) {
    case OpKind::kReduceSum:
      return b.reduce_sum(x, std::move(axes), keep);
    case OpKind::kReduceMean:
      return b.reduce_mean(x, std::move(axes), keep);
    default:
      return b.reduce_max(x, std::move(axes), keep);
  }
}

void expect_matches(const std::vector<float>& got, const std::vector<double>& want,
                    const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-5 * (1 + std::fabs(want[i]))) << what << " at " << i;
}

const OpKind kReduces[] = {OpKind::kReduceSum, OpKind::kReduceMean, OpKind::kReduceMax};

TEST(Reduce, EveryAxisSubsetMatchesNaive) {
  const Shape s = S({2, 3, 4, 5});
  Tensor xv = testing::random_tensor(s, 1);
  for (int mask = 0; mask < 16; ++mask) {
    // Subset `mask` (0 = the empty list = every dim); odd masks use negative axes.
    std::vector<int64_t> axes;
    std::vector<int> ref_axes;
    for (int d = 0; d < 4; ++d)
      if (mask & (1 << d)) {
        axes.push_back(mask % 2 ? d - 4 : d);
        ref_axes.push_back(d);
      }
    std::reverse(axes.begin(), axes.end());  // order of axes does not matter
    for (bool keep : {false, true})
      for (OpKind k : kReduces) {
        Graph g;
        Builder b(g);
        ValueId x = b.input("x", s);
        ValueId y = build_reduce(b, k, x, axes, keep);
        const std::string what =
            std::string(op_name(k)) + " mask " + std::to_string(mask) + (keep ? " keepdims" : "");
        auto got = run_forward(g, {y}, {{"x", xv}});
        expect_matches(got[0], reduce_ref(xv, ref_axes, k), what);
      }
  }
}

TEST(Reduce, LargeInputsSplitAcrossThreadsMatchNaive) {
  struct Case {
    Shape s;
    std::vector<int> axes;
  };
  const Case cases[] = {
      {S({300, 517}), {0}},       // columns
      {S({300, 517}), {1}},       // rows
      {S({300, 517}), {}},        // everything
      {S({40, 70, 33}), {1}},     // middle dim: columns under an outer kept dim
      {S({40, 70, 33}), {0, 2}},  // rows under an outer reduced dim
      {S({4, 1, 9000}), {2}},     // size-1 dim dropped
  };
  for (const Case& c : cases) {
    Tensor xv = testing::random_tensor(c.s, 2);
    for (OpKind k : kReduces) {
      Graph g;
      Builder b(g);
      ValueId x = b.input("x", c.s);
      ValueId y = build_reduce(b, k, x, std::vector<int64_t>(c.axes.begin(), c.axes.end()), false);
      auto got = run_forward(g, {y}, {{"x", xv}});
      expect_matches(got[0], reduce_ref(xv, c.axes, k),
                     std::string(op_name(k)) + " " + c.s.to_string());
    }
  }
}

TEST(Reduce, OutputKeepsNamesOfRemainingDims) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", Shape{{"batch", 2}, {"seq", 3}, {"hidden", 4}});
  EXPECT_EQ(g.shape(b.reduce_sum(x, {1})).to_string(), "[batch=2,hidden=4]");
  EXPECT_EQ(g.shape(b.reduce_mean(x, {-1}, true)).to_string(), "[batch=2,seq=3,hidden=1]");
  EXPECT_EQ(g.shape(b.reduce_max(x, {0, 2})).to_string(), "[seq=3]");
  EXPECT_EQ(g.shape(b.reduce_sum(x, {})).to_string(), "[]");
  EXPECT_EQ(g.shape(b.reduce_sum(x, {}, true)).to_string(), "[batch=1,seq=1,hidden=1]");
}

TEST(Reduce, ScalarAndSingleElementInputs) {
  for (const Shape& s : {Shape{}, S({1, 1})}) {
    for (OpKind k : kReduces) {
      Graph g;
      Builder b(g);
      ValueId x = b.input("x", s);
      ValueId y = build_reduce(b, k, x, {}, false);
      EXPECT_EQ(g.shape(y), Shape{});
      Tensor xv(s, DType::F32);
      xv.data<float>()[0] = -2.5f;
      EXPECT_EQ(run_forward(g, {y}, {{"x", xv}})[0][0], -2.5f) << op_name(k) << s.to_string();
    }
  }
  Graph g;
  Builder b(g);
  try {
    b.reduce_sum(b.input("x", Shape{}), {0}, false, "s");
    FAIL() << "expected an error";
  } catch (const StatusError& e) {
    EXPECT_NE(std::string(e.what()).find("(valid: x is a scalar: pass no axes)"), std::string::npos)
        << e.what();
  }
}

TEST(Reduce, MaxGradSplitsEvenlyAmongTies) {
  // x [2, 3]: row 0 has a two-way tie, row 1 a three-way tie.
  const float xs[] = {1, 3, 3, 2, 2, 2};
  for (int axis : {1, 0}) {
    Graph g;
    Builder b(g);
    const Shape s = S({2, 3});
    ValueId x = b.input("x", s);
    ValueId y = b.reduce_max(x, {axis});
    ValueId dy = b.input("dy", g.shape(y));
    Attrs at;
    at.axes = {axis};
    ValueId dx = b.op1(OpKind::kReduceMaxGrad, {x, y, dy}, at);
    Tensor xv(s, DType::F32), dyv(g.shape(y), DType::F32);
    std::copy(xs, xs + 6, xv.data<float>());
    for (int64_t i = 0; i < dyv.numel(); ++i) dyv.data<float>()[i] = 6.f * (i + 1);
    auto got = run_forward(g, {dx}, {{"x", xv}, {"dy", dyv}});
    // axis 1: maxima 3 (x2) and 2 (x3); axis 0: maxima 2, 3, 3 (column 0 unique).
    const std::vector<float> want =
        axis == 1 ? std::vector<float>{0, 3, 3, 4, 4, 4} : std::vector<float>{0, 12, 18, 6, 0, 0};
    EXPECT_EQ(got[0], want) << "axis " << axis;
  }
}

// Distinct values 0.1 apart (shuffled), so a finite-difference step never
// changes which element is the max.
Tensor distinct_values(const Shape& s) {
  Tensor t(s, DType::F32);
  std::vector<int64_t> idx(s.numel());
  std::iota(idx.begin(), idx.end(), 0);
  for (int64_t i = 0; i < s.numel(); ++i) std::swap(idx[i], idx[(i * 7919 + 13) % s.numel()]);
  for (int64_t i = 0; i < s.numel(); ++i) t.data<float>()[i] = 0.1f * idx[i] - 1.f;
  return t;
}

struct GradAxes {
  Shape s;
  std::vector<int64_t> axes;
  bool keepdims;
};

class ReduceGrad : public ::testing::TestWithParam<GradAxes> {};

TEST_P(ReduceGrad, MatchesFiniteDifferences) {
  const GradAxes& a = GetParam();
  for (OpKind k : kReduces) {
    GradCase c;
    c.params = {a.s};
    c.param_values = {distinct_values(a.s)};
    c.build = [k, a](Builder& b, const std::vector<ValueId>& p) {
      return build_reduce(b, k, p[0], a.axes, a.keepdims);
    };
    EXPECT_TRUE(check_gradients(c)) << op_name(k);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Axes, ReduceGrad,
    ::testing::Values(GradAxes{S({6}), {0}, false},            // rank 1 to a scalar
                      GradAxes{S({6}), {}, true},              // rank 1, keepdims
                      GradAxes{S({2, 3, 4}), {}, false},       // everything
                      GradAxes{S({2, 3, 4}), {0}, false},      // leading: no reshape needed
                      GradAxes{S({2, 3, 4}), {0, 1}, false},   // leading pair
                      GradAxes{S({2, 3, 4}), {1}, true},       // middle, keepdims
                      GradAxes{S({2, 3, 4}), {-1}, true},      // last, keepdims
                      GradAxes{S({2, 3, 4}), {-1}, false},     // last: reshape then broadcast
                      GradAxes{S({2, 3, 4}), {0, -1}, false},  // non-contiguous axes
                      GradAxes{S({2, 3, 4}), {1}, false}));    // middle

TEST(Reduce, AxisOutOfRangeIsAClearError) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", Shape{{"batch", 2}, {"seq", 3}, {"hidden", 4}});
  try {
    b.reduce_sum(x, {3}, false, "total");
    FAIL() << "expected an error";
  } catch (const StatusError& e) {
    EXPECT_NE(std::string(e.what()).find("reduce_sum 'total': axis 3 is out of range for "
                                         "x[batch=2,seq=3,hidden=4] of rank 3 (valid: -3..2)"),
              std::string::npos)
        << e.what();
  }
}

TEST(Reduce, RepeatedAxisIsAClearError) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", Shape{{"batch", 2}, {"seq", 3}});
  try {
    b.reduce_max(x, {1, -1}, false, "peak");
    FAIL() << "expected an error";
  } catch (const StatusError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "reduce_max 'peak': axis 1 of x[batch=2,seq=3] appears twice in axes (1, -1)"),
              std::string::npos)
        << e.what();
  }
}

TEST(Reduce, MaxGradWithWrongDyShapeIsAClearError) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", Shape{{"batch", 2}, {"seq", 3}});
  ValueId y = b.reduce_max(x, {1});
  ValueId dy = b.input("dy", Shape{{"seq", 3}});
  Attrs at;
  at.axes = {1};
  try {
    b.op1(OpKind::kReduceMaxGrad, {x, y, dy}, at, "g");
    FAIL() << "expected an error";
  } catch (const StatusError& e) {
    EXPECT_NE(std::string(e.what()).find("reduce_max_grad 'g': dy[seq=3] must be "
                                         "x[batch=2,seq=3] reduced over axes (1), i.e. [batch=2]"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace meshflow
