/* The day-one layers: LeakyReLU, AvgPool2d, GlobalAvgPool2d modules (shapes,
 * types, bad arguments, errors naming the module), a tiny CNN built from
 * them that learns, and dg_argmax / dg_accuracy on known inputs: ties go to
 * the first index, a NaN wins, keepdim and negative dims, strided inputs,
 * empty rows, and the errors for bad dims, shapes, dtypes and targets. */
#include <dgrad.h>

#include "test.h"

static const float *F(dg_tensor *t) { return dg_tensor_data(t); }
static const int64_t *I(dg_tensor *t) { return dg_tensor_data(t); }

static void test_modules(void) {
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  dg_module *ap = NULL, *gap = NULL, *lr = NULL, *bad = (dg_module *)1;
  CHECK_OK(dg_nn_avgpool2d(&ap, 2, 2));
  CHECK_OK(dg_nn_global_avgpool2d(&gap));
  CHECK_OK(dg_nn_leaky_relu(&lr, 0.2f));
  REQUIRE(ap && gap && lr);
  CHECK(!strcmp(dg_module_type(ap), "AvgPool2d"));
  CHECK(!strcmp(dg_module_type(gap), "GlobalAvgPool2d"));
  CHECK(!strcmp(dg_module_type(lr), "LeakyReLU"));
  CHECK_EQ_INT(dg_nn_avgpool2d(&bad, 0, 2), DG_EINVAL);
  CHECK(bad == NULL);
  bad = (dg_module *)1;
  CHECK_EQ_INT(dg_nn_avgpool2d(&bad, 2, -1), DG_EINVAL);
  CHECK(bad == NULL);
  CHECK_EQ_INT(dg_nn_avgpool2d(NULL, 2, 2), DG_EINVAL);
  CHECK_EQ_INT(dg_nn_global_avgpool2d(NULL), DG_EINVAL);
  CHECK_EQ_INT(dg_nn_leaky_relu(NULL, 0.01f), DG_EINVAL);

  int64_t xs[4] = {2, 3, 8, 7};
  dg_tensor *x = dg_randn(ctx, 4, xs, 0, 1);
  dg_tensor *y = dg_module_forward(ap, ctx, x);
  REQUIRE(y);
  int64_t want[4] = {2, 3, 4, 3};
  CHECK_EQ_INT(dg_tensor_ndim(y), 4);
  for (int i = 0; i < 4; i++) CHECK_EQ_INT(dg_tensor_dim(y, i), want[i]);
  CHECK_NEAR(F(y)[0], (F(x)[0] + F(x)[1] + F(x)[7] + F(x)[8]) / 4, 1e-6);
  dg_tensor *g = dg_module_forward(gap, ctx, x);
  REQUIRE(g);
  CHECK_EQ_INT(dg_tensor_ndim(g), 2);
  CHECK_EQ_INT(dg_tensor_dim(g, 0), 2);
  CHECK_EQ_INT(dg_tensor_dim(g, 1), 3);
  dg_tensor *l = dg_module_forward(lr, ctx, x), *l2 = dg_leaky_relu(ctx, x, 0.2f);
  REQUIRE(l && l2);
  CHECK(!memcmp(F(l), F(l2), 2 * 3 * 8 * 7 * sizeof(float)));
  /* errors name the module and the op */
  int64_t s3[3] = {3, 5, 6};
  CHECK(dg_module_forward(gap, ctx, dg_zeros(ctx, DG_F32, 3, s3)) == NULL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "GlobalAvgPool2d: global_avgpool2d: x (3, 5, 6)");
  dg_ctx_clear_error(ctx);
  int64_t small[4] = {1, 1, 1, 4};
  CHECK(dg_module_forward(ap, ctx, dg_zeros(ctx, DG_F32, 4, small)) == NULL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "AvgPool2d: avgpool2d: x (1, 1, 1, 4) with window 2");
  dg_module_free(ap);
  dg_module_free(gap);
  dg_module_free(lr);
  dg_ctx_free(ctx);
}

/* Appends the module that `call` makes in m to seq. */
#define ADD(seq, call)                                     \
  do {                                                     \
    dg_module *m = NULL;                                   \
    REQUIRE((call) == DG_OK && m);                         \
    REQUIRE(dg_sequential_add(seq, m, NULL) == DG_OK);     \
  } while (0)

