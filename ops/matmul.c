/* matmul, batched matmul and linear, forward and backward.
 *
 * Operand layouts: a logical (.., R, C) operand is used in place when its last
 * two dims are row-major (stride (ld, 1), ld >= C) or column-major (a
 * transposed tensor, stride (1, ld), ld >= R), whatever its batch stride:
 * the GEMM takes ld as its leading dimension and column-major just flips the
 * transpose flag, so slices, narrowed last dims and transposes cost no copy.
 * Anything else is packed first. Gradients are always written in the
 * operand's logical row-major layout.
 *
 * A batched a (B, M, K) times a shared b (K, N) with a's rows evenly spaced
 * is one GEMM over B*M rows, forward and backward. The GEMM, column sums,
 * bias fills and gradient passes are the backend's (backends/kern_blas.h). */
#include "backends/kern_blas.h"
#include "core/core_impl.h"

typedef struct {
  const float *p;
  int64_t rows, cols; /* logical last two dims */
  int64_t ld;         /* stored row (row-major) or column (column-major) stride */
  int64_t bstride;    /* elements between batch items (0: shared or one item) */
  int colmajor;
} mat_view;

/* Describes x's last two dims for GEMM, packing it when needed. */
static int mat_of(dg_ctx *ctx, const char *op, dg_tensor *x, int64_t batch, mat_view *m) {
  int nd = x->ndim;
  m->rows = x->shape[nd - 2];
  m->cols = x->shape[nd - 1];
  const int64_t *s = x->stride + nd - 2;
  int batched = nd == 3 && batch > 1;
  /* rows of at least cols floats apart (row-major) or columns of at least
   * rows floats apart (column-major), any batch stride: used in place */
  if (s[1] == 1 && (s[0] >= m->cols || m->rows == 1)) {
    m->p = x->data, m->ld = m->rows == 1 ? m->cols : s[0], m->colmajor = 0;
  } else if (s[0] == 1 && (s[1] >= m->rows || m->cols == 1)) {
    m->p = x->data, m->ld = m->cols == 1 ? m->rows : s[1], m->colmajor = 1;
  } else {
    m->p = dg__contig_data(ctx, op, x);
    if (!m->p) return ctx->err;
    m->ld = m->cols, m->colmajor = 0;
    m->bstride = batched ? m->rows * m->cols : 0;
    if (m->ld < 1) m->ld = 1;
    return DG_OK;
  }
  if (m->ld < 1) m->ld = 1;
  m->bstride = batched ? x->stride[0] : 0;
  return DG_OK;
}

/* 1 when op(m) (t: its effective GEMM transpose flag) is stored row-major
 * and its batch items follow each other at its row stride, so (B, M, K)
 * reads as (B*M, K) with the same ld. */
static int rows_flat(const mat_view *m, int64_t M, int t) {
  return !t && (m->bstride == 0 || m->bstride == M * m->ld);
}

/* ---- matmul ---- */

