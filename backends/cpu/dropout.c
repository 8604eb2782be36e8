/* Dropout kernels of the CPU backend (the op: ops/dropout.c). Uniforms are
 * drawn in chunks into a stack buffer; chunking does not change them
 * (element i always comes from offset + i). */
#include "backends/cpu/cpu_impl.h"
#include "backends/kern_dropout.h"
#include "base/rng_impl.h"

#define DROP_CHUNK 256 /* a multiple of 4: chunked draws advance the stream like one draw */

/* y (+)= keep ? x * scale : 0; forward is the storing form. */
static void cpu_dropout(const dg__dropout_args *a) {
  const float *x = a->x; /* (n) */
  float *y = a->y;       /* (n) */
  const int64_t N = a->n;
  const float p = a->p, scale = a->scale;
  float u[DROP_CHUNK];
  for (int64_t c = 0; c < N; c += DROP_CHUNK) {
    int64_t len = DG_MIN(DROP_CHUNK, N - c);
    dg__rng_uniform(a->seed, a->offset + (uint64_t)c, u, (size_t)len);
    if (!a->acc)
      for (int64_t i = 0; i < len; i++) y[c + i] = u[i] >= p ? x[c + i] * scale : 0.0f;
    else
      for (int64_t i = 0; i < len; i++) y[c + i] += u[i] >= p ? x[c + i] * scale : 0.0f;
  }
}

const struct dg__kern_dropout dg__cpu_kern_dropout = {cpu_dropout, cpu_dropout};