/* conv -> leaky -> avgpool -> conv -> leaky -> global avgpool -> linear */
static dg_module *tiny_cnn(void) {
  dg_module *seq = NULL;
  REQUIRE(dg_nn_sequential(&seq) == DG_OK);
  ADD(seq, dg_nn_conv2d(&m, 1, 4, 3, 1, 1, 1)); /* (N, 4, 8, 8) */
  ADD(seq, dg_nn_leaky_relu(&m, 0.1f));
  ADD(seq, dg_nn_avgpool2d(&m, 2, 2));          /* (N, 4, 4, 4) */
  ADD(seq, dg_nn_conv2d(&m, 4, 8, 3, 1, 1, 1)); /* (N, 8, 4, 4) */
  ADD(seq, dg_nn_leaky_relu(&m, 0.01f));
  ADD(seq, dg_nn_global_avgpool2d(&m));         /* (N, 8) */
  ADD(seq, dg_nn_linear(&m, 8, 2, 1));          /* (N, 2) */
  return seq;
}

/* Noisy images (B, 1, 8, 8): class 0 horizontal stripes, class 1 vertical
 * (a local pattern, which global pooling keeps). */
static void make_data(float *x, int64_t *y, int B) {
  dg_rng_uniform(11, 0, x, (size_t)B * 64);
  for (int b = 0; b < B; b++) {
    y[b] = b % 2;
    for (int i = 0; i < 64; i++) x[b * 64 + i] += (y[b] ? i % 2 : (i / 8) % 2) ? 1.0f : 0.0f;
  }
}

static void test_cnn_learns(void) {
  enum { B = 32 };
  dg_module *net = tiny_cnn();
  dg_params *ps = NULL;
  dg_ctx *ctx = NULL;
  REQUIRE(dg_params_new(&ps) == DG_OK && dg_ctx_new(&ctx, NULL) == DG_OK);
  CHECK_OK(dg_module_bind(net, ps, "", 3));
  CHECK_EQ_INT(dg_params_count(ps), 6);
  static float x[B * 64];
  static int64_t y[B];
  make_data(x, y, B);
  int64_t xs[4] = {B, 1, 8, 8}, ys[1] = {B};
  float first = 0, last = 0;
  int64_t correct0 = -1, correct = -1;
  for (int step = 0; step < 80; step++) {
    dg_params_zero_grad(ps);
    dg_tensor *out = dg_module_forward(net, ctx, dg_wrap(ctx, DG_F32, 4, xs, x));
    dg_tensor *t = dg_wrap(ctx, DG_I64, 1, ys, y);
    dg_tensor *loss = dg_cross_entropy(ctx, out, t);
    REQUIRE(loss);
    CHECK_OK(dg_accuracy(ctx, out, t, step ? &correct : &correct0));
    if (step == 0) first = dg_tensor_item(loss);
    last = dg_tensor_item(loss);
    CHECK_OK(dg_backward(ctx, loss));
    CHECK_EQ_INT(dg_params_unreached_count(ps), 0);
    size_t n;
    float *w = dg_params_data(ps, &n), *g = dg_params_grad(ps, &n);
    for (size_t i = 0; i < n; i++) w[i] -= 0.5f * g[i];
    dg_ctx_reset(ctx);
  }
  fprintf(stderr, "tiny CNN loss %.4f -> %.4f, accuracy %lld -> %lld of %d\n", first, last,
          (long long)correct0, (long long)correct, B);
  CHECK(last < 0.3f * first);
  CHECK(correct >= B - 2 && correct <= B && correct > correct0);
  dg_module_free(net);
  dg_params_free(ps);
  dg_ctx_free(ctx);
}

