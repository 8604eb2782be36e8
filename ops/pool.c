/* Pooling, NCHW, no padding (the ops: validation, recording, backward
 * wiring): maxpool2d, avgpool2d, global_avgpool2d.
 *
 * maxpool2d keeps, for every output, the index of its maximum inside the
 * input plane (H*W, int32) in the arena; backward scatters dy through those
 * indices. Ties go to the first maximum in row-major window order and a NaN
 * wins, as in PyTorch's CPU kernel. The average pools save nothing but
 * their geometry: backward spreads dy / (window size) over each window.
 * The kernels are the backend's (backends/kern_pool.h). */
#include "backends/kern_pool.h"
#include "core/core_impl.h"

typedef struct {
  dg__maxpool_args a; /* geometry and indices (data pointers unset) */
  const dg__backend *be;
} pool_state;

static int pool_backward(dg_ctx *ctx, dg_node *n) {
  const pool_state *st = n->extra;
  int overwrite;
  float *dx = dg__grad_buf_w(ctx, n->in[0], &overwrite); /* (N*C, H, W) */
  if (!dx) return ctx->err;
  dg__maxpool_args a = st->a;
  a.dy = n->out->grad->data, a.dx = dx, a.acc = !overwrite;
  st->be->pool->maxpool2d_bwd(&a);
  return DG_OK;
}

dg_tensor *dg_maxpool2d(dg_ctx *ctx, dg_tensor *x, int k, int s) {
  const dg__backend *be = dg__op_begin(ctx, "maxpool2d", 1, &x, (const char *[]){"x"}, 0);
  if (!be || !dg__check_f32(ctx, "maxpool2d", "x", x)) return NULL;
  char sx[96];
  if (x->ndim != 4 || k < 1 || s < 1 || x->shape[2] < k || x->shape[3] < k ||
      x->shape[2] * x->shape[3] > INT32_MAX) {
    dg__set_error(ctx, DG_ESHAPE, "maxpool2d: x %s with window %d, stride %d: need (N, C, H, W), "
                  "k >= 1, s >= 1, k <= H and k <= W", dg__shape_str(x, sx, sizeof sx), k, s);
    return NULL;
  }
  dg__maxpool_args a = {.planes = x->shape[0] * x->shape[1], .H = x->shape[2], .W = x->shape[3],
                        .k = k, .s = s};
  a.OH = (a.H - k) / s + 1;
  a.OW = (a.W - k) / s + 1;
  int64_t shape[4] = {x->shape[0], x->shape[1], a.OH, a.OW};
  dg_tensor *y = dg__new(ctx, "maxpool2d", DG_F32, 4, shape);
  const float *xp = y ? dg__contig_data(ctx, "maxpool2d", x) : NULL; /* (N*C, H, W) */
  if (!xp) return NULL;
  const int64_t L = a.OH * a.OW;
  a.idx = dg__op_data(ctx, (size_t)(a.planes * L) * sizeof(int32_t));
  if (!a.idx) {
    dg__set_error(ctx, DG_ENOMEM, "maxpool2d: out of memory for indices");
    return NULL;
  }
  a.x = xp, a.y = y->data;
  be->pool->maxpool2d_fwd(&a);
  if (dg__needs_grad(ctx, 1, &x)) {
    dg_node *n = dg__record(ctx, "maxpool2d", pool_backward, y, 1, &x);
    pool_state *st = n ? dg__arena_alloc(&ctx->arena, sizeof *st) : NULL;
    if (!st) {
      if (n) dg__set_error(ctx, DG_ENOMEM, "maxpool2d: out of memory");
      return NULL;
    }
    st->a = a, st->be = be;
    st->a.x = NULL, st->a.y = NULL;
    n->extra = st;
  }
  return y;
}

/* ---- average pooling ---- */

typedef struct {
  dg__avgpool_args a; /* geometry (data pointers unset) */
  const dg__backend *be;
} avg_state;

