/* Fused transformer MLP kernels of the CPU backend (the op: ops/mlp.c).
 *
 * dg_mlp_gelu(x (R, C), w1 (F, C), b1 (F), w2 (O, F), b2 (O)) -> y (R, O):
 *
 *   h = x w1^T + b1   (R, F)  pre-activation, saved
 *   g = gelu(h)       (R, F)  tanh form, never kept
 *   y = g w2^T + b2   (R, O)
 *
 * Rows go by blocks of MLP_BLOCK_FLOATS / F, so g lives only in a block
 * of step scratch (reused by every layer) and the element-wise passes run
 * on L2-resident blocks. Biases (and the residual) go in with the GEMMs
 * (dg__sgemm_add). Against linear + gelu + linear this keeps one
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

#include "backends/cpu/cpu_impl.h"
#include "backends/kern_mlp.h"

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

/* Forward over row blocks; h (R, F) is written whole when saved, else
 * block by block into scratch. */
static void mlp_fwd_rows(const float *x, const float *w1, const float *b1, const float *w2,
                         const float *b2, const float *res, float *h, int h_whole, float *g,
                         float *y, int64_t R, int64_t C, int64_t F, int64_t O) {
  int64_t rb = block_rows(F);
  for (int64_t r0 = 0; r0 < R; r0 += rb) {
    int64_t m = DG_MIN(rb, R - r0);
    float *hb = h_whole ? h + r0 * F : h, *yb = y + r0 * O;
    dg__gemm_epi e1 = {.bias = b1}, e2 = {.res = res ? res + r0 * O : NULL, .bias = b2};
    dg__sgemm_add(0, 1, m, F, C, x + r0 * C, C, w1, C, &e1, hb, F); /* b1 + x w1^T */
    ew_job j = {.h = hb, .g = g, .F = F};
    dg__parallel_range(m, row_grain(F), gelu_rows_task, &j);
    dg__sgemm_add(0, 1, m, O, F, g, F, w2, F, &e2, yb, O); /* + g w2^T */
  }
}

static int64_t cpu_block_rows(int64_t F) { return block_rows(F); }

static void cpu_mlp_forward(const dg__mlp_args *a) {
  if (a->F > 0) {
    mlp_fwd_rows(a->x, a->w1, a->b1, a->w2, a->b2, a->res, a->h, a->h_whole, a->g, a->y, a->R,
                 a->C, a->F, a->O);
  } else if (a->b2 || a->res) { /* no hidden units: y = res + b2 */
    dg__fill_rows(a->y, a->res, a->b2, a->R, a->O);
  } else {
    memset(a->y, 0, (size_t)(a->R * a->O) * sizeof(float));
  }
}

static void cpu_mlp_backward(const dg__mlp_args *a) {
  if (a->db2) dg__colsum(a->db2, a->dy, a->R, a->O, !a->accb2);
  if (a->dres) dg__grad_pass(a->dres, a->dy, a->R * a->O, a->accres);
  if (!a->dx && !a->dw1 && !a->db1 && !a->dw2) return;
  mlp_bwd p = {a->R, a->C, a->F, a->O, a->x, a->w1, a->w2, a->h, a->dy, a->dx, a->dw1, a->db1,
               a->dw2, !a->accx, !a->accw1, !a->accb1, !a->accw2};
  int64_t rb = DG_MIN(block_rows(p.F), p.R);
  for (int64_t r0 = 0; r0 < p.R; r0 += rb)
    bwd_block(&p, r0, DG_MIN(rb, p.R - r0), a->a, a->g, r0 == 0);
}

const struct dg__kern_mlp dg__cpu_kern_mlp = {cpu_block_rows, cpu_mlp_forward, cpu_mlp_backward};
