/* Kernels of the reduction family (ops/reduce.c, ops/argmax.c). Not API. */
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

/* Index of the maximum along D of x (O, D, I) -> idx (O, I), D >= 1. */
typedef struct {
  const float *x; /* (O, D, I) */
  int64_t *idx;   /* (O, I) */
  int64_t O, D, I;
} dg__argmax_args;

struct dg__kern_reduce {
  /* y[0] = scale * sum of x (D elements) */
  void (*sum_fwd)(const dg__reduce_args *a);
  /* dx (D) (+)= dy[0] * scale */
  void (*sum_bwd)(const dg__reduce_args *a);
  /* y (O, I) = scale * sum over D of x (O, D, I) */
  void (*sum_dim_fwd)(const dg__reduce_args *a);
  /* dx (O, D, I) (+)= scale * dy (O, I), broadcast over D */
  void (*sum_dim_bwd)(const dg__reduce_args *a);
  /* idx = argmax over D (ties: the first index; a NaN wins, the first one) */
  void (*argmax)(const dg__argmax_args *a);
  /* how many of a (n), b (n) are equal */
  int64_t (*count_eq)(const int64_t *a, const int64_t *b, int64_t n);
};

#endif
