/* Kernels of the softmax family (ops/softmax.c). Not API. */
#ifndef DG_KERN_SOFTMAX_H
#define DG_KERN_SOFTMAX_H

#include <stdint.h>

/* softmax or log-softmax over the last dim C of R contiguous rows.
 * Backward reads only the saved output y:
 *   softmax:     dx = y * (dy - sum(dy * y))
 *   log_softmax: dx = dy - exp(y) * sum(dy) */
typedef struct {
  const float *x, *dy; /* (R, C): x: input (forward) or saved output y (backward) */
  float *y;            /* (R, C): output (forward) or dx (backward) */
  int64_t R, C;
  int is_log;          /* 1: log_softmax */
  int acc;             /* backward: 0 stores into a fresh gradient, 1 adds */
} dg__softmax_args;

struct dg__kern_softmax {
  void (*fwd)(const dg__softmax_args *a);
  void (*bwd)(const dg__softmax_args *a);
};

#endif
