// sgemm: the one GEMM entry point of the CPU kernels (row-major,
// C = alpha * op(A) op(B) + beta * C). Backed by OpenBLAS (cblas_sgemm), or by
// meshflow is built with it (the fastest of OpenBLAS, BLIS and oneDNN on this
// CPU by bench/blas_compare.sh; see docs/kernels.md), else by cblas_sgemm.
// Both use OpenMP: called inside one of our parallel regions, they run on the
// calling thread only.
//
//   sgemm(false, true, M, N, K, 1.f, a, K, b, K, 0.f, y, N);   // y = a b^T
#pragma once

#include <cstdint>

namespace meshflow::cpu {

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// Which library sgemm calls: "oneDNN" or "OpenBLAS".
const char* gemm_library();

}  // namespace meshflow::cpu
