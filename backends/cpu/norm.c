/* Layer normalisation kernels of the CPU backend (the op: ops/norm.c).
 *
 * Forward computes each row's mean and variance in two passes (no
 * cancellation), summing in float vector lanes folded into double every 256
 * elements, and keeps mean and rstd = 1 / sqrt(var + eps) per row, so
 * backward need not recompute them. The mean is kept as a float m and a
 * correction corr, the mean of x - m (m is only as good as a float sum of
 * large values: where |mean| is large against the spread, x - m was off by
 * that error in every element, which shifted xhat off zero mean and made a
 * gradient wrong in its third digit, 1 in ~20,000 random programs of the
 * differential test); x - mean is taken as (x - m) - corr in forward and
 * backward alike.
 *   xhat = (x - mean - corr) * rstd,  g = dy * w
 *   dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
 *   dw += sum_rows dy * xhat,  db += sum_rows dy
 * The kernels are compiled per ISA (DG_SIMD_FN) and split over the pool:
 * forward and dx by rows, dw/db by columns (each column summed over the rows
 * in order), so any thread count gives the same bits. Fresh gradients are
 * stored, not zeroed and accumulated. */
#include <math.h>
#include <string.h>

#include "backends/cpu/cpu_impl.h"
#include "backends/kern_norm.h"

/* Float vector sums of (x - m)^2, of g and of g * (x - m) * rs over a row,
 * folded into double every 256 elements (vector speed, block-bounded
 * error). */
#define LN_BLOCK 256
/* backward prefetches x this many rows ahead */
#define LN_PF 8
/* forward's passes go by this many rows */
#define LN_ROWS 16

/* Sums of (x - m)^2 and (x - m) over a row; the second is what the mean
 * was missing (m is only as good as a float sum of large values). */
DG_INLINE double sumsq_dev(const float *restrict x, float m, int64_t C, double *sdev) {
  double s = 0, sd = 0;
  for (int64_t i0 = 0; i0 < C; i0 += LN_BLOCK) {
    int64_t i1 = DG_MIN(C, i0 + LN_BLOCK);
    float acc = 0, accd = 0;
    dg__v8 a0 = {0}, a1 = {0}, d0 = {0}, d1 = {0}; /* lanes 0-7 and 8-15 */
    int64_t i = i0;
    for (; i + 16 <= i1; i += 16) {
      dg__v8 e0 = DG_V8_LOAD(x + i) - m, e1 = DG_V8_LOAD(x + i + 8) - m;
      a0 += e0 * e0, a1 += e1 * e1;
      d0 += e0, d1 += e1;
    }
    for (; i < i1; i++) acc += (x[i] - m) * (x[i] - m), accd += x[i] - m;
    acc += DG_V8X2_SUM(a0, a1);
    accd += DG_V8X2_SUM(d0, d1);
    s += acc, sd += accd;
  }
  *sdev = sd;
  return s;
}

typedef dg__ln_args ln_job;