static int matmul_backward(dg_ctx *ctx, dg_node *n) {
  dg_tensor *a = n->in[0], *b = n->in[1];
  int ta = (int)n->i[0], tb = (int)n->i[1];
  int64_t B = n->i[2];
  dg_tensor *sa = dg__saved(ctx, n, 0), *sb = dg__saved(ctx, n, 1);
  if (!sa || !sb) return ctx->err;
  const float *dc = n->out->grad->data; /* (B, M, N) */
  int64_t Mo = n->out->shape[n->out->ndim - 2], No = n->out->shape[n->out->ndim - 1];
  int64_t K = ta ? sa->shape[sa->ndim - 2] : sa->shape[sa->ndim - 1];
  mat_view A, Bv;
  if (mat_of(ctx, "matmul backward", sa, B, &A) || mat_of(ctx, "matmul backward", sb, B, &Bv))
    return ctx->err;
  int tA = ta ^ A.colmajor, tB = tb ^ Bv.colmajor;
  const struct dg__kern_blas *k = dg__backend_get(n->out->device)->blas;
  int oa, ob;
  float *da = dg__grad_buf_w(ctx, a, &oa), *db = dg__grad_buf_w(ctx, b, &ob);
  if ((dg__wants_grad(a) && !da) || (dg__wants_grad(b) && !db)) return ctx->err;
  /* a shared b (batched a, 2-D b) sums over the batch: only its first
   * product may overwrite */
  /* gradient items are laid out by the logical shape (a stride-0 batch
   * still has B gradients) */
  int64_t a_bs = a->ndim == 3 ? A.rows * A.cols : 0, b_bs = b->ndim == 3 ? Bv.rows * Bv.cols : 0;
  if (B > 1 && b->ndim == 2 && !ta && rows_flat(&A, Mo, tA)) { /* shared b: B*M rows at once */
    if (da) k->sgemm(0, !tB, B * Mo, K, No, 1.0f, dc, No, Bv.p, Bv.ld, oa ? 0.0f : 1.0f, da, K);
    if (db) {
      float beta = ob ? 0.0f : 1.0f;
      if (!tb) k->sgemm(1, 0, K, No, B * Mo, 1.0f, A.p, A.ld, dc, No, beta, db, No);
      else k->sgemm(1, 0, No, K, B * Mo, 1.0f, dc, No, A.p, A.ld, beta, db, K);
    }
    return DG_OK;
  }
  for (int64_t i = 0; i < B; i++) {
    const float *dci = dc + i * Mo * No;
    float beta_a = oa ? 0.0f : 1.0f, beta_b = (ob && (b_bs || i == 0)) ? 0.0f : 1.0f;
    if (da) {
      float *dai = da + i * a_bs; /* logical (M,K) or (K,M) row-major */
      const float *bi = Bv.p + i * Bv.bstride;
      if (!ta) k->sgemm(0, !tB, Mo, K, No, 1.0f, dci, No, bi, Bv.ld, beta_a, dai, K);
      else k->sgemm(tB, 1, K, Mo, No, 1.0f, bi, Bv.ld, dci, No, beta_a, dai, Mo);
    }
    if (db) {
      float *dbi = db + i * b_bs;
      const float *ai = A.p + i * A.bstride;
      if (!tb) k->sgemm(!tA, 0, K, No, Mo, 1.0f, ai, A.ld, dci, No, beta_b, dbi, No);
      else k->sgemm(1, tA, No, K, Mo, 1.0f, dci, No, ai, A.ld, beta_b, dbi, K);
    }
  }
  return DG_OK;
}

static int matmul_check(dg_ctx *ctx, dg_tensor *a, dg_tensor *b, int ta, int tb,
                        int64_t *B, int64_t *M, int64_t *N, int64_t *K) {
  char sa[96], sb[96];
  if (!dg__check_f32(ctx, "matmul", "a", a) || !dg__check_f32(ctx, "matmul", "b", b))
    return ctx->err;
  if (a->ndim < 2 || a->ndim > 3 || b->ndim < 2 || b->ndim > 3 ||
      (a->ndim == 2 && b->ndim == 3))
    return dg__set_error(ctx, DG_ESHAPE,
                         "matmul: need (M,K)@(K,N), (B,M,K)@(B,K,N) or (B,M,K)@(K,N); got a %s, b %s",
                         dg__shape_str(a, sa, sizeof sa), dg__shape_str(b, sb, sizeof sb));
  int na = a->ndim, nb = b->ndim;
  *M = ta ? a->shape[na - 1] : a->shape[na - 2];
  *K = ta ? a->shape[na - 2] : a->shape[na - 1];
  int64_t Kb = tb ? b->shape[nb - 1] : b->shape[nb - 2];
  *N = tb ? b->shape[nb - 2] : b->shape[nb - 1];
  *B = na == 3 ? a->shape[0] : 1;
  if (Kb != *K || (nb == 3 && b->shape[0] != *B))
    return dg__set_error(ctx, DG_ESHAPE, "matmul: inner dims differ: a %s%s, b %s%s",
                         dg__shape_str(a, sa, sizeof sa), ta ? "^T" : "",
                         dg__shape_str(b, sb, sizeof sb), tb ? "^T" : "");
  return DG_OK;
}

