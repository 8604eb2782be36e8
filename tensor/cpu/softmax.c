/* softmax and log-softmax over the last dim, forward and backward.
 *
 * Both subtract the row maximum before exponentiating (no overflow for any
 * finite input; a row that is all -inf gives NaN, as in PyTorch) and sum the
 * exponentials in double. Backward uses only the saved output:
 *   softmax:     dx = y * (dy - sum(dy * y))
 *   log_softmax: dx = dy - exp(y) * sum(dy) */
#include <math.h>

#include "tensor/cpu/cpu_impl.h"

/* One row: y = softmax(x) or log_softmax(x). */
static void softmax_row(const float *restrict x, /* (C) */
                        float *restrict y,       /* (C) */
                        int64_t C, int logf_) {
  float m = -INFINITY;
  for (int64_t j = 0; j < C; j++) m = x[j] > m ? x[j] : m;
  double s = 0;
  if (logf_) {
    for (int64_t j = 0; j < C; j++) s += expf(x[j] - m);
    float ls = (float)log(s); /* (x - m) - ls, not x - (m + ls): exact for large x */
    for (int64_t j = 0; j < C; j++) y[j] = (x[j] - m) - ls;
  } else {
    for (int64_t j = 0; j < C; j++) {
      y[j] = expf(x[j] - m);
      s += y[j];
    }
    float inv = (float)(1.0 / s);
    for (int64_t j = 0; j < C; j++) y[j] *= inv;
  }
}

static int softmax_backward(dg_ctx *ctx, dg_node *n) {
  dg_tensor *sy = dg__saved(ctx, n, 0);
  if (!sy) return ctx->err;
  const float *y = dg__contig_data(ctx, "softmax backward", sy); /* (R, C) */
  float *dx = dg__grad_buf(ctx, n->in[0]);                      /* (R, C) */
  if (!y || !dx) return ctx->err;
  const float *dy = n->out->grad->data; /* (R, C) */
  int64_t R = n->i[0], C = n->i[1];
  int logf_ = (int)n->i[2];
  for (int64_t r = 0; r < R; r++) {
    const float *restrict yr = y + r * C, *restrict gr = dy + r * C;
    float *restrict xr = dx + r * C;
    double s = 0;
    if (logf_) {
      for (int64_t j = 0; j < C; j++) s += gr[j];
      float sf = (float)s;
      for (int64_t j = 0; j < C; j++) xr[j] += gr[j] - expf(yr[j]) * sf;
    } else {
      for (int64_t j = 0; j < C; j++) s += (double)gr[j] * yr[j];
      float sf = (float)s;
      for (int64_t j = 0; j < C; j++) xr[j] += yr[j] * (gr[j] - sf);
    }
  }
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
  float *yp = y->data; /* (R, C) */
  for (int64_t r = 0; r < R; r++) softmax_row(xp + r * C, yp + r * C, C, logf_);
  if (dg__needs_grad(ctx, 1, &x)) {
    dg_node *n = dg__record(ctx, op, softmax_backward, y, 1, &x);
    if (!n || dg__save(ctx, n, y)) return NULL;
    n->i[0] = R, n->i[1] = C, n->i[2] = logf_;
  }
  return y;
}

dg_tensor *dg_softmax(dg_ctx *ctx, dg_tensor *x) { return softmax_impl(ctx, x, 0); }
dg_tensor *dg_log_softmax(dg_ctx *ctx, dg_tensor *x) { return softmax_impl(ctx, x, 1); }
