/* Element-wise reductions for every dtype (f16/bf16 go through f32, one
 * rounding per step, as Gloo's float16 does). */
#include <math.h>
#include <string.h>

#include "dist/coll_ext.h"
#include "base/common_impl.h"

#define RED_LOOP(T, EXPR)                          \
  do {                                             \
    T *d_ = dst;                                   \
    const T *s_ = src;                             \
    for (size_t i = 0; i < n; i++) {               \
      T a = d_[i], b = s_[i];                      \
      d_[i] = (EXPR);                              \
    }                                              \
  } while (0)

#define RED_NATIVE(T)                                        \
  switch (op) {                                              \
    case DG_RED_SUM:                                         \
    case DG_RED_AVG: RED_LOOP(T, a + b); break;              \
    case DG_RED_MIN: RED_LOOP(T, b < a ? b : a); break;      \
    case DG_RED_MAX: RED_LOOP(T, b > a ? b : a); break;      \
    case DG_RED_PROD: RED_LOOP(T, a * b); break;             \
  }

static float apply_f(float a, float b, dg_redop op) {
  switch (op) {
    case DG_RED_MIN: return b < a ? b : a;
    case DG_RED_MAX: return b > a ? b : a;
    case DG_RED_PROD: return a * b;
    default: return a + b;
  }
}

static void reduce_half(uint16_t *d, const uint16_t *s, size_t n, int bf, dg_redop op) {
  for (size_t i = 0; i < n; i++) {
    float a = bf ? dg_bf16_to_f32(d[i]) : dg_f16_to_f32(d[i]);
    float b = bf ? dg_bf16_to_f32(s[i]) : dg_f16_to_f32(s[i]);
    float r = apply_f(a, b, op);
    d[i] = bf ? dg_f32_to_bf16(r) : dg_f32_to_f16(r);
  }
}

void dg__reduce(void *dst, const void *src, size_t n, dg_dtype dt, dg_redop op) {
  switch (dt) {
    case DG_F32: RED_NATIVE(float); break;
    case DG_F64: RED_NATIVE(double); break;
    case DG_I32: RED_NATIVE(int32_t); break;
    case DG_I64: RED_NATIVE(int64_t); break;
    case DG_F16: reduce_half(dst, src, n, 0, op); break;
    case DG_BF16: reduce_half(dst, src, n, 1, op); break;
    default: DG_ASSERT(!"bad dtype");
  }
}

void dg__reduce_avg_last(void *dst, const void *src, size_t n, dg_dtype dt, int by) {
  if (dt == DG_F32 && by > 0 && (by & (by - 1)) == 0) {
    /* x / 2^k == x * 2^-k exactly: one pass instead of two */
    float *d = dst, f = 1.0f / (float)by;
    const float *s = src;
    for (size_t i = 0; i < n; i++) d[i] = (d[i] + s[i]) * f;
    return;
  }
  dg__reduce(dst, src, n, dt, DG_RED_SUM);
  dg__scale_div(dst, n, dt, by);
}

#define DIV_LOOP(T, by)                           \
  do {                                            \
    T *b_ = buf;                                  \
    for (size_t i = 0; i < n; i++) b_[i] /= (by); \
  } while (0)

/* Type switch outside the loops so that they vectorise. */
void dg__scale_div(void *buf, size_t n, dg_dtype dt, int by) {
  if (by == 1) return;
  uint16_t *h = buf;
  switch (dt) {
    case DG_F32: DIV_LOOP(float, (float)by); break;
    case DG_F64: DIV_LOOP(double, (double)by); break;
    case DG_I32: DIV_LOOP(int32_t, by); break;
    case DG_I64: DIV_LOOP(int64_t, by); break;
    case DG_F16:
      for (size_t i = 0; i < n; i++) h[i] = dg_f32_to_f16(dg_f16_to_f32(h[i]) / (float)by);
      break;
    case DG_BF16:
      for (size_t i = 0; i < n; i++) h[i] = dg_f32_to_bf16(dg_bf16_to_f32(h[i]) / (float)by);
      break;
    default: DG_ASSERT(!"bad dtype");
  }
}
