/* Element-wise binary ops with numpy broadcasting (add, sub, mul, div) and the
 * scalar forms (scale, add_scalar), forward and backward.
 *
 * Broadcasting works on a "plan": the output shape right-aligned to 4 dims,
 * each operand's strides (its real strides, 0 along broadcast dims), then
 * adjacent dims merged wherever every operand is linear across them and
 * size-1 dims dropped. The common cases therefore collapse to one or two
 * dims with contiguous inner rows, and the inner loops are specialised for
 * operand strides of 1 (streamed) and 0 (broadcast scalar):
 *   same shape           -> 1 dim,  strides (1, 1)
 *   scalar b             -> 1 dim,  strides (1, 0)
 *   bias row (N,C)+(C)   -> (N, C), b strides (0, 1)
 *   (B,T,C)+(T,C)        -> (B, T*C), b strides (0, 1)
 *   column (N,C)*(N,1)   -> (N, C), b strides (1, 0)
 * Non-contiguous views are read in place through their strides.
 *
 * Backward: an input with the output's element count takes its gradient
 * directly (+=). A broadcast input's gradient is summed over its broadcast
 * dims in double precision (an arena scratch), then added. */
#include <string.h>

#include "tensor/cpu/cpu_impl.h"

enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV };
static const char *const op_names[] = {"add", "sub", "mul", "div"};

/* Row kinds: forward ops, then per-element gradients with d = dL/dout. */
enum {
  K_ADD, K_SUB, K_MUL, K_DIV, /* o = a op b */
  K_GMUL_A,                   /* d * b          (dL/da of a*b) */
  K_GMUL_B,                   /* d * a          (dL/db of a*b) */
  K_GDIV_A,                   /* d / b          (dL/da of a/b) */
  K_GDIV_B                    /* -d * a / b^2   (dL/db of a/b) */
};

typedef struct {
  int nd;             /* merged dims, 1..4 (sizes > 1, except a lone 1) */
  int64_t n[4];       /* sizes, outermost first */
  int64_t s[2][4];    /* operand strides in elements; 0 = broadcast */
  int64_t total;      /* output elements */
} bplan;

typedef struct {
  int nd;
  const int64_t *shape, *stride;
} operand;

/* Output shape of broadcasting a and b; DG_ESHAPE when they don't. */
static int broadcast_shape(const dg_tensor *a, const dg_tensor *b, int *nd, int64_t *shape) {
  *nd = a->ndim > b->ndim ? a->ndim : b->ndim;
  for (int i = 0; i < *nd; i++) {
    int ia = a->ndim - *nd + i, ib = b->ndim - *nd + i;
    int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
    if (da != db && da != 1 && db != 1) return DG_ESHAPE;
    shape[i] = da == 1 ? db : da;
  }
  return DG_OK;
}

/* Builds the merged iteration plan over an output of shape (nd) for nops
 * operands (each right-aligned against the output). */
static void bplan_init(bplan *p, int nd, const int64_t *shape, int nops, const operand *ops) {
  int64_t n[4], s[2][4];
  int m = 0;
  p->total = 1;
  for (int i = 0; i < nd; i++) {
    p->total *= shape[i];
    if (shape[i] == 1) continue;
    n[m] = shape[i];
    for (int k = 0; k < nops; k++) {
      int j = ops[k].nd - nd + i;
      s[k][m] = (j >= 0 && ops[k].shape[j] != 1) ? ops[k].stride[j] : 0;
    }
    m++;
  }
  /* merge from the innermost dim outwards */
  int q = 0; /* dims kept, stored innermost-first in n/s[.][3 - q] */
  for (int i = m - 1; i >= 0; i--) {
    int merge = q > 0;
    for (int k = 0; k < nops && merge; k++)
      merge = s[k][i] == p->s[k][4 - q] * p->n[4 - q];
    if (merge) {
      p->n[4 - q] *= n[i];
    } else {
      q++;
      p->n[4 - q] = n[i];
      for (int k = 0; k < nops; k++) p->s[k][4 - q] = s[k][i];
    }
  }
  if (q == 0) { /* every dim is 1: a single element */
    q = 1;
    p->n[3] = 1;
    for (int k = 0; k < nops; k++) p->s[k][3] = 0;
  }
  for (int i = 0; i < 4 - q; i++) { /* pad outer dims */
    p->n[i] = 1;
    p->s[0][i] = p->s[1][i] = 0;
  }
  if (nops < 2)
    for (int i = 0; i < 4; i++) p->s[1][i] = 0;
  p->nd = q;
}

/* o[i] (=|+=) EXPR over one row, specialised on operand strides so the
 * streamed cases vectorise. EXPR reads A, B (the current elements of a and
 * b) and d[i]. */
