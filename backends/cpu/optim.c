/* Optimizer update kernels of the CPU backend (the optimizers: optim/).
 * Element-wise updates (SGD, AdamW) are independent per element: ranges of
 * at least 2 * 32768 floats are split over the compute pool. LAMB and LARS
 * walk one parameter, norms accumulated in double; no scratch memory (LAMB
 * makes two passes and recomputes its update direction). */
#include <math.h>

#include "backends/cpu/cpu_impl.h"
#include "backends/kern_optim.h"

#define OPTIM_GRAIN 32768

/* ---- SGD ---- */

#ifdef DG_TARGET_AVX512 /* cpu_impl.h: the build has the AVX-512 and AVX2 targets */
#include <immintrin.h>

/* The baseline build's update (below) rounds every multiply and add on its
 * own: x86-64's baseline has no FMA to contract them into. This form keeps
 * those bits on 512-bit vectors: the explicit-rounding intrinsics are not
 * contracted under -ffp-contract=fast (tests/optim/test_optim checks the
 * bits against the baseline). Zen 4, the MLP benchmark's 536k parameters
 * in cache: about 50 us against 300 us for the baseline loop; in the MLP
 * step, where the update waits on memory, about 1%. */
#define RN (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define MUL(x, y) _mm512_mul_round_ps(x, y, RN)
#define ADD(x, y) _mm512_add_round_ps(x, y, RN)

typedef struct {
  __m512 lr, wd, mom, damp;
  int plain, first, nest;
} sgd_vec;

/* 16 (or, masked by m, fewer) floats of the update. */
DG_TARGET_AVX512 DG_INLINE void sgd16(const sgd_vec *k, float *w, const float *g, float *buf,
                                      __mmask16 m) {
  __m512 x = _mm512_maskz_loadu_ps(m, w);
  __m512 d = ADD(_mm512_maskz_loadu_ps(m, g), MUL(k->wd, x)); /* g + wd w */
  __m512 u = d;
  if (!k->plain) {
    __m512 b = k->first ? d : ADD(MUL(_mm512_maskz_loadu_ps(m, buf), k->mom), MUL(k->damp, d));
    _mm512_mask_storeu_ps(buf, m, b);
    u = k->nest ? ADD(d, MUL(k->mom, b)) : b;
  }
  _mm512_mask_storeu_ps(w, m, _mm512_sub_round_ps(x, MUL(k->lr, u), RN));
}

DG_TARGET_AVX512 static void sgd_range_avx512(const dg__sgd_args *a, size_t lo, size_t hi) {
  const sgd_vec k = {_mm512_set1_ps(a->lr), _mm512_set1_ps(a->weight_decay),
                     _mm512_set1_ps(a->momentum), _mm512_set1_ps(1.0f - a->dampening),
                     a->momentum == 0.0f, a->first, a->nesterov};
  float *w = a->w, *buf = a->buf;
  const float *g = a->g;
  size_t j = lo;
  for (; j + 16 <= hi; j += 16) sgd16(&k, w + j, g + j, buf ? buf + j : NULL, 0xffff);
  if (j < hi) sgd16(&k, w + j, g + j, buf ? buf + j : NULL, (__mmask16)((1u << (hi - j)) - 1));
}
#undef MUL
#undef ADD
#undef RN

/* The same on AVX2, which has no rounding-mode intrinsics: each product
 * goes through an empty asm so that it is rounded on its own and never
 * contracted into the add after it (tests/optim/test_optim fails without
 * the asm). Zen 3, MLP batch 64: the update's share of the step fell from
 * 6.5% (the baseline loop) to 4.2% (`perf`); it waits on memory. */
#define MUL(x, y)                                        \
  __extension__({                                        \
    __m256 p_ = _mm256_mul_ps(x, y);                     \
    __asm__("" : "+x"(p_));                              \
    p_;                                                  \
  })
DG_TARGET_AVX2 static void sgd_range_avx2(const dg__sgd_args *a, size_t lo, size_t hi) {
  const __m256 lr = _mm256_set1_ps(a->lr), wd = _mm256_set1_ps(a->weight_decay);
  const __m256 mom = _mm256_set1_ps(a->momentum), damp = _mm256_set1_ps(1.0f - a->dampening);
  const int plain = a->momentum == 0.0f, first = a->first, nest = a->nesterov;
  float *w = a->w, *buf = a->buf;
  const float *g = a->g;
  for (size_t j = lo; j + 8 <= hi; j += 8) { /* whole vectors: the caller does the rest */
    __m256 x = _mm256_loadu_ps(w + j);
    __m256 d = _mm256_add_ps(_mm256_loadu_ps(g + j), MUL(wd, x)); /* g + wd w */
    __m256 u = d;
    if (!plain) {
      __m256 b = first ? d
                       : _mm256_add_ps(MUL(_mm256_loadu_ps(buf + j), mom), MUL(damp, d));
      _mm256_storeu_ps(buf + j, b);
      u = nest ? _mm256_add_ps(d, MUL(mom, b)) : b;
    }
    _mm256_storeu_ps(w + j, _mm256_sub_ps(x, MUL(lr, u)));
  }
}
#undef MUL
#endif

