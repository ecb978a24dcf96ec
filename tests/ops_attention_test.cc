// Tests of the attention family: attention (+ its backward), dropout, rope.
// Forward results are compared with naive double-precision references written
// here; gradients with finite differences (and, for shapes that span several
// query blocks, with a naive double-precision backward).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>
#include <vector>

#include "grad_check.h"
#include "meshflow/kernels/cpu/attention_dropout.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/ops/verify.h"
#include "meshflow/runtime/executor.h"

namespace meshflow {
namespace {

using testing::check_gradients;
using testing::GradCase;
using testing::random_tensor;

Shape q_shape(int64_t B, int64_t H, int64_t T, int64_t D) {
  return Shape{{"batch", B}, {"heads", H}, {"seq", T}, {"head_dim", D}};
}
Shape kv_shape(int64_t B, int64_t Hkv, int64_t S, int64_t D) {
  return Shape{{"batch", B}, {"kv_heads", Hkv}, {"kv_seq", S}, {"head_dim", D}};
}

struct AttnCase {
  int64_t B, H, Hkv, T, S, D;
  bool causal;
  float alpha;  // 0 = 1/sqrt(D)
};

std::string case_name(const AttnCase& a) {
  return "B" + std::to_string(a.B) + "H" + std::to_string(a.H) + "Hkv" + std::to_string(a.Hkv) +
         "T" + std::to_string(a.T) + "S" + std::to_string(a.S) + "D" + std::to_string(a.D) +
         (a.causal ? "causal" : "full");
}

// Naive attention in double: scores, mask, softmax, P V. Also the backward
// given dout (dq, dk, dv), so shapes spanning several blocks can be checked.
struct NaiveAttention {
  std::vector<double> out, lse, dq, dk, dv;
};

NaiveAttention naive_attention(const AttnCase& a, const float* q, const float* k, const float* v,
                               const float* dout) {
  const int64_t rep = a.H / a.Hkv;
  const double scale = a.alpha == 0.f ? 1.0 / std::sqrt(double(a.D)) : a.alpha;
  NaiveAttention r;
  r.out.assign(a.B * a.H * a.T * a.D, 0.0);
  r.lse.assign(a.B * a.H * a.T, -std::numeric_limits<double>::infinity());
  r.dq.assign(r.out.size(), 0.0);
  r.dk.assign(a.B * a.Hkv * a.S * a.D, 0.0);
  r.dv.assign(r.dk.size(), 0.0);
  std::vector<double> p(a.S), dp(a.S);
  for (int64_t b = 0; b < a.B; ++b)
    for (int64_t h = 0; h < a.H; ++h) {
      const int64_t g = h / rep;
      const float* kp = k + (b * a.Hkv + g) * a.S * a.D;
      const float* vp = v + (b * a.Hkv + g) * a.S * a.D;
      for (int64_t i = 0; i < a.T; ++i) {
        const int64_t row = (b * a.H + h) * a.T + i;
        const float* qi = q + row * a.D;
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < a.S; ++j) {
          const bool visible = !a.causal || j <= i + (a.S - a.T);
          double s = 0;
          for (int64_t d = 0; d < a.D; ++d) s += double(qi[d]) * kp[j * a.D + d];
          p[j] = visible ? s * scale : -std::numeric_limits<double>::infinity();
          m = std::max(m, p[j]);
        }
        if (m == -std::numeric_limits<double>::infinity()) continue;  // sees no key
        double sum = 0;
        for (int64_t j = 0; j < a.S; ++j) sum += std::exp(p[j] - m);
        r.lse[row] = m + std::log(sum);
        for (int64_t j = 0; j < a.S; ++j) p[j] = std::exp(p[j] - r.lse[row]);
        for (int64_t j = 0; j < a.S; ++j)
          for (int64_t d = 0; d < a.D; ++d) r.out[row * a.D + d] += p[j] * vp[j * a.D + d];
        if (!dout) continue;
        const float* doi = dout + row * a.D;
        double di = 0;
        for (int64_t d = 0; d < a.D; ++d) di += double(doi[d]) * r.out[row * a.D + d];
        for (int64_t j = 0; j < a.S; ++j) {
          dp[j] = 0;
          for (int64_t d = 0; d < a.D; ++d) dp[j] += double(doi[d]) * vp[j * a.D + d];
          const double ds = p[j] * (dp[j] - di) * scale;
          for (int64_t d = 0; d < a.D; ++d) {
            r.dq[row * a.D + d] += ds * kp[j * a.D + d];
            r.dk[((b * a.Hkv + g) * a.S + j) * a.D + d] += ds * qi[d];
            r.dv[((b * a.Hkv + g) * a.S + j) * a.D + d] += p[j] * doi[d];
          }
        }
      }
    }
  return r;
}

// Max |x - ref| / max(1e-6, max |ref|).
double rel_err(const float* x, const std::vector<double>& ref) {
  double num = 0, den = 1e-6;
  for (size_t i = 0; i < ref.size(); ++i) {
    num = std::max(num, std::fabs(x[i] - ref[i]));
    den = std::max(den, std::fabs(ref[i]));
  }
  return num / den;
}

void PrintTo(const AttnCase& a, std::ostream* os) {
  *os << case_name(a);
}

Attrs attn_attrs(const AttnCase& a) {
  Attrs at;
  at.causal = a.causal;
  at.alpha = a.alpha;
  return at;
}

class AttentionCases : public ::testing::TestWithParam<AttnCase> {};

// Forward (out, lse) and the attention_grad kernel against the naive reference.
TEST_P(AttentionCases, MatchesNaiveForwardAndBackward) {
  const AttnCase& a = GetParam();
  Graph g;
  Builder b(g);
  ValueId q = b.input("q", q_shape(a.B, a.H, a.T, a.D));
  ValueId k = b.input("k", kv_shape(a.B, a.Hkv, a.S, a.D));
  ValueId v = b.input("v", kv_shape(a.B, a.Hkv, a.S, a.D));
  ValueId dout = b.input("dout", q_shape(a.B, a.H, a.T, a.D));
  std::vector<ValueId> o = b.op(OpKind::kAttention, {q, k, v}, attn_attrs(a), "attn");
  std::vector<ValueId> d =
      b.op(OpKind::kAttentionGrad, {dout, q, k, v, o[0], o[1]}, attn_attrs(a), "attn_grad");
  EXPECT_EQ(g.shape(o[0]).to_string(), q_shape(a.B, a.H, a.T, a.D).to_string());
  EXPECT_EQ(g.shape(o[1]).to_string(), q_shape(a.B, a.H, a.T, a.D).slice(0, 3).to_string());
  ASSERT_TRUE(verify(g).is_ok());

  Executor ex(
      g, {.seed = 0, .fetch = {o[0], o[1], d[0], d[1], d[2]}, .run_elsewhere = {}, .offload = {}});
  Tensor tq = random_tensor(g.shape(q), 1), tk = random_tensor(g.shape(k), 2);
  Tensor tv = random_tensor(g.shape(v), 3), tdo = random_tensor(g.shape(dout), 4);
  ASSERT_TRUE(ex.feed("q", tq).is_ok());
  ASSERT_TRUE(ex.feed("k", tk).is_ok());
  ASSERT_TRUE(ex.feed("v", tv).is_ok());
  ASSERT_TRUE(ex.feed("dout", tdo).is_ok());
  ex.run(ex.forward_backward_order());

  NaiveAttention ref =
      naive_attention(a, tq.data<float>(), tk.data<float>(), tv.data<float>(), tdo.data<float>());
  EXPECT_LT(rel_err(ex.data_f(o[0]), ref.out), 1e-5);
  const float* lse = ex.data_f(o[1]);
  for (size_t i = 0; i < ref.lse.size(); ++i) {
    if (std::isinf(ref.lse[i])) {
      EXPECT_TRUE(std::isinf(lse[i]) && lse[i] < 0) << "row " << i << " sees no key: " << lse[i];
    } else {
      EXPECT_NEAR(lse[i], ref.lse[i], 1e-5 * std::max(1.0, std::fabs(ref.lse[i]))) << "row " << i;
    }
  }
  EXPECT_LT(rel_err(ex.data_f(d[0]), ref.dq), 1e-4);
  EXPECT_LT(rel_err(ex.data_f(d[1]), ref.dk), 1e-4);
  EXPECT_LT(rel_err(ex.data_f(d[2]), ref.dv), 1e-4);
}

// Small cases, and ones whose T spans several 64-row query blocks.
INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionCases,
    ::testing::Values(AttnCase{2, 2, 2, 5, 5, 4, false, 0.f}, AttnCase{2, 2, 2, 5, 5, 4, true, 0.f},
                      AttnCase{1, 4, 2, 3, 7, 8, true, 0.f},    // GQA, T < S
                      AttnCase{1, 4, 1, 3, 7, 8, false, 0.5f},  // MQA, explicit scale
                      AttnCase{2, 2, 1, 6, 3, 4, true, 0.f},    // T > S: rows 0..2 see no key
                      AttnCase{1, 2, 1, 100, 130, 16, true, 0.f},
                      AttnCase{2, 3, 3, 130, 70, 8, false, 0.f},
                      AttnCase{1, 2, 1, 130, 70, 8, true, 0.f},  // rows 0..59 see no key
                      AttnCase{1, 2, 2, 128, 128, 64, true, 0.f}),
    [](const ::testing::TestParamInfo<AttnCase>& info) { return case_name(info.param); });

