/* Element-wise unary kernels of the CPU backend (the op: ops/unary.c):
 * relu, gelu (tanh form), tanh, sigmoid, exp, log, leaky_relu, forward and
 * backward.
 *
 * tanh, sigmoid and gelu use a branch-free single-precision exp (Cephes
 * expf, about 1 ulp; cpu_impl.h) so their loops vectorise; libm's
 * expf/tanhf are scalar calls. Relative error against double: sigmoid,
 * tanh < 2e-7. exp runs the same polynomial wherever its result is a
 * normal float ([-87.3, 88]) and hands each 64-element block holding
 * anything else (inf, nan, overflow, denormal results) to libm, so torch's
 * edge cases still hold; log calls libm (log(0) = -inf, log(<0) = nan).
 *
 * GELU backward recomputes its sigmoid (cpu_impl.h; a few vector flops per
 * element) from the saved input instead of the op saving it: one stream
 * less to write and read, and no extra arena memory.
 *
 * The loops are compiled for AVX-512/AVX2/baseline (DG_SIMD_FN), split over
 * the compute pool when long (relu from DG_GRAIN_MEM elements, the others
 * from DG_GRAIN_COMPUTE), and a fresh input gradient is stored (=) rather
 * than zeroed and accumulated. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu_impl.h"
#include "backends/kern_unary.h"

/* sigmoid from e = exp(-|x|): 1/(1 + e) for x >= 0, e/(1 + e) below, with
 * no overflow anywhere. NaN propagates. */
DG_INLINE float fast_sigmoidf(float x) {
  float e = dg__exp_nonpos(-fabsf(x));
  float m = x >= 0.0f ? 1.0f : 0.0f;
  float r = (e + m * (1.0f - e)) / (1.0f + e);
  int32_t nan = -(int32_t)(x != x);
  return dg__bits_to_f((dg__f_to_bits(r) & ~nan) | (dg__f_to_bits(x) & nan));
}

/* exp(x) for x in [-87.3, 88]: exp_nonpos's reduction and polynomial,
 * without the clamp. */
DG_INLINE float exp_mid(float x) { return dg__exp_poly(x); }

/* y (n) = exp(x (n)), in blocks of 64: the polynomial when the whole block
 * is inside [-87.3, 88] (or has no nan), libm otherwise. */
DG_INLINE void exp_loop(int64_t n, const float *restrict x, float *restrict y) {
  for (int64_t i0 = 0; i0 < n; i0 += 64) {
    int64_t m = n - i0 < 64 ? n - i0 : 64;
    int32_t bad = 0;
    for (int64_t i = i0; i < i0 + m; i++) {
      float v = x[i];
      bad |= -(int32_t)!(v >= -87.3f && v <= 88.0f); /* nan is bad too */
      float c = dg__bits_to_f(dg__f_to_bits(v) & ~bad);      /* keep the polynomial finite */
      y[i] = exp_mid(c);
    }
    if (bad)
      for (int64_t i = i0; i < i0 + m; i++) y[i] = expf(x[i]);
  }
}

/* y (n) = f(x (n)); alpha: leaky_relu's slope. */
DG_INLINE void unary_fwd_body(dg__unary_kind k, float alpha, int64_t n, const float *restrict x,
                              float *restrict y) {
  switch (k) {
    case DG_UNARY_RELU: /* x < 0 keeps nan as nan, like torch */
      for (int64_t i = 0; i < n; i++) y[i] = x[i] < 0.0f ? 0.0f : x[i];
      break;
    case DG_UNARY_GELU:
      for (int64_t i = 0; i < n; i++) {
        y[i] = dg__gelu(x[i]);
      }
      break;
    case DG_UNARY_TANH:
      for (int64_t i = 0; i < n; i++) y[i] = dg__tanhf(x[i]);
      break;
    case DG_UNARY_SIGMOID:
      for (int64_t i = 0; i < n; i++) y[i] = fast_sigmoidf(x[i]);
      break;
    case DG_UNARY_EXP:
      exp_loop(n, x, y);
      break;
    case DG_UNARY_LOG:
      for (int64_t i = 0; i < n; i++) y[i] = logf(x[i]);
      break;
    case DG_UNARY_LEAKY_RELU: /* a select of constants, so it vectorises; nan stays nan */
      for (int64_t i = 0; i < n; i++) y[i] = x[i] * (x[i] > 0.0f ? 1.0f : alpha);
      break;
  }
}
DG_SIMD_FN(unary_fwd,
           (dg__unary_kind k, float alpha, int64_t n, const float *restrict x, float *restrict y),
           (k, alpha, n, x, y))

