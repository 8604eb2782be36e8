/* The CPU backend's kernels and helpers, private to backends/cpu/ (and to
 * the op files not yet split into op and kernel, listed in
 * scripts/check_layers.py). Not API. */
#ifndef DG_CPU_IMPL_H
#define DG_CPU_IMPL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backends/backend.h"
#include "backends/kern_blas.h"
#include "base/common_impl.h"
#include "base/threads_impl.h"

#define DG_CPU_ALIGN 64 /* every block: one cache line, one AVX-512 vector */

/* Kernel tables of the families already moved into backends/cpu/. */
extern const struct dg__kern_mem dg__cpu_kern_mem;
extern const struct dg__kern_norm dg__cpu_kern_norm;
extern const struct dg__kern_batchnorm dg__cpu_kern_batchnorm;
extern const struct dg__kern_optim dg__cpu_kern_optim;
extern const struct dg__kern_mlp dg__cpu_kern_mlp;
extern const struct dg__kern_attention dg__cpu_kern_attention;
extern const struct dg__kern_conv dg__cpu_kern_conv;
extern const struct dg__kern_view dg__cpu_kern_view;
extern const struct dg__kern_concat dg__cpu_kern_concat;
extern const struct dg__kern_pool dg__cpu_kern_pool;
extern const struct dg__kern_mask dg__cpu_kern_mask;
extern const struct dg__kern_dropout dg__cpu_kern_dropout;
extern const struct dg__kern_embedding dg__cpu_kern_embedding;
extern const struct dg__kern_unary dg__cpu_kern_unary;
extern const struct dg__kern_reduce dg__cpu_kern_reduce;
extern const struct dg__kern_softmax dg__cpu_kern_softmax;
extern const struct dg__kern_loss dg__cpu_kern_loss;
extern const struct dg__kern_binary dg__cpu_kern_binary;
extern const struct dg__kern_blas dg__cpu_kern_blas;

/* Row-major C(M,N) = alpha * op(A)(M,K) op(B)(K,N) + beta * C; lda/ldb/ldc are
 * the stored row lengths. */
void dg__sgemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
               int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
/* How dg__sgemm splits a product of this shape (alpha 1, beta 0) on
 * `threads` threads: 0 by rows, 1 by columns, 2 either (the timing has not
 * picked yet), -1 not at all (no cut gives the whole's bits: one thread),
 * -2 not seen yet. */
int dg__sgemm_split_of(int ta, int tb, int64_t M, int64_t N, int64_t K, int threads);
/* C = op(A) op(B) through the epilogue e (kern_blas.h's sgemm_add). */
void dg__sgemm_add(int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                   const float *B, int64_t ldb, const dg__gemm_epi *e, float *C, int64_t ldc);

/* dgrad's own SGEMM (gemm_own.c: AVX-512, or AVX2 with the same bits),
 * same contract as dg__sgemm on one thread. Returns 0, or -1 without doing
 * anything where it does not run (no x86-64 gcc build, no AVX2 and FMA,
 * M/N/K <= 0, alpha 0, no memory for its packing buffers): the caller then
 * runs OpenBLAS. */
