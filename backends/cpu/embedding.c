/* Embedding kernels of the CPU backend (the op: ops/embedding.c): a row
 * copy per index forward, a serial scatter-add per index backward (in index
 * order, so repeated indices accumulate the same way every time). */
#include <string.h>

#include "backends/cpu/cpu_impl.h"
#include "backends/kern_embedding.h"

static void cpu_emb_fwd(const dg__emb_args *a) {
  const int64_t K = a->K, D = a->D;
  const int64_t *ix = a->idx; /* (K) */
  const float *w = a->w;      /* (V, D) */
  float *yp = a->y;           /* (K, D) */
  for (int64_t k = 0; k < K; k++) memcpy(yp + k * D, w + ix[k] * D, (size_t)D * sizeof(float));
}

static void cpu_emb_bwd(const dg__emb_args *a) {
  const int64_t K = a->K, D = a->D;
  const int64_t *idx = a->idx; /* (K) */
  const float *dy = a->dy;     /* (K, D) */
  float *dw = a->dw;           /* (V, D) */
  for (int64_t k = 0; k < K; k++) {
    float *restrict d = dw + idx[k] * D;
    const float *restrict g = dy + k * D;
    for (int64_t j = 0; j < D; j++) d[j] += g[j];
  }
}

const struct dg__kern_embedding dg__cpu_kern_embedding = {cpu_emb_fwd, cpu_emb_bwd};
