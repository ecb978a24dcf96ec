// softmax / log_softmax / cross_entropy / correct_count: forward and backward
// kernels against double references, finite-difference gradients (ignored
// targets included), shape errors and the out-of-range target check.
#include <gtest/gtest.h>

#include <cmath>

#include "grad_check.h"
#include "meshflow/autodiff/autodiff.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/ops/verify.h"
#include "meshflow/runtime/executor.h"

namespace meshflow {
namespace {

using testing::check_gradients;
using testing::GradCase;

using testing::S;

using testing::run_forward;

Tensor targets_tensor(const Shape& s, const std::vector<int32_t>& v) {
  Tensor t(s, DType::I32);
  EXPECT_EQ(t.numel(), static_cast<int64_t>(v.size()));
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

// Row logsumexp in double.
double lse_ref(const float* x, int64_t v) {
  double m = x[0];
  for (int64_t j = 1; j < v; ++j) m = std::max(m, double(x[j]));
  double s = 0;
  for (int64_t j = 0; j < v; ++j) s += std::exp(x[j] - m);
  return m + std::log(s);
}

// |got - want| <= tol * (1 + |want|), or <= atol + tol * |want| when atol is given.
void expect_close(const std::vector<float>& got, const std::vector<double>& want, double tol,
                  const std::string& what, double atol = -1) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i)
    if (!(std::fabs(got[i] - want[i]) <= (atol < 0 ? tol : atol) + tol * std::fabs(want[i]))) {
      ++bad;
      ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", want " << want[i];
    }
}

// Logits with a large offset (stability) and, for wide rows, a max that grows
// from chunk to chunk (exercises the online rescale) and sits in the last chunk.
Tensor logits_tensor(const Shape& s, uint64_t seed) {
  Tensor t = testing::random_tensor(s, seed, 2.f);
  const int64_t v = s.size(-1);
  for (int64_t i = 0; i < t.numel(); ++i) {
    float& x = t.data<float>()[i];
    if ((i / v) % 2 == 1) x += 1000.f;
    if (v > 1000) x += 8.f * static_cast<float>(i % v) / static_cast<float>(v);
  }
  return t;
}

TEST(Softmax, ForwardMatchesDoubleReference) {
  for (const Shape& s : {S({5}), S({2, 3, 7}), S({4, 3000}), S({600, 130})}) {
    Graph g;
    Builder b(g);
    ValueId x = b.input("x", s);
    ValueId y = b.softmax(x);
    ValueId ly = b.log_softmax(x);
    EXPECT_EQ(g.shape(y), s);
    Tensor xv = logits_tensor(s, 1);
    auto got = run_forward(g, {y, ly}, {{"x", xv}});
    const int64_t v = s.size(-1);
    std::vector<double> want_y, want_ly;
    for (int64_t r = 0; r < s.numel() / v; ++r) {
      const float* xr = xv.data<float>() + r * v;
      const double l = lse_ref(xr, v);
      for (int64_t j = 0; j < v; ++j) {
        want_y.push_back(std::exp(xr[j] - l));
        want_ly.push_back(xr[j] - l);
      }
    }
    expect_close(got[0], want_y, 1e-5, "softmax " + s.to_string());
    // log_softmax of logits near 1000: x - lse loses the low bits of x (ulp 6e-5).
    expect_close(got[1], want_ly, 2e-7 * 1000, "log_softmax " + s.to_string());
  }
}

TEST(Softmax, GradKernelsMatchDoubleReference) {
  for (const Shape& s : {S({6}), S({3, 2, 9}), S({2, 2500})}) {
    Graph g;
    Builder b(g);
    ValueId x = b.input("x", s);
    ValueId dy = b.input("dy", s);
    ValueId y = b.softmax(x), ly = b.log_softmax(x);
    ValueId dx = b.op1(OpKind::kSoftmaxGrad, {y, dy});
    ValueId ldx = b.op1(OpKind::kLogSoftmaxGrad, {ly, dy});
    Tensor xv = testing::random_tensor(s, 2), dyv = testing::random_tensor(s, 3);
    auto got = run_forward(g, {y, ly, dx, ldx}, {{"x", xv}, {"dy", dyv}});
    const int64_t v = s.size(-1);
    std::vector<double> want_dx, want_ldx;
    for (int64_t r = 0; r < s.numel() / v; ++r) {
      const float* yr = got[0].data() + r * v;
      const float* lyr = got[1].data() + r * v;
      const float* dyr = dyv.data<float>() + r * v;
      double dot = 0, sum = 0;
      for (int64_t j = 0; j < v; ++j) {
        dot += double(dyr[j]) * yr[j];
        sum += dyr[j];
      }
      for (int64_t j = 0; j < v; ++j) {
        want_dx.push_back(yr[j] * (dyr[j] - dot));
        want_ldx.push_back(dyr[j] - std::exp(double(lyr[j])) * sum);
      }
    }
    expect_close(got[2], want_dx, 1e-5, "softmax_grad " + s.to_string());
    expect_close(got[3], want_ldx, 1e-5, "log_softmax_grad " + s.to_string());
  }
}

TEST(Softmax, GradientsMatchFiniteDifferences) {
  for (const Shape& s : {S({5}), S({2, 3, 4})}) {
    for (OpKind k : {OpKind::kSoftmax, OpKind::kLogSoftmax}) {
      GradCase c;
      c.params = {s};
      c.build = [k](Builder& b, const std::vector<ValueId>& p) { return b.op1(k, {p[0]}); };
      EXPECT_TRUE(check_gradients(c)) << op_name(k) << " " << s.to_string();
    }
  }
}

TEST(Softmax, ScalarInputIsAClearError) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", Shape{});
  try {
    b.softmax(x, "attn_probs");
    FAIL() << "expected an error";
  } catch (const StatusError& e) {
    EXPECT_NE(std::string(e.what()).find("softmax 'attn_probs': x[] must have at least 1 dim"),
              std::string::npos)
        << e.what();
  }
}

