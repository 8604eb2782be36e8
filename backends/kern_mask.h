/* Kernels of the causal-mask family (ops/mask.c). Not API. */
#ifndef DG_KERN_MASK_H
#define DG_KERN_MASK_H

#include <stdint.h>

/* B score matrices of (T, T), contiguous; entry (i, j) is masked when the
 * key j is after the query i (j > i). */
typedef struct {
  const float *x, *dy; /* (B, T, T): scores (forward), output gradient (backward) */
  float *y;            /* (B, T, T): output (forward) or dx (backward) */
  int64_t B, T;
  int acc;             /* backward: 0 stores into a fresh gradient, 1 adds */
} dg__mask_args;

struct dg__kern_mask {
  /* y = x, -inf where masked */
  void (*causal_fwd)(const dg__mask_args *a);
  /* dx (+)= dy where kept; a fresh dx gets 0 where masked */
  void (*causal_bwd)(const dg__mask_args *a);
};

#endif
