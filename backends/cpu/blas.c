/* The CPU backend's BLAS table (backends/kern_blas.h): the GEMM
 * (backends/cpu/gemm.c), column sums for bias gradients, the bias/residual
 * fill before a GEMM accumulates, and a gradient passed through. Element
 * loops are compiled per ISA (DG_SIMD_FN); fills and passes split over the
 * pool by rows/elements (independent, so any thread count gives the same
 * bits). The conv, attention and MLP kernels call these directly. */
#include <string.h>

#include "backends/cpu/cpu_impl.h"
#include "backends/kern_blas.h"

/* db(O) (+)= column sums of dy(R, O). Rows are summed in f32 vector lanes in
 * blocks of COLSUM_ROWS and the block sums folded into double, so the error
 * is bounded by the block length, not by R (a bias gradient over 33k rows
 * summed in one f32 chain was off by 3e-4); columns go by chunks that keep
 * both accumulators in L1, each chunk streaming dy's rows in order. For
 * R <= COLSUM_ROWS a fresh db gets the plain f32 row chain's bits.
 *
 * With y, dz (R, O) = y > 0 ? dy : 0 (the relu op's backward) is stored
 * and summed in the same pass (db NULL: stored only): dg_linear_relu's
 * backward reads dz once fewer. Columns [c0, c1) of ld-wide rows. */
#define COLSUM_ROWS 256
#define COLSUM_COLS 512
DG_INLINE void colsum_body(float *restrict dz, const float *restrict dy, const float *restrict y,
                           float *restrict db, int64_t R, int64_t ld, int64_t c0, int64_t c1,
                           int overwrite) {
  for (int64_t o0 = c0; o0 < c1; o0 += COLSUM_COLS) {
    const int64_t n = DG_MIN((int64_t)COLSUM_COLS, c1 - o0);
    double d[COLSUM_COLS];
    for (int64_t o = 0; o < n; o++) d[o] = 0;
    for (int64_t r0 = 0; r0 < R; r0 += COLSUM_ROWS) {
      float a[COLSUM_COLS];
      const int64_t r1 = DG_MIN(R, r0 + COLSUM_ROWS);
      for (int64_t r = r0; r < r1; r++) {
        const float *restrict g = dy + r * ld + o0;
        const float *v = g; /* the row summed: dy's, or dz's */
        if (y) {
          const float *restrict s = y + r * ld + o0;
          float *restrict z = dz + r * ld + o0;
          for (int64_t o = 0; o < n; o++) z[o] = s[o] > 0.0f ? g[o] : 0.0f;
          v = z;
        }
        if (!db) continue;
        if (r == r0) memcpy(a, v, (size_t)n * sizeof(float));
        else for (int64_t o = 0; o < n; o++) a[o] += v[o];
      }
      if (db) for (int64_t o = 0; o < n; o++) d[o] += a[o];
    }
    if (!db) continue;
    float *restrict out = db + o0;
    if (overwrite) for (int64_t o = 0; o < n; o++) out[o] = (float)d[o];
    else for (int64_t o = 0; o < n; o++) out[o] = (float)((double)out[o] + d[o]);
  }
}
DG_SIMD_FN(colsum,
           (float *dz, const float *dy, const float *y, float *db, int64_t R, int64_t ld,
            int64_t c0, int64_t c1, int overwrite),
           (dz, dy, y, db, R, ld, c0, c1, overwrite))

void dg__colsum(float *db, const float *dy, int64_t R, int64_t O, int overwrite) {
  colsum(NULL, dy, NULL, db, R, O, 0, O, overwrite);
}

typedef struct {
  float *dz, *db;
  const float *dy, *y;
  int64_t R, O;
  int overwrite;
} relu_colsum_job;

static void relu_colsum_task(void *arg, int64_t lo, int64_t hi) {
  const relu_colsum_job *j = arg;
  colsum(j->dz, j->dy, j->y, j->db, j->R, j->O, lo, hi, j->overwrite);
}

/* Split over the pool by columns (each column's sum is the same whatever
 * the split), rows in order within each (no rows: a fresh db is zero). */
void dg__relu_colsum(float *dz, const float *dy, const float *y, float *db, int64_t R,
                     int64_t O, int overwrite) {
  relu_colsum_job j = {dz, db, dy, y, R, O, overwrite};
  dg__parallel_range(O, DG_MAX((int64_t)16, DG_GRAIN_MEM / DG_MAX(R, (int64_t)1)),
                     relu_colsum_task, &j);
}

