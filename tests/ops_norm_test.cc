// layer_norm and rms_norm: shape rules, forward against double-precision naive
// references, backward kernels against naive references, finite-difference
// gradients, determinism across thread counts, and error messages.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>

#include "grad_check.h"
#include "meshflow/autodiff/autodiff.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/runtime/executor.h"

namespace meshflow {
namespace {

using testing::check_gradients;
using testing::GradCase;
using testing::random_tensor;

using testing::S;

// Runs the graph's forward nodes with the given inputs; returns copies of `outs`.
std::vector<std::vector<float>> run(const Graph& g, const std::map<std::string, Tensor>& feeds,
                                    const std::vector<ValueId>& outs) {
  Executor ex(g, {.seed = 0, .fetch = outs, .run_elsewhere = {}, .offload = {}});
  for (const auto& [name, t] : feeds) {
    Status s = ex.feed(name, t);
    EXPECT_TRUE(s.is_ok()) << s.message();
  }
  ex.run(ex.eval_order());
  std::vector<std::vector<float>> r;
  for (ValueId v : outs) r.emplace_back(ex.data_f(v), ex.data_f(v) + g.shape(v).numel());
  return r;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// ---- naive references, double precision ----

struct NormRef {
  std::vector<double> y, mean, rstd;
};

NormRef naive_layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps) {
  const int64_t C = x.shape().size(-1), R = x.numel() / C;
  NormRef r;
  for (int64_t i = 0; i < R; ++i) {
    const float* xr = x.data<float>() + i * C;
    double m = 0, v = 0;
    for (int64_t j = 0; j < C; ++j) m += xr[j];
    m /= C;
    for (int64_t j = 0; j < C; ++j) v += (xr[j] - m) * (xr[j] - m);
    v /= C;
    const double rs = 1.0 / std::sqrt(v + eps);
    r.mean.push_back(m);
    r.rstd.push_back(rs);
    for (int64_t j = 0; j < C; ++j)
      r.y.push_back((xr[j] - m) * rs * gamma.data<float>()[j] + beta.data<float>()[j]);
  }
  return r;
}

NormRef naive_rms_norm(const Tensor& x, const Tensor& gamma, double eps) {
  const int64_t C = x.shape().size(-1), R = x.numel() / C;
  NormRef r;
  for (int64_t i = 0; i < R; ++i) {
    const float* xr = x.data<float>() + i * C;
    double ms = 0;
    for (int64_t j = 0; j < C; ++j) ms += double(xr[j]) * xr[j];
    const double rs = 1.0 / std::sqrt(ms / C + eps);
    r.rstd.push_back(rs);
    for (int64_t j = 0; j < C; ++j) r.y.push_back(xr[j] * rs * gamma.data<float>()[j]);
  }
  return r;
}

// Gradients of sum(y * dy) for layer norm (with_mean) or rms norm, by the
// textbook formulas in double.
struct NormGradRef {
  std::vector<double> dx, dgamma, dbeta;
};

NormGradRef naive_norm_grad(const Tensor& dy, const Tensor& x, const Tensor& gamma, double eps,
                            bool with_mean) {
  const int64_t C = x.shape().size(-1), R = x.numel() / C;
  NormGradRef r;
  r.dgamma.assign(C, 0);
  r.dbeta.assign(C, 0);
  for (int64_t i = 0; i < R; ++i) {
    const float* xr = x.data<float>() + i * C;
    const float* dyr = dy.data<float>() + i * C;
    double m = 0, v = 0;
    if (with_mean) {
      for (int64_t j = 0; j < C; ++j) m += xr[j];
      m /= C;
    }
    for (int64_t j = 0; j < C; ++j) v += (xr[j] - m) * (xr[j] - m);
    const double rs = 1.0 / std::sqrt(v / C + eps);
    double a = 0, b = 0;
    std::vector<double> xhat(C), g(C);
    for (int64_t j = 0; j < C; ++j) {
      xhat[j] = (xr[j] - m) * rs;
      g[j] = double(dyr[j]) * gamma.data<float>()[j];
      a += g[j] / C;
      b += g[j] * xhat[j] / C;
      r.dgamma[j] += dyr[j] * xhat[j];
      r.dbeta[j] += dyr[j];
    }
    for (int64_t j = 0; j < C; ++j)
      r.dx.push_back(rs * (g[j] - (with_mean ? a : 0.0) - xhat[j] * b));
  }
  return r;
}

// ---- layer_norm ----

TEST(LayerNorm, ShapeRuleGivesRowStatistics) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", Shape{{"batch", 2}, {"seq", 3}, {"hidden", 8}});
  ValueId gm = b.input("g", Shape{{"hidden", 8}});
  ValueId bt = b.input("b", Shape{{"hidden", 8}});
  std::vector<ValueId> o = b.op(OpKind::kLayerNorm, {x, gm, bt}, {}, "ln");
  ASSERT_EQ(o.size(), 3u);
  EXPECT_EQ(g.shape(o[0]).to_string(), "[batch=2,seq=3,hidden=8]");
  EXPECT_EQ(g.shape(o[1]).to_string(), "[batch=2,seq=3]");
  EXPECT_EQ(g.shape(o[2]).to_string(), "[batch=2,seq=3]");
}

TEST(LayerNorm, ForwardMatchesDoubleReference) {
  for (Shape xs : {S({5}), S({3, 16}), S({4, 33, 256}), S({2, 7, 1000})}) {
    const int64_t C = xs.size(-1);
    Graph g;
    Builder b(g);
    ValueId x = b.input("x", xs);
    ValueId gm = b.input("g", S({C}));
    ValueId bt = b.input("b", S({C}));
    Attrs at;
    at.eps = 1e-5f;
    std::vector<ValueId> o = b.op(OpKind::kLayerNorm, {x, gm, bt}, at, "ln");
    // An offset mean and a large scale exercise the two-pass variance.
    Tensor tx = random_tensor(xs, 1, 3.f);
    for (int64_t i = 0; i < tx.numel(); ++i) tx.data<float>()[i] += 10.f;
    Tensor tg = random_tensor(S({C}), 2), tb = random_tensor(S({C}), 3);
    auto got = run(g, {{"x", tx}, {"g", tg}, {"b", tb}}, o);
    NormRef ref = naive_layer_norm(tx, tg, tb, 1e-5);
    EXPECT_LT(max_abs_diff(got[0], ref.y), 2e-5) << xs.to_string();
    EXPECT_LT(max_abs_diff(got[1], ref.mean), 1e-5) << xs.to_string();
    EXPECT_LT(max_abs_diff(got[2], ref.rstd), 1e-6) << xs.to_string();
  }
}

TEST(LayerNorm, BackwardKernelMatchesReference) {
  for (Shape xs : {S({1, 8}), S({5, 31, 64}), S({2, 300, 100})}) {
    const int64_t C = xs.size(-1);
    const double eps = 1e-5;
    Tensor tx = random_tensor(xs, 4), tdy = random_tensor(xs, 5), tg = random_tensor(S({C}), 6);
    NormRef fwd = naive_layer_norm(tx, tg, tg, eps);
    Tensor tm(xs.slice(0, xs.rank() - 1), DType::F32), tr(tm.shape(), DType::F32);
    for (int64_t i = 0; i < tm.numel(); ++i) {
      tm.data<float>()[i] = static_cast<float>(fwd.mean[i]);
      tr.data<float>()[i] = static_cast<float>(fwd.rstd[i]);
    }
    Graph g;
    Builder b(g);
    std::vector<ValueId> in = {b.input("dy", xs), b.input("x", xs), b.input("g", S({C})),
                               b.input("m", tm.shape()), b.input("r", tr.shape())};
    std::vector<ValueId> o = b.op(OpKind::kLayerNormGrad, in, {}, "ln_grad");
    auto got = run(g, {{"dy", tdy}, {"x", tx}, {"g", tg}, {"m", tm}, {"r", tr}}, o);
    NormGradRef ref = naive_norm_grad(tdy, tx, tg, eps, true);
    const double rows = static_cast<double>(xs.numel() / C);
    EXPECT_LT(max_abs_diff(got[0], ref.dx), 1e-4) << xs.to_string();
    EXPECT_LT(max_abs_diff(got[1], ref.dgamma), 1e-5 * rows) << xs.to_string();
    EXPECT_LT(max_abs_diff(got[2], ref.dbeta), 1e-5 * rows) << xs.to_string();
  }
}

TEST(LayerNorm, GradientsMatchFiniteDifferences) {
  for (Shape xs : {S({6}), S({3, 5}), S({2, 3, 4})}) {
    const int64_t C = xs.size(-1);
    GradCase c;
    c.params = {xs, S({C}), S({C})};
    c.build = [](Builder& b, const std::vector<ValueId>& p) {
      return b.layer_norm(p[0], p[1], p[2], 1e-5f);
    };
    c.eps = 1e-3f;
    EXPECT_TRUE(check_gradients(c)) << xs.to_string();
  }
}

TEST(LayerNorm, OnlyNeededGradientsAreAccumulated) {
  // gamma and beta are fixed inputs: only x gets a gradient, and the graph verifies.
  GradCase c;
  c.params = {S({3, 6})};
  c.inputs = {{"gamma", random_tensor(S({6}), 11)}, {"beta", random_tensor(S({6}), 12)}};
  c.build = [](Builder& b, const std::vector<ValueId>& p) {
    return b.layer_norm(p[0], b.input("gamma", S({6})), b.input("beta", S({6})));
  };
  c.eps = 1e-3f;
  EXPECT_TRUE(check_gradients(c));
}

TEST(LayerNorm, GammaGradientDoesNotDependOnThreadCount) {
  const Shape xs = S({4, 150, 96});
  Graph g;
  Builder b(g);
  std::vector<ValueId> in = {b.input("dy", xs), b.input("x", xs), b.input("g", S({96})),
                             b.input("m", S({4, 150})), b.input("r", S({4, 150}))};
  std::vector<ValueId> o = b.op(OpKind::kLayerNormGrad, in, {}, "ln_grad");
  std::map<std::string, Tensor> feeds = {{"dy", random_tensor(xs, 1)},
                                         {"x", random_tensor(xs, 2)},
                                         {"g", random_tensor(S({96}), 3)},
                                         {"m", random_tensor(S({4, 150}), 4)},
                                         {"r", random_tensor(S({4, 150}), 5)}};
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  auto one = run(g, feeds, o);
  omp_set_num_threads(3);
  auto three = run(g, feeds, o);
  omp_set_num_threads(saved);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(std::memcmp(one[i].data(), three[i].data(), one[i].size() * sizeof(float)), 0)
        << "output " << i;
}

TEST(LayerNorm, WrongGammaSizeIsAClearError) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", Shape{{"seq", 3}, {"hidden", 8}});
  ValueId gm = b.input("g", Shape{{"hidden", 7}});
  ValueId bt = b.input("b", Shape{{"hidden", 8}});
  try {
    b.layer_norm(x, gm, bt, 1e-5f, "ln_f");
    FAIL() << "expected an error";
  } catch (const StatusError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("layer_norm 'ln_f'"), std::string::npos) << m;
    EXPECT_NE(m.find("gamma[hidden=7]"), std::string::npos) << m;
    EXPECT_NE(m.find("size 8"), std::string::npos) << m;
  }
}

