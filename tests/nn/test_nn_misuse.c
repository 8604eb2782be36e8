/* Loud misuse around modules: a failing forward names the module's dotted
 * path (once, the innermost), dg_tensor_item refuses anything but one
 * element, dropout follows both train switches, and the thread count's
 * documented defaults and environment variables. */
#include <dgrad.h>
#include <stdlib.h>

#include "test.h"

#define CHECK_PREFIX(s, pre)                                                 \
  do {                                                                       \
    const char *s_ = (s);                                                    \
    if (strncmp(s_, (pre), strlen(pre)))                                     \
      T_FAIL_("\"%s\" should start with \"%s\"", s_, (pre));                 \
  } while (0)

static int count(const char *s, const char *sub) {
  int n = 0;
  for (const char *p = strstr(s, sub); p; p = strstr(p + 1, sub)) n++;
  return n;
}

/* rc is the constructor's result; *m is read after it ran (argument
 * evaluation order is unspecified, so the module is passed by address). */
static void add(dg_module *seq, int rc, dg_module **m, const char *name) {
  REQUIRE(rc == DG_OK && dg_sequential_add(seq, *m, name) == DG_OK);
}

/* fc1 (8 -> 16), act, fc2 wants 32 inputs: the second layer's shape is wrong. */
static void test_error_names_layer(void) {
  dg_module *seq = NULL, *m = NULL;
  dg_params *ps = NULL;
  dg_ctx *ctx = NULL;
  REQUIRE(dg_params_new(&ps) == DG_OK && dg_ctx_new(&ctx, NULL) == DG_OK);
  REQUIRE(dg_nn_sequential(&seq) == DG_OK);
  add(seq, dg_nn_linear(&m, 8, 16, 1), &m, "fc1");
  add(seq, dg_nn_relu(&m), &m, "act");
  add(seq, dg_nn_linear(&m, 32, 4, 1), &m, "fc2");
  CHECK_OK(dg_module_bind(seq, ps, "", 1));
  int64_t xs[2] = {3, 8};
  CHECK(dg_module_forward(seq, ctx, dg_randn(ctx, 2, xs, 0, 1)) == NULL);
  CHECK_PREFIX(dg_ctx_errmsg(ctx), "fc2 (Linear): linear: x (3, 16)");
  CHECK_EQ_INT(count(dg_ctx_errmsg(ctx), "(Linear)"), 1); /* named once, not per level */
  CHECK_EQ_INT(count(dg_ctx_errmsg(ctx), "Sequential"), 0);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_ESHAPE); /* the op's code is kept */

  /* an error already on the ctx is the user's to read: left as it was */
  dg_ctx_clear_error(ctx);
  int64_t a[2] = {2, 3};
  CHECK(dg_matmul(ctx, dg_zeros(ctx, DG_F32, 2, a), dg_zeros(ctx, DG_F32, 2, a)) == NULL);
  char before[512];
  snprintf(before, sizeof before, "%s", dg_ctx_errmsg(ctx));
  CHECK(dg_module_forward(seq, ctx, NULL) == NULL);
  CHECK(!strcmp(dg_ctx_errmsg(ctx), before));

  /* once cleared, the next failure is named again */
  dg_ctx_clear_error(ctx);
  CHECK(dg_module_forward(seq, ctx, dg_randn(ctx, 2, xs, 0, 1)) == NULL);
  CHECK_PREFIX(dg_ctx_errmsg(ctx), "fc2 (Linear): ");
  /* a NULL input is named at the first module that sees it */
  dg_ctx_clear_error(ctx);
  CHECK(dg_module_forward(seq, ctx, NULL) == NULL);
  CHECK_PREFIX(dg_ctx_errmsg(ctx), "fc1 (Linear): ");
  dg_module_free(seq);
  dg_params_free(ps);
  dg_ctx_free(ctx);
}

