/* Element-wise ops: finite-difference checks of add/sub/mul/div over every
 * broadcasting pattern (same shape, bias row, suffix, scalars, columns,
 * both sides broadcast, 4 dims, non-contiguous views, an input used twice),
 * scale/add_scalar, and the unary ops; forward values against hand-computed
 * or double-precision expectations; edge values (log of 0 and of negatives,
 * sigmoid/tanh saturation, NaN); error paths. */
#include "gradcheck.h"
#include "test.h"

/* ---- helpers ---- */

static dg_tensor *input(int ndim, const int64_t *shape, float lo, float hi, uint64_t seed) {
  dg_tensor *t = gc_input(ndim, shape, lo, hi, seed);
  REQUIRE(t);
  return t;
}

/* Moves every element to at least `gap` away from 0 (keeps gradchecks off
 * kinks and poles). */
static void push_from_zero(dg_tensor *t, float gap) {
  float *d = dg_tensor_data(t);
  for (int64_t i = 0, n = dg_tensor_numel(t); i < n; i++) d[i] += d[i] < 0 ? -gap : gap;
}

typedef dg_tensor *(*binop_fn)(dg_ctx *, dg_tensor *, dg_tensor *);
static const binop_fn binops[4] = {dg_add, dg_sub, dg_mul, dg_div};
static const char *const binop_names[4] = {"add", "sub", "mul", "div"};

typedef struct {
  int op;
  int tview; /* 1: use transpose(in[0], 0, 1) as a */
  int same;  /* 1: op(in[0], in[0]) */
} bin_case;

static dg_tensor *f_binary(dg_ctx *ctx, dg_tensor **in, void *u) {
  bin_case *c = u;
  dg_tensor *a = c->tview ? dg_transpose(ctx, in[0], 0, 1) : in[0];
  return binops[c->op](ctx, a, c->same ? a : in[1]);
}

typedef struct {
  const char *name;
  int na, nb;
  int64_t a[4], b[4];
} bshape;

static const bshape bshapes[] = {
    {"same (3,4)", 2, 2, {3, 4}, {3, 4}},
    {"bias row (5,4)+(4)", 2, 1, {5, 4}, {4}},
    {"suffix (2,3,4)+(3,4)", 3, 2, {2, 3, 4}, {3, 4}},
    {"scalar b (3,4)+()", 2, 0, {3, 4}, {0}},
    {"one-element b (3,4)+(1)", 2, 1, {3, 4}, {1}},
    {"scalar a ()+(3,4)", 0, 2, {0}, {3, 4}},
    {"column (3,4)+(3,1)", 2, 2, {3, 4}, {3, 1}},
    {"outer (3,1)+(1,4)", 2, 2, {3, 1}, {1, 4}},
    {"middle (2,3,4)+(2,1,4)", 3, 3, {2, 3, 4}, {2, 1, 4}},
    {"4 dims (2,1,3,4)+(1,2,1,4)", 4, 4, {2, 1, 3, 4}, {1, 2, 1, 4}},
    {"prefix (4)+(2,3,4) with a broadcast", 1, 3, {4}, {2, 3, 4}},
    {"leading one (3,4)+(1,3,4)", 2, 3, {3, 4}, {1, 3, 4}},
};

