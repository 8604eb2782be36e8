/* Kernels of the pooling family (ops/pool.c). Not API. */
#ifndef DG_KERN_POOL_H
#define DG_KERN_POOL_H

#include <stdint.h>

/* 2-D max pooling, no padding, over `planes` (N*C) independent planes. */
typedef struct {
  int64_t planes, H, W, OH, OW, k, s; /* window k x k, stride s */
  const float *x, *dy;                /* (planes, H, W), (planes, OH, OW) */
  float *y, *dx;                      /* (planes, OH, OW), (planes, H, W) */
  int32_t *idx;                       /* (planes, OH, OW): argmax within each H*W plane */
  int acc;                            /* backward: 0 stores into a fresh dx, 1 adds */
} dg__maxpool_args;

struct dg__kern_pool {
  /* y = window maxima of x (ties: the first in row-major window order; a
   * NaN wins); fills idx */
  void (*maxpool2d_fwd)(const dg__maxpool_args *a);
  /* dx (+)= dy scattered through idx */
  void (*maxpool2d_bwd)(const dg__maxpool_args *a);
};

#endif