/* model.features.3 is a conv whose input channels are wrong. */
static void test_nested_path(void) {
  dg_module *root = NULL, *feat = NULL, *m = NULL;
  dg_params *ps = NULL;
  dg_ctx *ctx = NULL;
  REQUIRE(dg_params_new(&ps) == DG_OK && dg_ctx_new(&ctx, NULL) == DG_OK);
  REQUIRE(dg_nn_sequential(&root) == DG_OK && dg_nn_sequential(&feat) == DG_OK);
  add(feat, dg_nn_conv2d(&m, 1, 4, 3, 1, 1, 1), &m, NULL);
  add(feat, dg_nn_relu(&m), &m, NULL);
  add(feat, dg_nn_maxpool2d(&m, 2, 2), &m, NULL);
  add(feat, dg_nn_conv2d(&m, 8, 8, 3, 1, 1, 1), &m, NULL);
  add(root, DG_OK, &feat, "features");
  CHECK_OK(dg_module_bind(root, ps, "model", 1));
  int64_t xs[4] = {2, 1, 8, 8};
  CHECK(dg_module_forward(root, ctx, dg_randn(ctx, 4, xs, 0, 1)) == NULL);
  CHECK_PREFIX(dg_ctx_errmsg(ctx), "model.features.3 (Conv2d): conv2d");
  CHECK_EQ_INT(count(dg_ctx_errmsg(ctx), "(Conv2d)"), 1);
  dg_ctx_reset(ctx);

  /* a root bound at "" has no path: its type names it */
  dg_module *lin = NULL;
  REQUIRE(dg_nn_linear(&lin, 5, 2, 0) == DG_OK);
  dg_params *p2 = NULL;
  REQUIRE(dg_params_new(&p2) == DG_OK);
  CHECK_OK(dg_module_bind(lin, p2, "", 1));
  int64_t bad[2] = {3, 4};
  CHECK(dg_module_forward(lin, ctx, dg_zeros(ctx, DG_F32, 2, bad)) == NULL);
  CHECK_PREFIX(dg_ctx_errmsg(ctx), "Linear: linear: ");
  dg_ctx_reset(ctx);
  /* an unbound module's own message already names it: not doubled */
  dg_module *conv = NULL;
  REQUIRE(dg_nn_conv2d(&conv, 1, 1, 3, 1, 1, 0) == DG_OK);
  CHECK(dg_module_forward(conv, ctx, dg_randn(ctx, 4, xs, 0, 1)) == NULL);
  CHECK(!strcmp(dg_ctx_errmsg(ctx), "Conv2d: forward before dg_module_bind"));
  dg_module_free(conv);
  dg_module_free(lin);
  dg_module_free(root);
  dg_params_free(ps);
  dg_params_free(p2);
  dg_ctx_free(ctx);
}

/* A user's forward that fails in its own op, or returns NULL silently. */
static dg_tensor *badadd_fwd(dg_module *m, dg_ctx *ctx, dg_tensor *x) {
  return dg_add(ctx, x, dg_module_forward(m->children[0], ctx, x));
}
static dg_tensor *quiet_fwd(dg_module *m, dg_ctx *ctx, dg_tensor *x) {
  (void)m, (void)ctx, (void)x;
  return NULL;
}
static const dg_module_vtable badadd_vt = {"Residual", badadd_fwd, NULL, NULL, NULL};
static const dg_module_vtable quiet_vt = {"Quiet", quiet_fwd, NULL, NULL, NULL};

static void test_user_module_errors(void) {
  dg_module *seq = NULL, *res = NULL, *lin = NULL, *quiet = NULL;
  dg_params *ps = NULL;
  dg_ctx *ctx = NULL;
  REQUIRE(dg_params_new(&ps) == DG_OK && dg_ctx_new(&ctx, NULL) == DG_OK);
  REQUIRE(dg_nn_sequential(&seq) == DG_OK);
  REQUIRE(dg_module_new(&res, sizeof(dg_module), &badadd_vt) == DG_OK);
  REQUIRE(dg_nn_linear(&lin, 4, 6, 1) == DG_OK && !dg_module_add_child(res, lin, "proj"));
  add(seq, DG_OK, &res, "block");
  CHECK_OK(dg_module_bind(seq, ps, "net", 1));
  int64_t xs[2] = {2, 4};
  CHECK(dg_module_forward(seq, ctx, dg_randn(ctx, 2, xs, 0, 1)) == NULL);
  CHECK_PREFIX(dg_ctx_errmsg(ctx), "net.block (Residual): ");
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "(2, 6)");
  dg_ctx_reset(ctx);
  REQUIRE(dg_module_new(&quiet, sizeof(dg_module), &quiet_vt) == DG_OK);
  CHECK_OK(dg_module_bind(quiet, ps, "q", 1));
  CHECK(dg_module_forward(quiet, ctx, dg_randn(ctx, 2, xs, 0, 1)) == NULL);
  CHECK(!strcmp(dg_ctx_errmsg(ctx), "q (Quiet): forward returned NULL and recorded no error"));
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_ESTATE);
  dg_module_free(quiet);
  dg_module_free(seq);
  dg_params_free(ps);
  dg_ctx_free(ctx);
}