TEST(LayerNorm, GradientThroughSavedStatisticsIsRejected) {
  Graph g;
  Builder b(g);
  ValueId x = b.parameter("x", S({2, 4}), Init::normal(1.f));
  ValueId gm = b.parameter("g", S({4}), Init::ones());
  ValueId bt = b.parameter("b", S({4}), Init::zeros());
  std::vector<ValueId> o = b.op(OpKind::kLayerNorm, {x, gm, bt}, {}, "ln");
  g.loss = b.matmul(o[1], b.input("probe", S({2})), {false, false, 1, 0});
  EXPECT_THROW(append_backward(g), StatusError);
}

// ---- rms_norm ----

TEST(RmsNorm, ShapeRule) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", Shape{{"batch", 2}, {"seq", 3}, {"hidden", 8}});
  ValueId gm = b.input("g", Shape{{"hidden", 8}});
  std::vector<ValueId> o = b.op(OpKind::kRmsNorm, {x, gm}, {}, "rms");
  ASSERT_EQ(o.size(), 2u);
  EXPECT_EQ(g.shape(o[0]).to_string(), "[batch=2,seq=3,hidden=8]");
  EXPECT_EQ(g.shape(o[1]).to_string(), "[batch=2,seq=3]");
}

TEST(RmsNorm, ForwardMatchesLlamaRmsNormInDouble) {
  for (Shape xs : {S({7}), S({3, 16}), S({4, 33, 256}), S({2, 5, 1000})}) {
    const int64_t C = xs.size(-1);
    Graph g;
    Builder b(g);
    ValueId x = b.input("x", xs);
    ValueId gm = b.input("g", S({C}));
    Attrs at;
    at.eps = 1e-6f;
    std::vector<ValueId> o = b.op(OpKind::kRmsNorm, {x, gm}, at, "rms");
    Tensor tx = random_tensor(xs, 1, 2.f), tg = random_tensor(S({C}), 2);
    auto got = run(g, {{"x", tx}, {"g", tg}}, o);
    NormRef ref = naive_rms_norm(tx, tg, double(1e-6f));
    EXPECT_LT(max_abs_diff(got[0], ref.y), 2e-5) << xs.to_string();
    EXPECT_LT(max_abs_diff(got[1], ref.rstd), 1e-6) << xs.to_string();
  }
}

