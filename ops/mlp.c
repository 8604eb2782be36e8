/* Fused transformer MLP, forward and backward.
 *
 * dg_mlp_gelu(x (R, C), w1 (F, C), b1 (F), w2 (O, F), b2 (O)) -> y (R, O):
 *
 *   h = x w1^T + b1   (R, F)  pre-activation, saved
 *   g = gelu(h)       (R, F)  tanh form, never kept
 *   y = g w2^T + b2   (R, O)
 *
 * Rows go by blocks of MLP_BLOCK_FLOATS / F, so g lives only in a block
 * of step scratch (reused by every layer) and the element-wise passes run
 * on L2-resident blocks. Biases are copied into the GEMM outputs first
 * (beta 1 instead of OpenBLAS's clearing for beta 0). Against linear + gelu + linear this keeps one
 * (R, F) activation per layer instead of two, drops two (R, F) gradients
 * from backward, and the GELU input, output and gradient never stream
 * through memory. Backward, per row block, with dy (m, O):
 *
 *   a  = dy w2                 (m, F)
 *   g  = gelu(h), a *= gelu'(h)   (one exp per element for both)
 *   dw2 += dy^T g,  dw1 += a^T x,  db1 += colsum(a),  dx = a w1
 *
 * and db2 = colsum(dy) once. First writers overwrite (beta 0). */
#include <string.h>

#include "core/core_impl.h"
#include "backends/cpu/cpu_impl.h"

#define MLP_BLOCK_FLOATS (1 << 17) /* 512 KiB per scratch block */

/* Rows [r0, r1) of h (., F): g = gelu(h). */
DG_INLINE void gelu_rows_body(const float *restrict h, float *restrict g, int64_t r0, int64_t r1,
                              int64_t F) {
  for (int64_t i = r0 * F; i < r1 * F; i++) g[i] = dg__gelu(h[i]);
}
DG_SIMD_FN(gelu_rows, (const float *h, float *g, int64_t r0, int64_t r1, int64_t F),
           (h, g, r0, r1, F))

/* Elements [lo, hi): g = gelu(h), a *= gelu'(h), sharing the sigmoid.
 * h, saved in forward, comes from far away (a and g are in L2): it is
 * prefetched GELU_PF floats ahead, one line per 16. */
#define GELU_PF 1024
DG_INLINE void gelu_bwd_one(const float *restrict h, float *restrict a, float *restrict g,
                            int64_t i) {
  float v = h[i], v2 = v * v, s = dg__gelu_s(v, v2);
  g[i] = v * s;
  a[i] *= dg__gelu_grad_s(v, v2, s);
}
DG_INLINE void gelu_bwd_body(const float *restrict h, float *restrict a, float *restrict g,
                             int64_t lo, int64_t hi) {
  int64_t i = lo;
  for (; i + 64 <= hi; i += 64) {
    for (int k = 0; k < 64; k += 16) __builtin_prefetch(h + i + GELU_PF + k);
    for (int k = 0; k < 64; k++) gelu_bwd_one(h, a, g, i + k);
  }
  for (; i < hi; i++) gelu_bwd_one(h, a, g, i);
}
DG_SIMD_FN(gelu_bwd, (const float *h, float *a, float *g, int64_t lo, int64_t hi),
           (h, a, g, lo, hi))

typedef struct {
  float *h, *g, *a;
  int64_t F;
} ew_job;

static void gelu_rows_task(void *arg, int64_t lo, int64_t hi) {
  const ew_job *j = arg;
  gelu_rows(j->h, j->g, lo, hi, j->F);
}
static void gelu_bwd_task(void *arg, int64_t lo, int64_t hi) {
  const ew_job *j = arg;
  gelu_bwd(j->h, j->a, j->g, lo, hi);
}

static int64_t block_rows(int64_t F) {
  return DG_MAX((int64_t)1, MLP_BLOCK_FLOATS / DG_MAX(F, (int64_t)1));
}