// Every task owns its outputs (dk, dv per kv head included), so results do not
// depend on the thread count, bit for bit.
TEST(Attention, SameBitsForAnyThreadCount) {
  const AttnCase a{2, 4, 2, 150, 150, 16, true, 0.f};
  Graph g;
  Builder b(g);
  ValueId q = b.input("q", q_shape(a.B, a.H, a.T, a.D));
  ValueId k = b.input("k", kv_shape(a.B, a.Hkv, a.S, a.D));
  ValueId v = b.input("v", kv_shape(a.B, a.Hkv, a.S, a.D));
  ValueId dout = b.input("dout", q_shape(a.B, a.H, a.T, a.D));
  std::vector<ValueId> o = b.op(OpKind::kAttention, {q, k, v}, attn_attrs(a), "attn");
  std::vector<ValueId> d =
      b.op(OpKind::kAttentionGrad, {dout, q, k, v, o[0], o[1]}, attn_attrs(a), "attn_grad");
  const std::vector<ValueId> results = {o[0], o[1], d[0], d[1], d[2]};
  Executor ex(g, {.seed = 0, .fetch = results, .run_elsewhere = {}, .offload = {}});
  for (ValueId x : {q, k, v, dout})
    ASSERT_TRUE(ex.feed(g.value(x).name, random_tensor(g.shape(x), x)).is_ok());
  const int saved = omp_get_max_threads();
  std::vector<std::vector<float>> runs[2];
  for (int t = 0; t < 2; ++t) {
    omp_set_num_threads(t == 0 ? 1 : 3);
    ex.run(ex.forward_backward_order());
    for (ValueId r : results) runs[t].emplace_back(ex.data_f(r), ex.data_f(r) + g.shape(r).numel());
  }
  omp_set_num_threads(saved);
  for (size_t i = 0; i < results.size(); ++i) EXPECT_EQ(runs[0][i], runs[1][i]) << "output " << i;
}

