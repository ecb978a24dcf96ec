// sgemm: the GEMM entry point of the CPU kernels (row-major,
// C = alpha * op(A) op(B) + beta * C). Backed by oneDNN (dnnl_sgemm) when
// meshflow is built with it (the fastest of OpenBLAS, BLIS and oneDNN on this
// CPU by bench/blas_compare.sh; see docs/kernels.md), else by cblas_sgemm.
// small_sgemm: OpenBLAS always, for the attention kernels' many small
// per-head blocks (64 x 64 x 64), where a call through oneDNN costs more
// than its product.
// Both use OpenMP: called inside one of our parallel regions, they run on the
// calling thread only.
//
//   sgemm(false, true, M, N, K, 1.f, a, K, b, K, 0.f, y, N);   // y = a b^T
#pragma once

#include <cstdint>

namespace meshflow::cpu {

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// The same product through cblas_sgemm, whatever sgemm calls.
void small_sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                 const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                 int64_t ldc);

// xt[D, S] = x[S, D]^T. The attention kernels' score GEMMs read K (and dP
// reads V) transposed: OpenBLAS runs row-major Q [rows,D] x Kt [D,S] about
// 1.6x faster than Q x K^T at these sizes (its small-matrix kernels cover NN
// but not this NT case).
void transpose_to(const float* x, int64_t S, int64_t D, float* xt);

// Which library sgemm calls: "oneDNN" or "OpenBLAS".
const char* gemm_library();

}  // namespace meshflow::cpu