// loss and lse of cross_entropy in double.
struct CeRef {
  double loss = 0;
  std::vector<double> lse;
};
CeRef cross_entropy_ref(const Tensor& logits, const std::vector<int32_t>& t) {
  const int64_t v = logits.shape().size(-1), rows = logits.numel() / v;
  CeRef ref;
  int count = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = logits.data<float>() + r * v;
    ref.lse.push_back(lse_ref(xr, v));
    if (t[r] < 0) continue;
    ref.loss += ref.lse.back() - xr[t[r]];
    ++count;
  }
  ref.loss = count ? ref.loss / count : 0;
  return ref;
}

TEST(CrossEntropy, ForwardMatchesDoubleReferenceAndIgnoresNegativeTargets) {
  struct Case {
    Shape logits;
    std::vector<int32_t> targets;
  };
  const Case cases[] = {
      {Shape{{"vocab", 7}}, {3}},
      {Shape{{"batch", 2}, {"seq", 3}, {"vocab", 7}}, {0, 6, -100, 2, -1, 5}},
      {Shape{{"pos", 4}, {"vocab", 3000}}, {2999, -100, 0, 1234}},
      {Shape{{"pos", 3}, {"vocab", 5}}, {-1, -100, -7}},  // nothing valid: loss 0
  };
  for (const Case& k : cases) {
    Graph g;
    Builder b(g);
    ValueId x = b.input("logits", k.logits);
    const Shape rows = k.logits.slice(0, k.logits.rank() - 1);
    ValueId t = b.input("targets", rows, DType::I32);
    auto outs = b.op(OpKind::kCrossEntropy, {x, t});
    EXPECT_EQ(g.shape(outs[0]), Shape{});
    EXPECT_EQ(g.shape(outs[1]), rows);
    Tensor xv = logits_tensor(k.logits, 4);
    auto got = run_forward(g, outs, {{"logits", xv}, {"targets", targets_tensor(rows, k.targets)}});
    CeRef ref = cross_entropy_ref(xv, k.targets);
    expect_close(got[0], {ref.loss}, 1e-5, "loss " + k.logits.to_string());
    expect_close(got[1], ref.lse, 1e-6, "lse " + k.logits.to_string());
  }
}