TEST(RmsNorm, BackwardKernelMatchesReference) {
  for (Shape xs : {S({1, 8}), S({5, 31, 64}), S({2, 300, 100})}) {
    const int64_t C = xs.size(-1);
    const double eps = double(1e-6f);
    Tensor tx = random_tensor(xs, 4), tdy = random_tensor(xs, 5), tg = random_tensor(S({C}), 6);
    NormRef fwd = naive_rms_norm(tx, tg, eps);
    Tensor tr(xs.slice(0, xs.rank() - 1), DType::F32);
    for (int64_t i = 0; i < tr.numel(); ++i) tr.data<float>()[i] = static_cast<float>(fwd.rstd[i]);
    Graph g;
    Builder b(g);
    std::vector<ValueId> in = {b.input("dy", xs), b.input("x", xs), b.input("g", S({C})),
                               b.input("r", tr.shape())};
    std::vector<ValueId> o = b.op(OpKind::kRmsNormGrad, in, {}, "rms_grad");
    auto got = run(g, {{"dy", tdy}, {"x", tx}, {"g", tg}, {"r", tr}}, o);
    NormGradRef ref = naive_norm_grad(tdy, tx, tg, eps, false);
    const double rows = static_cast<double>(xs.numel() / C);
    EXPECT_LT(max_abs_diff(got[0], ref.dx), 1e-4) << xs.to_string();
    EXPECT_LT(max_abs_diff(got[1], ref.dgamma), 1e-5 * rows) << xs.to_string();
  }
}