/* Forward, rows [r0, r1): y = (x - mean) * rstd * w + b; fills mean, rstd. */
DG_INLINE void ln_fwd_rows_body(const ln_job *j, int64_t r0, int64_t r1) {
  const int64_t C = j->C;
  const float *restrict w = j->w, *restrict b = j->b;
  /* By LN_ROWS rows (in L1), in three passes: each row's sums are a chain
   * of dependent adds, and short loop bodies let the core run the next
   * rows' chains while one finishes (row by row, a row of 128 took twice
   * as long). */
  for (int64_t q0 = r0; q0 < r1; q0 += LN_ROWS) {
    const int64_t q1 = DG_MIN(r1, q0 + LN_ROWS);
    for (int64_t r = q0; r < q1; r++)
      j->mean[r] = (float)(dg__sum_blocks(j->x + r * C, C) / (double)C);
    for (int64_t r = q0; r < q1; r++) {
      /* dm: the exact mean minus m, from the deviations (small values,
       * summed accurately); the variance about the exact mean follows from
       * both sums */
      double sd, ss = sumsq_dev(j->x + r * C, j->mean[r], C, &sd), dm = sd / (double)C;
      double v = ss / (double)C - dm * dm;
      j->rstd[r] = (float)(1.0 / sqrt((v > 0 ? v : 0) + j->eps)), j->corr[r] = (float)dm;
    }
    for (int64_t r = q0; r < q1; r++) {
      const float *restrict xr = j->x + r * C;
      float *restrict yr = j->y + r * C;
      const float m = j->mean[r], rs = j->rstd[r], c = j->corr[r];
      if (w && b)
        for (int64_t i = 0; i < C; i++) yr[i] = ((xr[i] - m) - c) * rs * w[i] + b[i];
      else if (w)
        for (int64_t i = 0; i < C; i++) yr[i] = ((xr[i] - m) - c) * rs * w[i];
      else if (b)
        for (int64_t i = 0; i < C; i++) yr[i] = ((xr[i] - m) - c) * rs + b[i];
      else
        for (int64_t i = 0; i < C; i++) yr[i] = ((xr[i] - m) - c) * rs;
    }
  }
}
DG_SIMD_FN(ln_fwd_rows, (const ln_job *j, int64_t r0, int64_t r1), (j, r0, r1))

/* Backward, dx rows [r0, r1): dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
 * Compiled without contraction: g - mean(g) must subtract the same rounded
 * g = dy * w that the mean summed. Contracted into fma(dy, w, -mean(g)), it
 * kept the product's rounding error, which rstd (316 at zero variance)
 * magnified: a width-1 row, whose dx is exactly 0, got 4e-5 (differential
 * test, seed 501018139). GCC takes the option per function (its
 * __builtin_assoc_barrier does not stop its vectorised loops contracting);
 * clang takes a pragma in the body. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif
DG_INLINE void ln_bwd_rows_body(const ln_job *j, int64_t r0, int64_t r1) {
#ifdef __clang__
#pragma clang fp contract(off)
#endif
  const int64_t C = j->C;
  const float *restrict w = j->w;
  for (int64_t r = r0; r < r1; r++) {
    const float *restrict xr = j->x + r * C, *restrict gr = j->dy + r * C;
    float *restrict dr = j->y + r * C;
    if (r + LN_PF < r1) { /* x was saved in forward: far by now */
      for (int64_t k = 0; k < C; k += 16) __builtin_prefetch(xr + LN_PF * C + k);
    }
    const float mu = j->mean[r], rs = j->rstd[r], c = j->corr[r];
    double sg = 0, sgx = 0; /* sums of g and g * xhat */
    for (int64_t i0 = 0; i0 < C; i0 += LN_BLOCK) {
      int64_t i1 = DG_MIN(C, i0 + LN_BLOCK);
      dg__v8 a0 = {0}, a1 = {0}, x0 = {0}, x1 = {0}; /* lanes 0-7 and 8-15 */
      float t = 0, tx = 0;
      int64_t i = i0;
      for (; i + 16 <= i1; i += 16) {
        dg__v8 g0 = DG_V8_LOAD(gr + i), g1 = DG_V8_LOAD(gr + i + 8);
        if (w) g0 *= DG_V8_LOAD(w + i), g1 *= DG_V8_LOAD(w + i + 8);
        a0 += g0, a1 += g1;
        x0 += g0 * (((DG_V8_LOAD(xr + i) - mu) - c) * rs);
        x1 += g1 * (((DG_V8_LOAD(xr + i + 8) - mu) - c) * rs);
      }
      for (; i < i1; i++) {
        float g = w ? gr[i] * w[i] : gr[i];
        t += g;
        tx += g * (((xr[i] - mu) - c) * rs);
      }
      t += DG_V8X2_SUM(a0, a1), tx += DG_V8X2_SUM(x0, x1);
      sg += t, sgx += tx;
    }
    float mg = (float)(sg / (double)C), mgx = (float)(sgx / (double)C);
    if (j->acc) {
      for (int64_t i = 0; i < C; i++) {
        float g = w ? gr[i] * w[i] : gr[i];
        dr[i] += rs * (g - mg - ((xr[i] - mu) - c) * rs * mgx);
      }
    } else {
      for (int64_t i = 0; i < C; i++) {
        float g = w ? gr[i] * w[i] : gr[i];
        dr[i] = rs * (g - mg - ((xr[i] - mu) - c) * rs * mgx);
      }
    }
  }
}
DG_SIMD_FN(ln_bwd_rows, (const ln_job *j, int64_t r0, int64_t r1), (j, r0, r1))
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

