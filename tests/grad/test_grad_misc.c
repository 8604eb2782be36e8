/* dropout, causal mask, concat and split: finite-difference checks of
 * backward, forward values, reproducibility from the seed and error paths;
 * backward from several outputs at once. */
#include "gradcheck.h"
#include "test.h"

/* ---- dropout ---- */

/* Reseeds before dropout so every evaluation draws the same mask. */
static dg_tensor *f_dropout(dg_ctx *ctx, dg_tensor **in, void *u) {
  dg_ctx_seed(ctx, 99);
  return dg_dropout(ctx, in[0], *(float *)u);
}

/* Two dropouts in a row draw different masks from the one stream. */
static dg_tensor *f_dropout2(dg_ctx *ctx, dg_tensor **in, void *u) {
  (void)u;
  dg_ctx_seed(ctx, 7);
  return dg_dropout(ctx, dg_dropout(ctx, in[0], 0.5f), 0.25f);
}

static void grad_dropout(void) {
  int64_t s1[2] = {3, 5}, s2[3] = {2, 3, 100}; /* the second spans several RNG chunks */
  float p = 0.3f;
  dg_tensor *in[1] = {gc_input(2, s1, -1, 1, 100)};
  CHECK_EQ_INT(gc_check("dropout p=0.3 (3, 5)", f_dropout, &p, 1, in, 1e-3, 1e-2), 0);
  CHECK_EQ_INT(gc_check("dropout twice", f_dropout2, NULL, 1, in, 1e-3, 1e-2), 0);
  dg_tensor_free(in[0]);
  in[0] = gc_input(3, s2, -1, 1, 101);
  p = 0.5f;
  CHECK_EQ_INT(gc_check("dropout p=0.5 (2, 3, 100)", f_dropout, &p, 1, in, 1e-3, 1e-2), 0);
  dg_tensor_free(in[0]);
}

static void dropout_values(dg_ctx *ctx) {
  enum { N = 10000 };
  int64_t s[1] = {N};
  dg_tensor *x = dg_full(ctx, 1, s, 2.0f);
  dg_ctx_seed(ctx, 5);
  dg_tensor *a = dg_dropout(ctx, x, 0.25f), *b = dg_dropout(ctx, x, 0.25f);
  dg_ctx_seed(ctx, 5);
  dg_tensor *a2 = dg_dropout(ctx, x, 0.25f);
  dg_ctx_seed(ctx, 6);
  dg_tensor *c = dg_dropout(ctx, x, 0.25f);
  REQUIRE(a && b && a2 && c);
  int zeros = 0, same_ab = 0, same_ac = 0, bad = 0;
  for (int i = 0; i < N; i++) {
    double va = dg_tensor_get(a, i);
    zeros += va == 0;
    bad += !(va == 0 || fabs(va - 2.0 / 0.75) < 1e-6); /* kept values scaled by 1 / (1 - p) */
    bad += va != dg_tensor_get(a2, i);                  /* same seed: same mask */
    same_ab += va == dg_tensor_get(b, i);
    same_ac += va == dg_tensor_get(c, i);
  }
  CHECK_EQ_INT(bad, 0);
  CHECK(zeros > N / 4 - 300 && zeros < N / 4 + 300);
  CHECK(same_ab < N * 0.8); /* the stream advanced */
  CHECK(same_ac < N * 0.8); /* another seed, another mask */

  CHECK(dg_dropout(ctx, x, 0.0f) == x);
  dg_ctx_set_train(ctx, 0);
  CHECK(dg_dropout(ctx, x, 0.5f) == x);
  dg_ctx_set_train(ctx, 1);
  float badp[3] = {1.0f, -0.1f, NAN};
  for (int i = 0; i < 3; i++) {
    CHECK(dg_dropout(ctx, x, badp[i]) == NULL);
    CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_EINVAL);
    CHECK_STR_HAS(dg_ctx_errmsg(ctx), "dropout");
    dg_ctx_clear_error(ctx);
  }
}