static void check_binary_grads(void) {
  for (int op = 0; op < 4; op++)
    for (size_t s = 0; s < sizeof bshapes / sizeof bshapes[0]; s++) {
      const bshape *bs = &bshapes[s];
      dg_tensor *in[2] = {input(bs->na, bs->a, -1, 1, 10 + s), input(bs->nb, bs->b, -1.5f, 1.5f, 50 + s)};
      push_from_zero(in[1], 0.5f); /* |b| >= 0.5: away from div's pole */
      bin_case c = {op, 0, 0};
      char nm[128];
      snprintf(nm, sizeof nm, "%s %s", binop_names[op], bs->name);
      CHECK_EQ_INT(gc_check(nm, f_binary, &c, 2, in, 1e-3, 1e-2), 0);
      /* gradient only for b: a needs none */
      dg_tensor_set_requires_grad(in[0], 0);
      snprintf(nm, sizeof nm, "%s %s (b only)", binop_names[op], bs->name);
      CHECK_EQ_INT(gc_check(nm, f_binary, &c, 2, in, 1e-3, 1e-2), 0);
      dg_tensor_free(in[0]);
      dg_tensor_free(in[1]);
    }
  for (int op = 0; op < 4; op++) {
    int64_t at[2] = {4, 3}, bsh[2] = {3, 4}, brow[1] = {4};
    char nm[128];
    bin_case c = {op, 1, 0};
    dg_tensor *in[2] = {input(2, at, 0.5f, 2, 90), input(2, bsh, 0.5f, 2, 91)};
    snprintf(nm, sizeof nm, "%s transposed view a", binop_names[op]);
    CHECK_EQ_INT(gc_check(nm, f_binary, &c, 2, in, 1e-3, 1e-2), 0);
    dg_tensor_free(in[1]);
    in[1] = input(1, brow, 0.5f, 2, 92);
    snprintf(nm, sizeof nm, "%s transposed view a + row", binop_names[op]);
    CHECK_EQ_INT(gc_check(nm, f_binary, &c, 2, in, 1e-3, 1e-2), 0);
    bin_case same = {op, 0, 1};
    snprintf(nm, sizeof nm, "%s(x, x)", binop_names[op]);
    CHECK_EQ_INT(gc_check(nm, f_binary, &same, 2, in, 1e-3, 1e-2), 0);
    dg_tensor_free(in[0]);
    dg_tensor_free(in[1]);
  }
}

/* ---- scale / add_scalar ---- */

static dg_tensor *f_scale(dg_ctx *ctx, dg_tensor **in, void *u) {
  (void)u;
  return dg_add_scalar(ctx, dg_scale(ctx, dg_transpose(ctx, in[0], 0, 1), -2.5f), 3.0f);
}

/* ---- unary ---- */

typedef dg_tensor *(*unop_fn)(dg_ctx *, dg_tensor *);
typedef struct {
  const char *name;
  unop_fn fn;
  float lo, hi, gap;
} un_case;

static dg_tensor *f_unary(dg_ctx *ctx, dg_tensor **in, void *u) {
  return ((const un_case *)u)->fn(ctx, in[0]);
}

static dg_tensor *f_unary_view(dg_ctx *ctx, dg_tensor **in, void *u) {
  return ((const un_case *)u)->fn(ctx, dg_transpose(ctx, in[0], 0, 2));
}

static void check_unary_grads(void) {
  const un_case cases[] = {
      {"relu", dg_relu, -1, 1, 0.05f},     {"gelu", dg_gelu, -3, 3, 0},
      {"tanh", dg_tanh, -2, 2, 0},         {"sigmoid", dg_sigmoid, -4, 4, 0},
      {"exp", dg_exp, -2, 2, 0},           {"log", dg_log, 0.3f, 3, 0},
  };
  int64_t s3[3] = {2, 3, 5}, big[1] = {64};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char nm[96];
    dg_tensor *in[1] = {input(3, s3, cases[i].lo, cases[i].hi, 200 + i)};
    if (cases[i].gap > 0) push_from_zero(in[0], cases[i].gap);
    CHECK_EQ_INT(gc_check(cases[i].name, f_unary, (void *)&cases[i], 1, in, 1e-3, 1e-2), 0);
    snprintf(nm, sizeof nm, "%s of a permuted view", cases[i].name);
    CHECK_EQ_INT(gc_check(nm, f_unary_view, (void *)&cases[i], 1, in, 1e-3, 1e-2), 0);
    dg_tensor_free(in[0]);
    /* longer input: exercises the vectorised body, not just the tail */
    in[0] = input(1, big, cases[i].lo, cases[i].hi, 300 + i);
    if (cases[i].gap > 0) push_from_zero(in[0], cases[i].gap);
    snprintf(nm, sizeof nm, "%s (64)", cases[i].name);
    CHECK_EQ_INT(gc_check(nm, f_unary, (void *)&cases[i], 1, in, 1e-3, 1e-2), 0);
    dg_tensor_free(in[0]);
  }
  int64_t s2[2] = {3, 4};
  dg_tensor *in[1] = {input(2, s2, -1, 1, 400)};
  CHECK_EQ_INT(gc_check("scale/add_scalar on a view", f_scale, NULL, 1, in, 1e-3, 1e-2), 0);
  dg_tensor_free(in[0]);
}

