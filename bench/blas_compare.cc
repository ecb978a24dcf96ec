// Measures single-precision GEMM throughput of one BLAS library, loaded with
// dlopen so the same binary measures OpenBLAS, BLIS and oneDNN side by side
// (bench/blas_compare.sh runs it once per library, each in its own process).
//
//   blas_compare /usr/lib/x86_64-linux-gnu/blis-openmp/libblis.so.4 cblas 2
//   blas_compare /usr/lib/x86_64-linux-gnu/libdnnl.so.2 dnnl 1
// Shapes: the GEMMs of the GPT benchmark step (tokens=2048, d=256) and a square one.
#include <dlfcn.h>
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

using CblasSgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*,
                            int, float, float*, int);
using DnnlSgemm = int (*)(char, char, int64_t, int64_t, int64_t, float, const float*, int64_t,
                          const float*, int64_t, float, float*, int64_t);
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

struct Shape {
  const char* what;
  int m, n, k;
  bool tb;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: blas_compare LIBRARY.so cblas|dnnl THREADS\n");
    return 2;
  }
  const char* path = argv[1];
  const bool dnnl = std::strcmp(argv[2], "dnnl") == 0;
  const int threads = std::atoi(argv[3]);
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    std::fprintf(stderr, "blas_compare: cannot load %s: %s\n", path, dlerror());
    return 2;
  }
  omp_set_num_threads(threads);
  if (auto f = reinterpret_cast<void (*)(int)>(dlsym(h, "openblas_set_num_threads"))) f(threads);
  if (auto f = reinterpret_cast<void (*)(long)>(dlsym(h, "bli_thread_set_num_threads"))) f(threads);
  auto cblas = reinterpret_cast<CblasSgemm>(dlsym(h, "cblas_sgemm"));
  auto dsgemm = reinterpret_cast<DnnlSgemm>(dlsym(h, "dnnl_sgemm"));
  if ((dnnl && !dsgemm) || (!dnnl && !cblas)) {
    std::fprintf(stderr, "blas_compare: %s has no %s\n", path, dnnl ? "dnnl_sgemm" : "cblas_sgemm");
    return 2;
  }
  const Shape shapes[] = {
      {"qkv/fc1 fwd 2048x768x256", 2048, 768, 256, false},
      {"fc2 fwd 2048x256x1024", 2048, 256, 1024, false},
      {"dx = dy W^T 2048x1024x256", 2048, 1024, 256, true},
      {"lm head 2048x256x256", 2048, 256, 256, true},
      {"square 1024", 1024, 1024, 1024, false},
  };
  double total_flops = 0, total_s = 0;
  for (const Shape& s : shapes) {
    std::vector<float> a(size_t(s.m) * s.k, 0.5f), b(size_t(s.k) * s.n, 0.25f),
        c(size_t(s.m) * s.n);
    auto run = [&] {
      if (dnnl)
        dsgemm('N', s.tb ? 'T' : 'N', s.m, s.n, s.k, 1.f, a.data(), s.k, b.data(), s.tb ? s.k : s.n,
               0.f, c.data(), s.n);
      else
        cblas(kRowMajor, kNoTrans, s.tb ? kTrans : kNoTrans, s.m, s.n, s.k, 1.f, a.data(), s.k,
              b.data(), s.tb ? s.k : s.n, 0.f, c.data(), s.n);
    };
    for (int i = 0; i < 3; ++i) run();
    int reps = 0;
    auto t0 = std::chrono::steady_clock::now();
    double el = 0;
    while (el < 0.5) {
      run();
      ++reps;
      el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    double flops = 2.0 * s.m * s.n * s.k * reps;
    total_flops += flops;
    total_s += el;
    std::printf("%-28s %8.1f GFLOP/s\n", s.what, flops / el / 1e9);
  }
  std::printf("%-28s %8.1f GFLOP/s\n", "overall", total_flops / total_s / 1e9);
  return 0;
}
