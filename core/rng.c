/* The public RNG: uniforms and normals from the Philox generator
 * (base/rng.c), element i of a draw a pure function of (seed, offset + i)
 * whatever the thread count or chunking. */
#include <math.h>

#include "base/rng_impl.h"
#include "core/core_impl.h"

void dg_rng_uniform(uint64_t seed, uint64_t offset, float *out, size_t n) {
  dg__rng_uniform(seed, offset, out, n);
}

/* Box-Muller on word pairs (0,1) and (2,3) of one counter. */
void dg_rng_normal(uint64_t seed, uint64_t offset, float *out, size_t n) {
  uint32_t w[4];
  for (size_t i = 0; i < n; i++) {
    uint64_t idx = offset + i;
    dg__philox(seed ^ 0x9e3779b97f4a7c15ull, idx >> 2, w);
    int pair = (int)(idx & 2), second = (int)(idx & 1);
    double u1 = ((double)(w[pair] >> 8) + 1.0) / 16777217.0; /* (0, 1] */
    double u2 = (double)(w[pair + 1] >> 8) / 16777216.0;
    double r = sqrt(-2.0 * log(u1)), th = 6.283185307179586 * u2;
    out[i] = (float)(second ? r * sin(th) : r * cos(th));
  }
}
