/* softmax and log-softmax over the last dim (the op: validation, recording,
 * backward wiring), matching torch: the row maximum is subtracted first (no
 * overflow for any finite input; a row that is all -inf gives NaN).
 * Forward saves its output, and backward uses only that:
 *   softmax:     dx = y * (dy - sum(dy * y))
 *   log_softmax: dx = dy - exp(y) * sum(dy)
 * The kernels are the backend's (backends/kern_softmax.h). */
#include "backends/kern_softmax.h"
#include "core/core_impl.h"

static int softmax_backward(dg_ctx *ctx, dg_node *n) {
  dg_tensor *sy = dg__saved(ctx, n, 0);
  if (!sy) return ctx->err;
  int ow;
  const float *y = dg__contig_data(ctx, "softmax backward", sy); /* (R, C) */
  float *dx = y ? dg__grad_buf_w(ctx, n->in[0], &ow) : NULL;   /* (R, C) */
  if (!y || !dx) return ctx->err;
  const dg__backend *be = dg__backend_get(n->out->device);
  dg__softmax_args a = {y, n->out->grad->data, dx, n->i[0], n->i[1], (int)n->i[2], !ow};
  be->softmax->bwd(&a);
  return DG_OK;
}

static dg_tensor *softmax_impl(dg_ctx *ctx, dg_tensor *x, int logf_) {
  const char *op = logf_ ? "log_softmax" : "softmax";
  const dg__backend *be = dg__op_begin(ctx, op, 1, &x, (const char *[]){"x"}, 0);
  if (!be || !dg__check_f32(ctx, op, "x", x)) return NULL;
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
  dg__softmax_args a = {xp, NULL, y->data, R, C, logf_, 0};
  be->softmax->fwd(&a);
  if (dg__needs_grad(ctx, 1, &x)) {
    dg_node *n = dg__record(ctx, op, softmax_backward, y, 1, &x);
    if (!n || dg__save(ctx, n, y)) return NULL;
    n->i[0] = R, n->i[1] = C, n->i[2] = logf_;
  }
  return y;
}

dg_tensor *dg_softmax(dg_ctx *ctx, dg_tensor *x) { return softmax_impl(ctx, x, 0); }
dg_tensor *dg_log_softmax(dg_ctx *ctx, dg_tensor *x) { return softmax_impl(ctx, x, 1); }