/* ---- causal mask ---- */

static dg_tensor *f_mask_softmax(dg_ctx *ctx, dg_tensor **in, void *u) {
  (void)u; /* the -inf entries must not enter a finite loss: softmax zeroes them */
  return dg_softmax(ctx, dg_causal_mask(ctx, in[0]));
}

static void grad_mask(void) {
  int64_t s2[2] = {3, 3}, s3[3] = {2, 4, 4}, s4[4] = {2, 2, 3, 3};
  dg_tensor *in[1] = {gc_input(2, s2, -2, 2, 110)};
  CHECK_EQ_INT(gc_check("softmax(causal_mask) (3, 3)", f_mask_softmax, NULL, 1, in, 1e-3, 1e-2), 0);
  dg_tensor_free(in[0]);
  in[0] = gc_input(3, s3, -2, 2, 111);
  CHECK_EQ_INT(gc_check("softmax(causal_mask) (2, 4, 4)", f_mask_softmax, NULL, 1, in, 1e-3, 1e-2), 0);
  dg_tensor_free(in[0]);
  in[0] = gc_input(4, s4, -2, 2, 112);
  CHECK_EQ_INT(gc_check("softmax(causal_mask) (2, 2, 3, 3)", f_mask_softmax, NULL, 1, in, 1e-3, 1e-2), 0);
  dg_tensor_free(in[0]);
}

/* Forward values, and backward by hand: the gradient passes where kept. */
static void mask_values(dg_ctx *ctx) {
  int64_t s[3] = {2, 3, 3};
  dg_tensor *x = NULL;
  REQUIRE(dg_tensor_new(&x, DG_F32, 3, s, NULL, 0) == DG_OK);
  float *xd = dg_tensor_data(x);
  for (int i = 0; i < 18; i++) xd[i] = (float)i;
  dg_tensor_set_requires_grad(x, 1);
  dg_tensor *y = dg_causal_mask(ctx, x);
  REQUIRE(y);
  float g[18];
  for (int i = 0; i < 18; i++) g[i] = (float)(i + 100);
  CHECK_OK(dg_backward_with(ctx, y, dg_from_data(ctx, DG_F32, 3, s, g)));
  dg_tensor *dx = dg_tensor_grad(x);
  REQUIRE(dx);
  for (int b = 0; b < 2; b++)
    for (int i = 0; i < 3; i++)
      for (int j = 0; j < 3; j++) {
        int k = (b * 3 + i) * 3 + j;
        double v = dg_tensor_get(y, k);
        if (j > i) CHECK(isinf(v) && v < 0);
        else CHECK_NEAR(v, k, 0);
        CHECK_NEAR(dg_tensor_get(dx, k), j > i ? 0 : k + 100, 0);
      }
  dg_tensor_free(x);
  dg_ctx_reset(ctx);
  int64_t r[2] = {3, 4};
  CHECK(dg_causal_mask(ctx, dg_zeros(ctx, DG_F32, 2, r)) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_ESHAPE);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "causal_mask");
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "(3, 4)");
  dg_ctx_clear_error(ctx);
}

/* ---- concat / split ---- */

typedef struct { int n, dim; } cat_case;

static dg_tensor *f_concat(dg_ctx *ctx, dg_tensor **in, void *u) {
  cat_case *c = u;
  return dg_concat(ctx, c->n, in, c->dim);
}

/* Splits in[0] and concatenates the parts in reverse order, or returns part
 * `pick` alone when pick >= 0. */
typedef struct { int dim, n, pick, transpose; int64_t sizes[4]; } split_case;

