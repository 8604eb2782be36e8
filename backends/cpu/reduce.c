/* Reduction kernels of the CPU backend (the ops: ops/reduce.c, and argmax
 * and the accuracy count of ops/argmax.c).
 *
 * Accuracy: every sum accumulates in double (16 lanes for contiguous runs,
 * whole rows for sums along a non-last dim), so the error does not grow
 * with the length; results are rounded to float once. */
#include <math.h>
#include <string.h>

#include "backends/cpu/cpu_impl.h"
#include "backends/kern_reduce.h"

/* Sum of x (n) over 16 double lanes (the float -> double adds vectorise). */
static double sum_f32(const float *restrict x, int64_t n) {
  double acc[16] = {0}, s = 0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; l++) acc[l] += x[i + l];
  for (; i < n; i++) s += x[i];
  for (int l = 0; l < 16; l++) s += acc[l];
  return s;
}

/* ---- sum / mean over all elements ---- */

static void cpu_sum_fwd(const dg__reduce_args *a) {
  double s = sum_f32(a->x, a->D);
  a->y[0] = (float)(s * a->scale);
}

static void cpu_sum_bwd(const dg__reduce_args *a) {
  float *restrict dx = a->y; /* (x shape) */
  float g = a->dy[0] * (float)a->scale;
  int64_t n = a->D;
  if (!a->acc) for (int64_t i = 0; i < n; i++) dx[i] = g;
  else for (int64_t i = 0; i < n; i++) dx[i] += g;
}

/* ---- sum / mean along one dim: x viewed as (O, D, I) -> (O, I) ---- */

/* y (O, I) = scale * sum over D of x (O, D, I); acc (I) is double scratch. */
static void sum_mid(const float *x, int64_t O, int64_t D, int64_t I, double scale,
                    double *restrict acc, float *restrict y) {
  for (int64_t o = 0; o < O; o++) {
    if (I == 1) { /* reducing the last dim: contiguous rows */
      y[o] = (float)(sum_f32(x + o * D, D) * scale);
      continue;
    }
    memset(acc, 0, (size_t)I * sizeof *acc);
    for (int64_t d = 0; d < D; d++) {
      const float *restrict row = x + (o * D + d) * I;
      for (int64_t j = 0; j < I; j++) acc[j] += row[j];
    }
    for (int64_t j = 0; j < I; j++) y[o * I + j] = (float)(acc[j] * scale);
  }
}

static void cpu_sum_dim_fwd(const dg__reduce_args *a) {
  sum_mid(a->x, a->O, a->D, a->I, a->scale, a->work, a->y);
}

static void cpu_sum_dim_bwd(const dg__reduce_args *a) {
  float *dx = a->y;        /* (O, D, I) */
  const float *g = a->dy;  /* (O, I) */
  int64_t O = a->O, D = a->D, I = a->I;
  float scale = (float)a->scale;
  int overwrite = !a->acc;
  for (int64_t o = 0; o < O; o++) {
    const float *restrict go = g + o * I;
    for (int64_t d = 0; d < D; d++) {
      float *restrict row = dx + (o * D + d) * I;
      if (overwrite) for (int64_t j = 0; j < I; j++) row[j] = scale * go[j];
      else for (int64_t j = 0; j < I; j++) row[j] += scale * go[j];
    }
  }
}

/* ---- argmax along one dim: x viewed as (O, D, I) -> (O, I) ---- */

/* Rows of x (O, D, I) from o = lo to hi: the first maximum, or the first NaN. */
static void argmax_rows(void *arg, int64_t lo, int64_t hi) {
  const dg__argmax_args *a = arg;
  const int64_t D = a->D, I = a->I;
  for (int64_t o = lo; o < hi; o++)
    for (int64_t j = 0; j < I; j++) {
      const float *x = a->x + o * D * I + j;
      float m = x[0];
      int64_t best = 0;
      for (int64_t d = 1; d < D && !isnan(m); d++) {
        float v = x[d * I];
        if (v > m || isnan(v)) m = v, best = d;
      }
      a->idx[o * I + j] = best;
    }
}

static void cpu_argmax(const dg__argmax_args *a) {
  int64_t grain = DG_MAX((int64_t)1, DG_GRAIN_MEM / DG_MAX(a->D * a->I, (int64_t)1));
  dg__parallel_range(a->O, grain, argmax_rows, (void *)a);
}

static int64_t cpu_count_eq(const int64_t *a, const int64_t *b, int64_t n) {
  int64_t c = 0;
  for (int64_t i = 0; i < n; i++) c += a[i] == b[i];
  return c;
}

const struct dg__kern_reduce dg__cpu_kern_reduce = {cpu_sum_fwd,     cpu_sum_bwd,
                                                    cpu_sum_dim_fwd, cpu_sum_dim_bwd,
                                                    cpu_argmax,      cpu_count_eq};