static void sgd_range(const dg__sgd_args *a, size_t lo, size_t hi) {
#ifdef DG_TARGET_AVX512
  int isa = dg__simd_isa();
  if (isa == DG_ISA_AVX512) {
    sgd_range_avx512(a, lo, hi);
    return;
  }
  if (isa == DG_ISA_AVX2 && hi - lo >= 8) {
    sgd_range_avx2(a, lo, hi);
    lo += (hi - lo) / 8 * 8; /* the tail below, the baseline's loop */
  }
#endif
  float *w = a->w, *buf = a->buf;
  const float *g = a->g;
  const float lr = a->lr, wd = a->weight_decay, mom = a->momentum;
  const float damp = 1.0f - a->dampening;
  const int first = a->first, nest = a->nesterov;
  if (mom == 0.0f) {
    for (size_t j = lo; j < hi; j++) w[j] -= lr * (g[j] + wd * w[j]);
    return;
  }
  for (size_t j = lo; j < hi; j++) {
    float d = g[j] + wd * w[j];
    float b = first ? d : buf[j] * mom + damp * d;
    buf[j] = b;
    w[j] -= lr * (nest ? d + mom * b : b);
  }
}

static void sgd_chunk(void *arg, int64_t lo, int64_t hi) {
  const dg__sgd_args *a = arg;
  sgd_range(a, a->lo + (size_t)lo, a->lo + (size_t)hi);
}

static void cpu_sgd(const dg__sgd_args *a) {
  dg__parallel_range((int64_t)(a->hi - a->lo), OPTIM_GRAIN, sgd_chunk, (void *)a);
}

/* ---- AdamW ---- */

/* torch.optim.AdamW's update, operation for operation (sqrt and divisions
 * kept: the vector forms round exactly like the scalar ones). */
DG_INLINE void adamw_kernel_body(const dg__adamw_args *k, float *restrict w,
                                 const float *restrict g, float *restrict m, float *restrict v,
                                 size_t n) {
  for (size_t j = 0; j < n; j++) {
    float gj = g[j];
    float mj = m[j] * k->b1 + k->c1 * gj;
    float vj = v[j] * k->b2 + k->c2 * gj * gj;
    m[j] = mj;
    v[j] = vj;
    float wj = w[j] * k->decay;
    w[j] = wj - k->step_size * (mj / (sqrtf(vj) / k->bc2_sqrt + k->eps));
  }
}
DG_SIMD_FN(adamw_kernel,
           (const dg__adamw_args *k, float *restrict w, const float *restrict g,
            float *restrict m, float *restrict v, size_t n),
           (k, w, g, m, v, n))

static void adamw_chunk(void *arg, int64_t clo, int64_t chi) {
  const dg__adamw_args *a = arg;
  size_t lo = a->lo + (size_t)clo, hi = a->lo + (size_t)chi;
  if (hi > lo) adamw_kernel(a, a->w + lo, a->g + lo, a->m + lo, a->v + lo, hi - lo);
}

static void cpu_adamw(const dg__adamw_args *a) {
  dg__parallel_range((int64_t)(a->hi - a->lo), OPTIM_GRAIN, adamw_chunk, (void *)a);
}

/* ---- LAMB ---- */

static void cpu_lamb(const dg__lamb_args *a) {
  const float bc1 = a->bc1, bc2 = a->bc2;
  const float b1 = a->b1, b2 = a->b2, eps = a->eps, wd = a->weight_decay;
  float *w = a->w, *m = a->m, *v = a->v;
  const float *g = a->g;
  const size_t lo = a->lo, hi = a->hi;
  double wn = 0, rn = 0;
  for (size_t j = lo; j < hi; j++) {
    float gj = g[j];
    float mj = m[j] * b1 + (1.0f - b1) * gj;
    float vj = v[j] * b2 + (1.0f - b2) * gj * gj;
    m[j] = mj;
    v[j] = vj;
    float r = (mj / bc1) / (sqrtf(vj / bc2) + eps) + wd * w[j];
    wn += (double)w[j] * w[j];
    rn += (double)r * r;
  }
  double ratio = (wn > 0 && rn > 0) ? sqrt(wn) / sqrt(rn) : 1.0;
  const float step = (float)(a->lr * ratio);
  for (size_t j = lo; j < hi; j++) {
    float r = (m[j] / bc1) / (sqrtf(v[j] / bc2) + eps) + wd * w[j];
    w[j] -= step * r;
  }
}

/* ---- LARS ---- */

static void cpu_lars(const dg__lars_args *a) {
  const float mom = a->momentum;
  float *w = a->w, *buf = a->buf;
  const float *g = a->g;
  const size_t lo = a->lo, hi = a->hi;
  if (a->excluded) {
    const float lr = a->lr;
    for (size_t j = lo; j < hi; j++) {
      buf[j] = mom * buf[j] + lr * g[j];
      w[j] -= buf[j];
    }
    return;
  }
  const float wd = a->weight_decay;
  double wn = 0, gn = 0;
  for (size_t j = lo; j < hi; j++) {
    wn += (double)w[j] * w[j];
    gn += (double)g[j] * g[j];
  }
  wn = sqrt(wn);
  gn = sqrt(gn);
  double local = 1.0;
  if (wn > 0 && gn > 0) local = a->trust_coef * wn / (gn + wd * wn + a->eps);
  const float scale = (float)(a->lr * local);
  for (size_t j = lo; j < hi; j++) {
    buf[j] = mom * buf[j] + scale * (g[j] + wd * w[j]);
    w[j] -= buf[j];
  }
}

const struct dg__kern_optim dg__cpu_kern_optim = {cpu_sgd, cpu_adamw, cpu_lamb, cpu_lars};
