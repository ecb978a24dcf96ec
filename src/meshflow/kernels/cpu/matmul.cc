// matmul on the CPU: one cpu::sgemm (kernels/cpu/gemm.h) per batch element.
#include "meshflow/kernels/cpu/gemm.h"
#include "meshflow/kernels/cpu/parallel.h"
#include "meshflow/kernels/kernel.h"
#include "meshflow/ops/matmul_dims.h"

namespace meshflow {

namespace {

void matmul_kernel(const KernelCall& c) {
  MatMulDims d = value_or_throw(matmul_dims(c.g, c.n));
  const Attrs& at = c.attrs();
  const float* a = c.in_f(0);
  const float* b = c.in_f(1);
  float* y = c.out_f(0);
  const int M = static_cast<int>(d.M), N = static_cast<int>(d.N), K = static_cast<int>(d.K);
  const int lda = at.trans_a ? M : K;
  const int ldb = at.trans_b ? K : N;
  const bool ta = at.trans_a, tb = at.trans_b;
  const int64_t sa = d.M * d.K, sb = d.K * d.N, sy = d.M * d.N;
  if (d.B == 1) {
    cpu::sgemm(ta, tb, M, N, K, 1.f, a, lda, b, ldb, 0.f, y, N);
    return;
  }
  // Many small GEMMs: one per thread (OpenBLAS runs single-threaded inside our
  // OpenMP region). Large ones: sequential, each using every thread.
  const bool small = d.M * d.N * d.K < (1 << 18);
  if (small) {
    cpu::parallel_for(d.B, sa + sb + sy, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i)
        cpu::sgemm(ta, tb, M, N, K, 1.f, a + i * sa, lda, b + i * sb, ldb, 0.f, y + i * sy, N);
    });
  } else {
    for (int64_t i = 0; i < d.B; ++i)
      cpu::sgemm(ta, tb, M, N, K, 1.f, a + i * sa, lda, b + i * sb, ldb, 0.f, y + i * sy, N);
  }
}

}  // namespace

void register_matmul_kernels(KernelTable& t) {
  t[static_cast<int>(OpKind::kMatMul)] = matmul_kernel;
}

}  // namespace meshflow
