/* Views: reshape, slice along dim 0, transpose, permute, and contiguous.
 * Views share the input's memory; backward adds the output gradient back into
 * the input's (logical, contiguous) gradient, or copies it there when that
 * gradient is fresh. The backward kernels are the backend's
 * (backends/kern_view.h). */
#include "backends/kern_view.h"
#include "core/core_impl.h"

_Static_assert(DG_MAX_DIMS <= DG__VIEW_MAX_DIMS, "kern_view.h: DG__VIEW_MAX_DIMS too small");

/* The op prologue of every view: dg__op_begin on x, then the view kernels. */
static const dg__backend *view_begin(dg_ctx *ctx, const char *op, dg_tensor *x) {
  const dg__backend *be = dg__op_begin(ctx, op, 1, &x, (const char *[]){"x"}, 0);
  if (!be) return NULL;
  return be;
}

/* dx += dy where both are contiguous in the same element order (a fresh dx
 * is a copy of dy). */
static int flat_backward(dg_ctx *ctx, dg_node *n) {
  int overwrite;
  float *dx = dg__grad_buf_w(ctx, n->in[0], &overwrite);
  if (!dx) return ctx->err;
  int64_t m = dg__numel(n->out);
  dg__view_range_args a = {dx, n->out->grad->data, m, 0, m, overwrite};
  dg__backend_get(n->in[0]->device)->view->range_bwd(&a);
  return DG_OK;
}

static int record1(dg_ctx *ctx, const char *op, dg_backward_fn fn, dg_tensor *y,
                   dg_tensor *x, dg_node **out) {
  *out = NULL;
  if (!dg__needs_grad(ctx, 1, &x)) return DG_OK;
  *out = dg__record(ctx, op, fn, y, 1, &x);
  return *out ? DG_OK : ctx->err;
}

/* ---- contiguous ---- */

dg_tensor *dg_contiguous(dg_ctx *ctx, dg_tensor *x) {
  if (!view_begin(ctx, "contiguous", x)) return NULL;
  if (dg__is_contig(x)) return x;
  if (x->dtype != DG_F32) return dg__contig_copy(ctx, "contiguous", x); /* no grad to record */
  const float *d = dg__contig_data(ctx, "contiguous", x);
  if (!d) return NULL;
  /* dg__contig_data allocated a fresh arena tensor; wrap it */
  dg_tensor *y = dg__alias(ctx, "contiguous", x);
  if (!y) return NULL;
  y->data = (void *)d;
  dg__set_contig_strides(y);
  dg_node *n;
  if (record1(ctx, "contiguous", flat_backward, y, x, &n)) return NULL;
  return y;
}

/* ---- reshape ---- */

dg_tensor *dg_reshape(dg_ctx *ctx, dg_tensor *x, int ndim, const int64_t *shape) {
  if (!view_begin(ctx, "reshape", x)) return NULL;
  char sx[96];
  if (ndim < 0 || ndim > DG_MAX_DIMS || (ndim && !shape)) {
    dg__set_error(ctx, DG_EINVAL, "reshape: ndim %d outside [0, %d]", ndim, DG_MAX_DIMS);
    return NULL;
  }
  int64_t n = dg__numel(x), sh[DG_MAX_DIMS];
  int infer = -1, bad = 0;
  for (int i = 0; i < ndim; i++) {
    sh[i] = shape[i];
    if (shape[i] == -1 && infer < 0) infer = i, sh[i] = 1;
    else if (shape[i] < 0) bad = 1;
  }
  /* the known sizes' product; a shape no tensor can have (a negative size,
   * or a byte size that overflows) is an invalid argument, not a mismatch */
  int64_t known = bad ? -1 : dg__shape_numel(ndim, sh, sizeof(float));
  char sr[DG_MAX_DIMS * 22 + 4];
  if (known < 0) {
    dg__set_error(ctx, DG_EINVAL, "reshape: %s is not a valid shape (negative size or byte "
                  "size overflow)", dg__dims_str(ndim, shape, sr, sizeof sr));
    return NULL;
  }
  if (infer >= 0 && known > 0 && n % known == 0) sh[infer] = n / known;
  if ((infer >= 0 && (known == 0 || n % known)) || dg__shape_numel(ndim, sh, 1) != n) {
    dg__set_error(ctx, DG_ESHAPE, "reshape: cannot view %s (%lld elements) as %s",
                  dg__shape_str(x, sx, sizeof sx), (long long)n,
                  dg__dims_str(ndim, shape, sr, sizeof sr));
    return NULL;
  }
  dg_tensor *src = x;
  if (!dg__is_contig(x)) src = dg_contiguous(ctx, x);
  if (!src) return NULL;
  dg_tensor *y = dg__alias(ctx, "reshape", src);
  if (!y) return NULL;
  y->ndim = ndim;
  for (int i = 0; i < ndim; i++) y->shape[i] = sh[i];
  dg__set_contig_strides(y);
  dg_node *nd;
  if (record1(ctx, "reshape", flat_backward, y, src, &nd)) return NULL;
  return y;
}

