/* Kernels of the embedding family (ops/embedding.c). Not API. */
#ifndef DG_KERN_EMBEDDING_H
#define DG_KERN_EMBEDDING_H

#include <stdint.h>

/* K lookups of rows of D floats; the indices are int64, already checked to
 * be in [0, V). */
typedef struct {
  const float *w, *dy; /* (V, D) weight (forward), (K, D) output gradient (backward) */
  const int64_t *idx;  /* (K) */
  float *y, *dw;       /* (K, D) output (forward), (V, D) weight gradient (backward) */
  int64_t K, D;
} dg__emb_args;

struct dg__kern_embedding {
  /* y[k] = w[idx[k]] */
  void (*fwd)(const dg__emb_args *a);
  /* dw[idx[k]] += dy[k] (repeated indices accumulate; dw is never stored) */
  void (*bwd)(const dg__emb_args *a);
};

#endif