class AttentionGrad : public ::testing::TestWithParam<AttnCase> {};

TEST_P(AttentionGrad, MatchesFiniteDifferences) {
  const AttnCase a = GetParam();
  GradCase c;
  c.params = {q_shape(a.B, a.H, a.T, a.D), kv_shape(a.B, a.Hkv, a.S, a.D),
              kv_shape(a.B, a.Hkv, a.S, a.D)};
  c.build = [a](Builder& b, const std::vector<ValueId>& p) {
    return b.attention(p[0], p[1], p[2], a.causal, a.alpha, "attn");
  };
  EXPECT_TRUE(check_gradients(c));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionGrad,
    ::testing::Values(AttnCase{2, 2, 2, 4, 4, 4, false, 0.f}, AttnCase{2, 2, 2, 4, 4, 4, true, 0.f},
                      AttnCase{1, 4, 2, 3, 5, 4, true, 0.f},    // GQA, T < S
                      AttnCase{1, 4, 1, 3, 5, 4, false, 0.f},   // MQA
                      AttnCase{1, 2, 1, 5, 3, 4, true, 0.7f}),  // T > S, explicit scale
    [](const ::testing::TestParamInfo<AttnCase>& info) { return case_name(info.param); });

// Builds attention with the given shapes and returns the error message ("" if none).
std::string attention_error(const Shape& q, const Shape& k, const Shape& v) {
  Graph g;
  Builder b(g);
  try {
    b.attention(b.input("q", q), b.input("k", k), b.input("v", v), true, 0.f, "attn");
  } catch (const StatusError& e) {
    return e.what();
  }
  return "";
}

