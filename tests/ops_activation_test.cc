// relu / gelu (tanh) / silu: forward and *_grad kernels against double
// references, finite-difference gradients, shape errors.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "grad_check.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/runtime/executor.h"

namespace meshflow {
namespace {

using testing::check_gradients;
using testing::GradCase;

using testing::S;

// Runs the forward of g with the given feeds and returns y.
std::vector<float> run_forward(const Graph& g, ValueId y,
                               const std::map<std::string, Tensor>& feeds) {
  Executor ex(g, {.seed = 0, .fetch = {y}, .run_elsewhere = {}, .offload = {}});
  for (const auto& [name, t] : feeds) throw_if_error(ex.feed(name, t));
  ex.run(ex.eval_order());
  const float* p = ex.data_f(y);
  return std::vector<float>(p, p + g.shape(y).numel());
}

constexpr double kK = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kC = 0.044715;

double gelu_ref(double x) {
  return 0.5 * x * (1 + std::tanh(kK * (x + kC * x * x * x)));
}
double gelu_grad_ref(double x) {
  const double t = std::tanh(kK * (x + kC * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * kK * (1 + 3 * kC * x * x);
}
double sigmoid(double x) {
  return 1 / (1 + std::exp(-x));
}
double silu_ref(double x) {
  return x * sigmoid(x);
}
double silu_grad_ref(double x) {
  return sigmoid(x) * (1 + x * (1 - sigmoid(x)));
}
double relu_ref(double x) {
  return x > 0 ? x : 0;
}
double relu_grad_ref(double x) {
  return x > 0 ? 1 : 0;
}

// Random values plus the awkward ones: large magnitudes, zero, tiny.
Tensor test_values(const Shape& s, uint64_t seed) {
  Tensor t = testing::random_tensor(s, seed, 3.f);
  const float special[] = {-100.f, -30.f, -9.f, -5.f, -1e-4f, 0.f, 1e-4f, 5.f, 9.f, 30.f, 100.f};
  for (int64_t i = 0; i < std::min<int64_t>(t.numel(), 11); ++i) t.data<float>()[i] = special[i];
  return t;
}

bool close(double got, double want) {
  return std::fabs(got - want) <= 1e-6 + 1e-5 * std::fabs(want);
}

struct ActCase {
  OpKind fwd, grad;
  std::function<double(double)> f, df;
};

const ActCase kCases[] = {
    {OpKind::kRelu, OpKind::kReluGrad, relu_ref, relu_grad_ref},
    {OpKind::kGelu, OpKind::kGeluGrad, gelu_ref, gelu_grad_ref},
    {OpKind::kSilu, OpKind::kSiluGrad, silu_ref, silu_grad_ref},
};

TEST(Activation, ForwardMatchesDoubleReference) {
  // 70000 elements: large enough to be split across threads.
  for (const Shape& s : {S({13}), S({3, 5, 7}), S({70000})}) {
    for (const ActCase& a : kCases) {
      Graph g;
      Builder b(g);
      ValueId x = b.input("x", s);
      ValueId y = b.op1(a.fwd, {x});
      EXPECT_EQ(g.shape(y), s);
      Tensor xv = test_values(s, 3);
      std::vector<float> got = run_forward(g, y, {{"x", xv}});
      int bad = 0;
      for (int64_t i = 0; i < s.numel() && bad < 5; ++i) {
        const double want = a.f(xv.data<float>()[i]);
        if (!close(got[i], want)) {
          ++bad;
          ADD_FAILURE() << op_name(a.fwd) << "(" << xv.data<float>()[i] << ") = " << got[i]
                        << ", want " << want;
        }
      }
    }
  }
}

TEST(Activation, GradKernelsMatchDoubleReference) {
  for (const Shape& s : {S({11}), S({2, 3, 40}), S({70000})}) {
    for (const ActCase& a : kCases) {
      Graph g;
      Builder b(g);
      ValueId x = b.input("x", s);
      ValueId dy = b.input("dy", s);
      ValueId dx = b.op1(a.grad, {x, dy});
      Tensor xv = test_values(s, 5), dyv = testing::random_tensor(s, 6);
      std::vector<float> got = run_forward(g, dx, {{"x", xv}, {"dy", dyv}});
      int bad = 0;
      for (int64_t i = 0; i < s.numel() && bad < 5; ++i) {
        const double want = a.df(xv.data<float>()[i]) * dyv.data<float>()[i];
        if (!close(got[i], want)) {
          ++bad;
          ADD_FAILURE() << op_name(a.grad) << "(" << xv.data<float>()[i] << ") = " << got[i]
                        << ", want " << want;
        }
      }
    }
  }
}

TEST(Activation, GeluSpotValues) {
  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) in double, as PyTorch's
  // gelu(x, approximate='tanh') defines it.
  Graph g;
  Builder b(g);
  Shape s = S({4});
  ValueId x = b.input("x", s);
  ValueId y = b.gelu(x);
  Tensor xv(s, DType::F32);
  const float in[] = {-1.f, 0.5f, 1.f, 3.f};
  std::copy(in, in + 4, xv.data<float>());
  std::vector<float> got = run_forward(g, y, {{"x", xv}});
  const float want[] = {-0.15880801f, 0.34571401f, 0.84119199f, 2.99636261f};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << in[i];
}

// Finite differences. relu's inputs stay away from the kink at 0.
Tensor away_from_zero(const Shape& s, uint64_t seed) {
  Tensor t = testing::random_tensor(s, seed);
  for (int64_t i = 0; i < t.numel(); ++i) {
    float& v = t.data<float>()[i];
    v = v >= 0 ? v + 0.1f : v - 0.1f;
  }
  return t;
}

TEST(Activation, GradientsMatchFiniteDifferences) {
  for (const Shape& s : {S({7}), S({2, 3, 4})}) {
    for (const ActCase& a : kCases) {
      GradCase c;
      c.params = {s};
      c.param_values = {away_from_zero(s, 11)};
      OpKind k = a.fwd;
      c.build = [k](Builder& b, const std::vector<ValueId>& p) { return b.op1(k, {p[0]}); };
      EXPECT_TRUE(check_gradients(c)) << op_name(k) << " " << s.to_string();
    }
  }
}

TEST(Activation, ChainedGradients) {
  GradCase c;
  c.params = {S({3, 5})};
  c.build = [](Builder& b, const std::vector<ValueId>& p) {
    return b.gelu(b.mul(b.silu(p[0]), b.silu(p[0])));
  };
  EXPECT_TRUE(check_gradients(c));
}

TEST(Activation, KeepsDimNames) {
  Graph g;
  Builder b(g);
  Shape s{{"batch", 2}, {"seq", 3}, {"ffn", 8}};
  ValueId x = b.input("x", s);
  EXPECT_EQ(g.shape(b.gelu(x)).to_string(), "[batch=2,seq=3,ffn=8]");
  EXPECT_EQ(g.shape(b.silu(x)).to_string(), "[batch=2,seq=3,ffn=8]");
  EXPECT_EQ(g.shape(b.relu(x)).to_string(), "[batch=2,seq=3,ffn=8]");
}

TEST(Activation, GradWithWrongShapeIsAClearError) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", Shape{{"batch", 2}, {"ffn", 8}});
  ValueId dy = b.input("dy", Shape{{"batch", 2}, {"ffn", 4}});
  try {
    b.op1(OpKind::kGeluGrad, {x, dy}, {}, "bad");
    FAIL() << "expected an error";
  } catch (const StatusError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("gelu_grad 'bad'"), std::string::npos) << m;
    EXPECT_NE(m.find("dy[batch=2,ffn=4] must have the sizes of x[batch=2,ffn=8]"),
              std::string::npos)
        << m;
  }
}

TEST(Activation, IntegerInputIsAClearError) {
  Graph g;
  Builder b(g);
  ValueId ids = b.input("ids", Shape{{"batch", 2}}, DType::I32);
  try {
    b.relu(ids, "act");
    FAIL() << "expected an error";
  } catch (const StatusError& e) {
    EXPECT_NE(std::string(e.what()).find("relu 'act': input 0 must be f32, got i32"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace meshflow