/* ---- forward values ---- */

static void check_binary_values(dg_ctx *ctx) {
  int64_t s23[2] = {2, 3}, s3[1] = {3}, s21[2] = {2, 1};
  float av[6] = {1, 2, 3, 4, 5, 6}, bv[3] = {10, 20, 30}, cv[2] = {2, 4};
  dg_tensor *a = dg_from_data(ctx, DG_F32, 2, s23, av);
  dg_tensor *b = dg_from_data(ctx, DG_F32, 1, s3, bv);
  dg_tensor *c = dg_from_data(ctx, DG_F32, 2, s21, cv);
  REQUIRE(a && b && c);
  const float add_e[6] = {11, 22, 33, 14, 25, 36}, sub_e[6] = {-9, -18, -27, -6, -15, -24};
  const float mul_e[6] = {2, 4, 6, 16, 20, 24}, div_e[6] = {0.5f, 1, 1.5f, 1, 1.25f, 1.5f};
  dg_tensor *y[4] = {dg_add(ctx, a, b), dg_sub(ctx, a, b), dg_mul(ctx, a, c), dg_div(ctx, a, c)};
  const float *e[4] = {add_e, sub_e, mul_e, div_e};
  for (int k = 0; k < 4; k++) {
    REQUIRE(y[k]);
    CHECK_EQ_INT(dg_tensor_ndim(y[k]), 2);
    CHECK_EQ_INT(dg_tensor_dim(y[k], 0), 2);
    CHECK_EQ_INT(dg_tensor_dim(y[k], 1), 3);
    for (int i = 0; i < 6; i++) CHECK_NEAR(dg_tensor_get(y[k], i), e[k][i], 1e-6);
  }
  /* (2,1) + (3) -> (2, 3); () * (2,3) -> (2,3) */
  dg_tensor *o = dg_add(ctx, c, b);
  REQUIRE(o);
  CHECK_EQ_INT(dg_tensor_dim(o, 0), 2);
  CHECK_EQ_INT(dg_tensor_dim(o, 1), 3);
  CHECK_NEAR(dg_tensor_get(o, 0), 12, 0);
  CHECK_NEAR(dg_tensor_get(o, 5), 34, 0);
  float sv = 3;
  dg_tensor *sc = dg_from_data(ctx, DG_F32, 0, NULL, &sv);
  dg_tensor *m = dg_mul(ctx, sc, a);
  REQUIRE(m);
  CHECK_EQ_INT(dg_tensor_ndim(m), 2);
  CHECK_NEAR(dg_tensor_get(m, 4), 15, 0);
  dg_tensor *t = dg_sub(ctx, dg_transpose(ctx, a, 0, 1), c ? dg_reshape(ctx, c, 1, (int64_t[]){2}) : NULL);
  REQUIRE(t); /* (3,2) - (2): rows of a's transpose minus (2, 4) */
  const float t_e[6] = {-1, 0, 0, 1, 1, 2};
  for (int i = 0; i < 6; i++) CHECK_NEAR(dg_tensor_get(t, i), t_e[i], 0);
  dg_tensor *s1 = dg_scale(ctx, a, 0.5f), *s2 = dg_add_scalar(ctx, a, -1);
  REQUIRE(s1 && s2);
  CHECK_NEAR(dg_tensor_get(s1, 5), 3, 0);
  CHECK_NEAR(dg_tensor_get(s2, 0), 0, 0);
  /* empty tensors broadcast to empty results */
  int64_t s03[2] = {0, 3};
  dg_tensor *z = dg_zeros(ctx, DG_F32, 2, s03);
  dg_tensor *ze = dg_add(ctx, z, b);
  REQUIRE(ze);
  CHECK_EQ_INT(dg_tensor_numel(ze), 0);
}

