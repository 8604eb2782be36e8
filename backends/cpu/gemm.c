/* Row-major SGEMM: C(M,N) = alpha * op(A) op(B) + beta * C. dgrad's own
 * kernel on the CPUs and shapes it is chosen for (gemm_own.c), else
 * OpenBLAS when the build has it, else a plain blocked loop (correct, not
 * fast). */
#include <pthread.h>
#include <string.h>

#include "dgrad_config.h"
#include "backends/cpu/cpu_impl.h"
#include "backends/kern_blas.h"
#include "base/lend_impl.h"
#include "base/threads_impl.h"
#include "base/trace_impl.h"

#if DG_HAVE_BLAS
#include <cblas.h>
#endif

/* C (M, N) = res + bias (either NULL) at C's stride: blas.c's fill, a row
 * at a time where C's rows are not contiguous. */
static void fill_block(float *C, int64_t ldc, const float *res, const float *bias, int64_t M,
                       int64_t N) {
  if (ldc == N) {
    dg__fill_rows(C, res, bias, M, N);
    return;
  }
  for (int64_t i = 0; i < M; i++)
    dg__fill_rows(C + i * ldc, res ? res + i * ldc : NULL, bias, 1, N);
}

/* C (M, N) = C < 0 ? 0 : C where relu, then mask > 0 ? C : 0 where mask
 * (the relu kernel's selects), after a product the own kernel did not
 * take. */
DG_INLINE void select_block_body(float *C, int64_t ldc, int64_t M, int64_t N, int relu,
                                 const float *mask) {
  for (int64_t i = 0; i < M; i++) {
    float *restrict c = C + i * ldc;
    if (relu)
      for (int64_t j = 0; j < N; j++) c[j] = c[j] < 0.0f ? 0.0f : c[j];
    if (mask) {
      const float *restrict m = mask + i * ldc;
      for (int64_t j = 0; j < N; j++) c[j] = m[j] > 0.0f ? c[j] : 0.0f;
    }
  }
}
DG_SIMD_FN(select_block,
           (float *C, int64_t ldc, int64_t M, int64_t N, int relu, const float *mask),
           (C, ldc, M, N, relu, mask))

/* e's pointers at the block of C at row r0, column c0 (rows ldc apart). */
static dg__gemm_epi epi_at(const dg__gemm_epi *e, int64_t r0, int64_t c0, int64_t ldc) {
  int64_t off = r0 * ldc + c0;
  dg__gemm_epi b = {e->res ? e->res + off : NULL, e->bias ? e->bias + c0 : NULL,
                    e->mask ? e->mask + off : NULL, e->relu};
  return b;
}