dg_tensor *dg_matmul_t(dg_ctx *ctx, dg_tensor *a, dg_tensor *b, int ta, int tb) {
  dg_tensor *in[2] = {a, b};
  const dg__backend *be = dg__op_begin(ctx, "matmul", 2, in, (const char *[]){"a", "b"}, 0);
  int64_t B = 0, M = 0, N = 0, K = 0;
  if (!be || matmul_check(ctx, a, b, ta, tb, &B, &M, &N, &K))
    return NULL;
  int64_t shape[3] = {B, M, N};
  dg_tensor *c = a->ndim == 3 ? dg__new(ctx, "matmul", DG_F32, 3, shape)
                              : dg__new(ctx, "matmul", DG_F32, 2, shape + 1);
  if (!c) return NULL;
  mat_view A, Bv;
  if (mat_of(ctx, "matmul", a, B, &A) || mat_of(ctx, "matmul", b, B, &Bv)) return NULL;
  int tA = ta ^ A.colmajor, tB = tb ^ Bv.colmajor;
  const struct dg__kern_blas *k = be->blas;
  float *cp = c->data;
  if (B > 1 && !Bv.bstride && rows_flat(&A, M, tA)) /* shared b: one GEMM over B*M rows */
    k->sgemm(0, tB, B * M, N, K, 1.0f, A.p, A.ld, Bv.p, Bv.ld, 0.0f, cp, N);
  else
    for (int64_t i = 0; i < B; i++)
      k->sgemm(tA, tB, M, N, K, 1.0f, A.p + i * A.bstride, A.ld, Bv.p + i * Bv.bstride, Bv.ld,
                0.0f, cp + i * M * N, N);
  if (dg__needs_grad(ctx, 2, in)) {
    dg_node *n = dg__record(ctx, "matmul", matmul_backward, c, 2, in);
    if (!n || dg__save(ctx, n, a) || dg__save(ctx, n, b)) return NULL;
    n->i[0] = ta, n->i[1] = tb, n->i[2] = B;
  }
  return c;
}

dg_tensor *dg_matmul(dg_ctx *ctx, dg_tensor *a, dg_tensor *b) {
  return dg_matmul_t(ctx, a, b, 0, 0);
}

/* ---- linear: y(R, O) = x(R, I) w(O, I)^T + b(O) ----
 *
 * x is used in place when its rows are evenly spaced (any contiguous
 * tensor, a slice, a narrowed last dim: row stride ld >= I); w in place when
 * row- or column-major. The bias (and dg_linear_add's residual) go into y
 * with the GEMM's stores (kern_blas.h's sgemm_add), and dg_linear_relu's
 * ReLU with its last stores: no pass over y of its own on the own kernel.
 * Backward: dx, dw by GEMM (beta 0 into fresh buffers), db by a vectorised
 * column sum; dg_linear_relu first masks dy by y > 0 into step scratch,
 * summing db in the same pass (the bits of the relu op's backward and the
 * column sum, so of dg_relu(dg_linear(...))), unless the linear after it
 * masked its input gradient in the GEMM's stores already (relu_output). */

/* Row stride of x seen as (R, I) rows with unit column stride, or 0 when
 * its rows are not evenly spaced (then it is packed). */
static int64_t rows_ld(const dg_tensor *x, int64_t I) {
  int nd = x->ndim;
  if (x->stride[nd - 1] != 1 && I > 1) return 0;
  int64_t ld = -1, next = 0; /* stride the next-outer dim must have */
  for (int d = nd - 2; d >= 0; d--) {
    if (x->shape[d] == 1) continue;
    if (ld < 0) ld = x->stride[d];
    else if (x->stride[d] != next) return 0;
    next = x->stride[d] * x->shape[d];
  }
  if (ld < 0) ld = I; /* a single row */
  return ld >= I && ld >= 1 ? ld : 0;
}

static int linear_relu_backward(dg_ctx *ctx, dg_node *n);

/* Whether n's x (rows ld apart) is a dg_linear_relu's output, whose
 * gradient that node masks by x > 0 when it runs: its first writer may mask
 * instead, in the GEMM's stores (DG_TF_GRAD_RELU), and spare the node a
 * pass. Not once an earlier backward consumed the node: it will not run
 * again, and x's gradient stays unmasked, as dg_relu's. Not where n also
 * reads x as w, b or the residual: those add unmasked terms to the same
 * gradient. */
static int relu_output(const dg_node *n, int64_t ld, int64_t I) {
  const dg_tensor *x = n->in[0];
  for (int k = 1; k < n->nin; k++)
    if (n->in[k] == x) return 0;
  return x->node && !x->node->consumed && x->node->backward == linear_relu_backward && ld == I;
}