TEST(CrossEntropy, GradKernelMatchesDoubleReference) {
  const Shape s{{"pos", 5}, {"vocab", 2100}};
  const std::vector<int32_t> tv = {7, -100, 2099, 0, 1000};
  Graph g;
  Builder b(g);
  ValueId x = b.input("logits", s);
  ValueId t = b.input("targets", Shape{{"pos", 5}}, DType::I32);
  ValueId dloss = b.input("dloss", Shape{});
  auto outs = b.op(OpKind::kCrossEntropy, {x, t});
  ValueId dx = b.op1(OpKind::kCrossEntropyGrad, {x, t, outs[1], dloss});
  Tensor xv = logits_tensor(s, 5);
  auto got = run_forward(g, {dx},
                         {{"logits", xv},
                          {"targets", targets_tensor(Shape{{"pos", 5}}, tv)},
                          {"dloss", Tensor::scalar(2.5f)}});
  std::vector<double> want;
  for (int64_t r = 0; r < 5; ++r) {
    const float* xr = xv.data<float>() + r * 2100;
    const double l = lse_ref(xr, 2100);
    for (int64_t j = 0; j < 2100; ++j)
      want.push_back(tv[r] < 0 ? 0 : (std::exp(xr[j] - l) - (j == tv[r])) * 2.5 / 4);
  }
  // Rows offset by 1000 carry lse's float rounding (ulp 6e-5) into exp(x - lse).
  expect_close(got[0], want, 1e-4, "dlogits", 1e-9);
}

TEST(CrossEntropy, GradientsMatchFiniteDifferences) {
  struct Case {
    Shape logits;
    std::vector<int32_t> targets;
  };
  const Case cases[] = {
      {S({5}), {2}},                           // rank-1 logits, scalar target
      {S({4, 6}), {0, 5, -100, 3}},            // one ignored row
      {S({2, 3, 4}), {1, -1, 3, 0, 2, -100}},  // rank 3
  };
  for (const Case& k : cases) {
    GradCase c;
    c.params = {k.logits};
    const Shape rows = k.logits.slice(0, k.logits.rank() - 1);
    c.inputs["targets"] = targets_tensor(rows, k.targets);
    c.build = [rows](Builder& b, const std::vector<ValueId>& p) {
      return b.cross_entropy(p[0], b.input("targets", rows, DType::I32));
    };
    EXPECT_TRUE(check_gradients(c)) << k.logits.to_string();
  }
}

TEST(CrossEntropy, ComposedWithLogSoftmaxGradient) {
  // Upstream ops get the right gradient through cross_entropy's dlogits.
  GradCase c;
  c.params = {S({3, 4}), S({4, 6})};
  c.inputs["targets"] = targets_tensor(S({3}), {5, -100, 1});
  c.build = [](Builder& b, const std::vector<ValueId>& p) {
    ValueId logits = b.log_softmax(b.matmul(p[0], p[1]));
    return b.cross_entropy(logits, b.input("targets", S({3}), DType::I32));
  };
  EXPECT_TRUE(check_gradients(c));
}

TEST(CrossEntropy, TargetShapeMismatchIsAClearError) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("logits", Shape{{"batch", 2}, {"seq", 4}, {"vocab", 10}});
  ValueId t = b.input("targets", Shape{{"batch", 2}, {"seq", 3}}, DType::I32);
  try {
    b.cross_entropy(x, t, "loss");
    FAIL() << "expected an error";
  } catch (const StatusError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "cross_entropy 'loss': targets[batch=2,seq=3] must have the dims of "
                  "logits[batch=2,seq=4,vocab=10] without the last, i.e. [batch=2,seq=4]"),
              std::string::npos)
        << e.what();
  }
}

TEST(CrossEntropy, FloatTargetsAreAClearError) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("logits", Shape{{"batch", 2}, {"vocab", 10}});
  ValueId t = b.input("targets", Shape{{"batch", 2}});
  try {
    b.cross_entropy(x, t, "loss");
    FAIL() << "expected an error";
  } catch (const StatusError& e) {
    EXPECT_NE(std::string(e.what()).find("cross_entropy 'loss': input 1 must be i32, got f32"),
              std::string::npos)
        << e.what();
  }
}

