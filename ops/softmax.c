/* softmax and log-softmax over the last dim, forward and backward.
 *
 * Both subtract the row maximum before exponentiating (no overflow for any
 * finite input; a row that is all -inf gives NaN, as in PyTorch). Rows run
 * in 16 float lanes (per-ISA kernels, cpu_impl.h's vector exp, flushed to an
 * exact 0 for -inf such as masked scores), sums folded into double per
 * block of 256, and rows are split over the pool. Backward uses only the
 * saved output and stores into a fresh gradient instead of adding:
 *   softmax:     dx = y * (dy - sum(dy * y))
 *   log_softmax: dx = dy - exp(y) * sum(dy) */
#include <math.h>

#include "core/core_impl.h"
#include "backends/cpu/cpu_impl.h"

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

typedef struct {
  const float *x, *dy; /* (R, C) */
  float *y;            /* (R, C): output, or dx in backward */
  int64_t C;
  int logf_, overwrite;
} sm_job;

DG_INLINE void fwd_rows_body(const sm_job *jb, int64_t r0, int64_t r1) {
  const int64_t C = jb->C;
  for (int64_t r = r0; r < r1; r++) {
    const float *restrict x = jb->x + r * C;
    float *restrict y = jb->y + r * C;
    float m = row_max(x, C);
    if (jb->logf_) {
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
  const int ow = jb->overwrite;
  for (int64_t r = r0; r < r1; r++) {
    const float *restrict y = jb->x + r * C, *restrict g = jb->dy + r * C;
    float *restrict d = jb->y + r * C;
    if (jb->logf_) {
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

static int softmax_backward(dg_ctx *ctx, dg_node *n) {
  dg_tensor *sy = dg__saved(ctx, n, 0);
  if (!sy) return ctx->err;
  int ow;
  const float *y = dg__contig_data(ctx, "softmax backward", sy); /* (R, C) */
  float *dx = y ? dg__grad_buf_w(ctx, n->in[0], &ow) : NULL;   /* (R, C) */
  if (!y || !dx) return ctx->err;
  sm_job j = {y, n->out->grad->data, dx, n->i[1], (int)n->i[2], ow};
  dg__parallel_range(n->i[0], sm_grain(j.C), bwd_task, &j);
  return DG_OK;
}

static dg_tensor *softmax_impl(dg_ctx *ctx, dg_tensor *x, int logf_) {
  const char *op = logf_ ? "log_softmax" : "softmax";
  if (!ctx || dg__null_input(ctx, op, "x", x) || !dg__check_f32(ctx, op, "x", x)) return NULL;
  if (x->ndim < 1) {
    char sx[96];
    dg__set_error(ctx, DG_ESHAPE, "%s: x %s needs at least one dim", op,
                  dg__shape_str(x, sx, sizeof sx));
    return NULL;
  }
  int64_t C = x->shape[x->ndim - 1], N = dg__numel(x), R = C ? N / C : 0;
  dg_tensor *y = dg__new_like(ctx, op, x);
  const float *xp = y ? dg__contig_data(ctx, op, x) : NULL; /* (R, C) */
  if (!xp) return NULL;
  sm_job j = {xp, NULL, y->data, C, logf_, 1};
  dg__parallel_range(R, sm_grain(C), fwd_task, &j);
  if (dg__needs_grad(ctx, 1, &x)) {
    dg_node *n = dg__record(ctx, op, softmax_backward, y, 1, &x);
    if (!n || dg__save(ctx, n, y)) return NULL;
    n->i[0] = R, n->i[1] = C, n->i[2] = logf_;
  }
  return y;
}

dg_tensor *dg_softmax(dg_ctx *ctx, dg_tensor *x) { return softmax_impl(ctx, x, 0); }
dg_tensor *dg_log_softmax(dg_ctx *ctx, dg_tensor *x) { return softmax_impl(ctx, x, 1); }
