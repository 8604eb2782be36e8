/* Element-wise unary ops: relu, gelu (tanh form), tanh, sigmoid, exp, log,
 * forward and backward.
 *
 * tanh, sigmoid and gelu use a branch-free single-precision exp (Cephes
 * expf, about 1 ulp; cpu_impl.h) so their loops vectorise; libm's
 * expf/tanhf are scalar calls. Relative error against double: sigmoid,
 * tanh < 2e-7. exp runs the same polynomial wherever its result is a
 * normal float ([-87.3, 88]) and hands each 64-element block holding
 * anything else (inf, nan, overflow, denormal results) to libm, so torch's
 * edge cases still hold; log calls libm (log(0) = -inf, log(<0) = nan).
 *
 * Backward reads what it saved: the output for relu/tanh/sigmoid/exp (as
 * torch does), the input for gelu/log. GELU backward recomputes its sigmoid
 * (cpu_impl.h; a few vector flops per element) instead of saving it: one
 * stream less to write and read, and no extra arena memory.
 *
 * The loops are compiled for AVX-512/AVX2/baseline (DG_SIMD_FN), split over
 * the compute pool when long, and a fresh input gradient is stored (=)
 * rather than zeroed and accumulated. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core_impl.h"
#include "backends/cpu/cpu_impl.h"

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

typedef enum { U_RELU, U_GELU, U_TANH, U_SIGMOID, U_EXP, U_LOG } unary_kind;
static const char *const unary_names[] = {"relu", "gelu", "tanh", "sigmoid", "exp", "log"};
/* 1: backward uses the saved output; 0: the saved input. */
static const int saves_output[] = {1, 0, 1, 1, 1, 0};

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

/* y (n) = f(x (n)). */
DG_INLINE void unary_fwd_body(unary_kind k, int64_t n, const float *restrict x,
                              float *restrict y) {
  switch (k) {
    case U_RELU: /* x < 0 keeps nan as nan, like torch */
      for (int64_t i = 0; i < n; i++) y[i] = x[i] < 0.0f ? 0.0f : x[i];
      break;
    case U_GELU:
      for (int64_t i = 0; i < n; i++) {
        y[i] = dg__gelu(x[i]);
      }
      break;
    case U_TANH:
      for (int64_t i = 0; i < n; i++) y[i] = dg__tanhf(x[i]);
      break;
    case U_SIGMOID:
      for (int64_t i = 0; i < n; i++) y[i] = fast_sigmoidf(x[i]);
      break;
    case U_EXP:
      exp_loop(n, x, y);
      break;
    case U_LOG:
      for (int64_t i = 0; i < n; i++) y[i] = logf(x[i]);
      break;
  }
}
DG_SIMD_FN(unary_fwd, (unary_kind k, int64_t n, const float *restrict x, float *restrict y),
           (k, n, x, y))

/* dx[i] (= or +=) EXPR for i < n. */
#define EW_STORE(acc, n, EXPR)                                \
  do {                                                        \
    if (acc) for (int64_t i = 0; i < (n); i++) dx[i] += (EXPR); \
    else for (int64_t i = 0; i < (n); i++) dx[i] = (EXPR);      \
  } while (0)

/* dx (n) (+)= dy (n) * f'(s (n)), s being the saved output or input; acc = 0
 * stores. */
DG_INLINE void unary_bwd_body(unary_kind k, int acc, int64_t n, const float *restrict s,
                              const float *restrict dy, float *restrict dx) {
  switch (k) {
    case U_RELU: /* dy loaded unconditionally, so the select vectorises */
      EW_STORE(acc, n, s[i] > 0.0f ? dy[i] : 0.0f);
      break;
    case U_GELU: /* torch's GeluBackward, tanh form */
      EW_STORE(acc, n, dy[i] * dg__gelu_grad(s[i]));
      break;
    case U_TANH:
      EW_STORE(acc, n, dy[i] * (1.0f - s[i] * s[i]));
      break;
    case U_SIGMOID:
      EW_STORE(acc, n, dy[i] * s[i] * (1.0f - s[i]));
      break;
    case U_EXP:
      EW_STORE(acc, n, dy[i] * s[i]);
      break;
    case U_LOG:
      EW_STORE(acc, n, dy[i] / s[i]);
      break;
  }
}
DG_SIMD_FN(unary_bwd,
           (unary_kind k, int acc, int64_t n, const float *restrict s, const float *restrict dy,
            float *restrict dx),
           (k, acc, n, s, dy, dx))

typedef struct {
  unary_kind k;
  int acc;
  const float *x, *dy; /* x: input (forward) or saved tensor (backward) */
  float *y;            /* output (forward) or dx (backward) */
} unary_job;

static void fwd_range(void *arg, int64_t lo, int64_t hi) {
  const unary_job *j = arg;
  unary_fwd(j->k, hi - lo, j->x + lo, j->y + lo);
}

static void bwd_range(void *arg, int64_t lo, int64_t hi) {
  const unary_job *j = arg;
  unary_bwd(j->k, j->acc, hi - lo, j->x + lo, j->dy + lo, j->y + lo);
}

static int64_t grain_of(unary_kind k) { return k == U_RELU ? DG_GRAIN_MEM : DG_GRAIN_COMPUTE; }

static int unary_backward(dg_ctx *ctx, dg_node *nd) {
  dg_tensor *st = dg__saved(ctx, nd, 0);
  if (!st) return ctx->err;
  const float *s = dg__contig_data(ctx, nd->op, st);
  int overwrite;
  float *dx = dg__grad_buf_w(ctx, nd->in[0], &overwrite);
  if (!s || !dx) return ctx->err;
  unary_kind k = (unary_kind)nd->i[0];
  unary_job j = {k, !overwrite, s, nd->out->grad->data, dx};
  dg__parallel_range(dg__numel(nd->out), grain_of(k), bwd_range, &j);
  return DG_OK;
}

static dg_tensor *unary(dg_ctx *ctx, unary_kind k, dg_tensor *x) {
  const char *name = unary_names[k];
  if (!ctx || dg__null_input(ctx, name, "x", x) || !dg__check_f32(ctx, name, "x", x))
    return NULL;
  dg_tensor *y = dg__new_like(ctx, name, x);
  const float *xp = y ? dg__contig_data(ctx, name, x) : NULL;
  if (!xp) return NULL;
  unary_job j = {k, 0, xp, NULL, y->data};
  dg__parallel_range(dg__numel(y), grain_of(k), fwd_range, &j);
  if (dg__needs_grad(ctx, 1, &x)) {
    dg_node *nd = dg__record(ctx, name, unary_backward, y, 1, &x);
    if (!nd || dg__save(ctx, nd, saves_output[k] ? y : x)) return NULL;
    nd->i[0] = k;
  }
  return y;
}

dg_tensor *dg_relu(dg_ctx *ctx, dg_tensor *x) { return unary(ctx, U_RELU, x); }
dg_tensor *dg_gelu(dg_ctx *ctx, dg_tensor *x) { return unary(ctx, U_GELU, x); }
dg_tensor *dg_tanh(dg_ctx *ctx, dg_tensor *x) { return unary(ctx, U_TANH, x); }
dg_tensor *dg_sigmoid(dg_ctx *ctx, dg_tensor *x) { return unary(ctx, U_SIGMOID, x); }
dg_tensor *dg_exp(dg_ctx *ctx, dg_tensor *x) { return unary(ctx, U_EXP, x); }
dg_tensor *dg_log(dg_ctx *ctx, dg_tensor *x) { return unary(ctx, U_LOG, x); }
