/* nn: names and order of parameters, binding after a split keeps names and
 * initial values, forward shapes, train/eval, errors, and a small Sequential
 * that learns. */
#include <dgrad.h>

#include "test.h"

static dg_module *mlp(void) {
  dg_module *seq = NULL, *m = NULL;
  REQUIRE(dg_nn_sequential(&seq) == DG_OK);
  REQUIRE(dg_nn_linear(&m, 6, 16, 1) == DG_OK && !dg_sequential_add(seq, m, NULL));
  REQUIRE(dg_nn_relu(&m) == DG_OK && !dg_sequential_add(seq, m, NULL));
  REQUIRE(dg_nn_dropout(&m, 0.1f) == DG_OK && !dg_sequential_add(seq, m, NULL));
  REQUIRE(dg_nn_linear(&m, 16, 8, 1) == DG_OK && !dg_sequential_add(seq, m, NULL));
  REQUIRE(dg_nn_tanh(&m) == DG_OK && !dg_sequential_add(seq, m, NULL));
  REQUIRE(dg_nn_linear(&m, 8, 3, 0) == DG_OK && !dg_sequential_add(seq, m, "head"));
  return seq;
}

static void test_names_and_split(void) {
  dg_module *seq = mlp();
  dg_params *ps = NULL, *p1 = NULL, *p2 = NULL;
  REQUIRE(dg_params_new(&ps) == DG_OK);
  CHECK_OK(dg_module_bind(seq, ps, "layers", 7));
  const char *want[] = {"layers.0.weight", "layers.0.bias", "layers.3.weight", "layers.3.bias",
                        "layers.head.weight"};
  CHECK_EQ_INT(dg_params_count(ps), 5);
  for (int i = 0; i < 5 && i < dg_params_count(ps); i++)
    CHECK(!strcmp(dg_tensor_name(dg_params_get(ps, i)), want[i]));
  CHECK_EQ_INT(dg_tensor_dim(dg_params_get(ps, 2), 0), 8);
  /* torch's default bound 1/sqrt(fan_in) */
  float *w = dg_tensor_data(dg_params_get(ps, 0));
  float mx = 0;
  for (int i = 0; i < 96; i++) mx = fabsf(w[i]) > mx ? fabsf(w[i]) : mx;
  CHECK(mx <= 1 / sqrtf(6.0f) + 1e-6f && mx > 0.2f);

  /* split at 3: the tail keeps its names and initial values */
  dg_module *seq2 = mlp(), *tail = NULL;
  CHECK_OK(dg_sequential_split(seq2, 3, &tail));
  REQUIRE(tail);
  CHECK_EQ_INT(dg_sequential_len(seq2), 3);
  CHECK_EQ_INT(dg_sequential_len(tail), 3);
  REQUIRE(dg_params_new(&p1) == DG_OK && dg_params_new(&p2) == DG_OK);
  CHECK_OK(dg_module_bind(seq2, p1, "layers", 7));
  CHECK_OK(dg_module_bind(tail, p2, "layers", 7));
  CHECK_EQ_INT(dg_params_count(p1), 2);
  CHECK_EQ_INT(dg_params_count(p2), 3);
  dg_tensor *a = dg_params_find(ps, "layers.3.weight"), *b = dg_params_find(p2, "layers.3.weight");
  REQUIRE(a && b);
  CHECK(!memcmp(dg_tensor_data(a), dg_tensor_data(b), 8 * 16 * sizeof(float)));
  dg_module *none = NULL;
  CHECK_EQ_INT(dg_sequential_split(seq2, 9, &none), DG_EINVAL);
  CHECK(none == NULL);
  /* binding twice into one store is refused (duplicate names) */
  CHECK_EQ_INT(dg_module_bind(tail, p2, "layers", 7), DG_EINVAL);
  dg_module_free(tail);
  dg_module_free(seq2);
  dg_module_free(seq);
  dg_params_free(ps);
  dg_params_free(p1);
  dg_params_free(p2);
}