static dg_tensor *f_split(dg_ctx *ctx, dg_tensor **in, void *u) {
  split_case *c = u;
  dg_tensor *parts[4], *rev[4];
  dg_tensor *x = c->transpose ? dg_transpose(ctx, in[0], 0, 1) : in[0];
  if (dg_split(ctx, x, c->dim, c->n, c->sizes, parts)) return NULL;
  if (c->pick >= 0) return dg_contiguous(ctx, parts[c->pick]);
  for (int k = 0; k < c->n; k++) rev[k] = parts[c->n - 1 - k];
  return dg_concat(ctx, c->n, rev, c->dim);
}

static void grad_concat(void) {
  int64_t a[3] = {2, 3, 4}, b[3] = {2, 1, 4}, c[3] = {2, 2, 4};
  dg_tensor *in[3] = {gc_input(3, a, -1, 1, 120), gc_input(3, b, -1, 1, 121), gc_input(3, c, -1, 1, 122)};
  cat_case c1 = {3, 1}, c2 = {3, -2};
  CHECK_EQ_INT(gc_check("concat dim 1", f_concat, &c1, 3, in, 1e-3, 1e-2), 0);
  CHECK_EQ_INT(gc_check("concat dim -2", f_concat, &c2, 3, in, 1e-3, 1e-2), 0);
  dg_tensor_set_requires_grad(in[1], 0); /* a constant in the middle */
  CHECK_EQ_INT(gc_check("concat with a constant", f_concat, &c1, 3, in, 1e-3, 1e-2), 0);
  for (int i = 0; i < 3; i++) dg_tensor_free(in[i]);

  /* six inputs along the last dim: more than one node shares the output */
  dg_tensor *six[6];
  for (int i = 0; i < 6; i++) {
    int64_t s[2] = {3, 1 + i % 3};
    six[i] = gc_input(2, s, -1, 1, 130 + i);
  }
  cat_case c6 = {6, -1};
  CHECK_EQ_INT(gc_check("concat 6 inputs", f_concat, &c6, 6, six, 1e-3, 1e-2), 0);
  dg_tensor_set_requires_grad(six[0], 0); /* the first node needs grad only for some inputs */
  dg_tensor_set_requires_grad(six[1], 0);
  CHECK_EQ_INT(gc_check("concat 6 inputs, 2 constant", f_concat, &c6, 6, six, 1e-3, 1e-2), 0);
  for (int i = 0; i < 6; i++) dg_tensor_free(six[i]);

  int64_t d0[2] = {2, 3}, d1[2] = {4, 3};
  dg_tensor *in2[2] = {gc_input(2, d0, -1, 1, 140), gc_input(2, d1, -1, 1, 141)};
  cat_case c0 = {2, 0};
  CHECK_EQ_INT(gc_check("concat dim 0", f_concat, &c0, 2, in2, 1e-3, 1e-2), 0);
  dg_tensor_free(in2[1]);
  in2[1] = in2[0]; /* the same tensor twice: gradients add */
  CHECK_EQ_INT(gc_check("concat x with itself", f_concat, &c0, 2, in2, 1e-3, 1e-2), 0);
  dg_tensor_free(in2[0]);
}

static void grad_split(void) {
  int64_t s[3] = {5, 4, 6};
  dg_tensor *in[1] = {gc_input(3, s, -1, 1, 150)};
  split_case cases[6] = {
      {0, 3, -1, 0, {2, 0, 3}},  /* views along dim 0, one empty part */
      {1, 2, -1, 0, {1, 3}},
      {-1, 3, -1, 0, {1, 2, 3}},
      {2, 3, 1, 0, {1, 2, 3}},   /* one part alone: the rest gets zero gradient */
      {0, 2, 1, 0, {3, 2}},      /* one view alone */
      {0, 2, -1, 1, {1, 3}},     /* split a transposed (non-contiguous) view */
  };
  for (int k = 0; k < 6; k++) {
    char nm[64];
    snprintf(nm, sizeof nm, "split case %d (dim %d)", k, cases[k].dim);
    CHECK_EQ_INT(gc_check(nm, f_split, &cases[k], 1, in, 1e-3, 1e-2), 0);
  }
  dg_tensor_free(in[0]);
}