TEST(Attention, ShapeErrorsNameTheNodeDimsAndSizes) {
  std::string e =
      attention_error(q_shape(2, 6, 8, 16), kv_shape(2, 4, 8, 16), kv_shape(2, 4, 8, 16));
  EXPECT_NE(e.find("attention 'attn'"), std::string::npos) << e;
  EXPECT_NE(e.find("kv heads (4"), std::string::npos) << e;
  EXPECT_NE(e.find("must divide query heads (6"), std::string::npos) << e;

  e = attention_error(q_shape(2, 4, 8, 16), kv_shape(2, 2, 8, 32), kv_shape(2, 2, 8, 32));
  EXPECT_NE(e.find("head_dim differs"), std::string::npos) << e;
  EXPECT_NE(e.find("16"), std::string::npos) << e;
  EXPECT_NE(e.find("32"), std::string::npos) << e;

  e = attention_error(q_shape(2, 4, 8, 16), kv_shape(3, 2, 8, 16), kv_shape(3, 2, 8, 16));
  EXPECT_NE(e.find("batch differs"), std::string::npos) << e;

  e = attention_error(q_shape(2, 4, 8, 16), kv_shape(2, 2, 8, 16), kv_shape(2, 2, 9, 16));
  EXPECT_NE(e.find("same sizes"), std::string::npos) << e;

  e = attention_error(Shape{{"batch", 2}, {"seq", 8}, {"hidden", 16}}, kv_shape(2, 2, 8, 16),
                      kv_shape(2, 2, 8, 16));
  EXPECT_NE(e.find("must be 4-D"), std::string::npos) << e;
  EXPECT_NE(e.find("[batch=2,seq=8,hidden=16]"), std::string::npos) << e;
}

