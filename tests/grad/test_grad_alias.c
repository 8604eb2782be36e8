/* Aliased inputs, over every op with two or more tensor inputs: for each op
 * and each set of its inputs of compatible shape, all of the set is bound to
 * one tensor (y = op(x, x), res = x, tied weights) and the gradients are
 * checked against finite differences:
 *
 *   - a plain leaf (fresh gradient: first writers overwrite; then again into
 *     a zeroed gradient: they add), through gc_check;
 *   - one slot given a view of the leaf made inside the op wrapper (reshape
 *     to the same shape, transpose twice, slice of every row, contiguous,
 *     a transposed copy transposed back), on the last and on the first slot;
 *   - the leaf a parameter in a dg_params store, after dg_params_zero_grad
 *     over a gradient holding garbage (lazy zeroing: the buffer is stale, and
 *     exactly one writer may overwrite it) and, without zero_grad, on top of
 *     a previously accumulated gradient (backward adds);
 *   - larger shapes (several row blocks, kernels split over threads), where
 *     the tied gradient is compared with the sum of the untied ones.
 *
 * Everything runs on 1 and on 2 compute threads. Ops with one tensor input
 * (unary, reductions, softmax, attention on its packed qkv, maxpool) cannot
 * alias; cross_entropy and embedding take integer indices for the second. */
#include <stdarg.h>

#include "gradcheck.h"
#include "test.h"

#define MAXS 6

typedef dg_tensor *(*op_call)(dg_ctx *ctx, dg_tensor *const *s, const int *a);

typedef struct {
  const char *name;
  op_call call;
  int nslot;
  const char *slot[MAXS];
} op_desc;

/* A case: an op, its slots' shapes ("3x4 3x4 - 3", "-" for NULL), scalar
 * attributes, the tied slots (bit k: slot k) and the input range. */
typedef struct {
  const op_desc *op;
  const char *shapes;
  int attr[2];
  unsigned tie;
  float lo, hi;
} alias_case;

/* ---- op wrappers ---- */

static dg_tensor *c_add(dg_ctx *c, dg_tensor *const *s, const int *a) {
  (void)a;
  return dg_add(c, s[0], s[1]);
}
static dg_tensor *c_sub(dg_ctx *c, dg_tensor *const *s, const int *a) {
  (void)a;
  return dg_sub(c, s[0], s[1]);
}
static dg_tensor *c_mul(dg_ctx *c, dg_tensor *const *s, const int *a) {
  (void)a;
  return dg_mul(c, s[0], s[1]);
}
static dg_tensor *c_div(dg_ctx *c, dg_tensor *const *s, const int *a) {
  (void)a;
  return dg_div(c, s[0], s[1]);
}
/* b transposed first: (n, 1) op (1, n) broadcasts to (n, n) */
static dg_tensor *c_add_t(dg_ctx *c, dg_tensor *const *s, const int *a) {
  (void)a;
  return dg_add(c, s[0], dg_transpose(c, s[1], 0, 1));
}
static dg_tensor *c_mul_t(dg_ctx *c, dg_tensor *const *s, const int *a) {
  (void)a;
  return dg_mul(c, s[0], dg_transpose(c, s[1], 0, 1));
}
static dg_tensor *c_div_t(dg_ctx *c, dg_tensor *const *s, const int *a) {
  (void)a;
  return dg_div(c, s[0], dg_transpose(c, s[1], 0, 1));
}
static dg_tensor *c_matmul(dg_ctx *c, dg_tensor *const *s, const int *a) {
  (void)a;
  return dg_matmul(c, s[0], s[1]);
}
static dg_tensor *c_matmul_t(dg_ctx *c, dg_tensor *const *s, const int *a) {
  return dg_matmul_t(c, s[0], s[1], a[0], a[1]);
}
static dg_tensor *c_linear(dg_ctx *c, dg_tensor *const *s, const int *a) {
  (void)a;
  return dg_linear(c, s[0], s[1], s[2]);
}
static dg_tensor *c_linear_add(dg_ctx *c, dg_tensor *const *s, const int *a) {
  (void)a;
  return dg_linear_add(c, s[0], s[1], s[2], s[3]);
}
static dg_tensor *c_linear_relu(dg_ctx *c, dg_tensor *const *s, const int *a) {
  (void)a;
  return dg_linear_relu(c, s[0], s[1], s[2]);
}
static dg_tensor *c_mse(dg_ctx *c, dg_tensor *const *s, const int *a) {
  (void)a;
  return dg_mse(c, s[0], s[1]);
}
static dg_tensor *c_layernorm(dg_ctx *c, dg_tensor *const *s, const int *a) {
  (void)a;
  return dg_layernorm(c, s[0], s[1], s[2], 1e-5f);
}
/* a[0]: train; eval normalises with running statistics made here */
static dg_tensor *c_batchnorm(dg_ctx *c, dg_tensor *const *s, const int *a) {
  int64_t C = dg_tensor_dim(s[0], 1);
  dg_tensor *rm = dg_full(c, 1, &C, 0.25f), *rv = dg_full(c, 1, &C, 1.5f);
  return dg_batchnorm(c, s[0], s[1], s[2], rm, rv, a[0], 0.1f, 1e-5f);
}
static dg_tensor *c_conv2d(dg_ctx *c, dg_tensor *const *s, const int *a) {
  return dg_conv2d(c, s[0], s[1], s[2], a[0], a[1]);
}
static dg_tensor *c_concat(dg_ctx *c, dg_tensor *const *s, const int *a) {
  return dg_concat(c, 2, s, a[0]);
}
static dg_tensor *c_mlp(dg_ctx *c, dg_tensor *const *s, const int *a) {
  (void)a;
  return dg_mlp_gelu(c, s[0], s[1], s[2], s[3], s[4]);
}
static dg_tensor *c_mlp_add(dg_ctx *c, dg_tensor *const *s, const int *a) {
  (void)a;
  return dg_mlp_gelu_add(c, s[0], s[1], s[2], s[3], s[4], s[5]);
}

