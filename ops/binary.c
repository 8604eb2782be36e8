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
 * directly (+=; a fresh gradient is stored instead, and for add it is a
 * copy of dy). A broadcast input's gradient is summed over its broadcast
 * dims in double precision (an arena scratch), then added or stored.
 *
 * The loops run through one kernel (run_range) compiled for AVX-512, AVX2
 * and the baseline (DG_SIMD_FN) and split by output elements over the
 * compute pool when long: element-wise, so any split gives the same bits. */
#include <string.h>

#include "core/core_impl.h"
#include "backends/cpu/cpu_impl.h"

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
DG_INLINE void row(int kind, int acc, int64_t n, const float *a, int64_t sa, const float *b,
                   int64_t sb, const float *restrict d, float *restrict o) {
  if (acc) ROW_KINDS(+=)
  else ROW_KINDS(=)
}

typedef struct {
  const bplan *p;
  int kind, acc;
  const float *a, *b, *d;
  float *o;
} run_job;

/* Output elements [lo, hi) of the plan: o [+]= f(a, b, d), with o and d
 * contiguous in the output's shape. Rows may be cut at lo and hi. */
DG_INLINE void run_range_body(const run_job *j, int64_t lo, int64_t hi) {
  const bplan *p = j->p;
  const int64_t n3 = p->n[3], n2 = p->n[2], n1 = p->n[1];
  const int64_t sa3 = p->s[0][3], sb3 = p->s[1][3];
  int64_t r = lo / n3, c = lo - r * n3;
  for (int64_t off = lo; off < hi; r++, c = 0) {
    int64_t i2 = r % n2, i1 = (r / n2) % n1, i0 = r / (n2 * n1);
    int64_t oa = i0 * p->s[0][0] + i1 * p->s[0][1] + i2 * p->s[0][2] + c * sa3;
    int64_t ob = i0 * p->s[1][0] + i1 * p->s[1][1] + i2 * p->s[1][2] + c * sb3;
    int64_t len = DG_MIN(n3 - c, hi - off);
    row(j->kind, j->acc, len, j->a + oa, sa3, j->b + ob, sb3, j->d ? j->d + off : NULL,
        j->o + off);
    off += len;
  }
}
DG_SIMD_FN(run_range, (const run_job *j, int64_t lo, int64_t hi), (j, lo, hi))

static void run_task(void *arg, int64_t lo, int64_t hi) { run_range(arg, lo, hi); }

/* Runs `kind` over the plan, split over the pool when long. */
static void bplan_run(const bplan *p, int kind, int acc, const float *a, const float *b,
                      const float *d, float *o) {
  run_job j = {p, kind, acc, a, b, d, o};
  dg__parallel_range(p->total, DG_GRAIN_MEM, run_task, &j);
}

/* The plan of a flat loop over n elements with strides sa, sb (0 or 1). */
static void bplan_flat(bplan *p, int64_t n, int64_t sa, int64_t sb) {
  memset(p, 0, sizeof *p);
  p->nd = 1;
  p->n[0] = p->n[1] = p->n[2] = 1;
  p->n[3] = n ? n : 1;
  p->s[0][3] = sa, p->s[1][3] = sb;
  p->total = n;
}

/* o (n) [+]= f(a, b, d) over flat contiguous memory (strides sa, sb). */
static void run_flat(int kind, int acc, int64_t n, const float *a, int64_t sa, const float *b,
                     int64_t sb, const float *d, float *o) {
  bplan p;
  bplan_flat(&p, n, sa, sb);
  bplan_run(&p, kind, acc, a, b, d, o);
}

/* gx (x's shape, contiguous) (+)= scale * g (output shape, contiguous)
 * summed over the dims along which x was broadcast; acc = 0 stores. Sums in
 * double. */
static int reduce_into(dg_ctx *ctx, const dg_tensor *out, const dg_tensor *x, const float *g,
                       float scale, int acc_gx, float *gx) {
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
  if (acc_gx) for (int64_t i = 0; i < nx; i++) gx[i] += (float)(scale * acc[i]);
  else for (int64_t i = 0; i < nx; i++) gx[i] = (float)(scale * acc[i]);
  return DG_OK;
}