TEST(Attention, LseIsNotDifferentiable) {
  GradCase c;
  c.params = {q_shape(1, 2, 3, 4), kv_shape(1, 2, 3, 4), kv_shape(1, 2, 3, 4)};
  c.build = [](Builder& b, const std::vector<ValueId>& p) {
    return b.op(OpKind::kAttention, {p[0], p[1], p[2]}, {}, "attn")[1];
  };
  try {
    (void)check_gradients(c);
    FAIL() << "expected an error";
  } catch (const StatusError& e) {
    EXPECT_NE(std::string(e.what()).find("attention 'attn'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("lse output (1) is not differentiable"), std::string::npos)
        << e.what();
  }
}

// ---- dropout ----

struct DropoutRun {
  Graph g;
  ValueId x, y;
  explicit DropoutRun(int64_t n, float p, uint64_t seed) {
    Builder b(g);
    x = b.input("x", Shape{{"n", n}});
    y = b.dropout(x, p, seed, "drop");
  }
  std::vector<float> run(int32_t offset, const Tensor& input) {
    Executor ex(g, {.seed = 0, .fetch = {y}, .run_elsewhere = {}, .offload = {}});
    EXPECT_TRUE(ex.feed("x", input).is_ok());
    ex.feed_scalar_i32("rng_offset", offset);
    ex.run(ex.eval_order());
    const float* p = ex.data_f(y);
    return std::vector<float>(p, p + input.numel());
  }
};

TEST(Dropout, KeepsOneMinusPAndScalesKeptValues) {
  const int64_t n = 100000;
  const float p = 0.3f;
  DropoutRun d(n, p, 42);
  Tensor ones(Shape{{"n", n}}, DType::F32);
  for (int64_t i = 0; i < n; ++i) ones.data<float>()[i] = 1.f;
  std::vector<float> y = d.run(5, ones);
  int64_t kept = 0;
  const uint64_t stream = dropout_stream(42, 5);
  for (int64_t i = 0; i < n; ++i) {
    if (y[i] != 0.f) {
      ++kept;
      ASSERT_FLOAT_EQ(y[i], 1.f / (1.f - p)) << i;
    }
    ASSERT_EQ(y[i] != 0.f, dropout_keep(stream, i, p)) << i;
  }
  // 1 - p = 0.7 with std sqrt(0.21 / n) = 0.0015: 5 sigma is 0.0075.
  EXPECT_NEAR(double(kept) / n, 1.0 - p, 0.0075);
}

TEST(Dropout, MaskIsAFunctionOfSeedAndOffset) {
  const int64_t n = 10000;
  Tensor x = random_tensor(Shape{{"n", n}}, 3);
  DropoutRun d(n, 0.5f, 7);
  std::vector<float> a = d.run(11, x), again = d.run(11, x), other = d.run(12, x);
  EXPECT_EQ(a, again);
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i) differ += (a[i] == 0.f) != (other[i] == 0.f);
  // Independent masks with p = 0.5 disagree on half the positions.
  EXPECT_NEAR(double(differ) / n, 0.5, 0.05);

  DropoutRun other_seed(n, 0.5f, 8);
  std::vector<float> s = other_seed.run(11, x);
  differ = 0;
  for (int64_t i = 0; i < n; ++i) differ += (a[i] == 0.f) != (s[i] == 0.f);
  EXPECT_NEAR(double(differ) / n, 0.5, 0.05);
}

TEST(Dropout, GradUsesTheForwardMask) {
  Graph g;
  Builder b(g);
  const int64_t n = 4096;
  ValueId x = b.input("x", Shape{{"n", n}});
  ValueId y = b.dropout(x, 0.25f, 99, "drop");
  ValueId dx = b.op1(OpKind::kDropoutGrad, {x, b.rng_offset()}, g.node(g.value(y).producer).attrs);
  Executor ex(g, {.seed = 0, .fetch = {y, dx}, .run_elsewhere = {}, .offload = {}});
  ASSERT_TRUE(ex.feed("x", random_tensor(Shape{{"n", n}}, 5)).is_ok());
  ex.feed_scalar_i32("rng_offset", 17);
  ex.run(ex.eval_order());
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(ex.data_f(y)[i], ex.data_f(dx)[i]) << i;
}

TEST(Dropout, ZeroProbabilityIsACopy) {
  const int64_t n = 1000;
  Tensor x = random_tensor(Shape{{"n", n}}, 3);
  DropoutRun d(n, 0.f, 1);
  std::vector<float> y = d.run(4, x);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], x.data<float>()[i]);
}

TEST(Dropout, MatchesFiniteDifferences) {
  GradCase c;
  c.params = {Shape{{"batch", 3}, {"hidden", 16}}};
  c.build = [](Builder& b, const std::vector<ValueId>& p) {
    return b.dropout(b.dropout(p[0], 0.4f, 5), 0.2f, 6);
  };
  EXPECT_TRUE(check_gradients(c));
}

