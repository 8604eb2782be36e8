/* Kernels of the view family (ops/view.c): views share their input's
 * memory, so only backward moves data, routing the view's gradient back into
 * the input's (logical, contiguous) gradient. Not API. */
#ifndef DG_KERN_VIEW_H
#define DG_KERN_VIEW_H

#include <stdint.h>

/* Most dims a strided view may have here (at least the tensors' DG_MAX_DIMS;
 * ops/view.c checks). */
#define DG__VIEW_MAX_DIMS 8

/* dy (n) into dx[lo, lo + n) of dx (nx). */
typedef struct {
  float *dx;
  const float *dy;
  int64_t n, lo, nx;
  int store; /* 1: dx is fresh: store, and zero outside [lo, lo + n); 0: add */
} dg__view_range_args;

/* dy (contiguous in shape) into dx seen at strides `stride` (elements), a
 * permutation of dx's dims: every element of dx is written once. */
typedef struct {
  float *dx;
  const float *dy;
  int ndim;
  const int64_t *shape, *stride;
  int store; /* 1: dx is fresh: store; 0: add */
} dg__view_strided_args;

struct dg__kern_view {
  /* reshape, contiguous (lo 0, nx n) and slice backward */
  void (*range_bwd)(const dg__view_range_args *a);
  /* permute / transpose backward */
  void (*strided_bwd)(const dg__view_strided_args *a);
};

#endif