static double gelu_ref(double x) {
  return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

static void check_unary_values(dg_ctx *ctx) {
  enum { N = 41 };
  float xv[N];
  for (int i = 0; i < N; i++) xv[i] = -10.0f + 0.5f * (float)i + 0.013f;
  int64_t sh[1] = {N};
  dg_tensor *x = dg_from_data(ctx, DG_F32, 1, sh, xv);
  REQUIRE(x);
  dg_tensor *r = dg_relu(ctx, x), *g = dg_gelu(ctx, x), *t = dg_tanh(ctx, x);
  dg_tensor *s = dg_sigmoid(ctx, x), *e = dg_exp(ctx, x);
  REQUIRE(r && g && t && s && e);
  for (int i = 0; i < N; i++) {
    double v = xv[i];
    CHECK_NEAR(dg_tensor_get(r, i), v > 0 ? v : 0, 0);
    CHECK_NEAR(dg_tensor_get(g, i), gelu_ref(v), 1e-6 + 1e-5 * fabs(gelu_ref(v)));
    CHECK_NEAR(dg_tensor_get(t, i), tanh(v), 1e-6 * fabs(tanh(v)) + 1e-9);
    double sg = 1 / (1 + exp(-v));
    CHECK_NEAR(dg_tensor_get(s, i), sg, 1e-6 * sg);
    CHECK_NEAR(dg_tensor_get(e, i), exp(v), 1e-6 * exp(v));
  }
  /* torch's gelu(approximate='tanh') at a few points */
  float gv[4] = {1.0f, -1.0f, 0.5f, 2.0f};
  const double ge[4] = {0.8411920071, -0.1588079929, 0.3457140028, 1.9545977116};
  int64_t s4[1] = {4};
  dg_tensor *gg = dg_gelu(ctx, dg_from_data(ctx, DG_F32, 1, s4, gv));
  REQUIRE(gg);
  for (int i = 0; i < 4; i++) CHECK_NEAR(dg_tensor_get(gg, i), ge[i], 1e-6);
  /* tiny inputs keep their relative precision */
  float tv[4] = {1e-6f, -3e-4f, 0.62f, 0.63f};
  dg_tensor *tt = dg_tanh(ctx, dg_from_data(ctx, DG_F32, 1, s4, tv));
  REQUIRE(tt);
  for (int i = 0; i < 4; i++) CHECK_NEAR(dg_tensor_get(tt, i), tanh(tv[i]), 1e-6 * fabs(tanh(tv[i])));
  /* edges: saturation, infinities, nan, log outside its domain is a value */
  float ev[6] = {-200.0f, 200.0f, INFINITY, -INFINITY, NAN, 0.0f};
  int64_t s6[1] = {6};
  dg_tensor *ex = dg_from_data(ctx, DG_F32, 1, s6, ev);
  dg_tensor *es = dg_sigmoid(ctx, ex), *et = dg_tanh(ctx, ex), *er = dg_relu(ctx, ex);
  REQUIRE(es && et && er);
  CHECK_NEAR(dg_tensor_get(es, 0), 0, 1e-30);
  CHECK_NEAR(dg_tensor_get(es, 1), 1, 0);
  CHECK_NEAR(dg_tensor_get(es, 2), 1, 0);
  CHECK_NEAR(dg_tensor_get(es, 3), 0, 1e-30);
  CHECK(isnan(dg_tensor_get(es, 4)));
  CHECK_NEAR(dg_tensor_get(et, 0), -1, 0);
  CHECK_NEAR(dg_tensor_get(et, 2), 1, 0);
  CHECK(isnan(dg_tensor_get(et, 4)));
  CHECK(isnan(dg_tensor_get(er, 4)));
  float lv[4] = {0.0f, -1.0f, 1.0f, (float)M_E};
  dg_tensor *l = dg_log(ctx, dg_from_data(ctx, DG_F32, 1, s4, lv));
  REQUIRE(l);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_OK);
  CHECK(isinf(dg_tensor_get(l, 0)) && dg_tensor_get(l, 0) < 0);
  CHECK(isnan(dg_tensor_get(l, 1)));
  CHECK_NEAR(dg_tensor_get(l, 2), 0, 0);
  CHECK_NEAR(dg_tensor_get(l, 3), 1, 1e-6);
}