/* Rows split over the pool at about DG_GRAIN_COMPUTE elements each. */
static int64_t row_grain(int64_t F) {
  return DG_MAX((int64_t)1, DG_GRAIN_COMPUTE / DG_MAX(F, (int64_t)1));
}

typedef struct {
  int64_t R, C, F, O;
  const float *x, *w1, *w2, *h, *dy; /* saved and incoming */
  float *dx, *dw1, *db1, *dw2;       /* NULL when not wanted */
  int ox, o1, ob1, o2;               /* 1: first write overwrites */
} mlp_bwd;

/* Backward of rows [r0, r0 + m) with scratch a, g (m, F). */
static void bwd_block(const mlp_bwd *p, int64_t r0, int64_t m, float *a, float *g, int first) {
  int64_t C = p->C, F = p->F, O = p->O;
  const float *dy = p->dy + r0 * O, *x = p->x + r0 * C, *h = p->h + r0 * F;
  dg__sgemm(0, 0, m, F, O, 1.0f, dy, O, p->w2, F, 0.0f, a, F); /* dy (m,O) w2 (O,F) */
  ew_job j = {.h = (float *)h, .g = g, .a = a};
  dg__parallel_range(m * F, DG_GRAIN_COMPUTE, gelu_bwd_task, &j);
  if (p->dw2) /* dy^T (O,m) g (m,F) */
    dg__sgemm(1, 0, O, F, m, 1.0f, dy, O, g, F, first && p->o2 ? 0.0f : 1.0f, p->dw2, F);
  if (p->dw1) /* a^T (F,m) x (m,C) */
    dg__sgemm(1, 0, F, C, m, 1.0f, a, F, x, C, first && p->o1 ? 0.0f : 1.0f, p->dw1, C);
  if (p->db1) dg__colsum(p->db1, a, m, F, first && p->ob1);
  if (p->dx) /* a (m,F) w1 (F,C) */
    dg__sgemm(0, 0, m, C, F, 1.0f, a, F, p->w1, C, p->ox ? 0.0f : 1.0f, p->dx + r0 * C, C);
}

static int mlp_backward(dg_ctx *ctx, dg_node *n) {
  const char *op = "mlp_gelu backward";
  dg_tensor *sx = dg__saved(ctx, n, 0), *sw1 = dg__saved(ctx, n, 1);
  dg_tensor *sw2 = dg__saved(ctx, n, 2), *sh = dg__saved(ctx, n, 3);
  if (!sx || !sw1 || !sw2 || !sh) return ctx->err;
  mlp_bwd p = {.R = n->i[0], .C = n->i[1], .F = n->i[2], .O = n->i[3]};
  p.x = dg__contig_data(ctx, op, sx);
  p.w1 = dg__contig_data(ctx, op, sw1);
  p.w2 = dg__contig_data(ctx, op, sw2);
  p.h = dg__contig_data(ctx, op, sh);
  if (!p.x || !p.w1 || !p.w2 || !p.h) return ctx->err;
  p.dy = n->out->grad->data;
  int ob2;
  p.dx = dg__grad_buf_w(ctx, n->in[0], &p.ox);
  p.dw1 = dg__grad_buf_w(ctx, n->in[1], &p.o1);
  p.db1 = dg__grad_buf_w(ctx, n->in[2], &p.ob1);
  p.dw2 = dg__grad_buf_w(ctx, n->in[3], &p.o2);
  float *db2 = dg__grad_buf_w(ctx, n->in[4], &ob2);
  if (ctx->err) return ctx->err;
  if (db2) dg__colsum(db2, p.dy, p.R, p.O, ob2);
  if (n->nin > 5) { /* dg_mlp_gelu_add: the residual's gradient is dy */
    int orr;
    float *dr = dg__grad_buf_w(ctx, n->in[5], &orr);
    if (ctx->err) return ctx->err;
    if (dr) dg__grad_pass(dr, p.dy, p.R * p.O, !orr);
  }
  if (!p.dx && !p.dw1 && !p.db1 && !p.dw2) return DG_OK;
  int64_t rb = DG_MIN(block_rows(p.F), p.R);
  size_t bytes = (size_t)(rb * p.F) * sizeof(float);
  float *a = dg__scratch_take(ctx, bytes), *g = a ? dg__scratch_take(ctx, bytes) : NULL;
  if (!g) return ctx->err;
  for (int64_t r0 = 0; r0 < p.R; r0 += rb) bwd_block(&p, r0, DG_MIN(rb, p.R - r0), a, g, r0 == 0);
  dg__scratch_give(ctx, g, bytes);
  dg__scratch_give(ctx, a, bytes);
  return DG_OK;
}