/* The gradients of x, w, b (unless db_done) and dg_linear_add's res from
 * dy (R, O). */
static int linear_grads(dg_ctx *ctx, dg_node *n, const float *dy, int db_done) {
  dg_tensor *x = n->in[0], *w = n->in[1], *b = n->in[2];
  dg_tensor *sx = dg__saved(ctx, n, 0), *sw = dg__saved(ctx, n, 1);
  if (!sx || !sw) return ctx->err;
  int64_t R = n->i[0], I = n->i[1], O = n->i[2];
  int64_t ldx = rows_ld(sx, I);
  const float *xp = ldx ? sx->data : dg__contig_data(ctx, "linear backward", sx); /* (R, I) */
  mat_view W;
  if (!xp || mat_of(ctx, "linear backward", sw, 1, &W)) return ctx->err; /* (O, I) */
  if (!ldx) ldx = I;
  const struct dg__kern_blas *k = dg__backend_get(n->out->device)->blas;
  /* first writers overwrite (beta 0): no memset of fresh or lazily zeroed
   * gradient buffers */
  int ox, ow, ob;
  float *dx = dg__grad_buf_w(ctx, x, &ox), *dw = dg__grad_buf_w(ctx, w, &ow);
  float *db = db_done ? NULL : dg__grad_buf_w(ctx, b, &ob);
  if (ctx->err) return ctx->err;
  if (dx && ox && relu_output(n, ldx, I)) { /* dy(R,O) w(O,I), masked by x > 0 */
    dg__gemm_epi e = {.mask = xp};
    k->sgemm_add(0, W.colmajor, R, I, O, dy, O, W.p, W.ld, &e, dx, I);
    x->flags |= DG_TF_GRAD_RELU;
  } else if (dx) { /* dy(R,O) w(O,I) */
    k->sgemm(0, W.colmajor, R, I, O, 1.0f, dy, O, W.p, W.ld, ox ? 0.0f : 1.0f, dx, I);
  }
  if (dw) /* dy^T(O,R) x(R,I) */
    k->sgemm(1, 0, O, I, R, 1.0f, dy, O, xp, ldx, ow ? 0.0f : 1.0f, dw, I);
  if (db) k->colsum(db, dy, R, O, ob);
  if (n->nin > 3) { /* dg_linear_add: the residual's gradient is dy */
    int orr;
    float *dr = dg__grad_buf_w(ctx, n->in[3], &orr); /* (R, O) */
    if (ctx->err) return ctx->err;
    if (dr) k->grad_pass(dr, dy, R * O, !orr);
  }
  return DG_OK;
}

static int linear_backward(dg_ctx *ctx, dg_node *n) {
  return linear_grads(ctx, n, n->out->grad->data, 0);
}

/* dg_linear_relu: dz (R, O) = y > 0 ? dy : 0 from the saved output, with
 * db summed in the same pass, then the linear's other gradients from dz;
 * dz is dy where its only writer masked it already. */
static int linear_relu_backward(dg_ctx *ctx, dg_node *n) {
  if (n->out->flags & DG_TF_GRAD_RELU) {
    n->out->flags &= ~(uint32_t)DG_TF_GRAD_RELU;
    return linear_backward(ctx, n);
  }
  dg_tensor *sy = dg__saved(ctx, n, 2);
  const float *y = sy ? dg__contig_data(ctx, "linear_relu backward", sy) : NULL;
  if (!y) return ctx->err;
  int64_t R = n->i[0], O = n->i[2];
  int ob;
  float *db = dg__grad_buf_w(ctx, n->in[2], &ob);
  if (ctx->err) return ctx->err;
  size_t bytes = (size_t)DG_MAX(R * O, (int64_t)1) * sizeof(float);
  float *dz = dg__scratch_take(ctx, bytes);
  if (!dz) return ctx->err;
  dg__backend_get(n->out->device)->blas->relu_colsum(dz, n->out->grad->data, y, db, R, O, ob);
  int rc = linear_grads(ctx, n, dz, 1);
  dg__scratch_give(ctx, dz, bytes);
  return rc;
}

/* add: dg_linear_add (res required), else dg_linear or with relu
 * dg_linear_relu (res NULL). */