/* ---- error paths ---- */

static void check_errors(void) {
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  int64_t s23[2] = {2, 3}, s4[1] = {4}, s32[2] = {3, 2};
  dg_tensor *a = dg_zeros(ctx, DG_F32, 2, s23), *b = dg_zeros(ctx, DG_F32, 1, s4);
  for (int op = 0; op < 4; op++) {
    dg_ctx_clear_error(ctx);
    CHECK(binops[op](ctx, a, b) == NULL);
    CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_ESHAPE);
    CHECK_STR_HAS(dg_ctx_errmsg(ctx), binop_names[op]);
    CHECK_STR_HAS(dg_ctx_errmsg(ctx), "(2, 3)");
    CHECK_STR_HAS(dg_ctx_errmsg(ctx), "(4)");
  }
  dg_ctx_clear_error(ctx);
  CHECK(dg_mul(ctx, a, dg_zeros(ctx, DG_F32, 2, s32)) == NULL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "(3, 2)");
  dg_ctx_clear_error(ctx);
  dg_tensor *ai = dg_zeros(ctx, DG_I32, 2, s23);
  CHECK(dg_add(ctx, a, ai) == NULL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "add");
  dg_ctx_clear_error(ctx);
  CHECK(dg_relu(ctx, ai) == NULL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "relu");
  dg_ctx_clear_error(ctx);
  CHECK(dg_div(ctx, NULL, a) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_EINVAL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "div");
  /* NULL chains keep the first error */
  dg_ctx_clear_error(ctx);
  CHECK(dg_add(ctx, a, b) == NULL);
  CHECK(dg_gelu(ctx, dg_scale(ctx, dg_add(ctx, a, b), 2)) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_ESHAPE);
  CHECK(dg_add(NULL, a, a) == NULL);
  dg_ctx_free(ctx);
}

/* Gradients accumulate across backward calls and through a shared input. */
static void check_accumulation(void) {
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  int64_t s[2] = {2, 3}, r[1] = {3};
  dg_tensor *x = input(2, s, -1, 1, 7), *bias = input(1, r, -1, 1, 8);
  for (int rep = 0; rep < 2; rep++) {
    dg_ctx_reset(ctx);
    dg_tensor *y = dg_add(ctx, dg_mul(ctx, x, x), bias); /* (2,3) */
    REQUIRE(y);
    REQUIRE(dg_backward(ctx, y) == DG_OK);
  }
  const float *xd = dg_tensor_data(x);
  const float *gx = dg_tensor_data(dg_tensor_grad(x)), *gb = dg_tensor_data(dg_tensor_grad(bias));
  for (int i = 0; i < 6; i++) CHECK_NEAR(gx[i], 2 * 2 * xd[i], 1e-6);
  for (int i = 0; i < 3; i++) CHECK_NEAR(gb[i], 2 * 2, 0);
  dg_tensor_free(x);
  dg_tensor_free(bias);
  dg_ctx_free(ctx);
}

int main(void) {
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  check_binary_values(ctx);
  check_unary_values(ctx);
  dg_ctx_free(ctx);
  check_errors();
  check_accumulation();
  check_binary_grads();
  check_unary_grads();
  return TEST_DONE();
}
