// Times full GPT training steps (forward + backward + AdamW) in meshflow, and
// the GEMM peak of this machine in the same process, for bench/gpt_vs_torch.sh.
//
//   gpt_step --threads 2 --steps 20 [--layers 4 --embd 256 --heads 4 --seq 128 --batch 16]
// Prints one JSON line: {"threads", "tokens_per_s", "step_ms", "gflops", "gemm_peak_gflops", ...}
#include <cblas.h>
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "meshflow/autodiff/autodiff.h"
#include "meshflow/core/random.h"
#include "meshflow/engine/trainer.h"
#include "meshflow/kernels/cpu/blas_core.h"
#include "meshflow/models/gpt.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/ops/verify.h"
#include "meshflow/optim/optimizer.h"
#include "meshflow/runtime/executor.h"

using namespace meshflow;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Best GFLOP/s of a square SGEMM of the size the model's largest GEMMs have.
double gemm_peak() {
  const int n = 1024;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.f, a.data(), n, b.data(), n,
                0.f, c.data(), n);
    best = std::max(best, 2.0 * n * n * n / seconds_since(t0) / 1e9);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  meshflow::cpu::use_supported_blas_kernels(argv);  // kernels/cpu/blas_core.h
  int threads = 1, steps = 20, layers = 4, embd = 256, heads = 4, seq = 128, batch = 16;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    int v = std::atoi(argv[i + 1]);
    if (k == "--threads")
      threads = v;
    else if (k == "--steps")
      steps = v;
    else if (k == "--layers")
      layers = v;
    else if (k == "--embd")
      embd = v;
    else if (k == "--heads")
      heads = v;
    else if (k == "--seq")
      seq = v;
    else if (k == "--batch")
      batch = v;
    else {
      std::fprintf(stderr, "gpt_step: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  set_compute_threads(threads);
  GptConfig cfg;
  cfg.n_layer = layers;
  cfg.n_embd = embd;
  cfg.n_head = heads;
  cfg.n_positions = seq;
  cfg.vocab_size = 256;
  cfg.n_inner = 4 * embd;
  ModelGraph m = value_or_throw(build_gpt(cfg, batch, seq));
  Graph& g = m.graph;
  append_backward(g);
  OptimizerConfig oc;
  oc.lr = 1e-3f;
  oc.weight_decay = 0.1f;
  oc.grad_clip = 1.0f;
  append_optimizer(g, oc);
  throw_if_error(verify(g));
  ExecutorOptions eo;
  eo.seed = 1;
  Executor ex(g, eo);
  Tensor tokens(g.shape(g.find("tokens")), DType::I32),
      targets(g.shape(g.find("targets")), DType::I32);
  Rng rng(3);
  for (int64_t i = 0; i < tokens.numel(); ++i) {
    tokens.data<int32_t>()[i] = static_cast<int32_t>(rng.below(256));
    targets.data<int32_t>()[i] = static_cast<int32_t>(rng.below(256));
  }
  throw_if_error(ex.feed("tokens", tokens));
  throw_if_error(ex.feed("targets", targets));
  ex.feed_scalar("loss_scale", 1.f);
  ex.feed_scalar("lr", 1e-3f);
  double flops = 0;
  for (NodeId id : ex.training_order()) flops += op_cost(g, g.node(id)).flops;
  auto run_step = [&](int s) {
    ex.feed_scalar("step", static_cast<float>(s + 1));
    ex.feed_scalar_i32("rng_offset", s);
    ex.run(ex.training_order());
  };
  for (int s = 0; s < 3; ++s) run_step(s);  // warm up
  auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < steps; ++s) run_step(3 + s);
  double el = seconds_since(t0);
  double peak = gemm_peak();
  double tps = double(batch) * seq * steps / el;
  std::printf(
      "{\"impl\": \"meshflow\", \"threads\": %d, \"tokens_per_s\": %.1f, \"step_ms\": %.2f, "
      "\"gflops\": %.2f, "
      "\"gemm_peak_gflops\": %.2f, \"fraction_of_gemm_peak\": %.3f, \"loss\": %.4f, "
      "\"peak_bytes\": %lld}\n",
      threads, tps, 1e3 * el / steps, flops * steps / el / 1e9, peak,
      flops * steps / el / 1e9 / peak, ex.scalar(g.loss),
      static_cast<long long>(ex.memory().total()));
  return 0;
}
