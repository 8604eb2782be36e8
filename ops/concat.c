/* concat and split along any dim, forward and backward.
 *
 * Both see a tensor as (outer, size along dim, inner): a part occupies
 * columns [off, off + size) of every outer row, so copies and gradients are
 * `outer` contiguous blocks of size * inner floats.
 *
 * concat: a node takes at most DG_NODE_MAX_IN inputs, so n inputs are recorded
 * as ceil(n / 4) nodes that share the one output; each routes its inputs'
 * slices of the output gradient (the tape runs all of them once the output's
 * gradient is final). No intermediate copies.
 * split: each part is its own node. A part is a view (no copy) when it is
 * contiguous in x (x contiguous and nothing before dim bigger than 1), else a
 * contiguous copy. The kernels are the backend's (backends/kern_concat.h). */
#include <stdio.h>

#include "backends/kern_concat.h"
#include "core/core_impl.h"

/* outer and inner of t around dim. */
static void split_dims(const dg_tensor *t, int dim, int64_t *outer, int64_t *inner) {
  *outer = *inner = 1;
  for (int i = 0; i < dim; i++) *outer *= t->shape[i];
  for (int i = dim + 1; i < t->ndim; i++) *inner *= t->shape[i];
}

/* ---- concat ---- */

/* node->i: 0 = dim, 1 = offset along dim of in[0]. */
static int concat_backward(dg_ctx *ctx, dg_node *n) {
  int dim = (int)n->i[0];
  int64_t off = n->i[1], outer, inner, S = n->out->shape[dim];
  split_dims(n->out, dim, &outer, &inner);
  const dg__backend *be = dg__backend_get(n->out->device);
  const float *dy = n->out->grad->data; /* (outer, S, inner) */
  for (int k = 0; k < n->nin; k++) {
    int64_t sk = n->in[k]->shape[dim];
    int overwrite;
    float *dx = dg__grad_buf_w(ctx, n->in[k], &overwrite); /* (outer, sk, inner) */
    if (ctx->err) return ctx->err;
    if (dx) {
      dg__blocks_args a = {dx, dy + off * inner, sk * inner, S * inner, outer, sk * inner,
                           overwrite};
      be->concat->add_blocks(&a);
    }
    off += sk;
  }
  return DG_OK;
}

/* dg__op_begin over the n inputs, named "xs[k]" in messages (names on the
 * stack for up to CAT_NAMES inputs, else in the arena). */
#define CAT_NAMES 32
static const dg__backend *concat_begin(dg_ctx *ctx, int n, dg_tensor *const *xs) {
  char buf[CAT_NAMES][16], *text = buf[0];
  const char *stack_names[CAT_NAMES], **names = stack_names;
  if (n > CAT_NAMES) {
    names = dg__arena_alloc(&ctx->arena, (size_t)n * (sizeof *names + 16));
    if (!names) {
      dg__set_error(ctx, DG_ENOMEM, "concat: out of memory");
      return NULL;
    }
    text = (char *)(names + n);
  }
  for (int k = 0; k < n; k++) {
    snprintf(text + 16 * k, 16, "xs[%d]", k);
    names[k] = text + 16 * k;
  }
  return dg__op_begin(ctx, "concat", n, xs, names, 0);
}

static int concat_check(dg_ctx *ctx, int n, dg_tensor *const *xs, int *dim) {
  for (int k = 0; k < n; k++) {
    char nm[32];
    snprintf(nm, sizeof nm, "xs[%d]", k);
    if (!dg__check_f32(ctx, "concat", nm, xs[k])) return ctx->err;
  }
  char s0[96], sk[96];
  int nd = xs[0]->ndim, d = *dim < 0 ? *dim + nd : *dim;
  if (d < 0 || d >= nd)
    return dg__set_error(ctx, DG_EINVAL, "concat: dim %d out of range for %s", *dim,
                         dg__shape_str(xs[0], s0, sizeof s0));
  for (int k = 1; k < n; k++) {
    int ok = xs[k]->ndim == nd;
    for (int i = 0; ok && i < nd; i++) ok = i == d || xs[k]->shape[i] == xs[0]->shape[i];
    if (!ok)
      return dg__set_error(ctx, DG_ESHAPE, "concat: xs[%d] %s does not match xs[0] %s outside dim %d",
                           k, dg__shape_str(xs[k], sk, sizeof sk),
                           dg__shape_str(xs[0], s0, sizeof s0), d);
  }
  *dim = d;
  return DG_OK;
}

/* Records the nodes routing y's gradient back to the n inputs. */
static int concat_record(dg_ctx *ctx, int n, dg_tensor *const *xs, int dim, dg_tensor *y) {
  int64_t off = 0;
  for (int k0 = 0; k0 < n; k0 += DG_NODE_MAX_IN) {
    int m = DG_MIN(DG_NODE_MAX_IN, n - k0);
    if (dg__needs_grad(ctx, m, xs + k0)) {
      dg_node *nd = dg__record(ctx, "concat", concat_backward, y, m, xs + k0);
      if (!nd) return ctx->err;
      nd->i[0] = dim, nd->i[1] = off;
    }
    for (int k = k0; k < k0 + m; k++) off += xs[k]->shape[dim];
  }
  return DG_OK;
}