static int mlp_check(dg_ctx *ctx, dg_tensor *x, dg_tensor *w1, dg_tensor *b1, dg_tensor *w2,
                     dg_tensor *b2) {
  const char *op = "mlp_gelu";
  if (dg__null_input(ctx, op, "x", x) || dg__null_input(ctx, op, "w1", w1) ||
      dg__null_input(ctx, op, "w2", w2))
    return DG_EINVAL;
  if (!dg__check_f32(ctx, op, "x", x) || !dg__check_f32(ctx, op, "w1", w1) ||
      !dg__check_f32(ctx, op, "w2", w2) || (b1 && !dg__check_f32(ctx, op, "b1", b1)) ||
      (b2 && !dg__check_f32(ctx, op, "b2", b2)))
    return ctx->err;
  int64_t C = x->ndim ? x->shape[x->ndim - 1] : 0;
  if (x->ndim < 1 || w1->ndim != 2 || w1->shape[1] != C || w2->ndim != 2 ||
      w2->shape[1] != w1->shape[0] || (b1 && (b1->ndim != 1 || b1->shape[0] != w1->shape[0])) ||
      (b2 && (b2->ndim != 1 || b2->shape[0] != w2->shape[0]))) {
    char s[5][96];
    return dg__set_error(ctx, DG_ESHAPE,
                         "mlp_gelu: x %s, w1 %s (want (F, %lld)), b1 %s, w2 %s (want (O, F)), "
                         "b2 %s",
                         dg__shape_str(x, s[0], 96), dg__shape_str(w1, s[1], 96), (long long)C,
                         b1 ? dg__shape_str(b1, s[2], 96) : "none",
                         dg__shape_str(w2, s[3], 96), b2 ? dg__shape_str(b2, s[4], 96) : "none");
  }
  return DG_OK;
}

/* Forward over row blocks; h (R, F) is written whole when saved, else
 * block by block into scratch. */
static void mlp_fwd_rows(const float *x, const float *w1, const float *b1, const float *w2,
                         const float *b2, const float *res, float *h, int h_whole, float *g,
                         float *y, int64_t R, int64_t C, int64_t F, int64_t O) {
  int64_t rb = block_rows(F);
  for (int64_t r0 = 0; r0 < R; r0 += rb) {
    int64_t m = DG_MIN(rb, R - r0);
    float *hb = h_whole ? h + r0 * F : h, *yb = y + r0 * O;
    dg__fill_rows(hb, NULL, b1, m, F);
    dg__sgemm(0, 1, m, F, C, 1.0f, x + r0 * C, C, w1, C, b1 ? 1.0f : 0.0f, hb, F); /* + x w1^T */
    ew_job j = {.h = hb, .g = g, .F = F};
    dg__parallel_range(m, row_grain(F), gelu_rows_task, &j);
    dg__fill_rows(yb, res ? res + r0 * O : NULL, b2, m, O);
    dg__sgemm(0, 1, m, O, F, 1.0f, g, F, w2, F, b2 || res ? 1.0f : 0.0f, yb, O); /* + g w2^T */
  }
}