static dg_tensor *linear_impl(dg_ctx *ctx, const char *op, dg_tensor *x, dg_tensor *w,
                              dg_tensor *b, dg_tensor *res, int add, int relu) {
  dg_tensor *in[4] = {x, w, b, res};
  const dg__backend *be = dg__op_begin(ctx, op, 4, in, (const char *[]){"x", "w", "b", "res"},
                                       DG__OPT(2) | (add ? 0 : DG__OPT(3)));
  if (!be) return NULL;
  if (!dg__check_f32(ctx, op, "x", x) || !dg__check_f32(ctx, op, "w", w) ||
      (b && !dg__check_f32(ctx, op, "b", b)) ||
      (res && !dg__check_f32(ctx, "linear_add", "res", res)))
    return NULL;
  char sx[96], sw[96], sb[96];
  int64_t I = x->ndim ? x->shape[x->ndim - 1] : 0;
  if (x->ndim < 1 || w->ndim != 2 || w->shape[1] != I ||
      (b && (b->ndim != 1 || b->shape[0] != w->shape[0]))) {
    dg__set_error(ctx, DG_ESHAPE, "%s: x %s, w %s (want (out, %lld)), b %s", op,
                  dg__shape_str(x, sx, sizeof sx), dg__shape_str(w, sw, sizeof sw),
                  (long long)I, b ? dg__shape_str(b, sb, sizeof sb) : "none");
    return NULL;
  }
  int64_t O = w->shape[0], R = 1; /* rows: the leading dims, empty or not */
  for (int i = 0; i < x->ndim - 1; i++) R *= x->shape[i];
  int64_t shape[DG_MAX_DIMS];
  for (int i = 0; i < x->ndim; i++) shape[i] = x->shape[i];
  shape[x->ndim - 1] = O;
  dg_tensor *y = dg__new(ctx, op, DG_F32, x->ndim, shape);
  if (!y) return NULL;
  int64_t ldx = rows_ld(x, I);
  const float *xp = ldx ? x->data : dg__contig_data(ctx, op, x); /* (R, I) */
  mat_view W;
  if (!xp || mat_of(ctx, op, w, 1, &W)) return NULL; /* (O, I) */
  if (!ldx) ldx = I;
  float *yp = y->data; /* (R, O) */
  if (res && !dg__same_shape(res, y)) {
    char sr[96], sy[96];
    dg__set_error(ctx, DG_ESHAPE, "linear_add: residual %s, want the output's shape %s",
                  dg__shape_str(res, sr, sizeof sr), dg__shape_str(y, sy, sizeof sy));
    return NULL;
  }
  const float *bp = b ? dg__contig_data(ctx, op, b) : NULL;
  const float *rp = res ? dg__contig_data(ctx, op, res) : NULL;
  if ((b && !bp) || (res && !rp)) return NULL;
  dg__gemm_epi e = {rp, bp, NULL, relu};
  be->blas->sgemm_add(0, !W.colmajor, R, O, I, xp, ldx, W.p, W.ld, &e, yp, O);
  if (dg__needs_grad(ctx, res ? 4 : 3, in)) {
    dg_node *n = dg__record(ctx, relu ? "linear_relu" : "linear",
                            relu ? linear_relu_backward : linear_backward, y,
                            res ? 4 : b ? 3 : 2, in);
    if (!n || dg__save(ctx, n, x) || dg__save(ctx, n, w) || (relu && dg__save(ctx, n, y)))
      return NULL;
    n->i[0] = R, n->i[1] = I, n->i[2] = O;
  }
  return y;
}

dg_tensor *dg_linear(dg_ctx *ctx, dg_tensor *x, dg_tensor *w, dg_tensor *b) {
  return linear_impl(ctx, "linear", x, w, b, NULL, 0, 0);
}

dg_tensor *dg_linear_add(dg_ctx *ctx, dg_tensor *x, dg_tensor *w, dg_tensor *b, dg_tensor *res) {
  return linear_impl(ctx, "linear_add", x, w, b, res, 1, 0);
}

dg_tensor *dg_linear_relu(dg_ctx *ctx, dg_tensor *x, dg_tensor *w, dg_tensor *b) {
  return linear_impl(ctx, "linear_relu", x, w, b, NULL, 0, 1);
}
