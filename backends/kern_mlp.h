/* Kernels of the fused MLP family (ops/mlp.c). Not API. */
#ifndef DG_KERN_MLP_H
#define DG_KERN_MLP_H

#include <stdint.h>

/* y (R, O) = gelu(x w1^T + b1) w2^T + b2 (+ res), x (R, C), w1 (F, C),
 * w2 (O, F); gelu in tanh form. Rows go by blocks of block_rows(F) rows
 * through two (block, F) scratch buffers. */
typedef struct {
  int64_t R, C, F, O;
  const float *x, *w1, *b1, *w2, *b2, *res; /* b1, b2, res may be NULL */
  float *y;           /* forward: (R, O) */
  float *h;           /* (R, F) pre-activation: written by forward when h_whole
                       * (saved), else a (block, F) scratch; read by backward */
  int h_whole;
  float *g, *a;       /* (block, F) scratch each (forward: g only) */
  const float *dy;    /* backward: (R, O) */
  float *dx, *dw1, *db1, *dw2, *db2, *dres; /* backward: NULL when not wanted */
  int accx, accw1, accb1, accw2, accb2, accres; /* 0 stores into a fresh gradient, 1 adds */
} dg__mlp_args;

struct dg__kern_mlp {
  /* rows per block of the scratch (>= 1) */
  int64_t (*block_rows)(int64_t F);
  void (*forward)(const dg__mlp_args *a);
  /* db2 and dres from dy; dx, dw1, db1, dw2 (when any is wanted) block by
   * block through the scratch a and g */
  void (*backward)(const dg__mlp_args *a);
};

#endif