static void test_learns(void) {
  dg_module *seq = mlp();
  dg_params *ps = NULL;
  dg_ctx *ctx = NULL;
  REQUIRE(dg_params_new(&ps) == DG_OK && dg_ctx_new(&ctx, NULL) == DG_OK);
  CHECK_OK(dg_module_bind(seq, ps, "", 1));
  float x[32 * 6];
  int64_t y[32];
  dg_rng_uniform(5, 0, x, 32 * 6);
  for (int i = 0; i < 32; i++) y[i] = (x[i * 6] > 0.5f) + (x[i * 6 + 1] > 0.5f);
  int64_t xs[2] = {32, 6}, ys[1] = {32};
  float first = 0, last = 0;
  for (int step = 0; step < 200; step++) {
    dg_params_zero_grad(ps);
    dg_tensor *out = dg_module_forward(seq, ctx, dg_wrap(ctx, DG_F32, 2, xs, x));
    dg_tensor *loss = dg_cross_entropy(ctx, out, dg_wrap(ctx, DG_I64, 1, ys, y));
    REQUIRE(loss);
    CHECK_EQ_INT(dg_tensor_dim(out, 1), 3);
    if (step == 0) first = dg_tensor_item(loss);
    last = dg_tensor_item(loss);
    CHECK_OK(dg_backward(ctx, loss));
    size_t n;
    float *w = dg_params_data(ps, &n), *g = dg_params_grad(ps, &n);
    for (size_t i = 0; i < n; i++) w[i] -= 0.2f * g[i];
    dg_ctx_reset(ctx);
  }
  fprintf(stderr, "sequential MLP loss %.4f -> %.4f\n", first, last);
  CHECK(last < 0.6f * first);
  /* eval mode: dropout off, so two forwards agree */
  dg_module_set_train(seq, 0);
  dg_tensor *o1 = dg_module_forward(seq, ctx, dg_wrap(ctx, DG_F32, 2, xs, x));
  dg_tensor *o2 = dg_module_forward(seq, ctx, dg_wrap(ctx, DG_F32, 2, xs, x));
  REQUIRE(o1 && o2);
  CHECK(!memcmp(dg_tensor_data(o1), dg_tensor_data(o2), 32 * 3 * sizeof(float)));
  dg_module_free(seq);
  dg_params_free(ps);
  dg_ctx_free(ctx);
}

static void test_transformer_and_cnn(void) {
  dg_module *blk = NULL, *conv = NULL, *pool = NULL, *flat = NULL;
  dg_params *ps = NULL;
  dg_ctx *ctx = NULL;
  REQUIRE(dg_params_new(&ps) == DG_OK && dg_ctx_new(&ctx, NULL) == DG_OK);
  dg_module *badblk = NULL;
  CHECK_EQ_INT(dg_nn_transformer_block(&badblk, 30, 4, 0.0f), DG_EINVAL); /* 30 % 4 */
  CHECK(badblk == NULL);
  CHECK_OK(dg_nn_transformer_block(&blk, 32, 4, 0.0f));
  /* forward before bind is an error, not a crash */
  int64_t xs[3] = {2, 8, 32};
  CHECK(dg_module_forward(blk, ctx, dg_zeros(ctx, DG_F32, 3, xs)) == NULL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "bind");
  dg_ctx_reset(ctx);
  CHECK_OK(dg_module_bind(blk, ps, "h.0", 3));
  CHECK(dg_params_find(ps, "h.0.attn.c_attn.weight") != NULL);
  CHECK(dg_params_find(ps, "h.0.mlp.c_proj.bias") != NULL);
  CHECK(dg_params_find(ps, "h.0.ln_2.weight") != NULL);
  dg_tensor *x = dg_randn(ctx, 3, xs, 0, 1);
  dg_tensor *y = dg_module_forward(blk, ctx, x);
  REQUIRE(y);
  CHECK_EQ_INT(dg_tensor_ndim(y), 3);
  CHECK_EQ_INT(dg_tensor_dim(y, 2), 32);
  CHECK_OK(dg_backward(ctx, dg_mean(ctx, dg_mul(ctx, y, y))));
  CHECK_EQ_INT(dg_params_unreached_count(ps), 0);
  int64_t bad[3] = {2, 8, 16};
  CHECK(dg_module_forward(blk, ctx, dg_zeros(ctx, DG_F32, 3, bad)) == NULL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "(2, 8, 16)");
  dg_ctx_reset(ctx);
  CHECK_OK(dg_nn_conv2d(&conv, 1, 4, 3, 1, 1, 1));
  CHECK_OK(dg_nn_maxpool2d(&pool, 2, 2));
  CHECK_OK(dg_nn_flatten(&flat));
  CHECK_OK(dg_module_bind(conv, ps, "conv", 1));
  int64_t is[4] = {2, 1, 8, 8};
  dg_tensor *f = dg_module_forward(flat, ctx, dg_module_forward(pool, ctx,
                   dg_module_forward(conv, ctx, dg_randn(ctx, 4, is, 0, 1))));
  REQUIRE(f);
  CHECK_EQ_INT(dg_tensor_dim(f, 1), 4 * 4 * 4);
  CHECK(!strcmp(dg_module_type(conv), "Conv2d"));
  dg_module_free(conv);
  dg_module_free(pool);
  dg_module_free(flat);
  dg_module_free(blk);
  dg_module_free(NULL);
  dg_params_free(ps);
  dg_ctx_free(ctx);
}

int main(void) {
  test_names_and_split();
  test_learns();
  test_transformer_and_cnn();
  return TEST_DONE();
}
