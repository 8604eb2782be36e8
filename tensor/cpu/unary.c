/* Element-wise unary ops: relu, gelu (tanh form), tanh, sigmoid, exp, log,
 * forward and backward.
 *
 * tanh, sigmoid and gelu use a branch-free single-precision exp (Cephes
 * expf, about 1 ulp) so their loops vectorise; libm's expf/tanhf are scalar
 * calls. Relative error against double: sigmoid, tanh < 2e-7.
 * exp and log themselves call libm: accuracy and torch's edge cases
 * (inf, denormals, log(0) = -inf, log(<0) = nan) come for free.
 *
 * Backward reads what it saved: the output for relu/tanh/sigmoid/exp (as
 * torch does), the input for gelu/log. */
#include <math.h>
#include <string.h>

#include "tensor/cpu/cpu_impl.h"

static inline float bits_to_f(int32_t i) {
  float f;
  memcpy(&f, &i, sizeof f);
  return f;
}

static inline int32_t f_to_bits(float f) {
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
static inline float exp_nonpos(float x) {
  const float magic = 12582912.0f;
  int32_t xb = f_to_bits(x), lb = f_to_bits(-87.3365447504f);
  float xc = bits_to_f(xb < lb ? xb : lb); /* for x <= 0 a larger int is a smaller |x| */
  float t = xc * 1.44269504088896341f + magic;
  int32_t n = f_to_bits(t) - f_to_bits(magic);
  float fn = t - magic;
  float r = xc - fn * 0.693359375f;
  r = r - fn * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float y = p * r * r + r + 1.0f;
  return y * bits_to_f((n + 127) * (1 << 23));
}

/* tanh: Cephes' odd polynomial for |x| < 0.625, where (1 - e)/(1 + e)
 * would lose relative precision; (1 - e)/(1 + e), e = exp(-2|x|), beyond.
 * NaN propagates. */
static inline float fast_tanhf(float x) {
  float ax = fabsf(x);
  int32_t near0 = -(int32_t)(ax < 0.625f); /* all ones near 0 */
  float xs = bits_to_f(f_to_bits(x) & near0), s = xs * xs;
  float small = ((((-5.70498872745e-3f * s + 2.06390887954e-2f) * s - 5.37397155531e-2f) * s +
                  1.33314422036e-1f) * s - 3.33332819422e-1f) * s * xs + xs;
  float e = exp_nonpos(-2.0f * ax);
  float big = copysignf((1.0f - e) / (1.0f + e), x);
  int32_t nan = -(int32_t)(x != x);
  int32_t rb = (f_to_bits(small) & near0) | (f_to_bits(big) & ~near0);
  return bits_to_f((rb & ~nan) | (f_to_bits(x) & nan));
}

/* sigmoid from e = exp(-|x|): 1/(1 + e) for x >= 0, e/(1 + e) below, with
 * no overflow anywhere. NaN propagates. */
static inline float fast_sigmoidf(float x) {
  float e = exp_nonpos(-fabsf(x));
  float m = x >= 0.0f ? 1.0f : 0.0f;
  float r = (e + m * (1.0f - e)) / (1.0f + e);
  int32_t nan = -(int32_t)(x != x);
  return bits_to_f((f_to_bits(r) & ~nan) | (f_to_bits(x) & nan));
}

/* torch's approximate='tanh' constants: sqrt(2/pi) and 0.044715. */
#define GELU_BETA 0.7978845608028654f
#define GELU_KAPPA 0.044715f

typedef enum { U_RELU, U_GELU, U_TANH, U_SIGMOID, U_EXP, U_LOG } unary_kind;
static const char *const unary_names[] = {"relu", "gelu", "tanh", "sigmoid", "exp", "log"};
/* 1: backward uses the saved output; 0: the saved input. */
static const int saves_output[] = {1, 0, 1, 1, 1, 0};

/* y (n) = f(x (n)). */
static void unary_fwd(unary_kind k, int64_t n, const float *restrict x, float *restrict y) {
  switch (k) {
    case U_RELU: /* x < 0 keeps nan as nan, like torch */
      for (int64_t i = 0; i < n; i++) y[i] = x[i] < 0.0f ? 0.0f : x[i];
      break;
    case U_GELU:
      for (int64_t i = 0; i < n; i++) {
        float v = x[i], inner = GELU_BETA * (v + GELU_KAPPA * v * v * v);
        y[i] = 0.5f * v * (1.0f + fast_tanhf(inner));
      }
      break;
    case U_TANH:
      for (int64_t i = 0; i < n; i++) y[i] = fast_tanhf(x[i]);
      break;
    case U_SIGMOID:
      for (int64_t i = 0; i < n; i++) y[i] = fast_sigmoidf(x[i]);
      break;
    case U_EXP:
      for (int64_t i = 0; i < n; i++) y[i] = expf(x[i]);
      break;
    case U_LOG:
      for (int64_t i = 0; i < n; i++) y[i] = logf(x[i]);
      break;
  }
}

/* dx (n) += dy (n) * f'(s (n)), s being the saved output or input. */
static void unary_bwd(unary_kind k, int64_t n, const float *restrict s, const float *restrict dy,
                      float *restrict dx) {
  switch (k) {
    case U_RELU:
      for (int64_t i = 0; i < n; i++) {
        float g = dy[i]; /* loaded unconditionally, so the select vectorises */
        dx[i] += s[i] > 0.0f ? g : 0.0f;
      }
      break;
    case U_GELU: /* torch's GeluBackward, tanh form */
      for (int64_t i = 0; i < n; i++) {
        float v = s[i], v2 = v * v;
        float t = fast_tanhf(GELU_BETA * (v + GELU_KAPPA * v2 * v));
        float left = 0.5f * (1.0f + t);
        float right = 0.5f * v * (1.0f - t * t) * GELU_BETA * (1.0f + 3.0f * GELU_KAPPA * v2);
        dx[i] += dy[i] * (left + right);
      }
      break;
    case U_TANH:
      for (int64_t i = 0; i < n; i++) dx[i] += dy[i] * (1.0f - s[i] * s[i]);
      break;
    case U_SIGMOID:
      for (int64_t i = 0; i < n; i++) dx[i] += dy[i] * s[i] * (1.0f - s[i]);
      break;
    case U_EXP:
      for (int64_t i = 0; i < n; i++) dx[i] += dy[i] * s[i];
      break;
    case U_LOG:
      for (int64_t i = 0; i < n; i++) dx[i] += dy[i] / s[i];
      break;
  }
}

static int unary_backward(dg_ctx *ctx, dg_node *nd) {
  dg_tensor *st = dg__saved(ctx, nd, 0);
  if (!st) return ctx->err;
  const float *s = dg__contig_data(ctx, nd->op, st);
  float *dx = dg__grad_buf(ctx, nd->in[0]);
  if (!s || !dx) return ctx->err;
  unary_bwd((unary_kind)nd->i[0], dg__numel(nd->out), s, nd->out->grad->data, dx);
  return DG_OK;
}

static dg_tensor *unary(dg_ctx *ctx, unary_kind k, dg_tensor *x) {
  const char *name = unary_names[k];
  if (!ctx || dg__null_input(ctx, name, "x", x) || !dg__check_f32(ctx, name, "x", x))
    return NULL;
  dg_tensor *y = dg__new_like(ctx, name, x);
  const float *xp = y ? dg__contig_data(ctx, name, x) : NULL;
  if (!xp) return NULL;
  unary_fwd(k, dg__numel(y), xp, y->data);
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
