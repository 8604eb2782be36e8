/* Kernels of the pooling family (ops/pool.c): max and average pooling. Not
 * API. */
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

/* 2-D average pooling, no padding, over `planes` (N*C) independent planes;
 * window kh x kw, strides sh, sw. Global average pooling is kh = H, kw = W,
 * OH = OW = 1. */
typedef struct {
  int64_t planes, H, W, OH, OW, kh, kw, sh, sw;
  const float *x, *dy; /* (planes, H, W), (planes, OH, OW) */
  float *y, *dx;       /* (planes, OH, OW), (planes, H, W) */
  int acc;             /* backward: 0 stores into a fresh dx, 1 adds */
} dg__avgpool_args;

struct dg__kern_pool {
  /* y = window maxima of x (ties: the first in row-major window order; a
   * NaN wins); fills idx */
  void (*maxpool2d_fwd)(const dg__maxpool_args *a);
  /* dx (+)= dy scattered through idx */
  void (*maxpool2d_bwd)(const dg__maxpool_args *a);
  /* y = window means of x (summed in double; an empty window is NaN) */
  void (*avgpool2d_fwd)(const dg__avgpool_args *a);
  /* dx (+)= dy / (kh kw) added to every element of its window; elements in
   * no window get 0 (a fresh dx) */
  void (*avgpool2d_bwd)(const dg__avgpool_args *a);
};

#endif