static dg_tensor *mlp_impl(dg_ctx *ctx, dg_tensor *x, dg_tensor *w1, dg_tensor *b1,
                           dg_tensor *w2, dg_tensor *b2, dg_tensor *res) {
  const char *op = "mlp_gelu";
  if (!ctx || mlp_check(ctx, x, w1, b1, w2, b2)) return NULL;
  int64_t C = x->shape[x->ndim - 1], F = w1->shape[0], O = w2->shape[0];
  int64_t R = 1;
  for (int i = 0; i < x->ndim - 1; i++) R *= x->shape[i];
  int64_t shape[DG_MAX_DIMS];
  for (int i = 0; i < x->ndim; i++) shape[i] = x->shape[i];
  shape[x->ndim - 1] = O;
  dg_tensor *y = dg__new(ctx, op, DG_F32, x->ndim, shape);
  if (!y) return NULL;
  if (res && !dg__same_shape(res, y)) {
    char sr[96], sy[96];
    dg__set_error(ctx, DG_ESHAPE, "mlp_gelu_add: residual %s, want the output's shape %s",
                  dg__shape_str(res, sr, sizeof sr), dg__shape_str(y, sy, sizeof sy));
    return NULL;
  }
  const float *rp = res ? dg__contig_data(ctx, op, res) : NULL;
  if (res && !rp) return NULL;
  const float *xp = dg__contig_data(ctx, op, x), *w1p = dg__contig_data(ctx, op, w1);
  const float *w2p = dg__contig_data(ctx, op, w2);
  const float *b1p = b1 ? dg__contig_data(ctx, op, b1) : NULL;
  const float *b2p = b2 ? dg__contig_data(ctx, op, b2) : NULL;
  if (!xp || !w1p || !w2p || (b1 && !b1p) || (b2 && !b2p)) return NULL;
  dg_tensor *in[6] = {x, w1, b1, w2, b2, res};
  int grad = dg__needs_grad(ctx, 6, in);
  int64_t hshape[2] = {R, F}, rb = DG_MIN(block_rows(F), R);
  size_t bytes = (size_t)(DG_MAX(rb, (int64_t)1) * F) * sizeof(float);
  dg_tensor *h = grad ? dg__new(ctx, op, DG_F32, 2, hshape) : NULL;
  float *hs = grad ? NULL : dg__scratch_take(ctx, bytes);
  float *g = (h || hs) ? dg__scratch_take(ctx, bytes) : NULL;
  if (!g) return NULL;
  if (F > 0) {
    mlp_fwd_rows(xp, w1p, b1p, w2p, b2p, rp, h ? h->data : hs, h != NULL, g, y->data, R, C, F,
                 O);
  } else if (b2p || rp) { /* no hidden units: y = res + b2 */
    dg__fill_rows(y->data, rp, b2p, R, O);
  } else {
    memset(y->data, 0, (size_t)(R * O) * sizeof(float));
  }
  dg__scratch_give(ctx, g, bytes);
  if (hs) dg__scratch_give(ctx, hs, bytes);
  if (grad) {
    dg_node *n = dg__record(ctx, op, mlp_backward, y, res ? 6 : 5, in);
    if (!n || dg__save(ctx, n, x) || dg__save(ctx, n, w1) || dg__save(ctx, n, w2) ||
        dg__save(ctx, n, h))
      return NULL;
    n->i[0] = R, n->i[1] = C, n->i[2] = F, n->i[3] = O;
  }
  return y;
}

dg_tensor *dg_mlp_gelu(dg_ctx *ctx, dg_tensor *x, dg_tensor *w1, dg_tensor *b1, dg_tensor *w2,
                       dg_tensor *b2) {
  return mlp_impl(ctx, x, w1, b1, w2, b2, NULL);
}

dg_tensor *dg_mlp_gelu_add(dg_ctx *ctx, dg_tensor *x, dg_tensor *w1, dg_tensor *b1,
                           dg_tensor *w2, dg_tensor *b2, dg_tensor *res) {
  if (ctx && (dg__null_input(ctx, "mlp_gelu_add", "res", res) ||
              !dg__check_f32(ctx, "mlp_gelu_add", "res", res)))
    return NULL;
  return mlp_impl(ctx, x, w1, b1, w2, b2, res);
}