/* ---- slice along dim 0 ---- */

static int slice_backward(dg_ctx *ctx, dg_node *n) {
  int overwrite;
  float *dx = dg__grad_buf_w(ctx, n->in[0], &overwrite);
  if (!dx) return ctx->err;
  dg_tensor *x = n->in[0];
  int64_t row = x->shape[0] ? dg__numel(x) / x->shape[0] : 0;
  int64_t lo = n->i[0] * row, m = dg__numel(n->out), nx = dg__numel(x);
  /* fresh: zero outside the slice, copy inside */
  dg__view_range_args a = {dx, n->out->grad->data, m, lo, nx, overwrite};
  dg__backend_get(x->device)->view->range_bwd(&a);
  return DG_OK;
}

dg_tensor *dg_slice(dg_ctx *ctx, dg_tensor *x, int64_t start, int64_t end) {
  if (!view_begin(ctx, "slice", x)) return NULL;
  char sx[96];
  if (x->ndim < 1 || start < 0 || end < start || end > x->shape[0]) {
    dg__set_error(ctx, DG_ESHAPE, "slice: rows [%lld, %lld) out of range for %s",
                  (long long)start, (long long)end, dg__shape_str(x, sx, sizeof sx));
    return NULL;
  }
  dg_tensor *y = dg__alias(ctx, "slice", x);
  if (!y) return NULL;
  y->data = (char *)x->data + start * x->stride[0] * (int64_t)dg_dtype_size(x->dtype);
  y->shape[0] = end - start;
  dg_node *n;
  if (record1(ctx, "slice", slice_backward, y, x, &n)) return NULL;
  if (n) n->i[0] = start;
  return y;
}

/* ---- transpose / permute ---- */

static int permute_backward(dg_ctx *ctx, dg_node *n) {
  dg_tensor *x = n->in[0];
  int overwrite;
  float *dx = dg__grad_buf_w(ctx, x, &overwrite);
  if (!dx) return ctx->err;
  /* dx laid out contiguously in x's shape, seen through the permutation */
  int64_t cs[DG_MAX_DIMS], vs[DG_MAX_DIMS], s = 1;
  for (int i = x->ndim - 1; i >= 0; i--) cs[i] = s, s *= x->shape[i];
  for (int i = 0; i < n->out->ndim; i++) vs[i] = cs[n->i[i]];
  dg__view_strided_args a = {dx, n->out->grad->data, n->out->ndim, n->out->shape, vs, overwrite};
  dg__backend_get(x->device)->view->strided_bwd(&a);
  return DG_OK;
}

dg_tensor *dg_permute(dg_ctx *ctx, dg_tensor *x, const int *perm) {
  if (!view_begin(ctx, "permute", x)) return NULL;
  int seen[DG_MAX_DIMS] = {0};
  for (int i = 0; perm && i < x->ndim; i++) {
    if (perm[i] < 0 || perm[i] >= x->ndim || seen[perm[i]]++) perm = NULL;
  }
  if (!perm) {
    char sx[96];
    dg__set_error(ctx, DG_EINVAL, "permute: not a permutation of the %d dims of %s", x->ndim,
                  dg__shape_str(x, sx, sizeof sx));
    return NULL;
  }
  dg_tensor *y = dg__alias(ctx, "permute", x);
  if (!y) return NULL;
  for (int i = 0; i < x->ndim; i++) {
    y->shape[i] = x->shape[perm[i]];
    y->stride[i] = x->stride[perm[i]];
  }
  dg_node *n;
  if (record1(ctx, "permute", permute_backward, y, x, &n)) return NULL;
  if (n)
    for (int i = 0; i < x->ndim; i++) n->i[i] = perm[i];
  return y;
}

dg_tensor *dg_transpose(dg_ctx *ctx, dg_tensor *x, int d0, int d1) {
  if (!view_begin(ctx, "transpose", x)) return NULL;
  if (d0 < 0) d0 += x->ndim;
  if (d1 < 0) d1 += x->ndim;
  if (d0 < 0 || d1 < 0 || d0 >= x->ndim || d1 >= x->ndim) {
    char sx[96];
    dg__set_error(ctx, DG_EINVAL, "transpose: dims %d, %d out of range for %s", d0, d1,
                  dg__shape_str(x, sx, sizeof sx));
    return NULL;
  }
  int perm[DG_MAX_DIMS] = {0, 1, 2, 3};
  perm[d0] = d1;
  perm[d1] = d0;
  return dg_permute(ctx, x, perm);
}