/* Before: element 0 of a 5-element tensor, silently. */
static void test_item(void) {
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  float v5[5] = {7, 1, 2, 3, 4}, v1 = 2.5f;
  int64_t s5[1] = {5}, s11[2] = {1, 1}, s0[1] = {0};
  CHECK(isnan(dg_tensor_item(dg_from_data(ctx, DG_F32, 1, s5, v5))));
  CHECK_NEAR(dg_tensor_item(dg_from_data(ctx, DG_F32, 2, s11, &v1)), 2.5, 0);
  CHECK_NEAR(dg_tensor_item(dg_sum(ctx, dg_from_data(ctx, DG_F32, 1, s5, v5))), 17, 0);
  int64_t i7 = 7;
  CHECK_NEAR(dg_tensor_item(dg_from_data(ctx, DG_I64, 2, s11, &i7)), 7, 0);
  CHECK(isnan(dg_tensor_item(NULL)));
  dg_tensor *empty = dg_zeros(ctx, DG_F32, 1, s0);
  if (empty) CHECK(isnan(dg_tensor_item(empty)));
  dg_ctx_free(ctx);
}

/* Dropout is on only while both the module and the ctx are in train mode. */
static void test_dropout_switches(void) {
  dg_module *seq = NULL, *d = NULL;
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK && dg_nn_sequential(&seq) == DG_OK);
  add(seq, dg_nn_dropout(&d, 0.5f), &d, "drop");
  int64_t s[1] = {1000};
  dg_tensor *x = dg_full(ctx, 1, s, 1.0f);
  for (int mod = 0; mod < 2; mod++) {
    for (int c = 0; c < 2; c++) {
      dg_module_set_train(seq, mod);
      dg_ctx_set_train(ctx, c);
      dg_tensor *y = dg_module_forward(seq, ctx, x);
      REQUIRE(y);
      int dropped = 0, kept = 0; /* kept ones are scaled by 1 / (1 - p) */
      for (int64_t i = 0; i < 1000; i++) {
        dropped += dg_tensor_get(y, i) == 0.0;
        kept += dg_tensor_get(y, i) == (mod && c ? 2.0 : 1.0);
      }
      CHECK_EQ_INT(dropped + kept, 1000);
      if (mod && c) CHECK(dropped > 300 && dropped < 700);
      else CHECK(dropped == 0 && y == x); /* identity: no copy */
    }
  }
  dg_module_free(seq);
  dg_ctx_free(ctx);
}

/* common.h: 1 thread by default; DG_NUM_THREADS, else OMP_NUM_THREADS. */
static void test_thread_defaults(void) {
  unsetenv("DG_NUM_THREADS");
  unsetenv("OMP_NUM_THREADS");
  dg_set_num_threads(0);
  CHECK_EQ_INT(dg_get_num_threads(), 1);
  setenv("OMP_NUM_THREADS", "3", 1);
  dg_set_num_threads(0);
  CHECK_EQ_INT(dg_get_num_threads(), 3);
  setenv("DG_NUM_THREADS", "2", 1);
  dg_set_num_threads(0);
  CHECK_EQ_INT(dg_get_num_threads(), 2);
  setenv("DG_NUM_THREADS", "abc", 1);
  dg_set_num_threads(0);
  CHECK_EQ_INT(dg_get_num_threads(), 1);
  dg_set_num_threads(1000);
  CHECK_EQ_INT(dg_get_num_threads(), 64);
  dg_set_num_threads(1);
  unsetenv("DG_NUM_THREADS");
  unsetenv("OMP_NUM_THREADS");
}

int main(void) {
  test_error_names_layer();
  test_nested_path();
  test_user_module_errors();
  test_item();
  test_dropout_switches();
  test_thread_defaults();
  return TEST_DONE();
}
