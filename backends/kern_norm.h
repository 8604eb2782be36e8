/* Kernels of the normalisation family (ops/norm.c). Not API. */
#ifndef DG_KERN_NORM_H
#define DG_KERN_NORM_H

#include <stdint.h>

/* Layer normalisation over the last dim C of R rows. */
typedef struct {
  const float *x, *w, *b, *dy; /* (R, C), (C) or NULL, (C) or NULL, (R, C) */
  float *y, *dw, *db;          /* y: output (forward) or dx (backward); NULL: not wanted */
  int64_t R, C;
  double eps;
  int acc, accw, accb;         /* backward: 0 stores into a fresh gradient, 1 adds */
  float *mean, *rstd;          /* (R): written by forward, read by backward */
  float *corr;                 /* (R): the exact mean minus `mean` (its rounding),
                                  so x - mean is taken as (x - mean) - corr */
} dg__ln_args;

struct dg__kern_norm {
  /* y = (x - mean - corr) * rstd * w + b, per row; fills mean, rstd, corr */
  void (*layernorm_fwd)(const dg__ln_args *a);
  /* dx (a->y), dw, db, each when non-NULL */
  void (*layernorm_bwd)(const dg__ln_args *a);
};

#endif
