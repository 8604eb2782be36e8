/* Kernels of the loss family (ops/loss.c). Not API. */
#ifndef DG_KERN_LOSS_H
#define DG_KERN_LOSS_H

#include <stdint.h>

/* Cross-entropy from logits x (N, C) with targets in [0, C), mean over the
 * rows. Forward keeps each row's max m and log-sum-exp l of x - m, so
 * backward is one pass with no (N, C) softmax stored. */
typedef struct {
  const float *x;        /* (N, C) logits */
  const float *dy;       /* () loss gradient (backward) */
  const int64_t *target; /* (N) */
  float *max, *lsum;     /* (N) each: written by forward, read by backward */
  float *loss;           /* () forward */
  float *dx;             /* (N, C) backward */
  int64_t N, C;
  int acc;               /* backward: 0 stores into a fresh gradient, 1 adds */
} dg__ce_args;

/* Mean squared error of p against t, N elements each (contiguous). */
typedef struct {
  const float *p, *t; /* (N) prediction, target */
  const float *dy;    /* () loss gradient (backward) */
  float *loss;        /* () forward */
  float *dp, *dt;     /* (N) each (backward); NULL: not wanted */
  int64_t N;
  int accp, acct;     /* backward: 0 stores into a fresh gradient, 1 adds */
} dg__mse_args;

struct dg__kern_loss {
  /* max, lsum; loss = mean over rows of (m - x[target]) + l (N = 0: NaN) */
  void (*ce_fwd)(const dg__ce_args *a);
  /* dx (+)= (exp(x - m - l) - onehot(target)) * dy / N */
  void (*ce_bwd)(const dg__ce_args *a);
  /* loss = mean of (p - t)^2 */
  void (*mse_fwd)(const dg__mse_args *a);
  /* dp (+)= 2 dy / N * (p - t), dt (+)= -(2 dy / N * (p - t)) */
  void (*mse_bwd)(const dg__mse_args *a);
};

#endif
