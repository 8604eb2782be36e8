/* Batch normalisation kernels of the CPU backend (the op: ops/batchnorm.c).
 *
 * Statistics are two passes per channel (mean, then squared deviations
 * from it: no cancellation), each channel summed in double in a fixed
 * order, and the element-wise passes are independent per (sample, channel)
 * row, so any thread count gives the same bits. The mean is kept as a
 * float m and a correction corr = mean - m, and x - mean is taken as
 * (x - m) - corr (as layernorm does: a float mean is only as good as its
 * rounding, which would otherwise shift every xhat of a channel whose mean
 * is large against its spread). */
#include <string.h>

#include "backends/cpu/cpu_impl.h"
#include "backends/kern_batchnorm.h"

/* Channels per pool chunk: about 16K elements. */
static int64_t chan_grain(const dg__bn_args *a) {
  int64_t per = a->N * a->L;
  return DG_MAX((int64_t)1, 16384 / DG_MAX(per, (int64_t)1));
}

typedef struct {
  const dg__bn_args *a;
  double *out;
  const double *k0, *k1;
} bn_job;

static void stats_task(void *arg, int64_t c0, int64_t c1) {
  const bn_job *j = arg;
  const dg__bn_args *a = j->a;
  const int64_t C = a->C, L = a->L, n = a->N * L;
  for (int64_t c = c0; c < c1; c++) {
    double s = 0, m2 = 0;
    for (int64_t i = 0; i < a->N; i++) s += dg__sum_blocks(a->x + (i * C + c) * L, L);
    double mean = n ? s / (double)n : 0;
    for (int64_t i = 0; i < a->N; i++) {
      const float *xr = a->x + (i * C + c) * L;
      for (int64_t l = 0; l < L; l++) {
        double d = (double)xr[l] - mean;
        m2 += d * d;
      }
    }
    j->out[c] = mean;
    j->out[C + c] = m2;
  }
}

static void cpu_bn_stats(const dg__bn_args *a, double *st) {
  bn_job j = {a, st, NULL, NULL};
  dg__parallel_range(a->C, chan_grain(a), stats_task, &j);
}

static void cpu_bn_set_stats(float *mean, float *corr, float *invstd, const double *dmean,
                             const double *dvar, const float *rm, const float *rv, int64_t C,
                             double eps) {
  for (int64_t c = 0; c < C; c++) {
    /* a batch variance is >= 0 (rounding aside); running ones are taken as
     * they are (NaN and negative values give NaN, as torch) */
    double mu = dmean ? dmean[c] : rm[c], var = dmean ? (dvar[c] < 0 ? 0 : dvar[c]) : rv[c];
    mean[c] = (float)mu;
    corr[c] = (float)(mu - (double)mean[c]);
    invstd[c] = (float)(1.0 / sqrt(var + eps));
  }
}

/* rows [r0, r1) of (N * C): y = ((x - m) - corr) * invstd * w + b */
static void fwd_task(void *arg, int64_t r0, int64_t r1) {
  const dg__bn_args *a = ((const bn_job *)arg)->a;
  const int64_t C = a->C, L = a->L;
  for (int64_t r = r0; r < r1; r++) {
    int64_t c = r % C;
    const float *restrict xr = a->x + r * L;
    float *restrict yr = a->y + r * L;
    const float m = a->mean[c], k = a->corr[c], is = a->invstd[c];
    const float w = a->w ? a->w[c] : 1.0f, b = a->b ? a->b[c] : 0.0f;
    for (int64_t l = 0; l < L; l++) yr[l] = ((xr[l] - m) - k) * is * w + b;
  }
}

/* Rows per pool chunk: about 16K elements. */
static int64_t row_grain(int64_t L) { return DG_MAX((int64_t)1, 16384 / DG_MAX(L, (int64_t)1)); }

static void cpu_bn_fwd(const dg__bn_args *a) {
  bn_job j = {a, NULL, NULL, NULL};
  dg__parallel_range(a->N * a->C, row_grain(a->L), fwd_task, &j);
}

static void sums_task(void *arg, int64_t c0, int64_t c1) {
  const bn_job *j = arg;
  const dg__bn_args *a = j->a;
  const int64_t C = a->C, L = a->L;
  for (int64_t c = c0; c < c1; c++) {
    const float m = a->mean[c], k = a->corr[c], is = a->invstd[c];
    double sdy = 0, sdyx = 0;
    for (int64_t i = 0; i < a->N; i++) {
      const float *xr = a->x + (i * C + c) * L, *gr = a->dy + (i * C + c) * L;
      for (int64_t l = 0; l < L; l++) {
        sdy += gr[l];
        sdyx += (double)gr[l] * (double)(((xr[l] - m) - k) * is);
      }
    }
    j->out[c] = sdy;
    j->out[C + c] = sdyx;
    if (a->dw) a->dw[c] = a->accw ? a->dw[c] + (float)sdyx : (float)sdyx;
    if (a->db) a->db[c] = a->accb ? a->db[c] + (float)sdy : (float)sdy;
  }
}

static void cpu_bn_grad_sums(const dg__bn_args *a, double *sums) {
  bn_job j = {a, sums, NULL, NULL};
  dg__parallel_range(a->C, chan_grain(a), sums_task, &j);
}

static void dx_task(void *arg, int64_t r0, int64_t r1) {
  const bn_job *j = arg;
  const dg__bn_args *a = j->a;
  const int64_t C = a->C, L = a->L;
  for (int64_t r = r0; r < r1; r++) {
    int64_t c = r % C;
    const float *restrict xr = a->x + r * L, *restrict gr = a->dy + r * L;
    float *restrict dr = a->y + r * L;
    const float m = a->mean[c], k = a->corr[c], is = a->invstd[c];
    const float s = (a->w ? a->w[c] : 1.0f) * is;
    const float mdy = j->k0 ? (float)j->k0[c] : 0.0f, mdyx = j->k1 ? (float)j->k1[c] : 0.0f;
    if (a->acc)
      for (int64_t l = 0; l < L; l++) dr[l] += s * (gr[l] - mdy - ((xr[l] - m) - k) * is * mdyx);
    else
      for (int64_t l = 0; l < L; l++) dr[l] = s * (gr[l] - mdy - ((xr[l] - m) - k) * is * mdyx);
  }
}

static void cpu_bn_bwd_dx(const dg__bn_args *a, const double *mdy, const double *mdyx) {
  bn_job j = {a, NULL, mdy, mdyx};
  dg__parallel_range(a->N * a->C, row_grain(a->L), dx_task, &j);
}

static void cpu_bn_update_running(float *rm, float *rv, const double *mean, const double *var,
                                  int64_t C, double momentum) {
  for (int64_t c = 0; c < C; c++) {
    if (rm) rm[c] = (float)((1.0 - momentum) * rm[c] + momentum * mean[c]);
    if (rv) rv[c] = (float)((1.0 - momentum) * rv[c] + momentum * var[c]);
  }
}

const struct dg__kern_batchnorm dg__cpu_kern_batchnorm = {
    cpu_bn_stats,  cpu_bn_set_stats, cpu_bn_fwd, cpu_bn_grad_sums, cpu_bn_bwd_dx,
    cpu_bn_update_running};
