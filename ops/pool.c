/* maxpool2d (NCHW, no padding), forward and backward.
 *
 * Forward keeps, for every output, the index of its maximum inside the input
 * plane (H*W, int32) in the arena; backward scatters dy through those indices.
 * Ties go to the first maximum in row-major window order and a NaN wins, as
 * in PyTorch's CPU kernel. Planes are independent: both passes split them
 * over the pool, and a fresh dx is zeroed plane by plane inside the split. */
#include <math.h>
#include <string.h>

#include "core/core_impl.h"
#include "backends/cpu/cpu_impl.h"

typedef struct {
  int64_t planes, H, W, OH, OW, k, s; /* planes = N*C */
  int32_t *idx;                       /* (N*C, OH, OW) argmax within each H*W plane */
} pool_geom;

/* One plane: y (OH, OW), idx (OH, OW) from x (H, W). */
static void pool_plane(const pool_geom *g, const float *restrict x, float *restrict y,
                       int32_t *restrict idx) {
  const int64_t k = g->k, s = g->s, W = g->W;
  for (int64_t oh = 0; oh < g->OH; oh++)
    for (int64_t ow = 0; ow < g->OW; ow++) {
      int64_t base = oh * s * W + ow * s;
      float m = x[base];
      int64_t mi = base;
      for (int64_t i = 0; i < k; i++) {
        const float *r = x + base + i * W;
        for (int64_t j = 0; j < k; j++) {
          float v = r[j];
          if (v > m || isnan(v)) m = v, mi = base + i * W + j;
        }
      }
      y[oh * g->OW + ow] = m;
      idx[oh * g->OW + ow] = (int32_t)mi;
    }
}

/* The common 2x2 stride-2 window, unrolled. */
static void pool_plane_2x2(const pool_geom *g, const float *restrict x, float *restrict y,
                           int32_t *restrict idx) {
  const int64_t W = g->W;
  for (int64_t oh = 0; oh < g->OH; oh++) {
    const float *r0 = x + 2 * oh * W, *r1 = r0 + W;
    for (int64_t ow = 0; ow < g->OW; ow++) {
      int64_t c = 2 * ow, mi = c;
      float m = r0[c];
      if (r0[c + 1] > m || isnan(r0[c + 1])) m = r0[c + 1], mi = c + 1;
      if (r1[c] > m || isnan(r1[c])) m = r1[c], mi = W + c;
      if (r1[c + 1] > m || isnan(r1[c + 1])) m = r1[c + 1], mi = W + c + 1;
      y[oh * g->OW + ow] = m;
      idx[oh * g->OW + ow] = (int32_t)(2 * oh * W + mi);
    }
  }
}

typedef struct {
  const pool_geom *g;
  const float *x, *dy; /* (planes, H*W), (planes, OH*OW) */
  float *y, *dx;
  int acc;             /* 0: dx is fresh (zero each plane, then scatter) */
} pool_job;

static void fwd_planes(void *arg, int64_t lo, int64_t hi) {
  const pool_job *j = arg;
  const pool_geom *g = j->g;
  const int64_t L = g->OH * g->OW, P = g->H * g->W;
  for (int64_t p = lo; p < hi; p++) {
    if (g->k == 2 && g->s == 2) pool_plane_2x2(g, j->x + p * P, j->y + p * L, g->idx + p * L);
    else pool_plane(g, j->x + p * P, j->y + p * L, g->idx + p * L);
  }
}

static void bwd_planes(void *arg, int64_t lo, int64_t hi) {
  const pool_job *j = arg;
  const pool_geom *g = j->g;
  const int64_t L = g->OH * g->OW, P = g->H * g->W;
  for (int64_t p = lo; p < hi; p++) {
    const float *d = j->dy + p * L;
    const int32_t *ix = g->idx + p * L;
    float *dxp = j->dx + p * P;
    if (!j->acc) memset(dxp, 0, (size_t)P * sizeof *dxp);
    for (int64_t l = 0; l < L; l++) dxp[ix[l]] += d[l];
  }
}

/* Planes per pool chunk: about 16K input elements. */
static int64_t plane_grain(const pool_geom *g) {
  return DG_MAX((int64_t)1, 16384 / DG_MAX(g->H * g->W, (int64_t)1));
}

static int pool_backward(dg_ctx *ctx, dg_node *n) {
  const pool_geom *g = n->extra;
  int overwrite;
  float *dx = dg__grad_buf_w(ctx, n->in[0], &overwrite); /* (N*C, H, W) */
  if (!dx) return ctx->err;
  pool_job j = {g, NULL, n->out->grad->data, NULL, dx, !overwrite};
  dg__parallel_range(g->planes, plane_grain(g), bwd_planes, &j);
  return DG_OK;
}

dg_tensor *dg_maxpool2d(dg_ctx *ctx, dg_tensor *x, int k, int s) {
  if (!ctx || dg__null_input(ctx, "maxpool2d", "x", x)) return NULL;
  if (!dg__check_f32(ctx, "maxpool2d", "x", x)) return NULL;
  char sx[96];
  if (x->ndim != 4 || k < 1 || s < 1 || x->shape[2] < k || x->shape[3] < k ||
      x->shape[2] * x->shape[3] > INT32_MAX) {
    dg__set_error(ctx, DG_ESHAPE, "maxpool2d: x %s with window %d, stride %d: need (N, C, H, W), "
                  "k >= 1, s >= 1, k <= H and k <= W", dg__shape_str(x, sx, sizeof sx), k, s);
    return NULL;
  }
  pool_geom g = {.planes = x->shape[0] * x->shape[1], .H = x->shape[2], .W = x->shape[3],
                 .k = k, .s = s};
  g.OH = (g.H - k) / s + 1;
  g.OW = (g.W - k) / s + 1;
  int64_t shape[4] = {x->shape[0], x->shape[1], g.OH, g.OW};
  dg_tensor *y = dg__new(ctx, "maxpool2d", DG_F32, 4, shape);
  const float *xp = y ? dg__contig_data(ctx, "maxpool2d", x) : NULL; /* (N*C, H, W) */
  if (!xp) return NULL;
  const int64_t L = g.OH * g.OW;
  g.idx = dg__arena_alloc(&ctx->arena, (size_t)(g.planes * L) * sizeof(int32_t));
  if (!g.idx) {
    dg__set_error(ctx, DG_ENOMEM, "maxpool2d: out of memory for indices");
    return NULL;
  }
  pool_job j = {&g, xp, NULL, y->data, NULL, 0};
  dg__parallel_range(g.planes, plane_grain(&g), fwd_planes, &j);
  if (dg__needs_grad(ctx, 1, &x)) {
    dg_node *n = dg__record(ctx, "maxpool2d", pool_backward, y, 1, &x);
    pool_geom *ge = n ? dg__arena_alloc(&ctx->arena, sizeof *ge) : NULL;
    if (!ge) {
      if (n) dg__set_error(ctx, DG_ENOMEM, "maxpool2d: out of memory");
      return NULL;
    }
    *ge = g;
    n->extra = ge;
  }
  return y;
}
