/* Kernels of the concat/split family (ops/concat.c). A tensor is seen as
 * (outer, size along dim, inner): a part is `outer` blocks of len floats,
 * one per outer row, at a row stride. Not API. */
#ifndef DG_KERN_CONCAT_H
#define DG_KERN_CONCAT_H

#include <stdint.h>

/* dst[o * dst_row + j] (op) src[o * src_row + j] for o < outer, j < len. */
typedef struct {
  float *dst;
  const float *src;
  int64_t dst_row, src_row, outer, len;
  int store; /* add_blocks: 1 stores (=), 0 adds (+=) */
} dg__blocks_args;

/* split backward: a part's gradient dy (outer, sk, inner) into dx (outer,
 * S, inner) at column off along dim. */
typedef struct {
  float *dx;
  const float *dy;
  int64_t outer, S, sk, off, inner;
  int store; /* 1: dx is fresh: zero the other parts' columns, store this
              * one's; 0: add */
} dg__split_bwd_args;

struct dg__kern_concat {
  /* dst blocks = src blocks (concat forward, a split part's copy) */
  void (*copy_blocks)(const dg__blocks_args *a);
  /* dst blocks (+)= src blocks (concat backward) */
  void (*add_blocks)(const dg__blocks_args *a);
  void (*split_bwd)(const dg__split_bwd_args *a);
};

#endif
