#include "meshflow/kernels/cpu/blas_core.h"

#include <cblas.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

namespace meshflow::cpu {

namespace {

// OpenBLAS's x86-64 kernel sets by the widest vectors they use: 3 AVX-512,
// 2 AVX2 + FMA, 1 AVX, 0 SSE (the fallback) and any name not listed.
int vector_level(const std::string& core) {
  for (const char* c : {"SkylakeX", "Cooperlake", "SapphireRapids"})
    if (core == c) return 3;
  for (const char* c : {"Haswell", "Zen", "Excavator"})
    if (core == c) return 2;
  for (const char* c : {"Sandybridge", "Bulldozer", "Piledriver", "Steamroller"})
    if (core == c) return 1;
  return 0;
}

}  // namespace

bool BlasCore::falls_back() const {
  return !supported.empty() && vector_level(running) < 2;
}

BlasCore blas_core() {
  BlasCore b;
  const char* name = openblas_get_corename();
  b.running = name ? name : "";
  // Trailing spaces: OpenBLAS pads some names.
  while (!b.running.empty() && b.running.back() == ' ') b.running.pop_back();
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    b.supported = "SkylakeX";
  else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    b.supported = "Haswell";
#endif
  return b;
}

void use_supported_blas_kernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  const BlasCore b = blas_core();
  if (!b.falls_back()) return;
  // Without argv (a static initializer): the arguments this process got.
  std::string cmdline;
  std::vector<char*> args;
  if (argv == nullptr) {
    std::ifstream f("/proc/self/cmdline", std::ios::binary);
    cmdline.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    for (size_t i = 0; i < cmdline.size(); i += std::strlen(&cmdline[i]) + 1)
      args.push_back(&cmdline[i]);
    if (args.empty()) return;
    args.push_back(nullptr);
    argv = args.data();
  }
  ::setenv("OPENBLAS_CORETYPE", b.supported.c_str(), 1);
  ::execv("/proc/self/exe", argv);
  // The restart failed: go on as we are (the variable stays set, harmless).
}

}  // namespace meshflow::cpu