dg_tensor *dg_concat(dg_ctx *ctx, int n, dg_tensor *const *xs, int dim) {
  if (!ctx) return NULL;
  if (n < 1 || !xs) {
    dg__set_error(ctx, DG_EINVAL, "concat: need at least one input, got %d", n);
    return NULL;
  }
  const dg__backend *be = concat_begin(ctx, n, xs);
  if (!be || concat_check(ctx, n, xs, &dim))
    return NULL;
  int64_t shape[DG_MAX_DIMS], S = 0, outer, inner;
  for (int i = 0; i < xs[0]->ndim; i++) shape[i] = xs[0]->shape[i];
  for (int k = 0; k < n; k++) S += xs[k]->shape[dim];
  shape[dim] = S;
  dg_tensor *y = dg__new(ctx, "concat", DG_F32, xs[0]->ndim, shape);
  if (!y) return NULL;
  split_dims(y, dim, &outer, &inner);
  float *yp = y->data; /* (outer, S, inner) */
  int64_t off = 0;
  for (int k = 0; k < n; k++) {
    int64_t len = xs[k]->shape[dim] * inner;
    const float *x = dg__contig_data(ctx, "concat", xs[k]); /* (outer, sk, inner) */
    if (!x) return NULL;
    dg__blocks_args a = {yp + off * inner, x, S * inner, len, outer, len, 1};
    be->concat->copy_blocks(&a);
    off += xs[k]->shape[dim];
  }
  if (concat_record(ctx, n, xs, dim, y)) return NULL;
  return y;
}

/* ---- split ---- */

/* node->i: 0 = dim, 1 = offset of the part along dim. */
static int split_backward(dg_ctx *ctx, dg_node *n) {
  dg_tensor *x = n->in[0];
  int overwrite;
  float *dx = dg__grad_buf_w(ctx, x, &overwrite); /* (outer, S, inner) */
  if (!dx) return ctx->err;
  int dim = (int)n->i[0];
  int64_t off = n->i[1], outer, inner, S = x->shape[dim], sk = n->out->shape[dim];
  split_dims(x, dim, &outer, &inner);
  dg__split_bwd_args a = {dx, n->out->grad->data, outer, S, sk, off, inner, overwrite};
  dg__backend_get(x->device)->concat->split_bwd(&a);
  return DG_OK;
}

static int split_check(dg_ctx *ctx, dg_tensor *x, int *dim, int n, const int64_t *sizes) {
  if (!dg__check_f32(ctx, "split", "x", x)) return ctx->err;
  char sx[96];
  int d = *dim < 0 ? *dim + x->ndim : *dim;
  if (d < 0 || d >= x->ndim)
    return dg__set_error(ctx, DG_EINVAL, "split: dim %d out of range for %s", *dim,
                         dg__shape_str(x, sx, sizeof sx));
  int64_t total = 0;
  for (int k = 0; k < n; k++) {
    if (sizes[k] < 0)
      return dg__set_error(ctx, DG_EINVAL, "split: sizes[%d] = %lld is negative", k,
                           (long long)sizes[k]);
    total += sizes[k];
  }
  if (total != x->shape[d])
    return dg__set_error(ctx, DG_ESHAPE, "split: sizes sum to %lld but x %s has %lld along dim %d",
                         (long long)total, dg__shape_str(x, sx, sizeof sx),
                         (long long)x->shape[d], d);
  *dim = d;
  return DG_OK;
}

/* Part [off, off + size) of x along dim: a view when contiguous, else a copy. */
static dg_tensor *split_part(dg_ctx *ctx, const dg__backend *be, dg_tensor *x, const float *xp,
                             int dim, int64_t off, int64_t size) {
  int64_t outer, inner, S = x->shape[dim];
  split_dims(x, dim, &outer, &inner);
  dg_tensor *y;
  if (outer == 1 && dg__is_contig(x)) {
    y = dg__alias(ctx, "split", x);
    if (!y) return NULL;
    y->data = (float *)x->data + off * inner;
    y->shape[dim] = size;
    dg__set_contig_strides(y);
  } else {
    int64_t shape[DG_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) shape[i] = x->shape[i];
    shape[dim] = size;
    y = dg__new(ctx, "split", DG_F32, x->ndim, shape);
    if (!y) return NULL;
    dg__blocks_args a = {y->data, xp + off * inner, size * inner, S * inner, outer, size * inner,
                         1}; /* (outer, size, inner) from (outer, S, inner) */
    be->concat->copy_blocks(&a);
  }
  if (dg__needs_grad(ctx, 1, &x)) {
    dg_node *n = dg__record(ctx, "split", split_backward, y, 1, &x);
    if (!n) return NULL;
    n->i[0] = dim, n->i[1] = off;
  }
  return y;
}

int dg_split(dg_ctx *ctx, dg_tensor *x, int dim, int n, const int64_t *sizes, dg_tensor **out) {
  if (!ctx) return DG_EINVAL;
  if (!out || n < 1 || !sizes)
    return dg__set_error(ctx, DG_EINVAL, "split: need n >= 1 sizes and an output array, got n = %d", n);
  for (int k = 0; k < n; k++) out[k] = NULL;
  const dg__backend *be = dg__op_begin(ctx, "split", 1, &x, (const char *[]){"x"}, 0);
  if (!be) return ctx->err;
  if (split_check(ctx, x, &dim, n, sizes))
    return ctx->err;
  const float *xp = dg__contig_data(ctx, "split", x); /* (outer, S, inner) */
  if (!xp) return ctx->err;
  int64_t off = 0;
  for (int k = 0; k < n; k++) {
    out[k] = split_part(ctx, be, x, xp, dim, off, sizes[k]);
    if (!out[k]) {
      for (int j = 0; j < k; j++) out[j] = NULL;
      return ctx->err;
    }
    off += sizes[k];
  }
  return DG_OK;
}
