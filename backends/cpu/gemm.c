/* Row-major SGEMM: C(M,N) = alpha * op(A) op(B) + beta * C. OpenBLAS when the
 * build has it, else a plain blocked loop (correct, not fast). */
#include "dgrad_config.h"
#include "backends/cpu/cpu_impl.h"
#include "base/threads_impl.h"

#if DG_HAVE_BLAS
#include <cblas.h>
#endif

static void sgemm1(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
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

/* ---- split over the pool: each task owns a block of C's columns (or rows,
 * when C is tall), so tasks never write the same memory ---- */

typedef struct {
  int ta, tb, by_cols, ntasks;
  int64_t M, N, K, lda, ldb, ldc, step;
  float alpha, beta;
  const float *A, *B;
  float *C;
} gemm_job;

static void gemm_task(void *arg, int t) {
  const gemm_job *j = arg;
  int64_t lo = t * j->step, hi = DG_MIN(lo + j->step, j->by_cols ? j->N : j->M);
  if (lo >= hi) return;
  if (j->by_cols) { /* columns [lo, hi) of op(B) and C */
    const float *b = j->tb ? j->B + lo * j->ldb : j->B + lo;
    sgemm1(j->ta, j->tb, j->M, hi - lo, j->K, j->alpha, j->A, j->lda, b, j->ldb, j->beta,
           j->C + lo, j->ldc);
  } else { /* rows [lo, hi) of op(A) and C */
    const float *a = j->ta ? j->A + lo : j->A + lo * j->lda;
    sgemm1(j->ta, j->tb, hi - lo, j->N, j->K, j->alpha, a, j->lda, j->B, j->ldb, j->beta,
           j->C + lo * j->ldc, j->ldc);
  }
}

void dg__sgemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
               int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  int threads = dg_get_num_threads();
  /* below ~0.5 MFLOP the fork/join costs more than it saves */
  if (threads <= 1 || M <= 0 || N <= 0 || (double)M * N * K < 262144.0) {
    sgemm1(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  gemm_job j = {ta, tb, N >= M, threads, M, N, K, lda, ldb, ldc, 0, alpha, beta, A, B, C};
  int64_t len = j.by_cols ? N : M, align = j.by_cols ? 16 : 4;
  j.step = ((len + threads - 1) / threads + align - 1) / align * align;
  j.ntasks = (int)((len + j.step - 1) / j.step);
  dg__parallel_for(j.ntasks, gemm_task, &j);
}
