/* CPU kernels shared between op files. Not API. */
#ifndef DG_CPU_IMPL_H
#define DG_CPU_IMPL_H

#include <stdint.h>

#include "tensor/tensor_impl.h"
#include "tensor/threads_impl.h"

/* Row-major C(M,N) = alpha * op(A)(M,K) op(B)(K,N) + beta * C; lda/ldb/ldc are
 * the stored row lengths. */
void dg__sgemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
               int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);

/* ---- runtime-dispatched SIMD for element-wise kernels ----
 *
 * dgrad is built for the baseline x86-64 (SSE2). The hot element-wise loops
 * are written once as an always-inline body and compiled three times by
 * DG_SIMD_FN: for AVX-512F (512-bit vectors), for AVX2+FMA, and for the
 * baseline; the wrapper picks one per call from dg__simd_isa(), which reads
 * the CPU once (and DG_SIMD=base|avx2|avx512 caps it, e.g. to test the
 * baseline path on an AVX-512 machine). Results may differ between ISAs in
 * the last bits (FMA contraction), never between thread counts. */
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
#else
#define DG_SIMD_FN(name, params, args) \
  static void name params { name##_body args; }
#endif

/* Element-wise loops go parallel over the pool from 2 * grain elements.
 * Memory-bound loops (copies, adds, relu) and compute-bound ones (gelu,
 * tanh, exp) pay off from different sizes. */
#define DG_GRAIN_MEM 32768
#define DG_GRAIN_COMPUTE 8192

/* Float sum of p (n) in 16 vector lanes, folded into double every 256
 * elements: vector speed, error bounded by the block length. */
DG_INLINE double dg__sum_blocks(const float *restrict p, int64_t n) {
  double s = 0;
  int64_t i = 0;
  for (; i + 256 <= n; i += 256) {
    float acc[16] = {0};
    for (int64_t b = 0; b < 256; b += 16)
      for (int k = 0; k < 16; k++) acc[k] += p[i + b + k];
    float t = 0;
    for (int k = 0; k < 16; k++) t += acc[k];
    s += t;
  }
  float acc[16] = {0};
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 16; k++) acc[k] += p[i + k];
  for (int k = 0; k < 16; k++) s += acc[k];
  for (; i < n; i++) s += p[i];
  return s;
}

#endif
