/* Layer normalisation over the last dim (the op: validation, recording,
 * backward wiring), matching torch.nn.functional.layer_norm: biased
 * variance, eps inside the sqrt, optional elementwise weight and bias.
 * Forward keeps each row's mean and rstd in the node for backward. The
 * kernels are the backend's (backends/kern_norm.h). */
#include "backends/kern_norm.h"
#include "core/core_impl.h"

typedef struct {
  float *mean, *rstd, *corr; /* (R) each */
  const dg__backend *be;
} ln_stats;

/* Saved tensors: 0 = x, 1 = w (when node->i[2]). */
static int ln_backward(dg_ctx *ctx, dg_node *n) {
  int64_t R = n->i[0], C = n->i[1];
  int has_w = (int)n->i[2];
  dg_tensor *sx = dg__saved(ctx, n, 0), *sw = has_w ? dg__saved(ctx, n, 1) : NULL;
  if (!sx || (has_w && !sw)) return ctx->err;
  const float *x = dg__contig_data(ctx, "layernorm backward", sx);        /* (R, C) */
  const float *w = has_w ? dg__contig_data(ctx, "layernorm backward", sw) : NULL; /* (C) */
  int ox, ow, ob;
  float *dx = dg__grad_buf_w(ctx, n->in[0], &ox);                          /* (R, C) */
  float *dw = dg__grad_buf_w(ctx, n->in[1], &ow), *db = dg__grad_buf_w(ctx, n->in[2], &ob);
  if (!x || ctx->err) return ctx->err;
  const ln_stats *st = n->extra;
  dg__ln_args a = {x, w, NULL, n->out->grad->data, dx, dw, db, R, C, 0, !ox, !ow, !ob,
                   st->mean, st->rstd, st->corr};
  st->be->norm->layernorm_bwd(&a);
  return DG_OK;
}

static int ln_check(dg_ctx *ctx, dg_tensor *x, dg_tensor *w, dg_tensor *b, float eps) {
  if (!dg__check_f32(ctx, "layernorm", "x", x) || (w && !dg__check_f32(ctx, "layernorm", "w", w)) ||
      (b && !dg__check_f32(ctx, "layernorm", "b", b)))
    return ctx->err;
  char sx[96], sw[96], sb[96];
  int64_t C = x->ndim ? x->shape[x->ndim - 1] : -1;
  if (x->ndim < 1 || (w && (w->ndim != 1 || w->shape[0] != C)) ||
      (b && (b->ndim != 1 || b->shape[0] != C)))
    return dg__set_error(ctx, DG_ESHAPE, "layernorm: x %s needs w and b of shape (%lld); got w %s, b %s",
                         dg__shape_str(x, sx, sizeof sx), (long long)C,
                         w ? dg__shape_str(w, sw, sizeof sw) : "none",
                         b ? dg__shape_str(b, sb, sizeof sb) : "none");
  if (!(eps >= 0))
    return dg__set_error(ctx, DG_EINVAL, "layernorm: eps %g must be >= 0", (double)eps);
  return DG_OK;
}

dg_tensor *dg_layernorm(dg_ctx *ctx, dg_tensor *x, dg_tensor *w, dg_tensor *b, float eps) {
  dg_tensor *in[3] = {x, w, b};
  const dg__backend *be = dg__op_begin(ctx, "layernorm", 3, in, (const char *[]){"x", "w", "b"},
                                       DG__OPT(1) | DG__OPT(2));
  if (!be || ln_check(ctx, x, w, b, eps))
    return NULL;
  int64_t C = x->shape[x->ndim - 1], R = C ? dg__numel(x) / C : 0;
  dg_tensor *y = dg__new_like(ctx, "layernorm", x);
  const float *xp = y ? dg__contig_data(ctx, "layernorm", x) : NULL; /* (R, C) */
  const float *wp = xp && w ? dg__contig_data(ctx, "layernorm", w) : NULL; /* (C) */
  const float *bp = xp && b ? dg__contig_data(ctx, "layernorm", b) : NULL; /* (C) */
  ln_stats *st = xp ? dg__arena_alloc(&ctx->arena, sizeof *st) : NULL;
  float *ms = st ? dg__op_data(ctx, 3 * (size_t)R * sizeof(float)) : NULL;
  if (xp && !ms) dg__set_error(ctx, DG_ENOMEM, "layernorm: out of memory for row statistics");
  if (!ms || (w && !wp) || (b && !bp)) return NULL;
  st->mean = ms, st->rstd = ms + R, st->corr = ms + 2 * R, st->be = be;
  dg__ln_args a = {xp, wp, bp, NULL, y->data, NULL, NULL, R, C, eps, 0, 0, 0, st->mean,
                   st->rstd, st->corr};
  be->norm->layernorm_fwd(&a);
  if (dg__needs_grad(ctx, 3, in)) {
    dg_node *n = dg__record(ctx, "layernorm", ln_backward, y, 3, in);
    if (!n || dg__save(ctx, n, x) || (w && dg__save(ctx, n, w))) return NULL;
    n->i[0] = R, n->i[1] = C, n->i[2] = w != NULL;
    n->extra = st;
  }
  return y;
}