/* C = alpha op(A) op(B) + beta C on OpenBLAS, or without it a plain loop. */
static void sgemm_plain(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                        const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                        float *C, int64_t ldc) {
  if (K <= 0) {
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
    return;
  }
#if DG_HAVE_BLAS
  if (beta == 0.0f) { /* OpenBLAS's beta = 0 pass was 1-19% of a product slower on a
                       * Zen 3 than a memset (K = 64: 19%); both sum 0 + x */
    for (int64_t i = 0; i < M; i++) memset(C + i * ldc, 0, (size_t)N * sizeof(float));
    beta = 1.0f;
  }
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

/* own: the whole product's dg__sgemm_own_fits, passed to each of its
 * blocks. e (dg__sgemm_add's, at this block; NULL: none): res/bias
 * replace beta C, the selects follow. */
static void sgemm1(int own, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                   const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                   const dg__gemm_epi *e, float *C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (own && !dg__sgemm_own_add(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, e, C, ldc))
    return;
  if (e && (e->res || e->bias)) /* the own kernel declined */
    fill_block(C, ldc, e->res, e->bias, M, N), beta = 1.0f;
  sgemm_plain(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  if (e && (e->relu || e->mask)) select_block(C, ldc, M, N, e->relu, e->mask);
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
 * (a training step repeats its shapes) and keeps the faster.
 *
 * A split must not change a bit (the choice is a matter of timing, and a
 * run must give the bits of the same run on one thread). The own kernel's
 * sums depend on K only, so any cut keeps them. OpenBLAS computes a block's
 * edge tiles with other kernels that round differently, so a block gives
 * the whole's bits only where its tiles line up with the whole's: on a Zen
 * 3 EPYC (Debian's OpenBLAS, Zen kernels) row cuts kept the bits only at
 * multiples of 24 rows for M = 256, of 48 for 512 and of 192 for 1024, and
 * no column cut did for a 256x256x512 product, at any size of block (and
 * on a Xeon its small-matrix paths took a 32x96x512 product's column
 * halves, rounding them differently from the whole). So before a shape is
 * split, a probe runs the whole and then the split with its cuts at
 * multiples of each alignment in turn (nearest to even shares), on data of
 * its own (zeros would agree on any path), and keeps the first alignment
 * that gives the whole's bits; with none in either direction, the shape
 * runs on one thread. */

typedef struct {
  int own, ta, tb, by_cols, ntasks;
  int64_t M, N, K, lda, ldb, ldc, align; /* cuts at multiples of align */
  float alpha, beta;
  const float *A, *B;
  float *C;
  const dg__gemm_epi *e; /* dg__sgemm_add's, or NULL */
} gemm_job;

/* Where block t of len cut into n blocks starts: the multiple of align
 * nearest to t/n of len (len for t = n). */
static int64_t cut_at(int64_t len, int n, int64_t align, int t) {
  if (t >= n) return len;
  return DG_MIN((len * t / n + align / 2) / align * align, len);
}

static void gemm_task(void *arg, int t) {
  const gemm_job *j = arg;
  int64_t len = j->by_cols ? j->N : j->M;
  int64_t lo = cut_at(len, j->ntasks, j->align, t), hi = cut_at(len, j->ntasks, j->align, t + 1);
  if (lo >= hi) return;
  dg__gemm_epi e, *pe = NULL; /* j->e at this block */
  if (j->e) e = epi_at(j->e, j->by_cols ? 0 : lo, j->by_cols ? lo : 0, j->ldc), pe = &e;
  if (j->by_cols) { /* columns [lo, hi) of op(B) and C */
    const float *b = j->tb ? j->B + lo * j->ldb : j->B + lo;
    sgemm1(j->own, j->ta, j->tb, j->M, hi - lo, j->K, j->alpha, j->A, j->lda, b, j->ldb, j->beta,
           pe, j->C + lo, j->ldc);
  } else { /* rows [lo, hi) of op(A) and C */
    const float *a = j->ta ? j->A + lo : j->A + lo * j->lda;
    sgemm1(j->own, j->ta, j->tb, hi - lo, j->N, j->K, j->alpha, a, j->lda, j->B, j->ldb, j->beta,
           pe, j->C + lo * j->ldc, j->ldc);
  }
}

#define SPLIT_SLOTS 256 /* shapes remembered; past that, rows (they won more often) */
#define SPLIT_TRIES 3   /* timed calls per split before choosing */
#define COL_ALIGN 32    /* floats: 128 B, an adjacent-line prefetch pair */
#define ROW_MIN 16      /* rows per task below which rows are not tried */

#define PROBE_BYTES (64 << 20)  /* a probe's scratch at most; beyond, no split */

/* The alignments a probe tries, in order: the first (rows 4, columns
 * COL_ALIGN) is the own kernel's; the others are OpenBLAS's tile multiples. */
static const int64_t row_aligns[] = {4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384};
static const int64_t col_aligns[] = {COL_ALIGN, 64, 96, 128, 192, 256, 320, 384, 512, 640};

typedef struct {
  int64_t M, N, K;
  int ta, tb, threads; /* threads 0: a free slot */
  int ab;        /* alpha == 1 | (beta == 0) << 1: OpenBLAS's paths depend on them */
  int64_t align[2]; /* rows, columns: cuts that give the whole's bits (probed); 0: none */
  int tries[2];
  int pick;      /* -1 while trying, else 0 rows / 1 columns */
  int64_t ns[2]; /* fastest call seen: rows, columns */
} split_slot;

static split_slot g_split[SPLIT_SLOTS];
static pthread_mutex_t g_split_mu = PTHREAD_MUTEX_INITIALIZER;

/* Whether cutting len into n blocks at multiples of aligns[i] gives empty
 * blocks (the alignment is too coarse for the shape) or the cuts of an
 * alignment tried before it (nothing new to probe). */
static int cuts_skip(const int64_t *aligns, int i, int64_t len, int n) {
  for (int t = 0; t < n; t++)
    if (cut_at(len, n, aligns[i], t) >= cut_at(len, n, aligns[i], t + 1)) return 1;
  for (int p = 0; p < i; p++) {
    int t = 1;
    while (t < n && cut_at(len, n, aligns[p], t) == cut_at(len, n, aligns[i], t)) t++;
    if (t == n) return 1;
  }
  return 0;
}

/* p[i] = element skip + i of the probe's pattern: xorshift32 in [-1, 1). */
static void probe_fill(float *p, size_t n, size_t skip) {
  uint32_t x = 2463534242u;
  for (size_t i = 0; i < skip + n; i++) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    if (i >= skip) p[i - skip] = (float)(x >> 8) * (2.0f / 16777216.0f) - 1.0f;
  }
}

/* The first alignment at which rows (cols 0) or columns cut for e->threads
 * blocks give the bits of the whole, on a pattern of the probe's own; 0:
 * none, or not the memory to probe. A product too large for PROBE_BYTES is
 * probed with fewer columns (cutting rows) or rows (cutting columns), in
 * multiples of 64: the cut dimension and K, which set the tiles along the
 * cut, stay whole. */
static int64_t split_probe(const split_slot *e, int cols, float alpha, float beta) {
  int64_t M = e->M, N = e->N, K = e->K, len = cols ? N : M;
  const int64_t *aligns = cols ? col_aligns : row_aligns;
  int na_ = cols ? (int)(sizeof col_aligns / sizeof *col_aligns)
                 : (int)(sizeof row_aligns / sizeof *row_aligns);
  /* the own kernel's bits depend on K only (gemm_own.c): nothing to probe */
  if (dg__sgemm_own_fits(M, N, K)) return aligns[0];
  double cap = (double)PROBE_BYTES / sizeof(float);
  if ((double)M * K + (double)K * N + 2.0 * M * N > cap) {
    double fit = (cap - (double)len * K) / (double)(K + 2 * len); /* the other side */
    if (fit < 64) return 0;
    *(cols ? &M : &N) = DG_MIN(cols ? M : N, (int64_t)fit / 64 * 64);
  }
  size_t na = (size_t)(M * K), nb = (size_t)(K * N), nc = (size_t)(M * N);
  float *a = dg__malloc((na + nb + 2 * nc) * sizeof(float));
  if (!a) return 0;
  float *b = a + na, *c1 = b + nb, *c2 = c1 + nc;
  probe_fill(a, na + nb + nc, 0); /* A, B and C's input */
  int64_t lda = e->ta ? M : K, ldb = e->tb ? K : N, found = 0;
  sgemm1(0, e->ta, e->tb, M, N, K, alpha, a, lda, b, ldb, beta, NULL, c1, N);
  for (int i = 0; i < na_ && !found; i++) {
    if (cuts_skip(aligns, i, len, e->threads)) continue;
    /* the blocks as the split itself cuts them (gemm_task), one after another */
    probe_fill(c2, nc, na + nb); /* C's input again (not kept: peak memory) */
    gemm_job j = {0, e->ta, e->tb, cols, e->threads, M, N, K, lda, ldb, N, aligns[i], alpha,
                  beta, a, b, c2, NULL};
    for (int t = 0; t < j.ntasks; t++) gemm_task(&j, t);
    if (!memcmp(c1, c2, nc * sizeof(float))) found = aligns[i];
  }
  dg__free(a);
  return found;
}

/* The shape's slot, or a free one for it; NULL: the table is full. Called
 * with the lock held. */
static split_slot *slot_of(const split_slot *shape) {
  uint64_t h = 1469598103934665603ULL; /* FNV-1a over the shape: its first slot */
  int64_t v[7] = {shape->M, shape->N, shape->K, shape->ta, shape->tb, shape->threads, shape->ab};
  for (int i = 0; i < 7; i++) h = (h ^ (uint64_t)v[i]) * 1099511628211ULL;
  for (int i = 0; i < SPLIT_SLOTS; i++) {
    split_slot *c = &g_split[(h + (uint64_t)i) % SPLIT_SLOTS];
    if (!c->threads || (c->M == shape->M && c->N == shape->N && c->K == shape->K &&
                        c->ta == shape->ta && c->tb == shape->tb &&
                        c->threads == shape->threads && c->ab == shape->ab))
      return c;
  }
  return NULL;
}

/* The one split a probed slot allows (0 rows, 1 columns), -1 none, or 2
 * both (the timing picks). */
static int slot_only(const split_slot *e) {
  if (e->align[0] && e->align[1]) return 2;
  return e->align[1] ? 1 : e->align[0] ? 0 : -1;
}

int dg__sgemm_split_of(int ta, int tb, int64_t M, int64_t N, int64_t K, int threads) {
  split_slot shape = {M, N, K, ta, tb, threads, 3, {0, 0}, {0, 0}, -1, {0, 0}};
  pthread_mutex_lock(&g_split_mu);
  const split_slot *e = slot_of(&shape);
  int r = !e || !e->threads ? -2 : slot_only(e);
  if (r == 2 && e->pick >= 0) r = e->pick;
  pthread_mutex_unlock(&g_split_mu);
  return r;
}

/* The split to run (0 rows, 1 columns, -1 none: one thread) for a shape
 * that can be split as can[] says, the slot to time it into (NULL:
 * decided) and in align[] each direction's cut alignment. The first call
 * probes the shape's splits. Called with the lock held. */
static int split_pick(const split_slot *shape, const int can[2], float alpha, float beta,
                      split_slot **timing, int64_t align[2]) {
  *timing = NULL;
  split_slot *e = slot_of(shape);
  if (!e) return -1; /* a table full of shapes: no probe, no split */
  if (!e->threads) {
    *e = *shape;
    for (int cols = 0; cols < 2; cols++)
      e->align[cols] = can[cols] ? split_probe(e, cols, alpha, beta) : 0;
  }
  align[0] = e->align[0], align[1] = e->align[1];
  int only = slot_only(e);
  if (only != 2) return only;
  if (e->pick >= 0) return e->pick;
  *timing = e;
  return e->tries[0] > e->tries[1]; /* alternate, rows first */
}

static void split_record(split_slot *e, int cols, int64_t ns) {
  if (ns < e->ns[cols]) e->ns[cols] = ns;
  if (++e->tries[cols] >= SPLIT_TRIES && e->tries[!cols] >= SPLIT_TRIES)
    e->pick = e->ns[1] < e->ns[0];
}

/* A product on one thread while a peer rank of this host waits for this
 * one: column blocks claimed by the caller and the lend worker
 * (base/lend.c), on the own kernel only, whose blocks give the whole's bits
 * (its sums depend on K only), so lending never changes a step's bits.
 * 1: done. */
#define LEND_MIN 4e6 /* multiply-adds: below, the hand-off costs about a block */
#define LEND_TASKS 8
static int sgemm_lend(int own, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                      const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                      const dg__gemm_epi *e, float *C, int64_t ldc) {
  if (!own || M <= 0 || (double)M * N * K < LEND_MIN || N < 2 * COL_ALIGN || !dg__lend_armed())
    return 0;
  dg__sgemm_own_reserve(2); /* the worker's buffers, made in the first step */
  gemm_job j = {own, ta, tb, 1, LEND_TASKS, M, N, K, lda, ldb, ldc, COL_ALIGN, alpha, beta,
                A, B, C, e};
  return dg__lend_for(j.ntasks, gemm_task, &j); /* asks the probe */
}

/* dg__sgemm, or with e dg__sgemm_add (alpha 1). */
static void sgemm_any(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                      const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                      const dg__gemm_epi *e, float *C, int64_t ldc) {
  int threads = dg_get_num_threads(), own = dg__sgemm_own_fits(M, N, K);
  dg__gemm_epi sel;
  if (e && (e->res || e->bias) && !own && M > 0 && N > 0) { /* OpenBLAS: fill, then accumulate */
    fill_block(C, ldc, e->res, e->bias, M, N);
    sel = (dg__gemm_epi){NULL, NULL, e->mask, e->relu}; /* the selects still to do */
    e = &sel, beta = 1.0f;
  }
  /* below ~0.5 MFLOP the fork/join costs more than it saves */
  if (threads <= 1 || M <= 0 || N <= 0 || (double)M * N * K < 262144.0) {
    if (threads <= 1 &&
        sgemm_lend(own, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, e, C, ldc))
      return;
    sgemm1(own, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, e, C, ldc);
    return;
  }
  if (own) dg__sgemm_own_reserve(threads); /* every block's buffers, before any step counts */
  int can[2] = {M >= (int64_t)threads * ROW_MIN, N >= (int64_t)threads * COL_ALIGN};
  if (!can[0] && !can[1]) can[1] = N >= M, can[0] = !can[1];
  split_slot *timing = NULL;
  split_slot shape = {M, N, K, ta, tb, threads, (alpha == 1.0f) | (beta == 0.0f) << 1,
                      {0, 0}, {0, 0}, -1, {INT64_MAX, INT64_MAX}};
  int64_t align[2];
  pthread_mutex_lock(&g_split_mu);
  int cols = split_pick(&shape, can, alpha, beta, &timing, align);
  pthread_mutex_unlock(&g_split_mu);
  if (cols < 0) { /* no split gives the whole's bits */
    sgemm1(own, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, e, C, ldc);
    return;
  }
  gemm_job j = {own, ta, tb, cols, threads, M, N, K, lda, ldb, ldc, align[cols], alpha, beta,
                A, B, C, e};
  int64_t t0 = timing ? (int64_t)dg__trace_now() : 0;
  dg__parallel_for(j.ntasks, gemm_task, &j);
  if (timing) {
    int64_t dt = (int64_t)dg__trace_now() - t0;
    pthread_mutex_lock(&g_split_mu);
    split_record(timing, cols, dt);
    pthread_mutex_unlock(&g_split_mu);
  }
}

void dg__sgemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
               int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  sgemm_any(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, NULL, C, ldc);
}

/* On the own kernel res + bias go in with the first pass's stores (no fill
 * pass over C, and C is not read back) and the selects with the last
 * pass's; elsewhere C is filled, the GEMM accumulates and the selects are
 * a pass over each block, with the same bits. */
void dg__sgemm_add(int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                   const float *B, int64_t ldb, const dg__gemm_epi *e, float *C, int64_t ldc) {
  sgemm_any(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, e, C, ldc);
}