static const op_desc ADD = {"add", c_add, 2, {"a", "b"}};
static const op_desc SUB = {"sub", c_sub, 2, {"a", "b"}};
static const op_desc MUL = {"mul", c_mul, 2, {"a", "b"}};
static const op_desc DIV = {"div", c_div, 2, {"a", "b"}};
static const op_desc ADD_T = {"add(a, b^T)", c_add_t, 2, {"a", "b"}};
static const op_desc MUL_T = {"mul(a, b^T)", c_mul_t, 2, {"a", "b"}};
static const op_desc DIV_T = {"div(a, b^T)", c_div_t, 2, {"a", "b"}};
static const op_desc MATMUL = {"matmul", c_matmul, 2, {"a", "b"}};
static const op_desc MATMUL_T = {"matmul_t", c_matmul_t, 2, {"a", "b"}};
static const op_desc LINEAR = {"linear", c_linear, 3, {"x", "w", "b"}};
static const op_desc LINEAR_RELU = {"linear_relu", c_linear_relu, 3, {"x", "w", "b"}};
static const op_desc LINEAR_ADD = {"linear_add", c_linear_add, 4, {"x", "w", "b", "res"}};
static const op_desc MSE = {"mse", c_mse, 2, {"pred", "target"}};
static const op_desc LAYERNORM = {"layernorm", c_layernorm, 3, {"x", "w", "b"}};
static const op_desc BATCHNORM = {"batchnorm", c_batchnorm, 3, {"x", "w", "b"}};
static const op_desc CONV2D = {"conv2d", c_conv2d, 3, {"x", "w", "b"}};
static const op_desc CONCAT = {"concat", c_concat, 2, {"x0", "x1"}};
static const op_desc MLP = {"mlp_gelu", c_mlp, 5, {"x", "w1", "b1", "w2", "b2"}};
static const op_desc MLP_ADD = {"mlp_gelu_add", c_mlp_add, 6, {"x", "w1", "b1", "w2", "b2", "res"}};

#define T2(i, j) ((1u << (i)) | (1u << (j)))
#define T3(i, j, k) (T2(i, j) | (1u << (k)))
#define T4(i, j, k, l) (T3(i, j, k) | (1u << (l)))

