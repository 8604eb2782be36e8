/* Reductions: sum and mean over everything (-> a 0-dim tensor) or along one
 * dim (negative dims count from the end; keepdim keeps it as size 1),
 * forward and backward.
 *
 * Accuracy: every sum accumulates in double (16 lanes for contiguous runs,
 * whole rows for sums along a non-last dim), so the error does not grow
 * with the length; results are rounded to float once. */
#include <string.h>

#include "core/core_impl.h"
#include "backends/cpu/cpu_impl.h"

/* Sum of x (n) over 16 double lanes (the float -> double adds vectorise). */
static double sum_f32(const float *restrict x, int64_t n) {
  double acc[16] = {0}, s = 0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; l++) acc[l] += x[i + l];
  for (; i < n; i++) s += x[i];
  for (int l = 0; l < 16; l++) s += acc[l];
  return s;
}

/* ---- sum / mean over all elements ---- */

static int sum_all_backward(dg_ctx *ctx, dg_node *nd) {
  int overwrite;
  float *restrict dx = dg__grad_buf_w(ctx, nd->in[0], &overwrite); /* (x shape) */
  if (!dx) return ctx->err;
  float g = ((const float *)nd->out->grad->data)[0] * (float)nd->f[0];
  int64_t n = dg__numel(nd->in[0]);
  if (overwrite) for (int64_t i = 0; i < n; i++) dx[i] = g;
  else for (int64_t i = 0; i < n; i++) dx[i] += g;
  return DG_OK;
}

static dg_tensor *sum_all(dg_ctx *ctx, const char *name, dg_tensor *x, int mean) {
  if (!ctx || dg__null_input(ctx, name, "x", x) || !dg__check_f32(ctx, name, "x", x))
    return NULL;
  dg_tensor *y = dg__new(ctx, name, DG_F32, 0, NULL); /* () */
  const float *xp = y ? dg__contig_data(ctx, name, x) : NULL;
  if (!xp) return NULL;
  int64_t n = dg__numel(x);
  double s = sum_f32(xp, n);
  double scale = mean ? 1.0 / (double)n : 1.0; /* mean of nothing: 0 * inf = nan, like torch */
  ((float *)y->data)[0] = (float)(s * scale);
  if (dg__needs_grad(ctx, 1, &x)) {
    dg_node *nd = dg__record(ctx, name, sum_all_backward, y, 1, &x);
    if (!nd) return NULL;
    nd->f[0] = scale;
  }
  return y;
}

dg_tensor *dg_sum(dg_ctx *ctx, dg_tensor *x) { return sum_all(ctx, "sum", x, 0); }
dg_tensor *dg_mean(dg_ctx *ctx, dg_tensor *x) { return sum_all(ctx, "mean", x, 1); }

/* ---- sum / mean along one dim: x viewed as (O, D, I) -> (O, I) ---- */

static int sum_dim_backward(dg_ctx *ctx, dg_node *nd) {
  int overwrite;
  float *dx = dg__grad_buf_w(ctx, nd->in[0], &overwrite); /* (O, D, I) */
  if (!dx) return ctx->err;
  const float *g = nd->out->grad->data; /* (O, I) */
  int64_t O = nd->i[0], D = nd->i[1], I = nd->i[2];
  float scale = (float)nd->f[0];
  for (int64_t o = 0; o < O; o++) {
    const float *restrict go = g + o * I;
    for (int64_t d = 0; d < D; d++) {
      float *restrict row = dx + (o * D + d) * I;
      if (overwrite) for (int64_t j = 0; j < I; j++) row[j] = scale * go[j];
      else for (int64_t j = 0; j < I; j++) row[j] += scale * go[j];
    }
  }
  return DG_OK;
}

/* y (O, I) = scale * sum over D of x (O, D, I); acc (I) is double scratch. */
static void sum_mid(const float *x, int64_t O, int64_t D, int64_t I, double scale,
                    double *restrict acc, float *restrict y) {
  for (int64_t o = 0; o < O; o++) {
    if (I == 1) { /* reducing the last dim: contiguous rows */
      y[o] = (float)(sum_f32(x + o * D, D) * scale);
      continue;
    }
    memset(acc, 0, (size_t)I * sizeof *acc);
    for (int64_t d = 0; d < D; d++) {
      const float *restrict row = x + (o * D + d) * I;
      for (int64_t j = 0; j < I; j++) acc[j] += row[j];
    }
    for (int64_t j = 0; j < I; j++) y[o * I + j] = (float)(acc[j] * scale);
  }
}

static dg_tensor *sum_dim(dg_ctx *ctx, const char *name, dg_tensor *x, int dim, int keepdim,
                          int mean) {
  if (!ctx || dg__null_input(ctx, name, "x", x) || !dg__check_f32(ctx, name, "x", x))
    return NULL;
  int nd = x->ndim, d = dim < 0 ? dim + (nd ? nd : 1) : dim;
  if (d < 0 || d >= (nd ? nd : 1)) {
    char sx[96];
    dg__set_error(ctx, DG_EINVAL, "%s: dim %d out of range for %s", name, dim,
                  dg__shape_str(x, sx, sizeof sx));
    return NULL;
  }
  int64_t O = 1, D = nd ? x->shape[d] : 1, I = 1, shape[DG_MAX_DIMS];
  int ond = 0;
  for (int i = 0; i < nd; i++) {
    if (i < d) O *= x->shape[i];
    if (i > d) I *= x->shape[i];
    if (i != d) shape[ond++] = x->shape[i];
    else if (keepdim) shape[ond++] = 1;
  }
  dg_tensor *y = dg__new(ctx, name, DG_F32, ond, shape);
  const float *xp = y ? dg__contig_data(ctx, name, x) : NULL;
  double *acc = xp ? dg__arena_alloc(&ctx->arena, (size_t)(I ? I : 1) * sizeof *acc) : NULL;
  if (!acc) {
    if (xp) dg__set_error(ctx, DG_ENOMEM, "%s: out of memory", name);
    return NULL;
  }
  double scale = mean ? 1.0 / (double)D : 1.0; /* D = 0: 0 * inf = nan, like torch */
  sum_mid(xp, O, D, I, scale, acc, y->data);
  if (dg__needs_grad(ctx, 1, &x)) {
    dg_node *n = dg__record(ctx, name, sum_dim_backward, y, 1, &x);
    if (!n) return NULL;
    n->i[0] = O, n->i[1] = D, n->i[2] = I;
    n->f[0] = scale;
  }
  return y;
}

dg_tensor *dg_sum_dim(dg_ctx *ctx, dg_tensor *x, int dim, int keepdim) {
  return sum_dim(ctx, "sum_dim", x, dim, keepdim, 0);
}

dg_tensor *dg_mean_dim(dg_ctx *ctx, dg_tensor *x, int dim, int keepdim) {
  return sum_dim(ctx, "mean_dim", x, dim, keepdim, 1);
}
