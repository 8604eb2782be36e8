/* Fused multi-head self-attention, forward and backward (the op:
 * validation, recording, backward wiring).
 *
 * dg_attention(qkv (B, T, 3C), heads, causal, scale) -> y (B, T, C): for every
 * (batch b, head h), with hd = C / heads and q, k, v the (T, hd) column blocks
 * of qkv at offsets h*hd, C + h*hd, 2C + h*hd (row stride 3C):
 *
 *   S = scale * q k^T                       (T, T)
 *   P = softmax(S) over j (j <= i if causal) (T, T), zero above the diagonal
 *   y[:, h*hd : (h+1)*hd] = P v             (T, hd), row stride C
 *
 * P (B, H, T, T) is saved for backward, which writes straight into the
 * (B, T, 3C) gradient of qkv (the first writer overwrites). The kernels are
 * the backend's (backends/kern_attention.h); their scratch comes from the
 * arena. */
#include <math.h>

#include "backends/kern_attention.h"
#include "core/core_impl.h"

/* a->scratch: the kernels' scratch from the arena (none when they need
 * none); with_tt as the kernels' scratch() says. */
static int att_scratch(dg_ctx *ctx, const char *op, const dg__backend *be, dg__att_args *a,
                       int with_tt) {
  a->nscratch = be->attention->scratch(a->B, a->H, a->T, a->C / a->H, with_tt);
  a->scratch = NULL;
  if (a->nscratch <= 0) return DG_OK;
  a->scratch = dg__op_data(ctx, (size_t)a->nscratch * sizeof(float));
  if (!a->scratch) return dg__set_error(ctx, DG_ENOMEM, "%s: out of memory", op);
  return DG_OK;
}

static int attention_backward(dg_ctx *ctx, dg_node *n) {
  dg_tensor *sqkv = dg__saved(ctx, n, 0), *sP = dg__saved(ctx, n, 1);
  if (!sqkv || !sP) return ctx->err;
  const dg__backend *be = dg__backend_get(n->out->device);
  dg__att_args a = {.B = n->i[0], .T = n->i[1], .C = n->i[2], .H = n->i[3],
                    .causal = (int)n->f[1], .scale = (float)n->f[0]};
  a.qkv = dg__contig_data(ctx, "attention backward", sqkv);
  a.P = (float *)dg__contig_data(ctx, "attention backward", sP);
  if (!a.qkv || !a.P) return ctx->err;
  a.dy = n->out->grad->data;
  int ow;
  a.dqkv = dg__grad_buf_w(ctx, n->in[0], &ow);
  if (!a.dqkv) return ctx->err;
  a.acc = !ow;
  if (att_scratch(ctx, "attention backward", be, &a, 1)) return ctx->err;
  be->attention->backward(&a);
  return DG_OK;
}

dg_tensor *dg_attention(dg_ctx *ctx, dg_tensor *qkv, int heads, int causal, float scale) {
  const dg__backend *be = dg__op_begin(ctx, "attention", 1, &qkv, (const char *[]){"qkv"}, 0);
  if (!be || !dg__check_f32(ctx, "attention", "qkv", qkv)) return NULL;
  char sq[96];
  if (qkv->ndim != 3 || heads <= 0 || qkv->shape[2] % (3 * (int64_t)heads)) {
    dg__set_error(ctx, DG_ESHAPE, "attention: qkv %s must be (B, T, 3C) with C %% heads (%d) == 0",
                  dg__shape_str(qkv, sq, sizeof sq), heads);
    return NULL;
  }
  if (!isfinite(scale)) {
    dg__set_error(ctx, DG_EINVAL, "attention: scale %g is not finite", (double)scale);
    return NULL;
  }
  dg__att_args a = {.B = qkv->shape[0], .T = qkv->shape[1], .C = qkv->shape[2] / 3, .H = heads,
                    .causal = causal != 0, .scale = scale};
  int64_t shape[3] = {a.B, a.T, a.C}, pshape[4] = {a.B, a.H, a.T, a.T};
  dg_tensor *y = dg__new(ctx, "attention", DG_F32, 3, shape);
  if (!y) return NULL;
  a.y = y->data;
  a.qkv = dg__contig_data(ctx, "attention", qkv);
  if (!a.qkv) return NULL;
  int grad = dg__needs_grad(ctx, 1, &qkv);
  dg_tensor *P = NULL;
  if (grad) {
    P = dg__new(ctx, "attention", DG_F32, 4, pshape);
    if (!P) return NULL;
    a.P = P->data;
  }
  if (att_scratch(ctx, "attention", be, &a, !grad)) return NULL;
  be->attention->forward(&a);
  if (grad) {
    dg_node *n = dg__record(ctx, "attention", attention_backward, y, 1, &qkv);
    if (!n || dg__save(ctx, n, qkv) || dg__save(ctx, n, P)) return NULL;
    n->i[0] = a.B, n->i[1] = a.T, n->i[2] = a.C, n->i[3] = a.H;
    n->f[0] = scale, n->f[1] = a.causal;
  }
  return y;
}