static const alias_case cases[] = {
    {&ADD, "3x4 3x4", {0}, T2(0, 1), -2, 2},
    {&ADD, "2x3x2 2x3x2", {0}, T2(0, 1), -2, 2},
    {&SUB, "3x4 3x4", {0}, T2(0, 1), -2, 2},
    {&MUL, "3x4 3x4", {0}, T2(0, 1), -2, 2},
    {&MUL, "5 5", {0}, T2(0, 1), -2, 2},
    {&DIV, "3x4 3x4", {0}, T2(0, 1), 0.5f, 2},
    {&ADD_T, "3x1 3x1", {0}, T2(0, 1), -2, 2},
    {&MUL_T, "4x1 4x1", {0}, T2(0, 1), -2, 2},
    {&DIV_T, "3x1 3x1", {0}, T2(0, 1), 0.5f, 2},
    {&MATMUL, "3x3 3x3", {0}, T2(0, 1), -1, 1},
    {&MATMUL, "2x3x3 2x3x3", {0}, T2(0, 1), -1, 1},
    {&MATMUL_T, "3x4 3x4", {0, 1}, T2(0, 1), -1, 1}, /* a a^T */
    {&MATMUL_T, "3x4 3x4", {1, 0}, T2(0, 1), -1, 1}, /* a^T a */
    {&MATMUL_T, "3x3 3x3", {1, 1}, T2(0, 1), -1, 1},
    {&MATMUL_T, "2x3x4 2x3x4", {0, 1}, T2(0, 1), -1, 1},
    {&LINEAR, "3x4 3x4 -", {0}, T2(0, 1), -1, 1},
    {&LINEAR, "3x4 3x4 3", {0}, T2(0, 1), -1, 1},
    {&LINEAR, "3 3x3 3", {0}, T2(0, 2), -1, 1},
    {&LINEAR_RELU, "3x4 3x4 3", {0}, T2(0, 1), -1, 1},
    {&LINEAR_RELU, "3 3x3 3", {0}, T2(0, 2), -1, 1},
    {&LINEAR_ADD, "3x3 3x3 3 3x3", {0}, T2(0, 1), -1, 1},
    {&LINEAR_ADD, "3x3 3x3 3 3x3", {0}, T2(0, 3), -1, 1},
    {&LINEAR_ADD, "3x3 3x3 3 3x3", {0}, T2(1, 3), -1, 1},
    {&LINEAR_ADD, "3x3 3x3 3 3x3", {0}, T3(0, 1, 3), -1, 1},
    {&LINEAR_ADD, "3x3 3x3 - 3x3", {0}, T2(0, 3), -1, 1},
    {&LINEAR_ADD, "3 3x3 3 3", {0}, T2(0, 2), -1, 1},
    {&LINEAR_ADD, "3 3x3 3 3", {0}, T2(0, 3), -1, 1},
    {&LINEAR_ADD, "3 3x3 3 3", {0}, T2(2, 3), -1, 1},
    {&LINEAR_ADD, "3 3x3 3 3", {0}, T3(0, 2, 3), -1, 1},
    {&MSE, "3x4 3x4", {0}, T2(0, 1), -1, 1},
    {&LAYERNORM, "5 5 5", {0}, T2(0, 1), -2, 2},
    {&LAYERNORM, "5 5 5", {0}, T2(0, 2), -2, 2},
    {&LAYERNORM, "5 5 5", {0}, T2(1, 2), -2, 2},
    {&LAYERNORM, "5 5 5", {0}, T3(0, 1, 2), -2, 2},
    {&LAYERNORM, "5 5 -", {0}, T2(0, 1), -2, 2},
    {&LAYERNORM, "5 - 5", {0}, T2(0, 2), -2, 2},
    {&LAYERNORM, "3x5 5 5", {0}, T2(1, 2), -2, 2},
    {&BATCHNORM, "4x3x2 3 3", {1}, T2(1, 2), -2, 2}, /* weight = bias */
    {&BATCHNORM, "4x3x2 3 3", {0}, T2(1, 2), -2, 2},
    {&CONV2D, "2x2x3x3 2x2x3x3 -", {1, 1}, T2(0, 1), -1, 1},
    {&CONV2D, "2x2x3x3 2x2x3x3 2", {1, 0}, T2(0, 1), -1, 1},
    {&CONV2D, "2x2x3x3 2x2x3x3 2", {2, 1}, T2(0, 1), -1, 1},
    {&CONCAT, "3x2 3x2", {0}, T2(0, 1), -1, 1},
    {&CONCAT, "3x2 3x2", {1}, T2(0, 1), -1, 1},
    {&MLP, "3x1 1x1 - 1x1 -", {0}, T2(1, 3), -2, 2},
    {&MLP, "3x3 3x3 - 3x3 -", {0}, T2(1, 3), -2, 2},
    {&MLP, "3x3 3x3 3 3x3 3", {0}, T2(0, 1), -2, 2},
    {&MLP, "3x3 3x3 3 3x3 3", {0}, T2(0, 3), -2, 2},
    {&MLP, "3x3 3x3 3 3x3 3", {0}, T2(1, 3), -2, 2},
    {&MLP, "3x3 3x3 3 3x3 3", {0}, T2(2, 4), -2, 2},
    {&MLP, "3x3 3x3 3 3x3 3", {0}, T3(0, 1, 3), -2, 2},
    {&MLP, "3 3x3 3 3x3 3", {0}, T2(0, 2), -2, 2},
    {&MLP, "3 3x3 3 3x3 3", {0}, T2(0, 4), -2, 2},
    {&MLP, "3 3x3 3 3x3 3", {0}, T3(0, 2, 4), -2, 2},
    {&MLP_ADD, "3x1 1x1 - 1x1 - 3x1", {0}, T2(0, 5), -2, 2},
    {&MLP_ADD, "3x1 1x1 - 1x1 - 3x1", {0}, T2(1, 3), -2, 2},
    {&MLP_ADD, "3x3 3x3 3 3x3 3 3x3", {0}, T2(0, 5), -2, 2},
    {&MLP_ADD, "3x3 3x3 3 3x3 3 3x3", {0}, T2(1, 5), -2, 2},
    {&MLP_ADD, "3x3 3x3 3 3x3 3 3x3", {0}, T2(3, 5), -2, 2},
    {&MLP_ADD, "3x3 3x3 3 3x3 3 3x3", {0}, T2(0, 1), -2, 2},
    {&MLP_ADD, "3x3 3x3 3 3x3 3 3x3", {0}, T2(1, 3), -2, 2},
    {&MLP_ADD, "3x3 3x3 3 3x3 3 3x3", {0}, T4(0, 1, 3, 5), -2, 2},
    {&MLP_ADD, "3 3x3 3 3x3 3 3", {0}, T2(0, 5), -2, 2},
    {&MLP_ADD, "3 3x3 3 3x3 3 3", {0}, T2(2, 5), -2, 2},
    {&MLP_ADD, "3 3x3 3 3x3 3 3", {0}, T2(4, 5), -2, 2},
    {&MLP_ADD, "3 3x3 3 3x3 3 3", {0}, T2(2, 4), -2, 2},
};

