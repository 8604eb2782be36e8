/* Row-major SGEMM: C(M,N) = alpha * op(A) op(B) + beta * C. OpenBLAS when the
 * build has it, else a plain blocked loop (correct, not fast). */
#include "dgrad_config.h"
#include "tensor/cpu/cpu_impl.h"

#if DG_HAVE_BLAS
#include <cblas.h>
#endif

void dg__sgemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
               int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
    return;
  }
#if DG_HAVE_BLAS
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              (int)M, (int)N, (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
#else
  for (int64_t i = 0; i < M; i++) {
    float *c = C + i * ldc;
    for (int64_t j = 0; j < N; j++) c[j] = beta == 0.0f ? 0.0f : beta * c[j];
    for (int64_t k = 0; k < K; k++) {
      float a = alpha * (ta ? A[k * lda + i] : A[i * lda + k]);
      if (a == 0.0f) continue;
      if (!tb) {
        const float *b = B + k * ldb;
        for (int64_t j = 0; j < N; j++) c[j] += a * b[j];
      } else {
        for (int64_t j = 0; j < N; j++) c[j] += a * B[j * ldb + k];
      }
    }
  }
#endif
}