TEST(Dropout, ProbabilityOutOfRangeIsAnError) {
  for (float p : {1.f, -0.1f, 1.5f}) {
    Graph g;
    Builder b(g);
    ValueId x = b.input("x", Shape{{"n", 4}});
    try {
      b.dropout(x, p, 0, "drop");
      FAIL() << "expected an error for p = " << p;
    } catch (const StatusError& e) {
      EXPECT_NE(std::string(e.what()).find("dropout 'drop'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("must be in [0, 1)"), std::string::npos) << e.what();
    }
  }
}

// ---- rope ----

// Hugging Face LLaMA rotary embedding, in double.
std::vector<double> naive_rope(const Tensor& x, double theta, bool inverse) {
  const Shape& s = x.shape();
  const int64_t B = s.size(0), T = s.size(1), H = s.size(2), D = s.size(3), half = D / 2;
  const float* xp = x.data<float>();
  std::vector<double> y(x.numel());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t base = ((b * T + t) * H + h) * D;
        for (int64_t i = 0; i < D; ++i) {
          const double angle = (inverse ? -1.0 : 1.0) * t * std::pow(theta, -2.0 * (i % half) / D);
          const double rot = i < half ? -xp[base + i + half] : xp[base + i - half];
          y[base + i] = xp[base + i] * std::cos(angle) + rot * std::sin(angle);
        }
      }
  return y;
}

std::vector<float> run_rope(const Tensor& x, float theta, bool inverse) {
  Graph g;
  Builder b(g);
  ValueId in = b.input("x", x.shape());
  Attrs at;
  at.theta = theta;
  at.inverse = inverse;
  ValueId y = b.op1(OpKind::kRope, {in}, at, "rope");
  Executor ex(g, {.seed = 0, .fetch = {y}, .run_elsewhere = {}, .offload = {}});
  EXPECT_TRUE(ex.feed("x", x).is_ok());
  ex.run(ex.eval_order());
  return std::vector<float>(ex.data_f(y), ex.data_f(y) + x.numel());
}

TEST(Rope, MatchesNaiveReference) {
  Tensor x = random_tensor(Shape{{"batch", 2}, {"seq", 33}, {"heads", 3}, {"head_dim", 16}}, 9);
  for (bool inverse : {false, true}) {
    for (float theta : {10000.f, 500000.f}) {
      std::vector<float> y = run_rope(x, theta, inverse);
      std::vector<double> ref = naive_rope(x, theta, inverse);
      EXPECT_LT(rel_err(y.data(), ref), 1e-5) << "inverse " << inverse << " theta " << theta;
    }
  }
}

TEST(Rope, InverseUndoesTheRotation) {
  Tensor x = random_tensor(Shape{{"batch", 1}, {"seq", 50}, {"heads", 2}, {"head_dim", 8}}, 4);
  std::vector<float> y = run_rope(x, 10000.f, false);
  Tensor ty(x.shape(), DType::F32);
  ty.copy_from(y.data());
  std::vector<float> back = run_rope(ty, 10000.f, true);
  EXPECT_LT(testing::max_rel_diff(back.data(), x.data<float>(), x.numel()), 1e-5);
}

TEST(Rope, MatchesFiniteDifferences) {
  GradCase c;
  c.params = {Shape{{"batch", 2}, {"seq", 5}, {"heads", 2}, {"head_dim", 6}}};
  c.build = [](Builder& b, const std::vector<ValueId>& p) { return b.rope(p[0], 100.f); };
  EXPECT_TRUE(check_gradients(c));
}

TEST(Rope, OddHeadDimIsAnError) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", Shape{{"batch", 2}, {"seq", 4}, {"heads", 2}, {"head_dim", 7}});
  try {
    b.rope(x, 10000.f, "rope_q");
    FAIL() << "expected an error";
  } catch (const StatusError& e) {
    EXPECT_NE(std::string(e.what()).find("rope 'rope_q'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("head_dim=7"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("even"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace meshflow