/* Larger shapes: several row blocks and thread splits. Compared with the
 * untied gradients summed. */
static const alias_case big_cases[] = {
    {&MLP_ADD, "600x64 512x64 512 64x512 64 600x64", {0}, T2(0, 5), -1, 1},
    {&MLP, "700x400 400x400 400 400x400 400", {0}, T2(1, 3), -0.1f, 0.1f},
    {&MLP, "400x400 400x400 - 400x400 -", {0}, T2(0, 1), -0.1f, 0.1f},
    {&MLP_ADD, "400x400 400x400 400 400x400 400 400x400", {0}, T4(0, 1, 3, 5), -0.1f, 0.1f},
    {&LINEAR_ADD, "512x256 256x256 256 512x256", {0}, T2(0, 3), -1, 1},
    {&LINEAR_ADD, "256x256 256x256 256 256x256", {0}, T3(0, 1, 3), -1, 1},
    {&LINEAR, "256x256 256x256 256", {0}, T2(0, 1), -1, 1},
    {&LAYERNORM, "1024x128 128 128", {0}, T2(1, 2), -2, 2},
    {&LAYERNORM, "4096 4096 4096", {0}, T3(0, 1, 2), -2, 2},
    {&CONV2D, "8x8x6x6 8x8x6x6 8", {1, 2}, T2(0, 1), -1, 1},
    {&MATMUL, "256x256 256x256", {0}, T2(0, 1), -0.2f, 0.2f},
    {&MATMUL_T, "4x128x96 4x128x96", {0, 1}, T2(0, 1), -0.2f, 0.2f},
    {&ADD, "512x400 512x400", {0}, T2(0, 1), -2, 2},
    {&MUL, "512x400 512x400", {0}, T2(0, 1), -2, 2},
    {&DIV, "512x400 512x400", {0}, T2(0, 1), 0.5f, 2},
    {&CONCAT, "512x400 512x400", {1}, T2(0, 1), -1, 1},
    {&MSE, "512x400 512x400", {0}, T2(0, 1), -1, 1},
};

/* ---- bindings: slots -> leaves ---- */

enum { V_NONE, V_RESHAPE, V_T2, V_SLICE, V_CONTIG, V_TCT, NVIEWS };
static const char *const view_name[NVIEWS] = {
    "none", "reshape", "transpose twice", "slice of all rows", "contiguous",
    "transposed copy transposed back"};

typedef struct {
  const alias_case *c;
  int ndim[MAXS]; /* -1: NULL slot */
  int64_t shape[MAXS][4];
  int nleaf;
  int leaf[MAXS]; /* slot -> leaf, -1 for NULL */
  int leaf_slot[MAXS]; /* leaf -> its first slot */
  int view_slot, view;
  char desc[320];
} binding;

static void parse_shapes(const char *s, binding *b) {
  for (int k = 0; k < b->c->op->nslot; k++) {
    while (*s == ' ') s++;
    if (*s == '-') {
      b->ndim[k] = -1;
      s++;
      continue;
    }
    int nd = 0;
    for (;;) {
      char *end;
      b->shape[k][nd++] = strtoll(s, &end, 10);
      s = end;
      if (*s != 'x') break;
      s++;
    }
    b->ndim[k] = nd;
  }
}

