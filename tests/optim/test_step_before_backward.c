/* An optimizer step before any backward is a loud error (DG_ESTATE) that
 * changes nothing, for every optimizer: on a fresh store and after
 * dg_params_zero_grad (AdamW used to decay every weight, SGD with momentum
 * to take a step of stale momentum). A backward that reaches some
 * parameters steps as before, the others reading zero (torch 1.13's
 * zero_grad() default); gradient clipping in between does not hide a
 * missing backward; a store with no trainable parameter is not an error. */
#include <dgrad.h>

#include "../unit/mlp_step.h"
#include "test.h"

static int mk(int kind, dg_optim **o, dg_params *ps) {
  switch (kind) {
  case 0: {
    dg_sgd_opts so = {0.1f, 0.9f, 0.0f, 0, 0.01f};
    return dg_optim_new_sgd(o, ps, &so, NULL, 0);
  }
  case 1: return dg_optim_new_adamw(o, ps, NULL, NULL, 0);
  case 2: return dg_optim_new_lamb(o, ps, NULL, NULL, 0);
  default: return dg_optim_new_lars(o, ps, NULL, NULL, 0);
  }
}

/* Loss of the MLP on a fixed batch; uses only fc0 when `half`. */
static dg_tensor *loss_of(dg_ctx *ctx, dg_params *ps, int half) {
  enum { B = 8 };
  static float x[B * 20];
  static int64_t y[B];
  mlp_data(x, y, B);
  dg_tensor *xt = dg_wrap(ctx, DG_F32, 2, (int64_t[]){B, 20}, x);
  dg_tensor *h = dg_relu(ctx, dg_linear(ctx, xt, dg_params_get(ps, 0), dg_params_get(ps, 1)));
  if (half) return dg_mean(ctx, h);
  dg_tensor *o = dg_linear(ctx, h, dg_params_get(ps, 2), dg_params_get(ps, 3));
  return dg_cross_entropy(ctx, o, dg_wrap(ctx, DG_I64, 1, (int64_t[]){B}, y));
}

static void expect_refused(dg_optim *o, dg_params *ps, int64_t steps, const char *when) {
  size_t n;
  float *w = dg_params_data(ps, &n), *before = malloc(n * sizeof *w);
  memcpy(before, w, n * sizeof *w);
  int rc = dg_optim_step(o);
  if (rc != DG_ESTATE) T_FAIL_("%s %s: step returned %d", dg_optim_name(o), when, rc);
  CHECK_STR_HAS(dg_optim_errmsg(o), "step before any backward");
  CHECK_STR_HAS(dg_optim_errmsg(o), "call dg_backward first");
  CHECK(!memcmp(before, dg_params_data(ps, NULL), n * sizeof *w));
  CHECK_EQ_INT(dg_optim_step_count(o), steps);
  free(before);
}

static void test_refused(int kind) {
  dg_ctx *ctx = NULL;
  dg_params *ps = NULL;
  dg_optim *o = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK && dg_params_new(&ps) == DG_OK);
  REQUIRE(mlp_build(ps) == DG_OK && mk(kind, &o, ps) == DG_OK);
  expect_refused(o, ps, 0, "on a fresh store");
  dg_params_zero_grad(ps);
  expect_refused(o, ps, 0, "after zero_grad");
  /* one real step, then zero_grad: refused again, state untouched */
  dg_tensor *l = loss_of(ctx, ps, 0);
  REQUIRE(l && dg_backward(ctx, l) == DG_OK);
  CHECK_OK(dg_optim_step(o));
  dg_ctx_reset(ctx);
  dg_params_zero_grad(ps);
  const char *sn;
  float *st = NULL, *keep = NULL;
  size_t sl = 0;
  if (dg_optim_state_count(o)) {
    CHECK_OK(dg_optim_state_get(o, 0, &sn, &st, &sl));
    keep = malloc(sl * sizeof *st);
    memcpy(keep, st, sl * sizeof *st);
  }
  expect_refused(o, ps, 1, "after a step and zero_grad");
  if (keep) CHECK(!memcmp(keep, st, sl * sizeof *st));
  free(keep);
  /* clipping reads the gradients without making them look written */
  double total = -1;
  CHECK_OK(dg_clip_grad_norm(ps, 1.0, &total));
  CHECK(total == 0.0);
  expect_refused(o, ps, 1, "after zero_grad and clipping");
  dg_optim_free(o);
  dg_params_free(ps);
  dg_ctx_free(ctx);
}

/* A backward that reaches fc0 only: the step goes on; fc1's stale
 * gradients read as zero, so AdamW only decays fc1 (torch: zero grad). */
static void test_partial(void) {
  dg_ctx *ctx = NULL;
  dg_params *ps = NULL;
  dg_optim *o = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK && dg_params_new(&ps) == DG_OK);
  REQUIRE(mlp_build(ps) == DG_OK);
  dg_adamw_opts ao = {0.1f, 0.9f, 0.999f, 1e-8f, 0.5f};
  REQUIRE(dg_optim_new_adamw(&o, ps, &ao, NULL, 0) == DG_OK);
  dg_params_zero_grad(ps);
  dg_tensor *l = loss_of(ctx, ps, 1);
  REQUIRE(l && dg_backward(ctx, l) == DG_OK);
  dg_tensor *w2 = dg_params_get(ps, 2);
  float *d = dg_tensor_data(w2);
  float w0 = d[0], b0 = *(float *)dg_tensor_data(dg_params_get(ps, 0));
  CHECK_OK(dg_optim_step(o));
  CHECK_EQ_INT(dg_optim_step_count(o), 1);
  CHECK(d[0] == w0 * (float)(1.0 - (double)0.1f * 0.5f));
  CHECK(*(float *)dg_tensor_data(dg_params_get(ps, 0)) != b0);
  CHECK(*(float *)dg_tensor_data(dg_tensor_grad(w2)) == 0.0f);
  dg_optim_free(o);
  dg_params_free(ps);
  dg_ctx_free(ctx);
}

/* Nothing trainable: nothing to miss, the step is counted (as before). */
static void test_all_frozen(void) {
  dg_params *ps = NULL;
  dg_optim *o = NULL;
  REQUIRE(dg_params_new(&ps) == DG_OK && mlp_build(ps) == DG_OK);
  for (int i = 0; i < dg_params_count(ps); i++) dg_params_set_trainable(ps, i, 0);
  REQUIRE(dg_optim_new_adamw(&o, ps, NULL, NULL, 0) == DG_OK);
  CHECK_OK(dg_optim_step(o));
  CHECK_EQ_INT(dg_optim_step_count(o), 1);
  dg_optim_free(o);
  dg_params_free(ps);
}

int main(void) {
  for (int kind = 0; kind < 4; kind++) test_refused(kind);
  test_partial();
  test_all_frozen();
  return TEST_DONE();
}