static void test_argmax(void) {
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  /* rows: a tie (first wins), NaN (the first NaN wins), -inf only, plain */
  float xv[16] = {1, 3, 3, 0, 1, NAN, 5, NAN, -INFINITY, -INFINITY, -INFINITY, -INFINITY,
                  -1, -2, -0.5f, -3};
  int64_t xs[2] = {4, 4};
  dg_tensor *x = dg_from_data(ctx, DG_F32, 2, xs, xv);
  dg_tensor_set_requires_grad(x, 1);
  dg_tensor *a = dg_argmax(ctx, x, 1, 0);
  REQUIRE(a);
  CHECK(dg_tensor_dtype(a) == DG_I64);
  CHECK(!dg_tensor_requires_grad(a));
  CHECK_EQ_INT(dg_tensor_ndim(a), 1);
  CHECK_EQ_INT(dg_tensor_dim(a, 0), 4);
  int64_t want1[4] = {1, 1, 0, 2};
  for (int i = 0; i < 4; i++) CHECK_EQ_INT(I(a)[i], want1[i]);
  /* dim 0 (= -2), keepdim: (1, 4); column 1 has the NaN, column 3 too */
  dg_tensor *a0 = dg_argmax(ctx, x, -2, 1);
  REQUIRE(a0);
  CHECK_EQ_INT(dg_tensor_ndim(a0), 2);
  CHECK_EQ_INT(dg_tensor_dim(a0, 0), 1);
  CHECK_EQ_INT(dg_tensor_dim(a0, 1), 4);
  int64_t want0[4] = {0, 1, 1, 1};
  for (int i = 0; i < 4; i++) CHECK_EQ_INT(I(a0)[i], want0[i]);
  /* a transposed view: argmax over its dim 0 is the rows' argmax */
  dg_tensor *at = dg_argmax(ctx, dg_transpose(ctx, x, 0, 1), 0, 0);
  REQUIRE(at);
  for (int i = 0; i < 4; i++) CHECK_EQ_INT(I(at)[i], want1[i]);
  /* 3-d, middle dim */
  float zv[12] = {0, 9, 1, 8, 2, 7, 5, 5, 4, 6, 3, 4};
  int64_t zs[3] = {2, 3, 2};
  dg_tensor *zm = dg_argmax(ctx, dg_from_data(ctx, DG_F32, 3, zs, zv), 1, 0);
  REQUIRE(zm);
  CHECK_EQ_INT(dg_tensor_dim(zm, 0), 2);
  CHECK_EQ_INT(dg_tensor_dim(zm, 1), 2);
  int64_t wantz[4] = {2, 0, 0, 1};
  for (int i = 0; i < 4; i++) CHECK_EQ_INT(I(zm)[i], wantz[i]);
  /* a 0-dim tensor: index 0, shape () */
  dg_tensor *s = dg_argmax(ctx, dg_full(ctx, 0, NULL, 2.0f), 0, 0);
  REQUIRE(s);
  CHECK_EQ_INT(dg_tensor_ndim(s), 0);
  CHECK_EQ_INT(I(s)[0], 0);
  /* no rows: an empty result */
  int64_t es[2] = {0, 3};
  dg_tensor *e = dg_argmax(ctx, dg_zeros(ctx, DG_F32, 2, es), 1, 0);
  REQUIRE(e);
  CHECK_EQ_INT(dg_tensor_numel(e), 0);
  /* errors: dim out of range, an empty dim, a dtype, NULL */
  CHECK(dg_argmax(ctx, x, 2, 0) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_EINVAL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "argmax: dim 2 out of range for x (4, 4)");
  dg_ctx_clear_error(ctx);
  CHECK(dg_argmax(ctx, dg_zeros(ctx, DG_F32, 2, es), 0, 0) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_ESHAPE);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "argmax: dim 0 of x (0, 3) is empty");
  dg_ctx_clear_error(ctx);
  CHECK(dg_argmax(ctx, dg_zeros(ctx, DG_I64, 2, xs), 0, 0) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_EDTYPE);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "argmax");
  dg_ctx_clear_error(ctx);
  CHECK(dg_argmax(ctx, NULL, 0, 0) == NULL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "argmax");
  dg_ctx_free(ctx);
}