TEST(CrossEntropyDeathTest, TargetOutOfRangeNamesValueAndClassCount) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Graph g;
  Builder b(g);
  ValueId x = b.input("logits", Shape{{"batch", 3}, {"vocab", 5}});
  ValueId t = b.input("targets", Shape{{"batch", 3}}, DType::I32);
  ValueId loss = b.cross_entropy(x, t, "loss");
  std::map<std::string, Tensor> feeds = {{"logits", testing::random_tensor(g.shape(x), 1)},
                                         {"targets", targets_tensor(g.shape(t), {0, 9, 1})}};
  EXPECT_DEATH(run_forward(g, {loss}, feeds),
               "cross_entropy 'loss': target 9 at position 1 is out of range for 5 classes");
}

TEST(CorrectCount, CountsValidArgmaxHits) {
  const Shape s{{"pos", 6}, {"vocab", 4}};
  const float logits[] = {
      0,  3,  1,  2,      // argmax 1, target 1: hit
      5,  1,  1,  1,      // argmax 0, target 2: miss
      1,  1,  1,  9,      // argmax 3, target -100: ignored
      2,  2,  0,  0,      // tie: first max 0, target 0: hit
      2,  2,  0,  0,      // tie: first max 0, target 1: miss
      -1, -2, -3, -0.5f,  // argmax 3, target 3: hit
  };
  Graph g;
  Builder b(g);
  ValueId x = b.input("logits", s);
  ValueId t = b.input("targets", Shape{{"pos", 6}}, DType::I32);
  ValueId n = b.correct_count(x, t);
  EXPECT_EQ(g.producer(n).phase, Phase::kMetric);
  EXPECT_EQ(g.shape(n), Shape{});
  Tensor xv(s, DType::F32);
  std::copy(logits, logits + 24, xv.data<float>());
  auto got = run_forward(
      g, {n}, {{"logits", xv}, {"targets", targets_tensor(g.shape(t), {1, 2, -100, 0, 1, 3})}});
  EXPECT_EQ(got[0][0], 3.f);
}

TEST(CorrectCount, ManyRowsMatchNaiveArgmax) {
  const Shape s{{"pos", 900}, {"vocab", 257}};
  Tensor xv = testing::random_tensor(s, 9);
  std::vector<int32_t> tv(900);
  int want = 0;
  for (int r = 0; r < 900; ++r) {
    const float* xr = xv.data<float>() + r * 257;
    const int arg = static_cast<int>(std::max_element(xr, xr + 257) - xr);
    tv[r] = r % 7 == 0 ? -100 : (r % 2 ? arg : (arg + 1) % 257);
    want += tv[r] == arg;
  }
  Graph g;
  Builder b(g);
  ValueId x = b.input("logits", s);
  ValueId t = b.input("targets", Shape{{"pos", 900}}, DType::I32);
  ValueId n = b.correct_count(x, t);
  auto got = run_forward(g, {n}, {{"logits", xv}, {"targets", targets_tensor(g.shape(t), tv)}});
  EXPECT_EQ(got[0][0], static_cast<float>(want));
}

TEST(CrossEntropy, TrainingGraphWithMetricBuildsAndRuns) {
  // loss + metric in one graph: autodiff skips correct_count (no gradient).
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", Shape{{"batch", 4}, {"hidden", 3}});
  ValueId w = b.parameter("w", Shape{{"hidden", 3}, {"vocab", 5}}, Init::normal(0.5f));
  ValueId t = b.input("targets", Shape{{"batch", 4}}, DType::I32);
  ValueId logits = b.matmul(x, w);
  g.loss = b.cross_entropy(logits, t, "loss");
  g.outputs["correct"] = b.correct_count(logits, t, "correct");
  append_backward(g);
  ASSERT_TRUE(verify(g).is_ok()) << verify(g).message();
  ASSERT_TRUE(g.grad_of_param.count(w));
  Executor ex(g);
  throw_if_error(ex.feed("x", testing::random_tensor(g.shape(x), 3)));
  throw_if_error(ex.feed("targets", targets_tensor(g.shape(t), {0, 4, -100, 2})));
  ex.feed_scalar("loss_scale", 1.f);
  ex.run(ex.forward_backward_order());
  const float loss = ex.scalar(g.loss);
  EXPECT_TRUE(std::isfinite(loss) && loss > 0) << loss;
  ex.run(ex.eval_order());
  const float correct = ex.scalar(g.outputs["correct"]);
  EXPECT_GE(correct, 0.f);
  EXPECT_LE(correct, 3.f);
}

}  // namespace
}  // namespace meshflow
