#include "meshflow/kernels/cpu/gemm.h"

#ifdef MESHFLOW_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif
#include <cblas.h>

#include "meshflow/core/check.h"

namespace meshflow::cpu {

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
#ifdef MESHFLOW_HAVE_DNNL
  dnnl_status_t s = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda, B,
                               ldb, beta, C, ldc);
  MF_CHECK(s == dnnl_success) << "dnnl_sgemm(" << M << "x" << N << "x" << K
                              << ") failed with status " << s;
#else
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(M), static_cast<int>(N),
              static_cast<int>(K), alpha, A, static_cast<int>(lda), B, static_cast<int>(ldb), beta,
              C, static_cast<int>(ldc));
#endif
}

void small_sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                 const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                 int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(M), static_cast<int>(N),
              static_cast<int>(K), alpha, A, static_cast<int>(lda), B, static_cast<int>(ldb), beta,
              C, static_cast<int>(ldc));
}

void transpose_to(const float* x, int64_t S, int64_t D, float* xt) {
  for (int64_t d = 0; d < D; ++d)
    for (int64_t j = 0; j < S; ++j) xt[d * S + j] = x[j * D + d];
}

const char* gemm_library() {
#ifdef MESHFLOW_HAVE_DNNL
  return "oneDNN";
#else
  return "OpenBLAS";
#endif
}

}  // namespace meshflow::cpu
