/* Seeded initialisers: element i of a tensor depends only on (seed, i). */
#include <math.h>

#include "nn/nn_impl.h"

static float *f32_data(dg_tensor *w, size_t *n) {
  if (!w || w->dtype != DG_F32 || !dg__is_contig(w)) return NULL;
  dg__settle(w); /* a pending update must not land on the new values */
  *n = (size_t)dg__numel(w);
  return w->data;
}

void dg_init_uniform(dg_tensor *w, float lo, float hi, uint64_t seed) {
  size_t n;
  float *d = f32_data(w, &n);
  if (!d) return;
  dg_rng_uniform(seed, 0, d, n);
  for (size_t i = 0; i < n; i++) d[i] = lo + (hi - lo) * d[i];
}

void dg_init_normal(dg_tensor *w, float mean, float std, uint64_t seed) {
  size_t n;
  float *d = f32_data(w, &n);
  if (!d) return;
  dg_rng_normal(seed, 0, d, n);
  for (size_t i = 0; i < n; i++) d[i] = mean + std * d[i];
}

void dg_init_kaiming_uniform(dg_tensor *w, int64_t fan_in, float gain, uint64_t seed) {
  float b = fan_in > 0 ? gain * sqrtf(3.0f / (float)fan_in) : 0.0f;
  dg_init_uniform(w, -b, b, seed);
}

void dg_init_xavier_uniform(dg_tensor *w, int64_t fan_in, int64_t fan_out, uint64_t seed) {
  float b = (fan_in + fan_out) > 0 ? sqrtf(6.0f / (float)(fan_in + fan_out)) : 0.0f;
  dg_init_uniform(w, -b, b, seed);
}

void dg_init_constant(dg_tensor *w, float v) {
  size_t n;
  float *d = f32_data(w, &n);
  if (!d) return;
  for (size_t i = 0; i < n; i++) d[i] = v;
}