/* Backward, columns [c0, c1) of dw += sum_rows dy * xhat and db += sum_rows
 * dy, rows in order whatever the split (same bits for any thread count). */
DG_INLINE void ln_bwd_cols_body(const ln_job *j, int64_t c0, int64_t c1) {
  const int64_t C = j->C, n = c1 - c0;
  float *restrict dw = j->dw ? j->dw + c0 : NULL, *restrict db = j->db ? j->db + c0 : NULL;
  for (int64_t r = 0; r < j->R; r++) {
    const float *restrict xr = j->x + r * C + c0, *restrict gr = j->dy + r * C + c0;
    if (r + LN_PF < j->R) {
      for (int64_t k = 0; k < n; k += 16) __builtin_prefetch(xr + LN_PF * C + k);
    }
    const float mu = j->mean[r], rs = j->rstd[r], c = j->corr[r];
    if (dw) {
      if (r || j->accw)
        for (int64_t i = 0; i < n; i++) dw[i] += gr[i] * (((xr[i] - mu) - c) * rs);
      else for (int64_t i = 0; i < n; i++) dw[i] = gr[i] * (((xr[i] - mu) - c) * rs);
    }
    if (db) {
      if (r || j->accb) for (int64_t i = 0; i < n; i++) db[i] += gr[i];
      else for (int64_t i = 0; i < n; i++) db[i] = gr[i];
    }
  }
}
DG_SIMD_FN(ln_bwd_cols, (const ln_job *j, int64_t c0, int64_t c1), (j, c0, c1))

static void fwd_task(void *arg, int64_t lo, int64_t hi) { ln_fwd_rows(arg, lo, hi); }
static void bwd_rows_task(void *arg, int64_t lo, int64_t hi) { ln_bwd_rows(arg, lo, hi); }
static void bwd_cols_task(void *arg, int64_t lo, int64_t hi) { ln_bwd_cols(arg, lo, hi); }

/* Rows per pool chunk: about 16K elements. */
static int64_t row_grain(int64_t C) { return DG_MAX((int64_t)1, 16384 / DG_MAX(C, (int64_t)1)); }

static void cpu_ln_fwd(const dg__ln_args *a) {
  dg__parallel_range(a->R, row_grain(a->C), fwd_task, (void *)a);
}

static void cpu_ln_bwd(const dg__ln_args *a) {
  if ((a->dw || a->db) && a->R == 0) { /* no rows: a fresh dw/db is zero */
    if (a->dw && !a->accw) memset(a->dw, 0, (size_t)a->C * sizeof *a->dw);
    if (a->db && !a->accb) memset(a->db, 0, (size_t)a->C * sizeof *a->db);
  } else if (a->dw || a->db) {
    dg__parallel_range(a->C, DG_MAX((int64_t)16, 16384 / DG_MAX(a->R, (int64_t)1)),
                       bwd_cols_task, (void *)a);
  }
  if (a->y) dg__parallel_range(a->R, row_grain(a->C), bwd_rows_task, (void *)a);
}

const struct dg__kern_norm dg__cpu_kern_norm = {cpu_ln_fwd, cpu_ln_bwd};
