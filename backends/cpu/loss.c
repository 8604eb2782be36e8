/* Loss kernels of the CPU backend (the op: ops/loss.c): cross-entropy
 * from logits and mean squared error.
 *
 * Both cross-entropy passes run the vector exp of cpu_impl.h, are compiled
 * per ISA and split by rows over the pool; the loss is summed over the
 * rows in order (thread-count invariant). */
#include <math.h>

#include "backends/cpu/cpu_impl.h"
#include "backends/kern_loss.h"

/* ---- cross-entropy ---- */

typedef struct {
  const float *x;         /* (N, C) logits */
  const int64_t *target;  /* (N) */
  float *max, *lsum;      /* (N) each */
  float *dx;              /* (N, C) backward */
  float g;                /* dL/dloss / N */
  int64_t C;
  int acc;                /* 0: store into a fresh gradient */
} ce_job;

/* Forward rows [r0, r1): max and log-sum-exp of each row. The exp sum runs
 * in 16 float lanes (exp of x - m <= 0 by the vector polynomial), folded
 * into double per row. */
DG_INLINE void ce_fwd_rows_body(const ce_job *j, int64_t r0, int64_t r1) {
  const int64_t C = j->C;
  for (int64_t r = r0; r < r1; r++) {
    const float *restrict xr = j->x + r * C;
    float m16[16], m = -INFINITY;
    for (int k = 0; k < 16; k++) m16[k] = -INFINITY;
    int64_t i = 0;
    for (; i + 16 <= C; i += 16)
      for (int k = 0; k < 16; k++) m16[k] = xr[i + k] > m16[k] ? xr[i + k] : m16[k];
    for (; i < C; i++) m = xr[i] > m ? xr[i] : m;
    for (int k = 0; k < 16; k++) m = m16[k] > m ? m16[k] : m;
    float s16[16] = {0};
    double s = 0;
    for (i = 0; i + 16 <= C; i += 16)
      for (int k = 0; k < 16; k++) s16[k] += dg__exp_nonpos(xr[i + k] - m);
    for (; i < C; i++) s += dg__exp_nonpos(xr[i] - m);
    for (int k = 0; k < 16; k++) s += s16[k];
    j->max[r] = m, j->lsum[r] = (float)log(s);
  }
}
DG_SIMD_FN(ce_fwd_rows, (const ce_job *j, int64_t r0, int64_t r1), (j, r0, r1))

/* Backward rows [r0, r1): dx = (softmax(x) - onehot(t)) * g. */
DG_INLINE void ce_bwd_rows_body(const ce_job *j, int64_t r0, int64_t r1) {
  const int64_t C = j->C;
  const float g = j->g;
  for (int64_t r = r0; r < r1; r++) {
    const float *restrict xr = j->x + r * C;
    float *restrict dr = j->dx + r * C;
    const float m = j->max[r], l = j->lsum[r];
    if (j->acc)
      for (int64_t i = 0; i < C; i++) dr[i] += g * dg__exp_nonpos((xr[i] - m) - l);
    else
      for (int64_t i = 0; i < C; i++) dr[i] = g * dg__exp_nonpos((xr[i] - m) - l);
    dr[j->target[r]] -= g;
  }
}
DG_SIMD_FN(ce_bwd_rows, (const ce_job *j, int64_t r0, int64_t r1), (j, r0, r1))

static void ce_fwd_task(void *arg, int64_t lo, int64_t hi) { ce_fwd_rows(arg, lo, hi); }
static void ce_bwd_task(void *arg, int64_t lo, int64_t hi) { ce_bwd_rows(arg, lo, hi); }

/* Rows per pool chunk: about 16K elements. */
static int64_t ce_grain(int64_t C) { return DG_MAX((int64_t)1, 16384 / DG_MAX(C, (int64_t)1)); }

static void cpu_ce_fwd(const dg__ce_args *a) {
  const int64_t N = a->N, C = a->C;
  const float *x = a->x;
  const int64_t *t = a->target;
  ce_job j = {x, t, a->max, a->lsum, NULL, 0, C, 0};
  dg__parallel_range(N, ce_grain(C), ce_fwd_task, &j);
  double total = 0;
  for (int64_t r = 0; r < N; r++) total += ((double)a->max[r] - x[r * C + t[r]]) + a->lsum[r];
  *a->loss = (float)(total / (double)N); /* N = 0: NaN, as in PyTorch */
}

static void cpu_ce_bwd(const dg__ce_args *a) {
  float g = a->dy[0] / (float)a->N;
  ce_job j = {a->x, a->target, a->max, a->lsum, a->dx, g, a->C, a->acc};
  dg__parallel_range(a->N, ce_grain(a->C), ce_bwd_task, &j);
}

/* ---- mean squared error ---- */

static void cpu_mse_fwd(const dg__mse_args *a) {
  const float *p = a->p, *t = a->t; /* (N) */
  const int64_t N = a->N;
  double s = 0;
  for (int64_t i = 0; i < N; i++) {
    double d = (double)p[i] - t[i];
    s += d * d;
  }
  *a->loss = (float)(s / (double)N);
}

static void cpu_mse_bwd(const dg__mse_args *a) {
  const float *p = a->p, *t = a->t; /* (N) */
  float *dp = a->dp, *dt = a->dt;   /* (N) */
  const int64_t N = a->N;
  float g = 2.0f * a->dy[0] / (float)N;
  if (dp && !a->accp)
    for (int64_t i = 0; i < N; i++) dp[i] = g * (p[i] - t[i]);
  else if (dp)
    for (int64_t i = 0; i < N; i++) dp[i] += g * (p[i] - t[i]);
  if (dt && !a->acct)
    for (int64_t i = 0; i < N; i++) dt[i] = -(g * (p[i] - t[i]));
  else if (dt)
    for (int64_t i = 0; i < N; i++) dt[i] -= g * (p[i] - t[i]);
}

const struct dg__kern_loss dg__cpu_kern_loss = {cpu_ce_fwd, cpu_ce_bwd, cpu_mse_fwd,
                                                cpu_mse_bwd};