static void test_accuracy(void) {
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  /* argmax per row: 1 (tie 1/2), 1 (NaN), 0, 2 */
  float xv[12] = {1, 3, 3, 0, NAN, 5, 9, 2, 1, -1, -2, -0.5f};
  int64_t xs[2] = {4, 3}, ts[1] = {4};
  dg_tensor *x = dg_from_data(ctx, DG_F32, 2, xs, xv);
  int64_t t64[4] = {1, 1, 0, 0};
  int32_t t32[4] = {2, 1, 0, 2};
  int64_t c = -1;
  CHECK_OK(dg_accuracy(ctx, x, dg_from_data(ctx, DG_I64, 1, ts, t64), &c));
  CHECK_EQ_INT(c, 3);
  CHECK_OK(dg_accuracy(ctx, x, dg_from_data(ctx, DG_I32, 1, ts, t32), &c));
  CHECK_EQ_INT(c, 3); /* the tie goes to 1, not 2 */
  /* (2, 2, 3) logits with (2, 2) targets: the same rows */
  int64_t x3s[3] = {2, 2, 3}, t3s[2] = {2, 2};
  CHECK_OK(dg_accuracy(ctx, dg_from_data(ctx, DG_F32, 3, x3s, xv),
                       dg_from_data(ctx, DG_I64, 2, t3s, t64), &c));
  CHECK_EQ_INT(c, 3);
  /* no rows: 0 correct */
  int64_t zs[2] = {0, 3}, z1[1] = {0};
  c = -1;
  CHECK_OK(dg_accuracy(ctx, dg_zeros(ctx, DG_F32, 2, zs), dg_zeros(ctx, DG_I64, 1, z1), &c));
  CHECK_EQ_INT(c, 0);
  /* a target out of range: named with its row and both shapes */
  int64_t tbad[4] = {1, 1, 3, 0};
  c = -1;
  CHECK_EQ_INT(dg_accuracy(ctx, x, dg_from_data(ctx, DG_I64, 1, ts, tbad), &c), DG_EINVAL);
  CHECK_EQ_INT(c, 0);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "accuracy: logits (4, 3), targets (4)");
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "target 3 in row 2 is outside [0, 3)");
  dg_ctx_clear_error(ctx);
  int32_t tneg[4] = {0, -1, 0, 0};
  CHECK_EQ_INT(dg_accuracy(ctx, x, dg_from_data(ctx, DG_I32, 1, ts, tneg), &c), DG_EINVAL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "target -1 in row 1");
  dg_ctx_clear_error(ctx);
  /* rows but no classes: every target is out of range */
  int64_t nc[2] = {2, 0}, two[1] = {2};
  CHECK_EQ_INT(dg_accuracy(ctx, dg_zeros(ctx, DG_F32, 2, nc), dg_zeros(ctx, DG_I64, 1, two), &c),
               DG_EINVAL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "outside [0, 0)");
  dg_ctx_clear_error(ctx);
  /* shape mismatch, wrong dtypes, NULL arguments */
  int64_t t5[1] = {5};
  CHECK_EQ_INT(dg_accuracy(ctx, x, dg_zeros(ctx, DG_I64, 1, t5), &c), DG_ESHAPE);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "accuracy: logits (4, 3)");
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "(5)");
  dg_ctx_clear_error(ctx);
  CHECK_EQ_INT(dg_accuracy(ctx, x, dg_zeros(ctx, DG_I64, 2, xs), &c), DG_ESHAPE);
  dg_ctx_clear_error(ctx);
  CHECK_EQ_INT(dg_accuracy(ctx, x, dg_zeros(ctx, DG_F32, 1, ts), &c), DG_EDTYPE);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "accuracy: targets (4) must be i32 or i64");
  dg_ctx_clear_error(ctx);
  CHECK_EQ_INT(dg_accuracy(ctx, dg_zeros(ctx, DG_I64, 2, xs), dg_zeros(ctx, DG_I64, 1, ts), &c),
               DG_EDTYPE);
  dg_ctx_clear_error(ctx);
  CHECK_EQ_INT(dg_accuracy(ctx, x, dg_zeros(ctx, DG_I64, 1, ts), NULL), DG_EINVAL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "correct is NULL");
  dg_ctx_clear_error(ctx);
  CHECK(dg_accuracy(ctx, NULL, dg_zeros(ctx, DG_I64, 1, ts), &c) != DG_OK);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "accuracy");
  CHECK_EQ_INT(dg_accuracy(NULL, x, x, &c), DG_EINVAL);
  dg_ctx_free(ctx);
}

int main(void) {
  test_modules();
  test_argmax();
  test_accuracy();
  test_cnn_learns();
  return TEST_DONE();
}
