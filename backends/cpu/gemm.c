/* Row-major SGEMM: C(M,N) = alpha * op(A) op(B) + beta * C. OpenBLAS when the
 * build has it, else a plain blocked loop (correct, not fast). */
#include <pthread.h>

#include "dgrad_config.h"
#include "backends/cpu/cpu_impl.h"
#include "base/threads_impl.h"
#include "base/trace_impl.h"

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

/* ---- split over the pool: each task owns a block of C's rows or of its
 * columns, so tasks never write the same memory ----
 *
 * Which split is faster depends on the shape and the CPU, and by more than
 * the split's arithmetic suggests: splitting C's columns makes both threads
 * write every row, and where the line pairs that the L2's adjacent-line
 * prefetcher fetches together straddle the boundary the cores fight over
 * them (column blocks of 64 B cost 10-15% against 128 B on one Xeon; rows
 * won by up to 20% on tall outputs, columns on short ones). So column blocks
 * are 128 B multiples, and each shape tries both splits on its first calls
 * (a training step repeats its shapes) and keeps the faster. Both compute
 * every element with the same kernel over the same K order: the choice
 * never changes a bit. */

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

#define SPLIT_SLOTS 256 /* shapes remembered; past that, rows (they won more often) */
#define SPLIT_TRIES 3   /* timed calls per split before choosing */
#define COL_ALIGN 32    /* floats: 128 B, an adjacent-line prefetch pair */
#define ROW_MIN 16      /* rows per task below which rows are not tried */

typedef struct {
  int64_t M, N, K;
  int ta, tb, threads; /* threads 0: a free slot */
  int tries[2];
  int pick;      /* -1 while trying, else 0 rows / 1 columns */
  int64_t ns[2]; /* fastest call seen: rows, columns */
} split_slot;

static split_slot g_split[SPLIT_SLOTS];
static pthread_mutex_t g_split_mu = PTHREAD_MUTEX_INITIALIZER;

/* The split to run (0 rows, 1 columns) for a shape both can split, and the
 * slot to time it into (NULL: decided). Called with the lock held. */
static int split_pick(const split_slot *shape, split_slot **timing) {
  *timing = NULL;
  uint64_t h = 1469598103934665603ULL; /* FNV-1a over the shape: the probe's start */
  int64_t v[6] = {shape->M, shape->N, shape->K, shape->ta, shape->tb, shape->threads};
  for (int i = 0; i < 6; i++) h = (h ^ (uint64_t)v[i]) * 1099511628211ULL;
  split_slot *e = NULL;
  for (int i = 0; i < SPLIT_SLOTS && !e; i++) {
    split_slot *c = &g_split[(h + (uint64_t)i) % SPLIT_SLOTS];
    if (!c->threads || (c->M == shape->M && c->N == shape->N && c->K == shape->K &&
                        c->ta == shape->ta && c->tb == shape->tb && c->threads == shape->threads))
      e = c;
  }
  if (!e) return 0;
  if (!e->threads) *e = *shape;
  if (e->pick >= 0) return e->pick;
  *timing = e;
  return e->tries[0] > e->tries[1]; /* alternate, rows first */
}

static void split_record(split_slot *e, int cols, int64_t ns) {
  if (ns < e->ns[cols]) e->ns[cols] = ns;
  if (++e->tries[cols] >= SPLIT_TRIES && e->tries[!cols] >= SPLIT_TRIES)
    e->pick = e->ns[1] < e->ns[0];
}

void dg__sgemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
               int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  int threads = dg_get_num_threads();
  /* below ~0.5 MFLOP the fork/join costs more than it saves */
  if (threads <= 1 || M <= 0 || N <= 0 || (double)M * N * K < 262144.0) {
    sgemm1(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  int can_rows = M >= (int64_t)threads * ROW_MIN, can_cols = N >= (int64_t)threads * COL_ALIGN;
  if (!can_rows && !can_cols) can_cols = N >= M, can_rows = !can_cols;
  split_slot *timing = NULL;
  int cols = can_cols;
  if (can_rows && can_cols) {
    split_slot shape = {M, N, K, ta, tb, threads, {0, 0}, -1, {INT64_MAX, INT64_MAX}};
    pthread_mutex_lock(&g_split_mu);
    cols = split_pick(&shape, &timing);
    pthread_mutex_unlock(&g_split_mu);
  }
  gemm_job j = {ta, tb, cols, threads, M, N, K, lda, ldb, ldc, 0, alpha, beta, A, B, C};
  int64_t len = cols ? N : M, align = cols ? COL_ALIGN : 4;
  j.step = ((len + threads - 1) / threads + align - 1) / align * align;
  j.ntasks = (int)((len + j.step - 1) / j.step);
  int64_t t0 = timing ? (int64_t)dg__trace_now() : 0;
  dg__parallel_for(j.ntasks, gemm_task, &j);
  if (timing) {
    int64_t dt = (int64_t)dg__trace_now() - t0;
    pthread_mutex_lock(&g_split_mu);
    split_record(timing, cols, dt);
    pthread_mutex_unlock(&g_split_mu);
  }
}