int dg__sgemm_own(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                  int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
/* The same through the epilogue e (NULL: none): C = alpha op(A) op(B) +
 * res + bias where res or bias is given (beta unused: the bits of a fill of
 * C with res + bias and beta 1, without the fill), then e's selects as C is
 * stored (the relu kernel's bits). */
int dg__sgemm_own_add(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                      const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                      const dg__gemm_epi *e, float *C, int64_t ldc);
/* Whether the CPU can run it (AVX2 and FMA; AVX-512F for the wide kernel). */
int dg__sgemm_own_cpu(void);
/* Makes packing buffers for n products at once (the compute threads of a
 * split product), so that steady-state steps allocate nothing. */
void dg__sgemm_own_reserve(int n);
/* Whether dg__sgemm gives a product of this shape to it: the CPU is one it
 * is chosen for (AMD with AVX-512; DG_GEMM=own|blas overrides) and the shape
 * is past OpenBLAS's small-matrix paths and fills the kernel's tiles. A
 * function of the CPU and the shape alone, so every process on a machine
 * rounds alike and every block of a split product takes the whole's path. */
int dg__sgemm_own_fits(int64_t M, int64_t N, int64_t K);
/* Whether this process uses it at all (the CPU's choice, as above). */
int dg__sgemm_own_on(void);
/* Whether attention's per-head products run on dg__sgemm_small: where the
 * own kernel is on, and on every AMD CPU with AVX2 (a Zen 3 ran them 1.6x
 * faster than OpenBLAS's small-matrix paths); DG_GEMM=blas turns it off. */
int dg__sgemm_small_on(void);
/* C (M, N) = alpha * sum_k A(i, k) B(k, j) + beta * C (beta 0: C not read),
 * A(i, k) = A[i * ars + k * aks] (either operand layout), B row-major:
 * nothing packed, for operands already in L1 or L2 (attention's per-head
 * products). Each element is one FMA chain over k in order. On AVX2 or
 * AVX-512 (elsewhere a plain loop); attention takes it where
 * dg__sgemm_small_on. */
void dg__sgemm_small(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t ars,
                     int64_t aks, const float *B, int64_t ldb, float beta, float *C,
                     int64_t ldc);
/* D[c * ldd + r] = S[r * lds + c] for r < rows, c < cols. */
void dg__transpose(const float *S, int64_t lds, int64_t rows, int64_t cols, float *D,
                   int64_t ldd);

/* db(O) (+)= column sums of dy(R, O); overwrite: store, do not add. */
void dg__colsum(float *db, const float *dy, int64_t R, int64_t O, int overwrite);
/* kern_blas.h's relu_colsum. */
void dg__relu_colsum(float *dz, const float *dy, const float *y, float *db, int64_t R,
                     int64_t O, int overwrite);
/* y (R, O) = res + b per row, before a GEMM accumulates (beta 1); res or b
 * may be NULL (both: nothing is written). Split over the pool. */
void dg__fill_rows(float *y, const float *res, const float *b, int64_t R, int64_t O);
/* d (n) = s, or += s when acc: a gradient passed through. Split over the pool. */
void dg__grad_pass(float *d, const float *s, int64_t n, int acc);

/* ---- runtime-dispatched SIMD for element-wise kernels ----
 *
 * dgrad is built for the baseline x86-64 (SSE2). The hot element-wise loops
 * are written once as an always-inline body and compiled three times by
 * DG_SIMD_FN: for AVX-512F (512-bit vectors), for AVX2+FMA, and for the
 * baseline; the wrapper picks one per call from dg__simd_isa(), which reads
 * the CPU once (and DG_SIMD=base|avx2|avx512 caps it, e.g. to test the
 * baseline path on an AVX-512 machine). Every reduction names its 16 lanes,
 * but the build contracts a * b + c into one FMA where the ISA has one
 * (meson.build), so the three builds may round differently;
 * tests/grad/test_grad_threads checks them against each other within a
 * tolerance and 1 thread against 2. The SGD update (optim.c) keeps the
 * baseline's bits on every level by rounding each operation explicitly. */
enum { DG_ISA_BASE = 0, DG_ISA_AVX2 = 1, DG_ISA_AVX512 = 2 };
/* The ISA level the kernels use (cached after the first call). */
int dg__simd_isa(void);
/* Caps the level at isa (tests; < 0 re-reads CPU and environment). */
void dg__simd_force(int isa);

#define DG_INLINE static inline __attribute__((always_inline))

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DG_TARGET_AVX512 __attribute__((target("avx512f,avx2,fma,prefer-vector-width=512")))
#define DG_TARGET_AVX2 __attribute__((target("avx2,fma")))
/* Defines `static void name params` dispatching to name##_body args
 * (a DG_INLINE void function) compiled for each ISA. */
#define DG_SIMD_FN(name, params, args)                                   \
  DG_TARGET_AVX512 static void name##_avx512 params { name##_body args; } \
  DG_TARGET_AVX2 static void name##_avx2 params { name##_body args; }     \
  static void name##_base params { name##_body args; }                    \
  static void name params {                                               \
    int isa_ = dg__simd_isa();                                            \
    if (isa_ == DG_ISA_AVX512) name##_avx512 args;                        \
    else if (isa_ == DG_ISA_AVX2) name##_avx2 args;                       \
    else name##_base args;                                                \
  }
#include <immintrin.h>
/* Lanes below n (clamped to 0..8) of an AVX2 mask: maskload leaves the
 * others 0 and never touches their memory. */
DG_TARGET_AVX2 DG_INLINE __m256i dg__lanes8(int64_t n) {
  static const int32_t t[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  return _mm256_loadu_si256((const __m256i *)(t + 8 - (n < 0 ? 0 : n > 8 ? 8 : n)));
}
#else
#define DG_SIMD_FN(name, params, args) \
  static void name params { name##_body args; }
#endif

/* Element-wise loops go parallel over the pool from 2 * grain elements.
 * Memory-bound loops (copies, adds, relu) and compute-bound ones (gelu,
 * tanh, exp) pay off from different sizes. */
#define DG_GRAIN_MEM 32768
#define DG_GRAIN_COMPUTE 8192

/* 16 float lanes as two 8-lane values (GCC's vector extension: two AVX2
 * registers, halves of AVX-512 ones, pairs of SSE ones): lane k of a sum is
 * the same chain of adds as element k of a float[16] summed lane by lane,
 * but kept in registers (GCC left such arrays on the stack in scalar code,
 * and a 64-byte vector type on the stack under AVX2: a layernorm row of
 * 128 took 4x its loads' time). Only locals: never a parameter or a return
 * value (no ABI for them below AVX). */
typedef float dg__v8 __attribute__((vector_size(32)));
typedef float dg__v4 __attribute__((vector_size(16)));
#define DG_V8_LOAD(p)            \
  __extension__({                \
    dg__v8 v_;                   \
    memcpy(&v_, (p), sizeof v_); \
    v_;                          \
  })
/* The sum of 16 lanes, lo (0-7) and hi (8-15), as a tree of vector halves,
 * not a chain of 16 dependent scalar adds (the chain dominated short
 * rows). */
#define DG_V8X2_SUM(lo, hi)                                                                  \
  __extension__({                                                                          \
    dg__v8 h_ = (lo) + (hi);                                                               \
    dg__v4 q_ = __builtin_shufflevector(h_, h_, 0, 1, 2, 3) +                              \
                __builtin_shufflevector(h_, h_, 4, 5, 6, 7);                               \
    (q_[0] + q_[2]) + (q_[1] + q_[3]);                                                     \
  })

/* Float sum of p (n) in 16 vector lanes, folded into double every 256
 * elements: vector speed, error bounded by the block length. */
DG_INLINE double dg__sum_blocks(const float *restrict p, int64_t n) {
  double s = 0;
  int64_t i = 0;
  for (; i + 256 <= n; i += 256) {
    dg__v8 lo = {0}, hi = {0};
    for (int64_t b = 0; b < 256; b += 16)
      lo += DG_V8_LOAD(p + i + b), hi += DG_V8_LOAD(p + i + b + 8);
    s += DG_V8X2_SUM(lo, hi);
  }
  dg__v8 lo = {0}, hi = {0};
  for (; i + 16 <= n; i += 16) lo += DG_V8_LOAD(p + i), hi += DG_V8_LOAD(p + i + 8);
  s += DG_V8X2_SUM(lo, hi);
  for (; i < n; i++) s += p[i];
  return s;
}

/* ---- branch-free float helpers (vectorisable) ---- */

DG_INLINE float dg__bits_to_f(int32_t i) {
  float f;
  memcpy(&f, &i, sizeof f);
  return f;
}

DG_INLINE int32_t dg__f_to_bits(float f) {
  int32_t i;
  memcpy(&i, &f, sizeof i);
  return i;
}

/* Vectorisable float kernels. gcc (default -ftrapping-math) neither
 * if-converts a float select whose arm is computed nor a clamp whose
 * clamped path folds to a constant, so every select below is an integer
 * MIN or a bit mask: the loops stay branch-free.
 *
 * exp(x) for x <= 0 (Cephes expf: x = n ln2 + r, |r| <= ln2/2, degree-6
 * polynomial, ~1 ulp). Below -87.3 it saturates at FLT_MIN, far under the
 * precision of 1 + e where the callers use it. */
DG_INLINE float dg__exp_poly(float x) {
  /* x in [-87.3, 88]: 2^n stays a normal float */
  const float magic = 12582912.0f;
  float t = x * 1.44269504088896341f + magic;
  int32_t n = dg__f_to_bits(t) - dg__f_to_bits(magic);
  float fn = t - magic;
  float r = x - fn * 0.693359375f;
  r = r - fn * -2.12194440e-4f;
  /* the polynomial by Estrin's scheme (pairs, then r^2), not Horner's:
   * 3 dependent steps instead of 6, and the element-wise loops that call
   * this are bound by the chain's length (GELU 12-16% faster on a Zen 3) */
  float r2 = r * r;
  float pa = 1.9875691500e-4f * r + 1.3981999507e-3f;
  float pb = 8.3334519073e-3f * r + 4.1665795894e-2f;
  float pc = 1.6666665459e-1f * r + 5.0000001201e-1f;
  float p = (pa * r2 + pb) * r2 + pc;
  float y = p * r2 + (r + 1.0f);
  return y * dg__bits_to_f((n + 127) * (1 << 23));
}

DG_INLINE float dg__exp_nonpos(float x) {
  /* sign bit forced: +0 reads as -0 (x - max is +0 at the max) */
  int32_t xb = dg__f_to_bits(x) | INT32_MIN, lb = dg__f_to_bits(-87.3365447504f);
  float xc = dg__bits_to_f(xb < lb ? xb : lb); /* for x <= 0 a larger int is a smaller |x| */
  return dg__exp_poly(xc);
}

/* tanh: Cephes' odd polynomial for |x| < 0.625, where (1 - e)/(1 + e)
 * would lose relative precision; (1 - e)/(1 + e), e = exp(-2|x|), beyond.
 * NaN propagates. */
DG_INLINE float dg__tanhf(float x) {
  float ax = fabsf(x);
  int32_t near0 = -(int32_t)(ax < 0.625f); /* all ones near 0 */
  float xs = dg__bits_to_f(dg__f_to_bits(x) & near0), s = xs * xs;
  float small = ((((-5.70498872745e-3f * s + 2.06390887954e-2f) * s - 5.37397155531e-2f) * s +
                  1.33314422036e-1f) * s - 3.33332819422e-1f) * s * xs + xs;
  float e = dg__exp_nonpos(-2.0f * ax);
  float big = copysignf((1.0f - e) / (1.0f + e), x);
  int32_t nan = -(int32_t)(x != x);
  int32_t rb = (dg__f_to_bits(small) & near0) | (dg__f_to_bits(big) & ~near0);
  return dg__bits_to_f((rb & ~nan) | (dg__f_to_bits(x) & nan));
}

/* torch's approximate='tanh' constants: sqrt(2/pi) and 0.044715. */
#define DG_GELU_BETA 0.7978845608028654f
#define DG_GELU_KAPPA 0.044715f

/* GELU, tanh form, through the identity 0.5 (1 + tanh u) = sigmoid(2u):
 * gelu(v) = v s, s = sigmoid(2u) = 1 / (1 + exp(-2u)), 2u = 2 beta (v +
 * kappa v^3) (for v << 0 no cancellation in 1 + tanh: s keeps ~2 ulp).
 * One exp and one division, no separate small-|u| polynomial, no select
 * between the signs of u: exp's argument -2u is clamped to [-87.3, 88]
 * (no overflow), and past 88 s is 0 exactly, so s is exactly 0 or 1 at the
 * extremes (gelu(-inf) = nan as in torch, gelu(inf) = inf). */
DG_INLINE float dg__gelu_s(float v, float v2) {
  float nu = v * (-2.0f * DG_GELU_BETA - 2.0f * DG_GELU_BETA * DG_GELU_KAPPA * v2); /* -2u */
  int32_t keep = -(int32_t)(nu <= 88.0f); /* 0 past 88, and for NaN */
  float x = nu < 88.0f ? nu : 88.0f;
  x = x > -87.3365447504f ? x : -87.3365447504f;
  float s = 1.0f / (1.0f + dg__exp_poly(x));
  return dg__bits_to_f(dg__f_to_bits(s) & keep);
}

DG_INLINE float dg__gelu(float v) { return v * dg__gelu_s(v, v * v); }

/* d gelu(v) / dv = s + v s (1 - s) 2 beta (1 + 3 kappa v^2), given s. */
DG_INLINE float dg__gelu_grad_s(float v, float v2, float s) {
  return s + v * s * (1.0f - s) * (2.0f * DG_GELU_BETA) * (1.0f + 3.0f * DG_GELU_KAPPA * v2);
}

DG_INLINE float dg__gelu_grad(float v) {
  float v2 = v * v;
  return dg__gelu_grad_s(v, v2, dg__gelu_s(v, v2));
}

#endif
