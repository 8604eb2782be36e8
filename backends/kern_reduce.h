/* Kernels of the reduction family (ops/reduce.c). Not API. */
#ifndef DG_KERN_REDUCE_H
#define DG_KERN_REDUCE_H

#include <stdint.h>

/* x contiguous, viewed as (O, D, I) and summed over D into y (O, I), times
 * scale (1 for sums, 1 / D for means). A sum over everything is O = I = 1,
 * D = numel. */
typedef struct {
  const float *x, *dy; /* (O, D, I) input (forward); (O, I) output gradient (backward) */
  float *y;            /* (O, I) output (forward) or (O, D, I) dx (backward) */
  int64_t O, D, I;
  double scale;
  double *work;        /* sum_dim forward: (I) host scratch */
  int acc;             /* backward: 0 stores into a fresh gradient, 1 adds */
} dg__reduce_args;

struct dg__kern_reduce {
  /* y[0] = scale * sum of x (D elements) */
  void (*sum_fwd)(const dg__reduce_args *a);
  /* dx (D) (+)= dy[0] * scale */
  void (*sum_bwd)(const dg__reduce_args *a);
  /* y (O, I) = scale * sum over D of x (O, D, I) */
  void (*sum_dim_fwd)(const dg__reduce_args *a);
  /* dx (O, D, I) (+)= scale * dy (O, I), broadcast over D */
  void (*sum_dim_bwd)(const dg__reduce_args *a);
};

#endif
