/* Losses (the op: validation, recording, backward wiring): cross-entropy
 * from logits with integer targets, and mean squared error, both the mean
 * over their elements as in PyTorch.
 *
 * cross_entropy fuses log-softmax and the negative log-likelihood: forward
 * keeps each row's max m and log-sum-exp l of x - m (2N floats in the
 * node), so backward is one pass, dx = (exp(x - m - l) - onehot(t)) * g / N,
 * with no (N, C) softmax stored. The kernels are the backend's
 * (backends/kern_loss.h). */
#include "backends/kern_loss.h"
#include "core/core_impl.h"

/* ---- cross-entropy ---- */

typedef struct {
  const int64_t *target; /* (N) */
  float *max, *lsum;     /* (N) each: row max m and log(sum(exp(x - m))) */
} ce_saved;

static int ce_backward(dg_ctx *ctx, dg_node *n) {
  dg_tensor *sx = dg__saved(ctx, n, 0);
  if (!sx) return ctx->err;
  const float *x = dg__contig_data(ctx, "cross_entropy backward", sx); /* (N, C) */
  int overwrite;
  float *dx = dg__grad_buf_w(ctx, n->in[0], &overwrite);              /* (N, C) */
  if (!x || !dx) return ctx->err;
  const ce_saved *s = n->extra;
  const dg__backend *be = dg__backend_get(n->out->device);
  dg__ce_args a = {x, n->out->grad->data, s->target, s->max, s->lsum, NULL, dx,
                   n->i[0], n->i[1], !overwrite};
  be->loss->ce_bwd(&a);
  return DG_OK;
}

static int ce_check(dg_ctx *ctx, dg_tensor *logits, dg_tensor *targets) {
  char sl[96], st[96];
  if (!dg__check_f32(ctx, "cross_entropy", "logits", logits)) return ctx->err;
  if (targets->dtype != DG_I32 && targets->dtype != DG_I64)
    return dg__set_error(ctx, DG_EDTYPE, "cross_entropy: targets %s must be i32 or i64, got %s",
                         dg__shape_str(targets, st, sizeof st), dg_dtype_name(targets->dtype));
  int ok = logits->ndim >= 1 && targets->ndim == logits->ndim - 1;
  for (int i = 0; ok && i < targets->ndim; i++) ok = targets->shape[i] == logits->shape[i];
  if (!ok)
    return dg__set_error(ctx, DG_ESHAPE,
                         "cross_entropy: logits %s (..., C) need targets of shape (...), got %s",
                         dg__shape_str(logits, sl, sizeof sl),
                         dg__shape_str(targets, st, sizeof st));
  return DG_OK;
}

dg_tensor *dg_cross_entropy(dg_ctx *ctx, dg_tensor *logits, dg_tensor *targets) {
  dg_tensor *in[2] = {logits, targets};
  const dg__backend *be =
      dg__op_begin(ctx, "cross_entropy", 2, in, (const char *[]){"logits", "targets"}, 0);
  if (!be || ce_check(ctx, logits, targets))
    return NULL;
  int64_t C = logits->shape[logits->ndim - 1], N = dg__numel(targets);
  dg_tensor *loss = dg__new(ctx, "cross_entropy", DG_F32, 0, NULL);
  const float *x = loss ? dg__contig_data(ctx, "cross_entropy", logits) : NULL; /* (N, C) */
  int64_t *t = x ? dg__index_data(ctx, "cross_entropy", "target", "in row", targets, C)
                 : NULL; /* (N) */
  float *st = t ? dg__op_data(ctx, 2 * (size_t)N * sizeof *st) : NULL; /* (2, N) */
  if (t && !st) dg__set_error(ctx, DG_ENOMEM, "cross_entropy: out of memory");
  if (!st) return NULL;
  dg__ce_args a = {x, NULL, t, st, st + N, loss->data, NULL, N, C, 0};
  be->loss->ce_fwd(&a);
  if (dg__needs_grad(ctx, 1, &logits)) {
    dg_node *n = dg__record(ctx, "cross_entropy", ce_backward, loss, 1, &logits);
    ce_saved *s = n ? dg__arena_alloc(&ctx->arena, sizeof *s) : NULL;
    if (n && !s) dg__set_error(ctx, DG_ENOMEM, "cross_entropy: out of memory");
    if (!s || dg__save(ctx, n, logits)) return NULL;
    s->target = t, s->max = st, s->lsum = st + N;
    n->extra = s;
    n->i[0] = N, n->i[1] = C;
  }
  return loss;
}

/* ---- mean squared error ---- */

static int mse_backward(dg_ctx *ctx, dg_node *n) {
  dg_tensor *sp = dg__saved(ctx, n, 0), *st = dg__saved(ctx, n, 1);
  if (!sp || !st) return ctx->err;
  const float *p = dg__contig_data(ctx, "mse backward", sp); /* (n) */
  const float *t = dg__contig_data(ctx, "mse backward", st); /* (n) */
  int op, ot;
  float *dp = dg__grad_buf_w(ctx, n->in[0], &op), *dt = dg__grad_buf_w(ctx, n->in[1], &ot); /* (n) */
  if (!p || !t || ctx->err) return ctx->err;
  const dg__backend *be = dg__backend_get(n->out->device);
  dg__mse_args a = {p, t, n->out->grad->data, NULL, dp, dt, n->i[0], !op, !ot};
  be->loss->mse_bwd(&a);
  return DG_OK;
}

dg_tensor *dg_mse(dg_ctx *ctx, dg_tensor *pred, dg_tensor *target) {
  dg_tensor *in[2] = {pred, target};
  const dg__backend *be = dg__op_begin(ctx, "mse", 2, in, (const char *[]){"pred", "target"}, 0);
  if (!be || !dg__check_f32(ctx, "mse", "pred", pred) ||
      !dg__check_f32(ctx, "mse", "target", target))
    return NULL;
  if (!dg__same_shape(pred, target)) {
    char sp[96], st[96];
    dg__set_error(ctx, DG_ESHAPE, "mse: pred %s and target %s differ",
                  dg__shape_str(pred, sp, sizeof sp), dg__shape_str(target, st, sizeof st));
    return NULL;
  }
  int64_t N = dg__numel(pred);
  dg_tensor *loss = dg__new(ctx, "mse", DG_F32, 0, NULL);
  const float *p = loss ? dg__contig_data(ctx, "mse", pred) : NULL;  /* (N) */
  const float *t = p ? dg__contig_data(ctx, "mse", target) : NULL;   /* (N) */
  if (!t) return NULL;
  dg__mse_args a = {p, t, NULL, loss->data, NULL, NULL, N, 0, 0};
  be->loss->mse_fwd(&a);
  if (dg__needs_grad(ctx, 2, in)) {
    dg_node *n = dg__record(ctx, "mse", mse_backward, loss, 2, in);
    if (!n || dg__save(ctx, n, pred) || dg__save(ctx, n, target)) return NULL;
    n->i[0] = N;
  }
  return loss;
}
