/* Reductions (the op: validation, shape inference, recording, backward
 * wiring): sum and mean over everything (-> a 0-dim tensor) or along one
 * dim (negative dims count from the end; keepdim keeps it as size 1).
 * Sums accumulate in double and are rounded to float once; the kernels are
 * the backend's (backends/kern_reduce.h). */
#include "backends/kern_reduce.h"
#include "core/core_impl.h"

/* ---- sum / mean over all elements ---- */

static int sum_all_backward(dg_ctx *ctx, dg_node *nd) {
  int overwrite;
  float *dx = dg__grad_buf_w(ctx, nd->in[0], &overwrite); /* (x shape) */
  if (!dx) return ctx->err;
  const dg__backend *be = dg__backend_get(nd->out->device);
  /* dy: () */
  dg__reduce_args a = {NULL, nd->out->grad->data, dx, 1, dg__numel(nd->in[0]), 1, nd->f[0],
                       NULL, !overwrite};
  be->reduce->sum_bwd(&a);
  return DG_OK;
}

static dg_tensor *sum_all(dg_ctx *ctx, const char *name, dg_tensor *x, int mean) {
  const dg__backend *be = dg__op_begin(ctx, name, 1, &x, (const char *[]){"x"}, 0);
  if (!be || !dg__check_f32(ctx, name, "x", x))
    return NULL;
  dg_tensor *y = dg__new(ctx, name, DG_F32, 0, NULL); /* () */
  const float *xp = y ? dg__contig_data(ctx, name, x) : NULL;
  if (!xp) return NULL;
  int64_t n = dg__numel(x);
  double scale = mean ? 1.0 / (double)n : 1.0; /* mean of nothing: 0 * inf = nan, like torch */
  dg__reduce_args a = {xp, NULL, y->data, 1, n, 1, scale, NULL, 0};
  be->reduce->sum_fwd(&a);
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
  const dg__backend *be = dg__backend_get(nd->out->device);
  /* dy: (O, I) */
  dg__reduce_args a = {NULL, nd->out->grad->data, dx, nd->i[0], nd->i[1], nd->i[2], nd->f[0],
                       NULL, !overwrite};
  be->reduce->sum_dim_bwd(&a);
  return DG_OK;
}

static dg_tensor *sum_dim(dg_ctx *ctx, const char *name, dg_tensor *x, int dim, int keepdim,
                          int mean) {
  const dg__backend *be = dg__op_begin(ctx, name, 1, &x, (const char *[]){"x"}, 0);
  if (!be || !dg__check_f32(ctx, name, "x", x)) return NULL;
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
  double *acc = xp ? dg__op_data(ctx, (size_t)(I ? I : 1) * sizeof *acc) : NULL;
  if (!acc) {
    if (xp) dg__set_error(ctx, DG_ENOMEM, "%s: out of memory", name);
    return NULL;
  }
  double scale = mean ? 1.0 / (double)D : 1.0; /* D = 0: 0 * inf = nan, like torch */
  dg__reduce_args a = {xp, NULL, y->data, O, D, I, scale, acc, 0};
  be->reduce->sum_dim_fwd(&a);
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
