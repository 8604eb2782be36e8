/* Kernels of the batch-normalisation family (ops/batchnorm.c). Not API.
 *
 * x is viewed as (N, C, L): channel c of sample n is the L contiguous
 * values at x + (n * C + c) * L (L = H * W for 2-d inputs, 1 for (N, C)).
 * Per-channel statistics and gradient sums are host doubles, so that the
 * op can combine them across processes (SyncBatchNorm) before the
 * element-wise pass. */
#ifndef DG_KERN_BATCHNORM_H
#define DG_KERN_BATCHNORM_H

#include <stdint.h>

typedef struct {
  const float *x, *dy; /* (N, C, L); dy backward only */
  const float *w, *b;  /* (C) or NULL */
  float *y;            /* forward: output (N, C, L); backward: dx (NULL: not wanted) */
  float *dw, *db;      /* backward: (C) or NULL (not wanted) */
  int64_t N, C, L;
  /* normalise with xhat = ((x - mean) - corr) * invstd, each (C): corr is
   * the exact mean minus the float `mean` (0 with running statistics) */
  const float *mean, *corr, *invstd;
  int acc, accw, accb; /* backward: 0 stores into a fresh gradient, 1 adds */
} dg__bn_args;

struct dg__kern_batchnorm {
  /* st (2C) = per channel: the mean of its N * L values, then the sum of
   * squared deviations from that mean (M2), both in double (N * L may be
   * 0: then 0 and 0) */
  void (*stats)(const dg__bn_args *a, double *st);
  /* mean, corr, invstd (C) for the element-wise passes: from the batch's
   * mean and biased variance (dmean, dvar: (C) host doubles) when dmean is
   * non-NULL, else from the running statistics rm, rv (C) */
  void (*set_stats)(float *mean, float *corr, float *invstd, const double *dmean,
                    const double *dvar, const float *rm, const float *rv, int64_t C, double eps);
  /* y = xhat * w + b (w, b: 1 and 0 when NULL) */
  void (*fwd)(const dg__bn_args *a);
  /* sums (2C) = per channel: sum dy, sum dy * xhat over this batch; dw
   * (+)= the second, db (+)= the first, when wanted */
  void (*grad_sums)(const dg__bn_args *a, double *sums);
  /* dx (a->y) (+)= w * invstd * (dy - mdy[c] - xhat * mdyx[c]); mdy, mdyx
   * (C): the means of dy and dy * xhat over the batch the statistics came
   * from (training), NULL for fixed statistics (eval: dx = w invstd dy) */
  void (*bwd_dx)(const dg__bn_args *a, const double *mdy, const double *mdyx);
  /* running statistics (C), in place: r = (1 - momentum) r + momentum v,
   * rm with mean, rv with var (each (C) doubles) */
  void (*update_running)(float *rm, float *rv, const double *mean, const double *var, int64_t C,
                         double momentum);
};

#endif
