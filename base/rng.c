/* Philox4x32-10 (Salmon et al. 2011): a counter-based generator, so element
 * i of a draw is a pure function of (seed, offset + i) whatever the thread
 * count or chunking. */
#include "base/rng_impl.h"

void dg__philox(uint64_t seed, uint64_t counter, uint32_t out[4]) {
  uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int r = 0; r < 10; r++) {
    uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    c1 = (uint32_t)p1;
    c3 = (uint32_t)p0;
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

static float u01(uint32_t x) { return (float)(x >> 8) * (1.0f / 16777216.0f); }

/* Each Philox call yields 4 numbers: element i uses word (offset+i)%4 of
 * counter (offset+i)/4. */
void dg__rng_uniform(uint64_t seed, uint64_t offset, float *out, size_t n) {
  uint32_t w[4];
  uint64_t have = UINT64_MAX;
  for (size_t i = 0; i < n; i++) {
    uint64_t idx = offset + i, ctr = idx >> 2;
    if (ctr != have) {
      dg__philox(seed, ctr, w);
      have = ctr;
    }
    out[i] = u01(w[idx & 3]);
  }
}