TEST(RmsNorm, GradientsMatchFiniteDifferences) {
  for (Shape xs : {S({6}), S({3, 5}), S({2, 3, 4})}) {
    const int64_t C = xs.size(-1);
    GradCase c;
    c.params = {xs, S({C})};
    c.build = [](Builder& b, const std::vector<ValueId>& p) { return b.rms_norm(p[0], p[1]); };
    c.eps = 1e-3f;
    EXPECT_TRUE(check_gradients(c)) << xs.to_string();
  }
}

TEST(RmsNorm, GammaGradientDoesNotDependOnThreadCount) {
  const Shape xs = S({4, 150, 96});
  Graph g;
  Builder b(g);
  std::vector<ValueId> in = {b.input("dy", xs), b.input("x", xs), b.input("g", S({96})),
                             b.input("r", S({4, 150}))};
  std::vector<ValueId> o = b.op(OpKind::kRmsNormGrad, in, {}, "rms_grad");
  std::map<std::string, Tensor> feeds = {{"dy", random_tensor(xs, 1)},
                                         {"x", random_tensor(xs, 2)},
                                         {"g", random_tensor(S({96}), 3)},
                                         {"r", random_tensor(S({4, 150}), 5)}};
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  auto one = run(g, feeds, o);
  omp_set_num_threads(3);
  auto three = run(g, feeds, o);
  omp_set_num_threads(saved);
  for (int i = 0; i < 2; ++i)
    EXPECT_EQ(std::memcmp(one[i].data(), three[i].data(), one[i].size() * sizeof(float)), 0)
        << "output " << i;
}

TEST(RmsNorm, ScalarInputIsAClearError) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", Shape{});
  ValueId gm = b.input("g", S({1}));
  try {
    b.rms_norm(x, gm, 1e-6f, "rms");
    FAIL() << "expected an error";
  } catch (const StatusError& e) {
    EXPECT_NE(std::string(e.what()).find("rms_norm 'rms'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace meshflow
