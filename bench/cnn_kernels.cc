// The CPU kernels of a convolutional network's non-GEMM layers, called as
// the executor calls them: max_pool2d and batch_norm, forward and backward,
// at the shapes of configs/models/resnet_fashion.json's stem (batch 32, 32
// channels, 28 x 28, pool 3x3 stride 2 padding 1), median of >= 20 runs.
//   OMP_NUM_THREADS=T build/bench/cnn_kernels
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#include "meshflow/kernels/kernel.h"
#include "meshflow/ops/builder.h"

namespace {

using Clock = std::chrono::steady_clock;

// Median seconds of fn over >= 20 repetitions and >= 0.5 s.
double time_s(const std::function<void()>& fn) {
  fn();
  std::vector<double> t;
  const auto start = Clock::now();
  while (t.size() < 20 || std::chrono::duration<double>(Clock::now() - start).count() < 0.5) {
    const auto t0 = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

std::vector<float> filled(int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = float((i * 7919) % 1000) * 0.001f;
  return v;
}

}  // namespace

int main() {
  using namespace meshflow;
  Graph g;
  Builder b(g);
  const Shape xs{{"batch", 32}, {"channels", 32}, {"height", 28}, {"width", 28}};
  const Shape cs{{"channels", 32}};
  const ValueId x = b.input("x", xs);
  const ValueId pooled = b.max_pool2d(x, {{3, 3}, {2, 2}, {1, 1}, {1, 1}}, "pool");
  const ValueId dpool = b.input("dpool", g.shape(pooled));
  const ValueId pool_dx =
      b.op1(OpKind::kMaxPool2dGrad, {dpool, x}, g.producer(pooled).attrs, "pool_dx");
  const ValueId gamma = b.input("gamma", cs), beta = b.input("beta", cs);
  const ValueId normed =
      b.batch_norm(x, gamma, beta, b.input("running_mean", cs), b.input("running_var", cs));
  const ValueId dy = b.input("dy", xs), mean = b.input("mean", cs), rstd = b.input("rstd", cs);
  const ValueId bn_dx =
      b.op(OpKind::kBatchNormGrad, {dy, x, gamma, mean, rstd}, g.producer(normed).attrs)[0];

  std::vector<float> X = filled(xs.numel()), Y(static_cast<size_t>(xs.numel())),
                     P(static_cast<size_t>(g.shape(pooled).numel())),
                     DP = filled(g.shape(pooled).numel()), DX(static_cast<size_t>(xs.numel())),
                     DY = filled(xs.numel()), G(32, 1.f), B(32, 0.f), RM(32, 0.f), RV(32, 1.f),
                     M(32), R(32), DG(32), DB(32);
  int64_t training = 0;  // rng_offset >= 0: the batch's own statistics
  auto run = [&](ValueId out, std::vector<void*> in, std::vector<void*> outs) {
    const Node& n = g.producer(out);
    in.resize(n.inputs.size());
    KernelCall k{g, n, std::move(in), std::move(outs)};
    cpu_kernel(n.kind)(k);
  };
  const double pool_f = time_s([&] { run(pooled, {X.data()}, {P.data()}); });
  const double pool_b = time_s([&] { run(pool_dx, {DP.data(), X.data()}, {DX.data()}); });
  const double bn_f = time_s([&] {
    run(normed, {X.data(), G.data(), B.data(), RM.data(), RV.data(), &training},
        {Y.data(), M.data(), R.data()});
  });
  const double bn_b = time_s([&] {
    run(bn_dx, {DY.data(), X.data(), G.data(), M.data(), R.data()},
        {DX.data(), DG.data(), DB.data()});
  });
  std::printf("cnn kernels, %d threads, x %s\n", omp_get_max_threads(), xs.to_string().c_str());
  std::printf("  max_pool2d        %.3f ms\n  max_pool2d_grad   %.3f ms\n", 1e3 * pool_f,
              1e3 * pool_b);
  std::printf("  batch_norm        %.3f ms\n  batch_norm_grad   %.3f ms\n", 1e3 * bn_f, 1e3 * bn_b);
}
