#include "grad_check.h"

#include <cmath>

#include "meshflow/autodiff/autodiff.h"
#include "meshflow/core/random.h"
#include "meshflow/ops/verify.h"
#include "meshflow/runtime/executor.h"

namespace meshflow::testing {

Shape S(const std::vector<int64_t>& sizes) {
  std::vector<Dim> d;
  for (size_t i = 0; i < sizes.size(); ++i) d.push_back({"d" + std::to_string(i), sizes[i]});
  return Shape(d);
}

std::vector<std::vector<float>> run_forward(const Graph& g, const std::vector<ValueId>& ys,
                                            const std::map<std::string, Tensor>& feeds) {
  ExecutorOptions eo;
  eo.fetch = ys;
  Executor ex(g, eo);
  for (const auto& [name, t] : feeds) throw_if_error(ex.feed(name, t));
  ex.run(ex.eval_order());
  std::vector<std::vector<float>> out;
  for (ValueId y : ys) out.emplace_back(ex.data_f(y), ex.data_f(y) + g.shape(y).numel());
  return out;
}

Tensor random_tensor(const Shape& s, uint64_t seed, float scale) {
  Tensor t(s, DType::F32);
  uint64_t st = mix64(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = scale * normal01(st, i);
  return t;
}

double max_rel_diff(const float* a, const float* b, int64_t n) {
  double num = 0, den = 1e-6;
  for (int64_t i = 0; i < n; ++i) {
    num = std::max(num, std::fabs(double(a[i]) - double(b[i])));
    den = std::max(den, std::fabs(double(b[i])));
  }
  return num / den;
}

::testing::AssertionResult check_gradients(const GradCase& c) {
  Graph g;
  Builder b(g);
  std::vector<ValueId> params;
  for (size_t i = 0; i < c.params.size(); ++i)
    params.push_back(b.parameter("p" + std::to_string(i), c.params[i], Init::zeros()));
  ValueId y = c.build(b, params);
  b.set_phase(Phase::kForward);
  ValueId r = b.input("probe", g.shape(y));
  // loss = sum(y * r), as a full contraction (needs no other op).
  g.loss = b.matmul(y, r, {false, false, g.shape(y).rank(), 0}, "probe_loss");
  append_backward(g);
  Status vs = verify(g);
  if (!vs.is_ok()) return ::testing::AssertionFailure() << "verify: " << vs.message();

  Executor ex(g);
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor v =
        i < c.param_values.size() ? c.param_values[i] : random_tensor(c.params[i], c.seed + i);
    ex.storage(params[i]).copy_from(v.raw());
  }
  for (const auto& [name, t] : c.inputs) {
    Status s = ex.feed(name, t);
    if (!s.is_ok()) return ::testing::AssertionFailure() << s.message();
  }
  Tensor probe = random_tensor(g.shape(y), c.seed + 100);
  ex.storage(r).copy_from(probe.raw());
  ex.feed_scalar("loss_scale", 1.f);
  ex.feed_scalar_i32("rng_offset", 3);
  ex.run(ex.forward_backward_order());

  // Copy every analytic gradient first: the forward runs below reuse the arena.
  std::vector<std::vector<float>> grads;
  for (size_t i = 0; i < params.size(); ++i) {
    auto it = g.grad_of_param.find(params[i]);
    if (it == g.grad_of_param.end())
      return ::testing::AssertionFailure() << "parameter " << i << " got no gradient";
    grads.emplace_back(ex.data_f(it->second), ex.data_f(it->second) + c.params[i].numel());
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t n = c.params[i].numel();
    const std::vector<float>& analytic = grads[i];
    float* p = ex.storage(params[i]).data<float>();
    double worst = 0;
    int64_t worst_at = -1;
    float worst_a = 0, worst_n = 0;
    for (int64_t j = 0; j < n; ++j) {
      const float saved = p[j];
      p[j] = saved + c.eps;
      ex.run(ex.eval_order());
      double lp = ex.scalar(g.loss);
      p[j] = saved - c.eps;
      ex.run(ex.eval_order());
      double lm = ex.scalar(g.loss);
      p[j] = saved;
      double numeric = (lp - lm) / (2.0 * c.eps);
      double err = std::fabs(analytic[j] - numeric) / std::max(1.0, std::fabs(numeric));
      if (err > worst) {
        worst = err;
        worst_at = j;
        worst_a = analytic[j];
        worst_n = static_cast<float>(numeric);
      }
    }
    if (worst > c.tol)
      return ::testing::AssertionFailure()
             << "parameter " << i << " " << c.params[i].to_string() << ": element " << worst_at
             << " analytic " << worst_a << " vs numeric " << worst_n << " (error " << worst
             << " > tol " << c.tol << ")";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace meshflow::testing
