/* Element-wise unary ops (the op: validation, recording, backward wiring):
 * relu, gelu (tanh form), tanh, sigmoid, exp, log, leaky_relu.
 *
 * Backward reads what the op saved: the output for relu/tanh/sigmoid/exp
 * (as torch does), the input for gelu/log/leaky_relu (GELU backward
 * recomputes its sigmoid from the input instead of saving it; leaky_relu's
 * slope may be negative, so only the input's sign tells the branch). The
 * kernels are the backend's (backends/kern_unary.h). */
#include "backends/kern_unary.h"
#include "core/core_impl.h"

static const char *const unary_names[] = {"relu", "gelu", "tanh", "sigmoid",
                                          "exp", "log", "leaky_relu"};
/* 1: backward uses the saved output; 0: the saved input. */
static const int saves_output[] = {1, 0, 1, 1, 1, 0, 0};

static int unary_backward(dg_ctx *ctx, dg_node *nd) {
  dg_tensor *st = dg__saved(ctx, nd, 0);
  if (!st) return ctx->err;
  const float *s = dg__contig_data(ctx, nd->op, st);
  int overwrite;
  float *dx = dg__grad_buf_w(ctx, nd->in[0], &overwrite);
  if (!s || !dx) return ctx->err;
  const dg__backend *be = dg__backend_get(nd->out->device);
  dg__unary_args a = {(dg__unary_kind)nd->i[0], !overwrite, s, nd->out->grad->data, dx,
                      dg__numel(nd->out), (float)nd->f[0]};
  be->unary->bwd(&a);
  return DG_OK;
}

/* y = f(x), x any shape -> y of x's shape; alpha: leaky_relu's slope. */
static dg_tensor *unary_a(dg_ctx *ctx, dg__unary_kind k, dg_tensor *x, float alpha) {
  const char *name = unary_names[k];
  const dg__backend *be = dg__op_begin(ctx, name, 1, &x, (const char *[]){"x"}, 0);
  if (!be || !dg__check_f32(ctx, name, "x", x))
    return NULL;
  dg_tensor *y = dg__new_like(ctx, name, x);
  const float *xp = y ? dg__contig_data(ctx, name, x) : NULL;
  if (!xp) return NULL;
  dg__unary_args a = {k, 0, xp, NULL, y->data, dg__numel(y), alpha};
  be->unary->fwd(&a);
  if (dg__needs_grad(ctx, 1, &x)) {
    dg_node *nd = dg__record(ctx, name, unary_backward, y, 1, &x);
    if (!nd || dg__save(ctx, nd, saves_output[k] ? y : x)) return NULL;
    nd->i[0] = k;
    nd->f[0] = alpha;
  }
  return y;
}

static dg_tensor *unary(dg_ctx *ctx, dg__unary_kind k, dg_tensor *x) {
  return unary_a(ctx, k, x, 0.0f);
}

dg_tensor *dg_relu(dg_ctx *ctx, dg_tensor *x) { return unary(ctx, DG_UNARY_RELU, x); }
dg_tensor *dg_gelu(dg_ctx *ctx, dg_tensor *x) { return unary(ctx, DG_UNARY_GELU, x); }
dg_tensor *dg_tanh(dg_ctx *ctx, dg_tensor *x) { return unary(ctx, DG_UNARY_TANH, x); }
dg_tensor *dg_sigmoid(dg_ctx *ctx, dg_tensor *x) { return unary(ctx, DG_UNARY_SIGMOID, x); }
dg_tensor *dg_exp(dg_ctx *ctx, dg_tensor *x) { return unary(ctx, DG_UNARY_EXP, x); }
dg_tensor *dg_log(dg_ctx *ctx, dg_tensor *x) { return unary(ctx, DG_UNARY_LOG, x); }

dg_tensor *dg_leaky_relu(dg_ctx *ctx, dg_tensor *x, float slope) {
  return unary_a(ctx, DG_UNARY_LEAKY_RELU, x, slope);
}