static void concat_values(dg_ctx *ctx) {
  int64_t sa[2] = {2, 2}, sb[2] = {2, 1};
  float a[4] = {1, 2, 3, 4}, b[2] = {5, 6};
  dg_tensor *xs[2] = {dg_from_data(ctx, DG_F32, 2, sa, a), dg_from_data(ctx, DG_F32, 2, sb, b)};
  dg_tensor *y = dg_concat(ctx, 2, xs, 1);
  REQUIRE(y);
  float want[6] = {1, 2, 5, 3, 4, 6};
  CHECK_EQ_INT(dg_tensor_dim(y, 1), 3);
  for (int i = 0; i < 6; i++) CHECK_NEAR(dg_tensor_get(y, i), want[i], 0);
  dg_tensor *parts[2];
  int64_t sz[2] = {1, 2};
  CHECK_OK(dg_split(ctx, y, 1, 2, sz, parts));
  CHECK_NEAR(dg_tensor_get(parts[0], 1), 3, 0);
  CHECK_NEAR(dg_tensor_get(parts[1], 0), 2, 0);
  CHECK_NEAR(dg_tensor_get(parts[1], 3), 6, 0);
  CHECK_OK(dg_split(ctx, y, 0, 2, (int64_t[]){1, 1}, parts));
  CHECK_NEAR(dg_tensor_get(parts[1], 2), 6, 0);

  CHECK(dg_concat(ctx, 2, (dg_tensor *[]){xs[0], dg_zeros(ctx, DG_F32, 2, (int64_t[]){3, 1})}, 1) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_ESHAPE);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "concat");
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "(3, 1)");
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "(2, 2)");
  dg_ctx_clear_error(ctx);
  CHECK(dg_concat(ctx, 2, xs, 2) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_EINVAL);
  dg_ctx_clear_error(ctx);
  CHECK(dg_concat(ctx, 2, (dg_tensor *[]){xs[0], NULL}, 1) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_EINVAL);
  dg_ctx_clear_error(ctx);
  CHECK_EQ_INT(dg_split(ctx, y, 1, 2, (int64_t[]){1, 1}, parts), DG_ESHAPE);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "split");
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "(2, 3)");
  CHECK(parts[0] == NULL && parts[1] == NULL);
  dg_ctx_clear_error(ctx);
  CHECK_EQ_INT(dg_split(ctx, y, 1, 2, (int64_t[]){4, -1}, parts), DG_EINVAL);
  dg_ctx_clear_error(ctx);
}

/* ---- backward from several outputs at once ---- */

/* Three outputs of one leaf, the third an intermediate of the other two:
 * y1 = tanh(x)^2, y2 = 3 tanh(x), y3 = tanh(x). Into *f the scalar
 * sum_k <y_k, g_k> (double), into ys the outputs. */
static double multi_outputs(dg_ctx *c, dg_tensor *x, const float *g, dg_tensor **ys) {
  dg_tensor *h = dg_tanh(c, x);
  ys[0] = dg_mul(c, h, h), ys[1] = dg_scale(c, h, 3.0f), ys[2] = h;
  double f = 0;
  for (int k = 0; k < 3; k++) {
    const float *y = dg_tensor_data(ys[k]);
    for (int i = 0; i < 12; i++) f += (double)y[i] * g[k * 12 + i];
  }
  return f;
}

static void zero_grad(dg_tensor *x) {
  dg_tensor *g = dg_tensor_grad(x);
  if (g) memset(dg_tensor_data(g), 0, (size_t)dg_tensor_numel(g) * sizeof(float));
}

/* dg_backward_multi gives the gradient of sum_k <y_k, g_k>: against
 * central differences, and against dg_backward of that scalar built from
 * ops; misuse writes nothing. */