/* dx[i] (= or +=) EXPR for i < n. */
#define EW_STORE(acc, n, EXPR)                                \
  do {                                                        \
    if (acc) for (int64_t i = 0; i < (n); i++) dx[i] += (EXPR); \
    else for (int64_t i = 0; i < (n); i++) dx[i] = (EXPR);      \
  } while (0)

/* dx (n) (+)= dy (n) * f'(s (n)), s being the saved output or input; acc = 0
 * stores. */
DG_INLINE void unary_bwd_body(dg__unary_kind k, float alpha, int acc, int64_t n,
                              const float *restrict s, const float *restrict dy,
                              float *restrict dx) {
  switch (k) {
    case DG_UNARY_RELU: /* dy loaded unconditionally, so the select vectorises */
      EW_STORE(acc, n, s[i] > 0.0f ? dy[i] : 0.0f);
      break;
    case DG_UNARY_GELU: /* torch's GeluBackward, tanh form */
      EW_STORE(acc, n, dy[i] * dg__gelu_grad(s[i]));
      break;
    case DG_UNARY_TANH:
      EW_STORE(acc, n, dy[i] * (1.0f - s[i] * s[i]));
      break;
    case DG_UNARY_SIGMOID:
      EW_STORE(acc, n, dy[i] * s[i] * (1.0f - s[i]));
      break;
    case DG_UNARY_EXP:
      EW_STORE(acc, n, dy[i] * s[i]);
      break;
    case DG_UNARY_LOG:
      EW_STORE(acc, n, dy[i] / s[i]);
      break;
    case DG_UNARY_LEAKY_RELU: /* s is the input; at 0 (and nan) the slope, as torch */
      EW_STORE(acc, n, dy[i] * (s[i] > 0.0f ? 1.0f : alpha));
      break;
  }
}
DG_SIMD_FN(unary_bwd,
           (dg__unary_kind k, float alpha, int acc, int64_t n, const float *restrict s,
            const float *restrict dy, float *restrict dx),
           (k, alpha, acc, n, s, dy, dx))

static void fwd_range(void *arg, int64_t lo, int64_t hi) {
  const dg__unary_args *j = arg;
  unary_fwd(j->kind, j->alpha, hi - lo, j->x + lo, j->y + lo);
}

static void bwd_range(void *arg, int64_t lo, int64_t hi) {
  const dg__unary_args *j = arg;
  unary_bwd(j->kind, j->alpha, j->acc, hi - lo, j->x + lo, j->dy + lo, j->y + lo);
}

static int64_t grain_of(dg__unary_kind k) {
  return k == DG_UNARY_RELU || k == DG_UNARY_LEAKY_RELU ? DG_GRAIN_MEM : DG_GRAIN_COMPUTE;
}

static void cpu_unary_fwd(const dg__unary_args *a) {
  dg__parallel_range(a->n, grain_of(a->kind), fwd_range, (void *)a);
}

static void cpu_unary_bwd(const dg__unary_args *a) {
  dg__parallel_range(a->n, grain_of(a->kind), bwd_range, (void *)a);
}

const struct dg__kern_unary dg__cpu_kern_unary = {cpu_unary_fwd, cpu_unary_bwd};
