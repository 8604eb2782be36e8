/* Causal-mask kernels of the CPU backend (the op: ops/mask.c). Row by row:
 * the kept prefix (j <= i) is copied, the rest set to -inf; backward stores
 * into a fresh gradient (zeros where masked) instead of clearing and
 * adding. */
#include <math.h>
#include <string.h>

#include "backends/cpu/cpu_impl.h"
#include "backends/kern_mask.h"

static void cpu_causal_fwd(const dg__mask_args *a) {
  const int64_t B = a->B, T = a->T;
  const float *x = a->x; /* (B, T, T) */
  float *yp = a->y;      /* (B, T, T) */
  for (int64_t b = 0; b < B; b++)
    for (int64_t i = 0; i < T; i++) {
      const float *xr = x + (b * T + i) * T;
      float *restrict yr = yp + (b * T + i) * T;
      memcpy(yr, xr, (size_t)(i + 1) * sizeof(float));
      for (int64_t j = i + 1; j < T; j++) yr[j] = -INFINITY;
    }
}

static void cpu_causal_bwd(const dg__mask_args *a) {
  const int64_t B = a->B, T = a->T;
  float *dx = a->y;        /* (B, T, T) */
  const float *dy = a->dy; /* (B, T, T) */
  for (int64_t b = 0; b < B; b++)
    for (int64_t i = 0; i < T; i++) {
      float *restrict d = dx + (b * T + i) * T;
      const float *restrict g = dy + (b * T + i) * T;
      if (!a->acc) { /* fresh gradient: store, zeros where masked */
        memcpy(d, g, (size_t)(i + 1) * sizeof(float));
        memset(d + i + 1, 0, (size_t)(T - i - 1) * sizeof(float));
      } else {
        for (int64_t j = 0; j <= i; j++) d[j] += g[j];
      }
    }
}

const struct dg__kern_mask dg__cpu_kern_mask = {cpu_causal_fwd, cpu_causal_bwd};