#define ROW_LOOPS(ASSIGN, EXPR)                                                  \
  do {                                                                           \
    if (sa == 1 && sb == 1) {                                                    \
      for (int64_t i = 0; i < n; i++) { float A = a[i], B = b[i];                \
        (void)A; (void)B; o[i] ASSIGN (EXPR); }                                  \
    } else if (sa == 1 && sb == 0) {                                             \
      const float B = b[0];                                                      \
      for (int64_t i = 0; i < n; i++) { float A = a[i];                          \
        (void)A; (void)B; o[i] ASSIGN (EXPR); }                                  \
    } else if (sa == 0 && sb == 1) {                                             \
      const float A = a[0];                                                      \
      for (int64_t i = 0; i < n; i++) { float B = b[i];                          \
        (void)A; (void)B; o[i] ASSIGN (EXPR); }                                  \
    } else {                                                                     \
      for (int64_t i = 0; i < n; i++) { float A = a[i * sa], B = b[i * sb];      \
        (void)A; (void)B; o[i] ASSIGN (EXPR); }                                  \
    }                                                                            \
  } while (0)

#define ROW_KINDS(ASSIGN)                                      \
  switch (kind) {                                              \
    case K_ADD: ROW_LOOPS(ASSIGN, A + B); break;               \
    case K_SUB: ROW_LOOPS(ASSIGN, A - B); break;               \
    case K_MUL: ROW_LOOPS(ASSIGN, A * B); break;               \
    case K_DIV: ROW_LOOPS(ASSIGN, A / B); break;               \
    case K_GMUL_A: ROW_LOOPS(ASSIGN, d[i] * B); break;         \
    case K_GMUL_B: ROW_LOOPS(ASSIGN, d[i] * A); break;         \
    case K_GDIV_A: ROW_LOOPS(ASSIGN, d[i] / B); break;         \
    default: ROW_LOOPS(ASSIGN, -d[i] * A / (B * B)); break;    \
  }

/* One row: a (n, stride sa), b (n, stride sb), d (n) or NULL, o (n). */
static void row(int kind, int acc, int64_t n, const float *a, int64_t sa, const float *b,
                int64_t sb, const float *restrict d, float *restrict o) {
  if (acc) ROW_KINDS(+=)
  else ROW_KINDS(=)
}

/* Runs `kind` over the plan: o (total) [+]= f(a, b, d), with o and d
 * contiguous in the output's shape. */
static void bplan_run(const bplan *p, int kind, int acc, const float *a, const float *b,
                      const float *d, float *o) {
  int64_t off = 0, n3 = p->n[3];
  for (int64_t i0 = 0; i0 < p->n[0]; i0++)
    for (int64_t i1 = 0; i1 < p->n[1]; i1++)
      for (int64_t i2 = 0; i2 < p->n[2]; i2++, off += n3) {
        int64_t oa = i0 * p->s[0][0] + i1 * p->s[0][1] + i2 * p->s[0][2];
        int64_t ob = i0 * p->s[1][0] + i1 * p->s[1][1] + i2 * p->s[1][2];
        row(kind, acc, n3, a + oa, p->s[0][3], b + ob, p->s[1][3], d ? d + off : NULL, o + off);
      }
}

/* gx (x's shape, contiguous) += scale * g (output shape, contiguous) summed
 * over the dims along which x was broadcast. Sums in double. */
static int reduce_into(dg_ctx *ctx, const dg_tensor *out, const dg_tensor *x, const float *g,
                       float scale, float *gx) {
  int64_t nx = dg__numel(x), cs[DG_MAX_DIMS], st = 1;
  for (int i = x->ndim - 1; i >= 0; i--) cs[i] = st, st *= x->shape[i];
  operand op = {x->ndim, x->shape, cs};
  bplan p;
  bplan_init(&p, out->ndim, out->shape, 1, &op);
  double *acc = dg__arena_alloc(&ctx->arena, (size_t)(nx ? nx : 1) * sizeof *acc);
  if (!acc) return dg__set_error(ctx, DG_ENOMEM, "backward: out of memory for a reduction");
  memset(acc, 0, (size_t)nx * sizeof *acc);
  int64_t off = 0, n3 = p.n[3], s3 = p.s[0][3];
  for (int64_t i0 = 0; i0 < p.n[0]; i0++)
    for (int64_t i1 = 0; i1 < p.n[1]; i1++)
      for (int64_t i2 = 0; i2 < p.n[2]; i2++, off += n3) {
        double *restrict ar = acc + i0 * p.s[0][0] + i1 * p.s[0][1] + i2 * p.s[0][2];
        const float *restrict gr = g + off;
        if (s3) { /* x keeps this dim: elementwise; x's inner stride is 1 */
          for (int64_t i = 0; i < n3; i++) ar[i] += gr[i];
        } else { /* x broadcast along the row: sum it */
          double s = 0;
          for (int64_t i = 0; i < n3; i++) s += gr[i];
          ar[0] += s;
        }
      }
  for (int64_t i = 0; i < nx; i++) gx[i] += (float)(scale * acc[i]);
  return DG_OK;
}

