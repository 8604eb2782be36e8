/* Element-wise binary ops with numpy broadcasting (add, sub, mul, div) and the
 * scalar forms (scale, add_scalar): the op (validation, shape inference,
 * the broadcast plan, recording, backward wiring).
 *
 * Broadcasting works on a "plan" (backends/kern_binary.h): the output shape
 * right-aligned to 4 dims, each operand's strides (its real strides, 0
 * along broadcast dims), then adjacent dims merged wherever every operand
 * is linear across them and size-1 dims dropped. The common cases
 * therefore collapse to one or two dims with contiguous inner rows, which
 * the kernels specialise for operand strides of 1 (streamed) and 0
 * (broadcast scalar):
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
 * dims in double precision (an arena scratch), then added or stored. The
 * kernels are the backend's (backends/kern_binary.h). */
#include <string.h>

#include "backends/kern_binary.h"
#include "core/core_impl.h"

enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV }; /* in the order of DG_BIN_ADD.. */
static const char *const op_names[] = {"add", "sub", "mul", "div"};

typedef dg__bplan bplan;

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

/* Runs `kind` over the plan on the backend, split over the pool when long. */
static void bplan_run(const dg__backend *be, const bplan *p, int kind, int acc, const float *a,
                      const float *b, const float *d, float *o) {
  dg__binary_args j = {p, kind, acc, a, b, d, o};
  be->binary->run(&j);
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
static void run_flat(const dg__backend *be, int kind, int acc, int64_t n, const float *a,
                     int64_t sa, const float *b, int64_t sb, const float *d, float *o) {
  bplan p;
  bplan_flat(&p, n, sa, sb);
  bplan_run(be, &p, kind, acc, a, b, d, o);
}

/* gx (x's shape, contiguous) (+)= scale * g (output shape, contiguous)
 * summed over the dims along which x was broadcast; acc = 0 stores. Sums in
 * double. */
static int reduce_into(dg_ctx *ctx, const dg__backend *be, const dg_tensor *out,
                       const dg_tensor *x, const float *g, float scale, int acc_gx, float *gx) {
  int64_t nx = dg__numel(x), cs[DG_MAX_DIMS], st = 1;
  for (int i = x->ndim - 1; i >= 0; i--) cs[i] = st, st *= x->shape[i];
  operand op = {x->ndim, x->shape, cs};
  bplan p;
  bplan_init(&p, out->ndim, out->shape, 1, &op);
  double *acc = dg__op_data(ctx, (size_t)(nx ? nx : 1) * sizeof *acc);
  if (!acc) return dg__set_error(ctx, DG_ENOMEM, "backward: out of memory for a reduction");
  dg__bsum_args a = {&p, g, gx, nx, scale, acc_gx, acc};
  be->binary->reduce(&a);
  return DG_OK;
}

/* ---- add / sub / mul / div ---- */

/* Gradient for input k (0 = a, 1 = b) of a broadcast op. */
static int binary_grad_input(dg_ctx *ctx, const dg__backend *be, dg_node *nd, int k,
                             dg_tensor *sa, dg_tensor *sb, const bplan *p) {
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
    if (!full) return reduce_into(ctx, be, out, x, d, *sg, !overwrite, gx);
    if (overwrite && *sg > 0) { /* fresh: a copy of dy */
      if (be->copy(gx, out->device, d, out->device, (size_t)n * sizeof *gx))
        return dg__set_error(ctx, DG_EDEVICE, "%s backward: gradient copy failed", nd->op);
    } else {
      run_flat(be, DG_BIN_GMUL_A, !overwrite, n, d, 1, sg, 0, d, gx); /* gx (+)= +-dy */
    }
    return DG_OK;
  }
  int kind = op == OP_MUL ? (k ? DG_BIN_GMUL_B : DG_BIN_GMUL_A)
                          : (k ? DG_BIN_GDIV_B : DG_BIN_GDIV_A);
  if (full) {
    bplan_run(be, p, kind, !overwrite, sa->data, sb->data, d, gx);
    return DG_OK;
  }
  float *g = dg__op_data(ctx, (size_t)(n ? n : 1) * sizeof *g);
  if (!g) return dg__set_error(ctx, DG_ENOMEM, "%s backward: out of memory", nd->op);
  bplan_run(be, p, kind, 0, sa->data, sb->data, d, g);
  return reduce_into(ctx, be, out, x, g, 1.0f, !overwrite, gx);
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
  const dg__backend *be = dg__backend_get(nd->out->device);
  for (int k = 0; k < 2; k++)
    if (dg__wants_grad(nd->in[k]) && binary_grad_input(ctx, be, nd, k, sa, sb, &p))
      return ctx->err;
  return DG_OK;
}

static int binary_check(dg_ctx *ctx, const char *name, dg_tensor *a, dg_tensor *b, int *nd,
                        int64_t *shape) {
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
  dg_tensor *in[2] = {a, b};
  const dg__backend *be = dg__op_begin(ctx, name, 2, in, (const char *[]){"a", "b"}, 0);
  if (!be || binary_check(ctx, name, a, b, &nd, shape))
    return NULL;
  dg_tensor *y = dg__new(ctx, name, DG_F32, nd, shape);
  if (!y) return NULL;
  if (dg__numel(y)) { /* same shape and contiguous: one flat loop after merging */
    operand ops[2] = {{a->ndim, a->shape, a->stride}, {b->ndim, b->shape, b->stride}};
    bplan p;
    bplan_init(&p, nd, shape, 2, ops);
    bplan_run(be, &p, DG_BIN_ADD + op, 0, a->data, b->data, NULL, y->data);
  }
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
  int dev = nd->out->device;
  const dg__backend *be = dg__backend_get(dev);
  if (overwrite && s == 1.0f) {
    if (be->copy(dx, dev, dy, dev, (size_t)n * sizeof *dx))
      return dg__set_error(ctx, DG_EDEVICE, "%s backward: gradient copy failed", nd->op);
  } else {
    run_flat(be, DG_BIN_GMUL_A, !overwrite, n, dy, 1, &s, 0, dy, dx); /* dx (+)= s * dy */
  }
  return DG_OK;
}

static dg_tensor *scalar_op(dg_ctx *ctx, const char *name, dg_tensor *a, float s, int mul) {
  const dg__backend *be = dg__op_begin(ctx, name, 1, &a, (const char *[]){"a"}, 0);
  if (!be || !dg__check_f32(ctx, name, "a", a))
    return NULL;
  dg_tensor *y = dg__new_like(ctx, name, a);
  const float *x = y ? dg__contig_data(ctx, name, a) : NULL;
  if (!x) return NULL;
  run_flat(be, mul ? DG_BIN_MUL : DG_BIN_ADD, 0, dg__numel(y), x, 1, &s, 0, NULL, y->data);
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