/* y rows [lo, hi) = b: one row copied, then doubled (a few memcpy calls,
 * not one per row). */
typedef struct {
  const float *b; /* (O) */
  float *y;       /* (R, O) */
  int64_t O;
} bias_job;

/* y is fresh arena memory, far from the core: rows are fetched for
 * writing FILL_PF floats ahead (a write-allocate miss per line otherwise
 * stalls each store), a line per 16 floats. */
#define FILL_PF 2048

DG_INLINE void bias_rows_body(float *restrict y, const float *restrict b, int64_t n, int64_t O) {
  for (int64_t i = 0; i < n; i++) {
    float *restrict yr = y + i * O;
    for (int64_t k = 0; k < O; k += 16) __builtin_prefetch(yr + FILL_PF + k, 1);
    for (int64_t o = 0; o < O; o++) yr[o] = b[o];
  }
}
DG_SIMD_FN(bias_rows, (float *y, const float *b, int64_t n, int64_t O), (y, b, n, O))

static void bias_task(void *arg, int64_t lo, int64_t hi) {
  const bias_job *j = arg;
  bias_rows(j->y + lo * j->O, j->b, hi - lo, j->O);
}

/* d[lo, hi) (+)= s: the residual's gradient of dg_linear_add. */
typedef struct {
  float *d;
  const float *s;
  int acc;
} add_job;

DG_INLINE void acc_rows_body(float *restrict d, const float *restrict s, int64_t n) {
  for (int64_t i = 0; i < n; i++) d[i] += s[i];
}
DG_SIMD_FN(acc_rows, (float *d, const float *s, int64_t n), (d, s, n))

static void add_task(void *arg, int64_t lo, int64_t hi) {
  const add_job *j = arg;
  if (j->acc) acc_rows(j->d + lo, j->s + lo, hi - lo);
  else memcpy(j->d + lo, j->s + lo, (size_t)(hi - lo) * sizeof(float));
}

/* y rows [lo, hi) = res + b: the residual and bias of dg_linear_add in one
 * pass, before the GEMM accumulates. */
typedef struct {
  const float *b, *res; /* (O) or NULL, (R, O) */
  float *y;             /* (R, O) */
  int64_t O;
} res_job;

DG_INLINE void res_bias_body(float *restrict y, const float *restrict r, const float *restrict b,
                             int64_t rows, int64_t O) {
  for (int64_t i = 0; i < rows; i++) {
    for (int64_t k = 0; k < O; k += 16) __builtin_prefetch(y + i * O + FILL_PF + k, 1);
    for (int64_t o = 0; o < O; o++) y[i * O + o] = r[i * O + o] + b[o];
  }
}
DG_SIMD_FN(res_bias, (float *y, const float *r, const float *b, int64_t rows, int64_t O),
           (y, r, b, rows, O))

static void res_task(void *arg, int64_t lo, int64_t hi) {
  const res_job *j = arg;
  if (j->b) res_bias(j->y + lo * j->O, j->res + lo * j->O, j->b, hi - lo, j->O);
  else memcpy(j->y + lo * j->O, j->res + lo * j->O, (size_t)((hi - lo) * j->O) * sizeof(float));
}

void dg__fill_rows(float *y, const float *res, const float *b, int64_t R, int64_t O) {
  if (R <= 0 || O <= 0 || (!res && !b)) return;
  int64_t grain = DG_MAX((int64_t)1, DG_GRAIN_MEM / O);
  if (res) {
    res_job rj = {b, res, y, O};
    dg__parallel_range(R, grain, res_task, &rj);
  } else {
    bias_job bj = {b, y, O};
    dg__parallel_range(R, grain, bias_task, &bj);
  }
}

void dg__grad_pass(float *d, const float *s, int64_t n, int acc) {
  add_job aj = {d, s, acc};
  dg__parallel_range(n, DG_GRAIN_MEM, add_task, &aj);
}

const struct dg__kern_blas dg__cpu_kern_blas = {
    .sgemm = dg__sgemm,
    .sgemm_add = dg__sgemm_add,
    .colsum = dg__colsum,
    .relu_colsum = dg__relu_colsum,
    .fill_rows = dg__fill_rows,
    .grad_pass = dg__grad_pass,
    .can_lend = dg__sgemm_own_on, /* only the own kernel's blocks keep the bits (gemm.c) */
};
