/* Layer normalisation over the last dim, forward and backward, matching
 * torch.nn.functional.layer_norm: biased variance, eps inside the sqrt,
 * optional elementwise weight and bias.
 *
 * Forward computes each row's mean and variance in double (two passes, no
 * cancellation) and keeps mean and rstd = 1 / sqrt(var + eps) per row in the
 * node, so backward need not recompute them:
 *   xhat = (x - mean) * rstd,  g = dy * w
 *   dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
 *   dw += sum_rows dy * xhat,  db += sum_rows dy */
#include <math.h>

#include "tensor/cpu/cpu_impl.h"

typedef struct {
  float *mean, *rstd; /* (R) each */
} ln_stats;

/* Saved tensors: 0 = x, 1 = w (when node->i[2]). */
static int ln_backward(dg_ctx *ctx, dg_node *n) {
  int64_t R = n->i[0], C = n->i[1];
  int has_w = (int)n->i[2];
  dg_tensor *sx = dg__saved(ctx, n, 0), *sw = has_w ? dg__saved(ctx, n, 1) : NULL;
  if (!sx || (has_w && !sw)) return ctx->err;
  const float *x = dg__contig_data(ctx, "layernorm backward", sx);        /* (R, C) */
  const float *w = has_w ? dg__contig_data(ctx, "layernorm backward", sw) : NULL; /* (C) */
  float *dx = dg__grad_buf(ctx, n->in[0]);                               /* (R, C) */
  float *dw = dg__grad_buf(ctx, n->in[1]), *db = dg__grad_buf(ctx, n->in[2]); /* (C) */
  if (!x || ctx->err) return ctx->err;
  const ln_stats *st = n->extra;
  const float *dy = n->out->grad->data; /* (R, C) */
  for (int64_t r = 0; r < R; r++) {
    const float *restrict xr = x + r * C, *restrict gr = dy + r * C;
    float mu = st->mean[r], rs = st->rstd[r];
    if (dw)
      for (int64_t j = 0; j < C; j++) dw[j] += gr[j] * (xr[j] - mu) * rs;
    if (db)
      for (int64_t j = 0; j < C; j++) db[j] += gr[j];
    if (!dx) continue;
    double sg = 0, sgx = 0; /* sums of g and g * xhat */
    for (int64_t j = 0; j < C; j++) {
      float g = w ? gr[j] * w[j] : gr[j];
      sg += g;
      sgx += (double)g * ((xr[j] - mu) * rs);
    }
    float mg = (float)(sg / (double)C), mgx = (float)(sgx / (double)C);
    float *restrict dr = dx + r * C;
    for (int64_t j = 0; j < C; j++) {
      float g = w ? gr[j] * w[j] : gr[j];
      dr[j] += rs * (g - mg - (xr[j] - mu) * rs * mgx);
    }
  }
  return DG_OK;
}

/* y(R, C) = (x - mean) * rstd * w + b for every row; fills st. */
static void ln_forward(const float *restrict x, const float *restrict w,
                       const float *restrict b, float *restrict y, int64_t R, int64_t C,
                       double eps, ln_stats *st) {
  for (int64_t r = 0; r < R; r++) {
    const float *restrict xr = x + r * C;
    float *restrict yr = y + r * C;
    double s = 0, v = 0;
    for (int64_t j = 0; j < C; j++) s += xr[j];
    double mu = s / (double)C;
    for (int64_t j = 0; j < C; j++) {
      double d = xr[j] - mu;
      v += d * d;
    }
    float m = (float)mu, rs = (float)(1.0 / sqrt(v / (double)C + eps));
    st->mean[r] = m, st->rstd[r] = rs;
    for (int64_t j = 0; j < C; j++) yr[j] = (xr[j] - m) * rs;
    if (w)
      for (int64_t j = 0; j < C; j++) yr[j] *= w[j];
    if (b)
      for (int64_t j = 0; j < C; j++) yr[j] += b[j];
  }
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
  if (!ctx || dg__null_input(ctx, "layernorm", "x", x) || ln_check(ctx, x, w, b, eps)) return NULL;
  int64_t C = x->shape[x->ndim - 1], R = C ? dg__numel(x) / C : 0;
  dg_tensor *y = dg__new_like(ctx, "layernorm", x);
  const float *xp = y ? dg__contig_data(ctx, "layernorm", x) : NULL; /* (R, C) */
  const float *wp = xp && w ? dg__contig_data(ctx, "layernorm", w) : NULL; /* (C) */
  const float *bp = xp && b ? dg__contig_data(ctx, "layernorm", b) : NULL; /* (C) */
  ln_stats *st = xp ? dg__arena_alloc(&ctx->arena, sizeof *st) : NULL;
  float *ms = st ? dg__arena_alloc(&ctx->arena, 2 * (size_t)R * sizeof(float)) : NULL;
  if (xp && !ms) dg__set_error(ctx, DG_ENOMEM, "layernorm: out of memory for row statistics");
  if (!ms || (w && !wp) || (b && !bp)) return NULL;
  st->mean = ms, st->rstd = ms + R;
  ln_forward(xp, wp, bp, y->data, R, C, eps, st);
  dg_tensor *in[3] = {x, w, b};
  if (dg__needs_grad(ctx, 3, in)) {
    dg_node *n = dg__record(ctx, "layernorm", ln_backward, y, 3, in);
    if (!n || dg__save(ctx, n, x) || (w && dg__save(ctx, n, w))) return NULL;
    n->i[0] = R, n->i[1] = C, n->i[2] = w != NULL;
    n->extra = st;
  }
  return y;
}