/* ---- add / sub / mul / div ---- */

/* Gradient for input k (0 = a, 1 = b) of a broadcast op. */
static int binary_grad_input(dg_ctx *ctx, dg_node *nd, int k, dg_tensor *sa, dg_tensor *sb,
                             const bplan *p) {
  int op = (int)nd->i[0];
  dg_tensor *x = nd->in[k], *out = nd->out;
  float *gx = dg__grad_buf(ctx, x);
  if (!gx) return ctx->err;
  const float *d = out->grad->data; /* (out shape) */
  int64_t n = dg__numel(out);
  int full = dg__numel(x) == n; /* x not broadcast: gx has the output's layout */
  float sign = (op == OP_SUB && k == 1) ? -1.0f : 1.0f;
  if (op == OP_ADD || op == OP_SUB) {
    if (!full) return reduce_into(ctx, out, x, d, sign, gx);
    if (sign > 0) for (int64_t i = 0; i < n; i++) gx[i] += d[i];
    else for (int64_t i = 0; i < n; i++) gx[i] -= d[i];
    return DG_OK;
  }
  int kind = op == OP_MUL ? (k ? K_GMUL_B : K_GMUL_A) : (k ? K_GDIV_B : K_GDIV_A);
  if (full) {
    bplan_run(p, kind, 1, sa->data, sb->data, d, gx);
    return DG_OK;
  }
  float *g = dg__arena_alloc(&ctx->arena, (size_t)(n ? n : 1) * sizeof *g);
  if (!g) return dg__set_error(ctx, DG_ENOMEM, "%s backward: out of memory", nd->op);
  bplan_run(p, kind, 0, sa->data, sb->data, d, g);
  return reduce_into(ctx, out, x, g, 1.0f, gx);
}

/* Same shapes, everything contiguous: fused single-pass loops. */
static void binary_grad_flat(int op, int64_t n, const float *restrict d, const float *restrict a,
                             const float *restrict b, float *da, float *db) {
  if (op == OP_MUL) {
    if (da) for (int64_t i = 0; i < n; i++) da[i] += d[i] * b[i];
    if (db) for (int64_t i = 0; i < n; i++) db[i] += d[i] * a[i];
  } else { /* OP_DIV */
    if (da) for (int64_t i = 0; i < n; i++) da[i] += d[i] / b[i];
    if (db) for (int64_t i = 0; i < n; i++) db[i] -= d[i] * a[i] / (b[i] * b[i]);
  }
}

static int binary_backward(dg_ctx *ctx, dg_node *nd) {
  int op = (int)nd->i[0];
  dg_tensor *sa = NULL, *sb = NULL;
  if (op == OP_MUL || op == OP_DIV) {
    sa = dg__saved(ctx, nd, 0);
    sb = dg__saved(ctx, nd, 1);
    if (!sa || !sb) return ctx->err;
    if (dg__same_shape(sa, sb) && dg__is_contig(sa) && dg__is_contig(sb)) {
      float *da = dg__grad_buf(ctx, nd->in[0]), *db = dg__grad_buf(ctx, nd->in[1]);
      if (ctx->err) return ctx->err;
      binary_grad_flat(op, dg__numel(sa), nd->out->grad->data, sa->data, sb->data, da, db);
      return DG_OK;
    }
  }
  bplan p;
  if (sa) {
    operand ops[2] = {{sa->ndim, sa->shape, sa->stride}, {sb->ndim, sb->shape, sb->stride}};
    bplan_init(&p, nd->out->ndim, nd->out->shape, 2, ops);
  }
  for (int k = 0; k < 2; k++)
    if (dg__wants_grad(nd->in[k]) && binary_grad_input(ctx, nd, k, sa, sb, &p)) return ctx->err;
  return DG_OK;
}

static int binary_check(dg_ctx *ctx, const char *name, dg_tensor *a, dg_tensor *b, int *nd,
                        int64_t *shape) {
  if (dg__null_input(ctx, name, "a", a) || dg__null_input(ctx, name, "b", b)) return DG_EINVAL;
  if (!dg__check_f32(ctx, name, "a", a) || !dg__check_f32(ctx, name, "b", b)) return ctx->err;
  if (broadcast_shape(a, b, nd, shape)) {
    char s1[96], s2[96];
    return dg__set_error(ctx, DG_ESHAPE, "%s: shapes %s and %s do not broadcast", name,
                         dg__shape_str(a, s1, sizeof s1), dg__shape_str(b, s2, sizeof s2));
  }
  return DG_OK;
}

