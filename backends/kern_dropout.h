/* Kernels of the dropout family (ops/dropout.c). Not API. */
#ifndef DG_KERN_DROPOUT_H
#define DG_KERN_DROPOUT_H

#include <stdint.h>

/* Inverted dropout over n contiguous elements: element i is kept when the
 * uniform (seed, offset + i) of dgrad's Philox stream (base/rng_impl.h) is
 * >= p, and a kept element is scaled by `scale` (1 / (1 - p)). The mask is
 * never stored: backward draws the same uniforms again. */
typedef struct {
  const float *x; /* (n): input (forward) or output gradient (backward) */
  float *y;       /* (n): output (forward) or dx (backward) */
  int64_t n;
  float p, scale;
  uint64_t seed, offset;
  int acc;        /* backward: 0 stores into a fresh gradient, 1 adds */
} dg__dropout_args;

struct dg__kern_dropout {
  /* y = keep ? x * scale : 0 */
  void (*fwd)(const dg__dropout_args *a);
  /* dx (+)= keep ? dy * scale : 0 */
  void (*bwd)(const dg__dropout_args *a);
};

#endif