static int avg_backward(dg_ctx *ctx, dg_node *n) {
  const avg_state *st = n->extra;
  int overwrite;
  float *dx = dg__grad_buf_w(ctx, n->in[0], &overwrite); /* (N*C, H, W) */
  if (!dx) return ctx->err;
  dg__avgpool_args a = st->a;
  a.dy = n->out->grad->data, a.dx = dx, a.acc = !overwrite; /* dy (N*C, OH, OW) */
  st->be->pool->avgpool2d_bwd(&a);
  return DG_OK;
}

/* y (out_nd, out_shape) from x by the geometry in a; records the node. */
static dg_tensor *avg_run(dg_ctx *ctx, const char *name, const dg__backend *be, dg_tensor *x,
                          dg__avgpool_args a, int out_nd, const int64_t *out_shape) {
  dg_tensor *y = dg__new(ctx, name, DG_F32, out_nd, out_shape);
  const float *xp = y ? dg__contig_data(ctx, name, x) : NULL; /* (N*C, H, W) */
  if (!xp) return NULL;
  a.x = xp, a.y = y->data;
  be->pool->avgpool2d_fwd(&a);
  if (dg__needs_grad(ctx, 1, &x)) {
    dg_node *n = dg__record(ctx, name, avg_backward, y, 1, &x);
    avg_state *st = n ? dg__arena_alloc(&ctx->arena, sizeof *st) : NULL;
    if (!st) {
      if (n) dg__set_error(ctx, DG_ENOMEM, "%s: out of memory", name);
      return NULL;
    }
    st->a = a, st->be = be;
    st->a.x = NULL, st->a.y = NULL;
    n->extra = st;
  }
  return y;
}

dg_tensor *dg_avgpool2d(dg_ctx *ctx, dg_tensor *x, int k, int s) {
  const dg__backend *be = dg__op_begin(ctx, "avgpool2d", 1, &x, (const char *[]){"x"}, 0);
  if (!be || !dg__check_f32(ctx, "avgpool2d", "x", x)) return NULL;
  if (x->ndim != 4 || k < 1 || s < 1 || x->shape[2] < k || x->shape[3] < k) {
    char sx[96];
    dg__set_error(ctx, DG_ESHAPE, "avgpool2d: x %s with window %d, stride %d: need (N, C, H, W), "
                  "k >= 1, s >= 1, k <= H and k <= W", dg__shape_str(x, sx, sizeof sx), k, s);
    return NULL;
  }
  dg__avgpool_args a = {.planes = x->shape[0] * x->shape[1], .H = x->shape[2], .W = x->shape[3],
                        .kh = k, .kw = k, .sh = s, .sw = s};
  a.OH = (a.H - k) / s + 1;
  a.OW = (a.W - k) / s + 1;
  int64_t shape[4] = {x->shape[0], x->shape[1], a.OH, a.OW}; /* (N, C, OH, OW) */
  return avg_run(ctx, "avgpool2d", be, x, a, 4, shape);
}

dg_tensor *dg_global_avgpool2d(dg_ctx *ctx, dg_tensor *x) {
  const dg__backend *be =
      dg__op_begin(ctx, "global_avgpool2d", 1, &x, (const char *[]){"x"}, 0);
  if (!be || !dg__check_f32(ctx, "global_avgpool2d", "x", x)) return NULL;
  if (x->ndim != 4) {
    char sx[96];
    dg__set_error(ctx, DG_ESHAPE, "global_avgpool2d: x %s: need (N, C, H, W)",
                  dg__shape_str(x, sx, sizeof sx));
    return NULL;
  }
  /* one window of H x W per plane; H or W = 0: the mean of nothing, NaN as torch */
  dg__avgpool_args a = {.planes = x->shape[0] * x->shape[1], .H = x->shape[2], .W = x->shape[3],
                        .OH = 1, .OW = 1, .kh = x->shape[2], .kw = x->shape[3], .sh = 1, .sw = 1};
  int64_t shape[2] = {x->shape[0], x->shape[1]}; /* (N, C) */
  return avg_run(ctx, "global_avgpool2d", be, x, a, 2, shape);
}
