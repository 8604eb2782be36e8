/* The counter-based generator (Philox4x32-10) under dgrad's RNG: a pure
 * function of (seed, counter), so core (dg_rng_uniform, dg_rng_normal, the
 * context's stream) and the backends' kernels (dropout) draw the same
 * numbers. Not API. */
#ifndef DG_RNG_IMPL_H
#define DG_RNG_IMPL_H

#include <stddef.h>
#include <stdint.h>

/* The 4 words of counter `counter` under key `seed`. */
void dg__philox(uint64_t seed, uint64_t counter, uint32_t out[4]);
/* n uniforms in [0, 1): element i is word (offset+i)%4 of counter
 * (offset+i)/4 (what dg_rng_uniform returns). */
void dg__rng_uniform(uint64_t seed, uint64_t offset, float *out, size_t n);

#endif
