/* softmax and log-softmax kernels of the CPU backend (the op:
 * ops/softmax.c).
 *
 * Both subtract the row maximum before exponentiating (no overflow for any
 * finite input; a row that is all -inf gives NaN, as in PyTorch). Rows run
 * in 16 float lanes (per-ISA kernels, cpu_impl.h's vector exp, flushed to an
 * exact 0 for -inf such as masked scores), sums folded into double per
 * block of 256, and rows are split over the pool. Backward stores into a
 * fresh gradient instead of adding. */
#include <math.h>

#include "backends/cpu/cpu_impl.h"
#include "backends/kern_softmax.h"

/* exp(x) for x <= 0, exactly 0 below -87.3 (cpu_impl.h's kernel saturates
 * at FLT_MIN there). */
DG_INLINE float sm_exp(float x) {
  int32_t keep = -(int32_t)(x >= -87.3365447504f);
  return dg__bits_to_f(dg__f_to_bits(dg__exp_nonpos(x)) & keep);
}

/* Float bits -> int32 in the same order (an integer max vectorises, a
 * float one does not under IEEE NaN rules); sm_key is its own inverse. */
DG_INLINE int32_t sm_key(int32_t b) { return b ^ ((b >> 31) & INT32_MAX); }

DG_INLINE float row_max(const float *restrict x, int64_t C) {
  int32_t mx[16];
  for (int k = 0; k < 16; k++) mx[k] = INT32_MIN;
  int64_t j = 0;
  for (; j + 16 <= C; j += 16)
    for (int k = 0; k < 16; k++) {
      int32_t key = sm_key(dg__f_to_bits(x[j + k]));
      mx[k] = key > mx[k] ? key : mx[k];
    }
  for (; j < C; j++) {
    int32_t key = sm_key(dg__f_to_bits(x[j]));
    mx[0] = key > mx[0] ? key : mx[0];
  }
  for (int w = 8; w; w >>= 1)
    for (int k = 0; k < w; k++) mx[k] = mx[k + w] > mx[k] ? mx[k + w] : mx[k];
  return dg__bits_to_f(sm_key(mx[0]));
}

/* sum_j e_j with e_j = exp(x_j - m), storing e_j into y when y != NULL. */
DG_INLINE double exp_sum(const float *restrict x, float *restrict y, int64_t C, float m) {
  double s = 0;
  int64_t j = 0;
  while (j + 16 <= C) {
    float acc[16] = {0};
    for (int64_t end = DG_MIN(j + 256, C & ~(int64_t)15); j < end; j += 16)
      for (int k = 0; k < 16; k++) {
        float e = sm_exp(x[j + k] - m);
        if (y) y[j + k] = e;
        acc[k] += e;
      }
    for (int k = 0; k < 16; k++) s += acc[k];
  }
  for (; j < C; j++) {
    float e = sm_exp(x[j] - m);
    if (y) y[j] = e;
    s += e;
  }
  return s;
}

typedef dg__softmax_args sm_job;

DG_INLINE void fwd_rows_body(const sm_job *jb, int64_t r0, int64_t r1) {
  const int64_t C = jb->C;
  for (int64_t r = r0; r < r1; r++) {
    const float *restrict x = jb->x + r * C;
    float *restrict y = jb->y + r * C;
    float m = row_max(x, C);
    if (jb->is_log) {
      float ls = (float)log(exp_sum(x, NULL, C, m)); /* (x - m) - ls: exact for large x */
      for (int64_t j = 0; j < C; j++) y[j] = (x[j] - m) - ls;
    } else {
      float inv = (float)(1.0 / exp_sum(x, y, C, m));
      for (int64_t j = 0; j < C; j++) y[j] *= inv;
    }
  }
}
DG_SIMD_FN(fwd_rows, (const sm_job *jb, int64_t r0, int64_t r1), (jb, r0, r1))

/* sum_j a_j * b_j (b NULL: sum a) in 16 lanes, folded into double per 256. */
DG_INLINE double dot_rows(const float *restrict a, const float *restrict b, int64_t C) {
  double s = 0;
  int64_t j = 0;
  while (j + 16 <= C) {
    float acc[16] = {0};
    for (int64_t end = DG_MIN(j + 256, C & ~(int64_t)15); j < end; j += 16)
      for (int k = 0; k < 16; k++) acc[k] += b ? a[j + k] * b[j + k] : a[j + k];
    for (int k = 0; k < 16; k++) s += acc[k];
  }
  for (; j < C; j++) s += b ? (double)a[j] * b[j] : a[j];
  return s;
}

DG_INLINE void bwd_rows_body(const sm_job *jb, int64_t r0, int64_t r1) {
  const int64_t C = jb->C;
  const int ow = !jb->acc;
  for (int64_t r = r0; r < r1; r++) {
    const float *restrict y = jb->x + r * C, *restrict g = jb->dy + r * C;
    float *restrict d = jb->y + r * C;
    if (jb->is_log) {
      float s = (float)dot_rows(g, NULL, C);
      for (int64_t j = 0; j < C; j++) {
        float v = g[j] - sm_exp(y[j]) * s;
        d[j] = ow ? v : d[j] + v;
      }
    } else {
      float s = (float)dot_rows(g, y, C);
      for (int64_t j = 0; j < C; j++) {
        float v = y[j] * (g[j] - s);
        d[j] = ow ? v : d[j] + v;
      }
    }
  }
}
DG_SIMD_FN(bwd_rows, (const sm_job *jb, int64_t r0, int64_t r1), (jb, r0, r1))

static void fwd_task(void *arg, int64_t lo, int64_t hi) { fwd_rows(arg, lo, hi); }
static void bwd_task(void *arg, int64_t lo, int64_t hi) { bwd_rows(arg, lo, hi); }

/* Rows per pool chunk: about 8K elements. */
static int64_t sm_grain(int64_t C) {
  return DG_MAX((int64_t)1, DG_GRAIN_COMPUTE / DG_MAX(C, (int64_t)1));
}

static void cpu_softmax_fwd(const dg__softmax_args *a) {
  dg__parallel_range(a->R, sm_grain(a->C), fwd_task, (void *)a);
}

static void cpu_softmax_bwd(const dg__softmax_args *a) {
  dg__parallel_range(a->R, sm_grain(a->C), bwd_task, (void *)a);
}

const struct dg__kern_softmax dg__cpu_kern_softmax = {cpu_softmax_fwd, cpu_softmax_bwd};