/* snprintf at the end of buf (cap bytes in all), truncating. */
static void appendf(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void appendf(char *buf, size_t cap, const char *fmt, ...) {
  size_t n = strlen(buf);
  va_list ap;
  va_start(ap, fmt);
  if (n < cap) vsnprintf(buf + n, cap - n, fmt, ap);
  va_end(ap);
}

/* untied: every slot its own leaf (the tied ones to be given equal values). */
static void bind_case(const alias_case *c, binding *b, int untied) {
  memset(b, 0, sizeof *b);
  b->c = c;
  b->view_slot = -1;
  parse_shapes(c->shapes, b);
  int first = -1;
  for (int k = 0; k < c->op->nslot; k++) {
    b->leaf[k] = -1;
    if (b->ndim[k] < 0) continue;
    if (!untied && (c->tie >> k & 1) && first >= 0) {
      b->leaf[k] = b->leaf[first];
      continue;
    }
    if ((c->tie >> k & 1) && first < 0) first = k;
    b->leaf_slot[b->nleaf] = k;
    b->leaf[k] = b->nleaf++;
  }
  char *d = b->desc;
  const size_t cap = sizeof b->desc;
  snprintf(d, cap, "%s [%s] attr (%d, %d) tied {", c->op->name, c->shapes, c->attr[0],
           c->attr[1]);
  for (int k = 0, n = 0; k < c->op->nslot; k++)
    if (c->tie >> k & 1) appendf(d, cap, "%s%s", n++ ? ", " : "", c->op->slot[k]);
  appendf(d, cap, "}, inputs [");
  for (int l = 0; l < b->nleaf; l++) { /* gc_check's "input l" */
    appendf(d, cap, "%s%d: ", l ? ", " : "", l);
    for (int k = 0, n = 0; k < c->op->nslot; k++)
      if (b->leaf[k] == l) appendf(d, cap, "%s%s", n++ ? "=" : "", c->op->slot[k]);
  }
  appendf(d, cap, "]");
}

static int first_tied(const binding *b) {
  for (int k = 0; k < b->c->op->nslot; k++)
    if (b->c->tie >> k & 1) return k;
  return -1;
}
static int last_tied(const binding *b) {
  int last = -1;
  for (int k = 0; k < b->c->op->nslot; k++)
    if (b->c->tie >> k & 1) last = k;
  return last;
}

/* Whether view v keeps slot k's shape and applies to it. */
static int view_applies(const binding *b, int k, int v) {
  int nd = b->ndim[k];
  if (v == V_T2 || v == V_TCT) return nd >= 2;
  if (v == V_SLICE) return nd >= 1;
  return 1;
}

static dg_tensor *make_view(dg_ctx *ctx, dg_tensor *t, int v) {
  int nd = dg_tensor_ndim(t);
  switch (v) {
  case V_RESHAPE: return dg_reshape(ctx, t, nd, dg_tensor_shape(t));
  case V_T2: return dg_transpose(ctx, dg_transpose(ctx, t, 0, 1), 0, 1);
  case V_SLICE: return dg_slice(ctx, t, 0, dg_tensor_dim(t, 0));
  case V_CONTIG: return dg_contiguous(ctx, t);
  case V_TCT: return dg_transpose(ctx, dg_contiguous(ctx, dg_transpose(ctx, t, 0, 1)), 0, 1);
  default: return t;
  }
}

/* The gc_fn: binds the leaves to the op's slots. */
static dg_tensor *bound_fn(dg_ctx *ctx, dg_tensor **in, void *u) {
  const binding *b = u;
  dg_tensor *s[MAXS] = {0};
  for (int k = 0; k < b->c->op->nslot; k++) {
    if (b->leaf[k] < 0) continue;
    s[k] = in[b->leaf[k]];
    if (k == b->view_slot) s[k] = make_view(ctx, s[k], b->view);
    if (!s[k]) return NULL;
  }
  return b->c->op->call(ctx, s, b->c->attr);
}

static void fill_uniform(float *d, int64_t n, float lo, float hi, uint64_t seed) {
  dg_rng_uniform(seed, 0, d, (size_t)n);
  for (int64_t i = 0; i < n; i++) d[i] = lo + (hi - lo) * d[i];
}

/* Fresh plain leaves (persistent, grad on, no gradient yet). */
static void make_leaves(const binding *b, dg_tensor **in, uint64_t seed) {
  for (int l = 0; l < b->nleaf; l++) {
    int k = b->leaf_slot[l];
    in[l] = gc_input(b->ndim[k], b->shape[k], b->c->lo, b->c->hi, seed + (uint64_t)l);
    REQUIRE(in[l] != NULL);
  }
}

static void free_leaves(int n, dg_tensor **in) {
  for (int l = 0; l < n; l++) dg_tensor_free(in[l]);
}

/* ---- plain leaves and views, through gc_check ---- */

static int g_threads = 1;

static void view_label(char *nm, size_t cap, const binding *b, const char *what) {
  if (b->view_slot < 0)
    snprintf(nm, cap, "%s, %s, threads %d", b->desc, what, g_threads);
  else
    snprintf(nm, cap, "%s, %s, slot %s gets a view (%s), threads %d", b->desc, what,
             b->c->op->slot[b->view_slot], view_name[b->view], g_threads);
}

static void plain_checks(const alias_case *c, uint64_t seed) {
  binding b;
  bind_case(c, &b, 0);
  dg_tensor *in[MAXS];
  char nm[512];
  /* fresh gradients (the first writer overwrites), then zeroed ones (add) */
  make_leaves(&b, in, seed);
  view_label(nm, sizeof nm, &b, "plain leaf, fresh gradient");
  CHECK_EQ_INT(gc_check(nm, bound_fn, &b, b.nleaf, in, 1e-3, 1e-2), 0);
  view_label(nm, sizeof nm, &b, "plain leaf, zeroed gradient");
  CHECK_EQ_INT(gc_check(nm, bound_fn, &b, b.nleaf, in, 1e-3, 1e-2), 0);
  free_leaves(b.nleaf, in);
  const int slots[2] = {last_tied(&b), first_tied(&b)};
  for (int v = V_RESHAPE; v < NVIEWS; v++) {
    for (int s = 0; s < 2; s++) {
      if (s == 1 && v != V_RESHAPE && v != V_T2) continue;
      if (!view_applies(&b, slots[s], v)) continue;
      b.view_slot = slots[s];
      b.view = v;
      make_leaves(&b, in, seed);
      view_label(nm, sizeof nm, &b, "plain leaf, fresh gradient");
      CHECK_EQ_INT(gc_check(nm, bound_fn, &b, b.nleaf, in, 1e-3, 1e-2), 0);
      free_leaves(b.nleaf, in);
    }
  }
}

/* ---- parameters: lazily zeroed and accumulated gradients ---- */

enum { M_PLAIN, M_STALE, M_ACCUM };
static const char *const mode_name[] = {
    "plain leaf, fresh gradient",
    "parameter after zero_grad over a garbage gradient",
    "parameter accumulating onto an earlier gradient"};

typedef struct {
  dg_tensor *in[MAXS];
  dg_params *ps;     /* M_STALE, M_ACCUM: owns in[] */
  float *grad[MAXS]; /* the step's own gradient (earlier one subtracted) */
  float *w;          /* loss = sum(out * w) */
} run_state;

static dg_params *make_params(const binding *b, dg_tensor **in, uint64_t seed) {
  dg_params *ps = NULL;
  REQUIRE(dg_params_new(&ps) == DG_OK);
  for (int l = 0; l < b->nleaf; l++) {
    int k = b->leaf_slot[l];
    char name[16];
    snprintf(name, sizeof name, "p%d", l);
    REQUIRE(dg_params_add(ps, name, b->ndim[k], b->shape[k], &in[l]) == DG_OK);
  }
  /* data pointers are final once every parameter is added */
  for (int l = 0; l < b->nleaf; l++)
    fill_uniform(dg_tensor_data(in[l]), dg_tensor_numel(in[l]), b->c->lo, b->c->hi,
                 seed + (uint64_t)l);
  return ps;
}

static float *weights(int64_t n, uint64_t seed) {
  float *w = malloc((size_t)(n ? n : 1) * sizeof *w);
  REQUIRE(w != NULL);
  fill_uniform(w, n, -1, 1, seed);
  return w;
}

/* An earlier step: backward of sum(out), then the gradients set to known
 * values: garbage that zero_grad marks stale (M_STALE, prior 0), or an
 * accumulated gradient the next backward adds to (M_ACCUM). */
static int prior_step(dg_ctx *ctx, const binding *b, run_state *r, int mode, float **prior,
                      const char *label) {
  dg_tensor *y = bound_fn(ctx, r->in, (void *)b);
  if (!y || dg_backward(ctx, y)) {
    fprintf(stderr, "FAIL %s: first step failed: %s\n", label, dg_ctx_errmsg(ctx));
    return 1;
  }
  for (int l = 0; l < b->nleaf; l++) {
    int64_t n = dg_tensor_numel(r->in[l]);
    dg_tensor *g = dg_tensor_grad(r->in[l]);
    REQUIRE(g != NULL);
    float *gd = dg_tensor_data(g);
    prior[l] = calloc((size_t)(n ? n : 1), sizeof(float));
    REQUIRE(prior[l] != NULL);
    for (int64_t e = 0; e < n; e++) {
      gd[e] = mode == M_STALE ? 100.0f + (float)e : 0.25f * (float)(e % 7) - 0.75f;
      if (mode == M_ACCUM) prior[l][e] = gd[e];
    }
  }
  if (mode == M_STALE) dg_params_zero_grad(r->ps);
  return 0;
}

/* The tied binding's gradients of sum(out * w) in the given mode. */
static int tied_run(dg_ctx *ctx, const binding *b, int mode, uint64_t seed, run_state *r,
                    const char *label) {
  memset(r, 0, sizeof *r);
  float *prior[MAXS] = {0};
  if (mode == M_PLAIN) make_leaves(b, r->in, seed);
  else r->ps = make_params(b, r->in, seed);
  if (mode != M_PLAIN && prior_step(ctx, b, r, mode, prior, label)) return 1;
  dg_ctx_reset(ctx);
  dg_tensor *y = bound_fn(ctx, r->in, (void *)b);
  if (!y) {
    fprintf(stderr, "FAIL %s: forward failed: %s\n", label, dg_ctx_errmsg(ctx));
    return 1;
  }
  int64_t ny = dg_tensor_numel(y);
  r->w = weights(ny, 777);
  dg_tensor *wt = dg_from_data(ctx, DG_F32, dg_tensor_ndim(y), dg_tensor_shape(y), r->w);
  if (!wt || dg_backward_with(ctx, y, wt)) {
    fprintf(stderr, "FAIL %s: backward failed: %s\n", label, dg_ctx_errmsg(ctx));
    return 1;
  }
  int bad = 0;
  for (int l = 0; l < b->nleaf; l++) {
    int64_t n = dg_tensor_numel(r->in[l]);
    dg_tensor *g = dg_tensor_grad(r->in[l]);
    r->grad[l] = calloc((size_t)(n ? n : 1), sizeof(float));
    REQUIRE(r->grad[l] != NULL);
    if (!g && n) {
      fprintf(stderr, "FAIL %s: leaf %d got no gradient\n", label, l);
      bad++;
    }
    for (int64_t e = 0; g && e < n; e++)
      r->grad[l][e] = ((const float *)dg_tensor_data(g))[e] - (prior[l] ? prior[l][e] : 0);
    free(prior[l]);
  }
  return bad;
}

static void free_run(const binding *b, run_state *r) {
  if (r->ps) dg_params_free(r->ps);
  else free_leaves(b->nleaf, r->in);
  for (int l = 0; l < MAXS; l++) free(r->grad[l]);
  free(r->w);
}

static const char *leaf_name(const binding *b, int l) {
  int k = b->leaf_slot[l];
  return (b->c->tie >> k & 1) ? "the tied tensor" : b->c->op->slot[k];
}

/* Central differences of sum(out * w) against r->grad, as gc_check. */
static int fd_compare(dg_ctx *ctx, binding *b, run_state *r, const char *label) {
  int bad = 0, kinks = 0, ok = 1;
  for (int l = 0; l < b->nleaf; l++) {
    float *x = dg_tensor_data(r->in[l]);
    for (int64_t j = 0, n = dg_tensor_numel(r->in[l]); j < n; j++) {
      float x0 = x[j];
      double h = 1e-2 * (fabs(x0) > 1 ? fabs(x0) : 1.0);
      double L0 = gc_loss(ctx, bound_fn, b, r->in, r->w, &ok);
      x[j] = (float)(x0 + h);
      double hp = (double)x[j] - x0, Lp = gc_loss(ctx, bound_fn, b, r->in, r->w, &ok);
      x[j] = (float)(x0 - h);
      double hm = x0 - (double)x[j], Lm = gc_loss(ctx, bound_fn, b, r->in, r->w, &ok);
      x[j] = x0;
      double fd = (Lp - Lm) / (hp + hm), dp = (Lp - L0) / hp, dm = (L0 - Lm) / hm;
      double tol = 1e-3 + 1e-2 * fabs(fd);
      if (fabs(dp - dm) > 10 * tol + 0.5 * (fabs(dp) + fabs(dm))) {
        kinks++;
        continue;
      }
      if (!(fabs(r->grad[l][j] - fd) <= tol)) {
        if (bad < 8)
          fprintf(stderr, "FAIL %s: %s (leaf %d) elem %lld: analytic %.6g vs numeric %.6g\n",
                  label, leaf_name(b, l), l, (long long)j, r->grad[l][j], fd);
        bad++;
      }
    }
  }
  if (kinks > 2) {
    fprintf(stderr, "FAIL %s: %d elements skipped as kinks\n", label, kinks);
    bad++;
  }
  return bad + !ok;
}

static void param_check(binding *b, int mode, uint64_t seed) {
  char nm[512];
  view_label(nm, sizeof nm, b, mode_name[mode]);
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  run_state r;
  int bad = tied_run(ctx, b, mode, seed, &r, nm);
  if (!bad) bad = fd_compare(ctx, b, &r, nm);
  fprintf(stderr, "%s %s\n", bad ? "FAIL" : "ok  ", nm);
  CHECK_EQ_INT(bad, 0);
  free_run(b, &r);
  dg_ctx_free(ctx);
}

static void param_checks(const alias_case *c, uint64_t seed) {
  binding b;
  bind_case(c, &b, 0);
  param_check(&b, M_STALE, seed);
  param_check(&b, M_ACCUM, seed);
  b.view_slot = last_tied(&b);
  b.view = V_RESHAPE;
  param_check(&b, M_STALE, seed);
  b.view_slot = first_tied(&b);
  b.view = V_T2;
  if (view_applies(&b, b.view_slot, V_T2)) param_check(&b, M_STALE, seed);
}

/* ---- large shapes: tied against the untied gradients summed ---- */

/* Untied: every slot its own plain leaf, tied slots with equal values;
 * want[l] = the tied leaf l's expected gradient. */
static int untied_grads(dg_ctx *ctx, const binding *bt, uint64_t seed, float **want) {
  binding bu;
  bind_case(bt->c, &bu, 1);
  dg_tensor *in[MAXS];
  for (int l = 0; l < bu.nleaf; l++) {
    int k = bu.leaf_slot[l];
    in[l] = gc_input(bu.ndim[k], bu.shape[k], bu.c->lo, bu.c->hi, seed + (uint64_t)bt->leaf[k]);
    REQUIRE(in[l] != NULL);
  }
  dg_ctx_reset(ctx);
  dg_tensor *y = bound_fn(ctx, in, &bu);
  REQUIRE(y != NULL);
  float *w = weights(dg_tensor_numel(y), 777);
  dg_tensor *wt = dg_from_data(ctx, DG_F32, dg_tensor_ndim(y), dg_tensor_shape(y), w);
  REQUIRE(wt && dg_backward_with(ctx, y, wt) == DG_OK);
  for (int l = 0; l < bu.nleaf; l++) {
    int k = bu.leaf_slot[l], tl = bt->leaf[k];
    int64_t n = dg_tensor_numel(in[l]);
    dg_tensor *g = dg_tensor_grad(in[l]);
    REQUIRE(g || !n);
    for (int64_t e = 0; e < n; e++) want[tl][e] += ((const float *)dg_tensor_data(g))[e];
  }
  free(w);
  free_leaves(bu.nleaf, in);
  return 0;
}

static void big_check(const alias_case *c, int mode, uint64_t seed) {
  binding b;
  bind_case(c, &b, 0);
  char nm[512];
  view_label(nm, sizeof nm, &b, mode_name[mode]);
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  float *want[MAXS] = {0};
  for (int l = 0; l < b.nleaf; l++) {
    int k = b.leaf_slot[l];
    int64_t n = 1;
    for (int d = 0; d < b.ndim[k]; d++) n *= b.shape[k][d];
    want[l] = calloc((size_t)(n ? n : 1), sizeof(float));
  }
  untied_grads(ctx, &b, seed, want);
  run_state r;
  int bad = tied_run(ctx, &b, mode, seed, &r, nm);
  for (int l = 0; !bad && l < b.nleaf; l++) {
    int64_t n = dg_tensor_numel(r.in[l]), at = 0;
    double scale = 0, diff = 0;
    for (int64_t e = 0; e < n; e++) scale = fmax(scale, fabs(want[l][e]));
    for (int64_t e = 0; e < n; e++) {
      double d = fabs((double)r.grad[l][e] - want[l][e]);
      if (!(d <= diff)) diff = d, at = e;
    }
    if (!(diff <= 1e-4 * (1 + scale))) {
      fprintf(stderr, "FAIL %s: %s (leaf %d) elem %lld: tied %.6g vs untied sum %.6g "
              "(max |grad| %.3g)\n", nm, leaf_name(&b, l), l, (long long)at, r.grad[l][at],
              want[l][at], scale);
      bad++;
    }
  }
  fprintf(stderr, "%s %s (against the untied sum)\n", bad ? "FAIL" : "ok  ", nm);
  CHECK_EQ_INT(bad, 0);
  free_run(&b, &r);
  for (int l = 0; l < MAXS; l++) free(want[l]);
  dg_ctx_free(ctx);
}

int main(void) {
  static const int threads[2] = {1, 2};
  for (int t = 0; t < 2; t++) {
    g_threads = threads[t];
    dg_set_num_threads(g_threads);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
      plain_checks(&cases[i], 1000 + 10 * i);
      param_checks(&cases[i], 1000 + 10 * i);
    }
    for (size_t i = 0; i < sizeof big_cases / sizeof big_cases[0]; i++) {
      big_check(&big_cases[i], M_PLAIN, 5000 + 10 * i);
      big_check(&big_cases[i], M_STALE, 5000 + 10 * i);
    }
  }
  dg_set_num_threads(1);
  return TEST_DONE();
}