static dg_tensor *binary(dg_ctx *ctx, int op, dg_tensor *a, dg_tensor *b) {
  const char *name = op_names[op];
  int nd = 0;
  int64_t shape[DG_MAX_DIMS];
  if (!ctx || binary_check(ctx, name, a, b, &nd, shape)) return NULL;
  dg_tensor *y = dg__new(ctx, name, DG_F32, nd, shape);
  if (!y) return NULL;
  int64_t n = dg__numel(y);
  float *restrict o = y->data;
  const float *restrict pa = a->data, *restrict pb = b->data;
  if (dg__same_shape(a, b) && dg__is_contig(a) && dg__is_contig(b)) {
    switch (op) { /* the most common case: one flat loop */
      case OP_ADD: for (int64_t i = 0; i < n; i++) o[i] = pa[i] + pb[i]; break;
      case OP_SUB: for (int64_t i = 0; i < n; i++) o[i] = pa[i] - pb[i]; break;
      case OP_MUL: for (int64_t i = 0; i < n; i++) o[i] = pa[i] * pb[i]; break;
      default: for (int64_t i = 0; i < n; i++) o[i] = pa[i] / pb[i]; break;
    }
  } else if (n) {
    operand ops[2] = {{a->ndim, a->shape, a->stride}, {b->ndim, b->shape, b->stride}};
    bplan p;
    bplan_init(&p, nd, shape, 2, ops);
    bplan_run(&p, K_ADD + op, 0, pa, pb, NULL, o);
  }
  dg_tensor *in[2] = {a, b};
  if (dg__needs_grad(ctx, 2, in)) {
    dg_node *node = dg__record(ctx, name, binary_backward, y, 2, in);
    if (!node) return NULL;
    node->i[0] = op;
    if ((op == OP_MUL || op == OP_DIV) && (dg__save(ctx, node, a) || dg__save(ctx, node, b)))
      return NULL;
  }
  return y;
}

dg_tensor *dg_add(dg_ctx *ctx, dg_tensor *a, dg_tensor *b) { return binary(ctx, OP_ADD, a, b); }
dg_tensor *dg_sub(dg_ctx *ctx, dg_tensor *a, dg_tensor *b) { return binary(ctx, OP_SUB, a, b); }
dg_tensor *dg_mul(dg_ctx *ctx, dg_tensor *a, dg_tensor *b) { return binary(ctx, OP_MUL, a, b); }
dg_tensor *dg_div(dg_ctx *ctx, dg_tensor *a, dg_tensor *b) { return binary(ctx, OP_DIV, a, b); }

/* ---- scale / add_scalar: y = a * s, y = a + s ---- */

static int scalar_backward(dg_ctx *ctx, dg_node *nd) {
  float *restrict dx = dg__grad_buf(ctx, nd->in[0]); /* (x shape) */
  if (!dx) return ctx->err;
  const float *restrict dy = nd->out->grad->data;
  float s = (float)nd->f[0]; /* 1 for add_scalar */
  for (int64_t i = 0, n = dg__numel(nd->out); i < n; i++) dx[i] += s * dy[i];
  return DG_OK;
}

static dg_tensor *scalar_op(dg_ctx *ctx, const char *name, dg_tensor *a, float s, int mul) {
  if (!ctx || dg__null_input(ctx, name, "a", a) || !dg__check_f32(ctx, name, "a", a))
    return NULL;
  dg_tensor *y = dg__new_like(ctx, name, a);
  const float *restrict x = y ? dg__contig_data(ctx, name, a) : NULL;
  if (!x) return NULL;
  float *restrict o = y->data;
  int64_t n = dg__numel(y);
  if (mul) for (int64_t i = 0; i < n; i++) o[i] = x[i] * s;
  else for (int64_t i = 0; i < n; i++) o[i] = x[i] + s;
  if (dg__needs_grad(ctx, 1, &a)) {
    dg_node *node = dg__record(ctx, name, scalar_backward, y, 1, &a);
    if (!node) return NULL;
    node->f[0] = mul ? s : 1.0f;
  }
  return y;
}

dg_tensor *dg_scale(dg_ctx *ctx, dg_tensor *a, float s) { return scalar_op(ctx, "scale", a, s, 1); }
dg_tensor *dg_add_scalar(dg_ctx *ctx, dg_tensor *a, float s) {
  return scalar_op(ctx, "add_scalar", a, s, 0);
}