/* ---- add / sub / mul / div ---- */

/* Gradient for input k (0 = a, 1 = b) of a broadcast op. */
static int binary_grad_input(dg_ctx *ctx, dg_node *nd, int k, dg_tensor *sa, dg_tensor *sb,
                             const bplan *p) {
  int op = (int)nd->i[0], overwrite;
  dg_tensor *x = nd->in[k], *out = nd->out;
  float *gx = dg__grad_buf_w(ctx, x, &overwrite);
  if (!gx) return ctx->err;
  const float *d = out->grad->data; /* (out shape) */
  int64_t n = dg__numel(out);
  int full = dg__numel(x) == n; /* x not broadcast: gx has the output's layout */
  static const float sign[2] = {1.0f, -1.0f};
  const float *sg = &sign[op == OP_SUB && k == 1];
  if (op == OP_ADD || op == OP_SUB) {
    if (!full) return reduce_into(ctx, out, x, d, *sg, !overwrite, gx);
    if (overwrite && *sg > 0) memcpy(gx, d, (size_t)n * sizeof *gx); /* fresh: a copy of dy */
    else run_flat(K_GMUL_A, !overwrite, n, d, 1, sg, 0, d, gx);     /* gx (+)= +-dy */
    return DG_OK;
  }
  int kind = op == OP_MUL ? (k ? K_GMUL_B : K_GMUL_A) : (k ? K_GDIV_B : K_GDIV_A);
  if (full) {
    bplan_run(p, kind, !overwrite, sa->data, sb->data, d, gx);
    return DG_OK;
  }
  float *g = dg__arena_alloc(&ctx->arena, (size_t)(n ? n : 1) * sizeof *g);
  if (!g) return dg__set_error(ctx, DG_ENOMEM, "%s backward: out of memory", nd->op);
  bplan_run(p, kind, 0, sa->data, sb->data, d, g);
  return reduce_into(ctx, out, x, g, 1.0f, !overwrite, gx);
}

static int binary_backward(dg_ctx *ctx, dg_node *nd) {
  int op = (int)nd->i[0];
  dg_tensor *sa = NULL, *sb = NULL;
  bplan p;
  if (op == OP_MUL || op == OP_DIV) {
    sa = dg__saved(ctx, nd, 0);
    sb = dg__saved(ctx, nd, 1);
    if (!sa || !sb) return ctx->err;
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
  if (dg__numel(y)) { /* same shape and contiguous: one flat loop after merging */
    operand ops[2] = {{a->ndim, a->shape, a->stride}, {b->ndim, b->shape, b->stride}};
    bplan p;
    bplan_init(&p, nd, shape, 2, ops);
    bplan_run(&p, K_ADD + op, 0, a->data, b->data, NULL, y->data);
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
  int overwrite;
  float *dx = dg__grad_buf_w(ctx, nd->in[0], &overwrite); /* (x shape) */
  if (!dx) return ctx->err;
  const float *dy = nd->out->grad->data;
  float s = (float)nd->f[0]; /* 1 for add_scalar */
  int64_t n = dg__numel(nd->out);
  if (overwrite && s == 1.0f) memcpy(dx, dy, (size_t)n * sizeof *dx);
  else run_flat(K_GMUL_A, !overwrite, n, dy, 1, &s, 0, dy, dx); /* dx (+)= s * dy */
  return DG_OK;
}

static dg_tensor *scalar_op(dg_ctx *ctx, const char *name, dg_tensor *a, float s, int mul) {
  if (!ctx || dg__null_input(ctx, name, "a", a) || !dg__check_f32(ctx, name, "a", a))
    return NULL;
  dg_tensor *y = dg__new_like(ctx, name, a);
  const float *x = y ? dg__contig_data(ctx, name, a) : NULL;
  if (!x) return NULL;
  run_flat(mul ? K_MUL : K_ADD, 0, dg__numel(y), x, 1, &s, 0, NULL, y->data);
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
