// The kernel set OpenBLAS runs. Debian's OpenBLAS (built with DYNAMIC_ARCH)
// picks it from the CPUID model when the library loads, and falls back to
// its generic Prescott (SSE3) kernels on a model it does not know. A virtual
// machine that hides the processor model ("Intel(R) Xeon(R) Processor")
// gets those even where the CPU runs AVX-512: on this project's 2-core
// development VM, SGEMM at 64 GFLOP/s against 275 with the SkylakeX kernels
// (`meshflow bench --calibrate`, 2026-11-26). OpenBLAS reads the
// OPENBLAS_CORETYPE variable only as it loads, so the remedy is a process
// started with it: use_supported_blas_kernels restarts the program so.
//
//   int main(int argc, char** argv) {
//     meshflow::cpu::use_supported_blas_kernels(argv);   // first thing
//     ...
//   meshflow::cpu::blas_core().running;   // "SkylakeX"
#pragma once

#include <string>

namespace meshflow::cpu {

struct BlasCore {
  std::string running;  // openblas_get_corename(): "SkylakeX", "Haswell", "Prescott", ...
  // The best kernel set this CPU's instructions run (cpuid): "SkylakeX"
  // (AVX-512 F, BW, DQ and VL), "Haswell" (AVX2 and FMA) or "" (neither).
  std::string supported;
  // OpenBLAS runs a set without AVX2 (its fallback) where the CPU supports one.
  bool falls_back() const;
};
BlasCore blas_core();

// When OpenBLAS fell back (BlasCore::falls_back) and OPENBLAS_CORETYPE is
// unset: sets OPENBLAS_CORETYPE to the supported set and re-executes this
// program (/proc/self/exe, the same arguments and environment otherwise),
// so that OpenBLAS loads with it. Returns when nothing needs doing, when the
// variable is already set (by the user, or by this restart: never twice), or
// when the restart fails (the process goes on with the slow kernels).
// Call it first in main, before any thread starts; argv null: the
// arguments are read from /proc/self/cmdline (a static initializer's call).
void use_supported_blas_kernels(char** argv = nullptr);

}  // namespace meshflow::cpu