static void backward_multi(void) {
  dg_ctx *c = NULL;
  dg_tensor *x = NULL;
  REQUIRE(dg_ctx_new(&c, NULL) == DG_OK);
  REQUIRE(dg_tensor_new(&x, DG_F32, 2, (int64_t[]){3, 4}, NULL, 0) == DG_OK);
  float *xv = dg_tensor_data(x), g[36];
  dg_rng_normal(3, 0, xv, 12);
  dg_rng_normal(4, 0, g, 36);
  dg_tensor_set_requires_grad(x, 1);
  dg_tensor *ys[3], *gs[3];
  multi_outputs(c, x, g, ys);
  for (int k = 0; k < 3; k++) gs[k] = dg_wrap(c, DG_F32, 2, (int64_t[]){3, 4}, g + k * 12);
  REQUIRE(dg_backward_multi(c, 3, ys, gs) == DG_OK);
  float got[12];
  memcpy(got, dg_tensor_data(dg_tensor_grad(x)), sizeof got);
  dg_ctx_reset(c);
  for (int i = 0; i < 12; i++) { /* central differences, grad mode off */
    const float x0 = xv[i], e = 1e-2f;
    dg_ctx_set_grad_enabled(c, 0);
    xv[i] = x0 + e;
    double fp = multi_outputs(c, x, g, ys);
    xv[i] = x0 - e;
    double fm = multi_outputs(c, x, g, ys);
    xv[i] = x0;
    dg_ctx_set_grad_enabled(c, 1);
    dg_ctx_reset(c);
    CHECK_NEAR(got[i], (fp - fm) / (2 * e), 2e-3 + 2e-3 * fabs((fp - fm) / (2 * e)));
  }
  zero_grad(x);
  multi_outputs(c, x, g, ys); /* the same scalar from ops: one root */
  dg_tensor *f = NULL;
  for (int k = 0; k < 3; k++) {
    dg_tensor *t = dg_sum(c, dg_mul(c, ys[k], dg_wrap(c, DG_F32, 2, (int64_t[]){3, 4},
                                                      g + k * 12)));
    f = f ? dg_add(c, f, t) : t;
  }
  REQUIRE(f && dg_backward(c, f) == DG_OK);
  const float *want = dg_tensor_data(dg_tensor_grad(x));
  for (int i = 0; i < 12; i++) CHECK_NEAR(got[i], want[i], 1e-5 * fabs(want[i]) + 1e-6);
  dg_ctx_reset(c);
  /* misuse: an output without grad, none at all; x's gradient untouched */
  zero_grad(x);
  multi_outputs(c, x, g, ys);
  ys[1] = dg_full(c, 2, (int64_t[]){3, 4}, 1.0f);
  CHECK_EQ_INT(dg_backward_multi(c, 3, ys, NULL), DG_EINVAL);
  CHECK_STR_HAS(dg_ctx_errmsg(c), "output 1 does not require grad");
  CHECK_EQ_INT(dg_backward_multi(c, 0, ys, NULL), DG_EINVAL);
  CHECK_EQ_INT(dg_backward_multi(c, 2, NULL, NULL), DG_EINVAL);
  gs[0] = dg_full(c, 2, (int64_t[]){4, 3}, 1.0f);
  CHECK_EQ_INT(dg_backward_multi(c, 1, ys, gs), DG_ESHAPE);
  CHECK_STR_HAS(dg_ctx_errmsg(c), "grad_out (4, 3) does not match output (3, 4)");
  const dg_tensor *gx = dg_tensor_grad(x);
  for (int i = 0; gx && i < 12; i++) CHECK(((const float *)dg_tensor_data(gx))[i] == 0);
  dg_tensor_free(x);
  dg_ctx_free(c);
}

int main(void) {
  backward_multi();
  grad_dropout();
  grad_mask();
  grad_concat();
  grad_split();
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  dropout_values(ctx);
  dg_ctx_reset(ctx);
  mask_values(ctx);
  dg_ctx_reset(ctx);
  concat_values(ctx);
  dg_ctx_free(ctx);
  return TEST_DONE();
}
