/* BatchNorm1d / BatchNorm2d modules against PyTorch (fixtures/batchnorm.dgref,
 * written by make_bn_fixtures.py): for each case, several training batches
 * one after another (output, input / weight / bias gradients, running
 * statistics after each), then eval mode (module flag, and the ctx's mode)
 * with the running statistics; and the same batches as micro-batches of
 * one accumulated step (gradients summed, one running-statistics update per
 * micro-batch, as torch).
 *
 *   test_ref_batchnorm FIXTURE.dgref */
#include "ref_fixture.h"

#define STEPS 3

static const ref_fixture *fx;

static const ref_tensor *want(const char *cs, const char *what) {
  char nm[128];
  snprintf(nm, sizeof nm, "%s.%s", cs, what);
  const ref_tensor *r = ref_find(fx, nm);
  if (!r) {
    T_FAIL_("fixture lacks %s", nm);
    exit(1);
  }
  return r;
}

typedef struct {
  dg_params *ps;
  dg_module *m;
  dg_tensor *w, *b, *rm, *rv;
} bn_env;

static void env_open(bn_env *e, const char *cs, int two_d) {
  const ref_tensor *pw = want(cs, "p.weight"), *pb = want(cs, "p.bias"), *h = want(cs, "hyper");
  const float *hy = h->data;
  int64_t C = pw->dims[0];
  REQUIRE(dg_params_new(&e->ps) == DG_OK);
  REQUIRE((two_d ? dg_nn_batchnorm2d : dg_nn_batchnorm1d)(&e->m, C, hy[1], hy[0]) == DG_OK);
  REQUIRE(dg_module_bind(e->m, e->ps, "bn", 7) == DG_OK);
  e->w = dg_params_find(e->ps, "bn.weight");
  e->b = dg_params_find(e->ps, "bn.bias");
  e->rm = dg_params_buffer_find(e->ps, "bn.running_mean");
  e->rv = dg_params_buffer_find(e->ps, "bn.running_var");
  REQUIRE(e->w && e->b && e->rm && e->rv);
  CHECK_EQ_INT(dg_params_count(e->ps), 2); /* buffers are not parameters */
  CHECK_EQ_INT(dg_params_buffer_count(e->ps), 2);
  CHECK(!strcmp(dg_tensor_name(e->rv), "bn.running_var"));
  CHECK(dg_tensor_get(e->rm, 0) == 0 && dg_tensor_get(e->rv, 0) == 1); /* torch's initial values */
  memcpy(dg_tensor_data(e->w), pw->data, (size_t)C * sizeof(float));
  memcpy(dg_tensor_data(e->b), pb->data, (size_t)C * sizeof(float));
}

static void env_close(bn_env *e) {
  dg_module_free(e->m);
  dg_params_free(e->ps);
}

/* Forward of input `key` with output gradient in.g; compares the output
 * (and, with check_grads, x's gradient) to the fixture. */
static void run_batch(dg_ctx *ctx, bn_env *e, const char *cs, const char *key, int check_grads) {
  char nm[96];
  snprintf(nm, sizeof nm, "%s.in.x", key);
  dg_tensor *x = ref_new_tensor(want(cs, nm));
  snprintf(nm, sizeof nm, "%s.in.g", key);
  dg_tensor *g = ref_new_tensor(want(cs, nm));
  REQUIRE(x && g);
  dg_tensor_set_requires_grad(x, 1);
  dg_tensor *y = dg_module_forward(e->m, ctx, x);
  if (!y || dg_backward_with(ctx, y, g)) {
    T_FAIL_("%s %s: %s", cs, key, dg_ctx_errmsg(ctx));
    exit(1);
  }
  snprintf(nm, sizeof nm, "%s.out.y", key);
  ref_compare(cs, want(cs, nm), y, 1.0, REF_TOL, 1);
  if (check_grads) {
    snprintf(nm, sizeof nm, "%s.g.in.x", key);
    ref_compare(cs, want(cs, nm), dg_tensor_grad(x), 1.0, REF_TOL, 1);
  }
  dg_ctx_reset(ctx);
  dg_tensor_free(x);
  dg_tensor_free(g);
}

static void compare_params(bn_env *e, const char *cs, const char *key) {
  char nm[96];
  snprintf(nm, sizeof nm, "%s.g.weight", key);
  ref_compare(cs, want(cs, nm), dg_tensor_grad(e->w), 1.0, REF_TOL, 1);
  snprintf(nm, sizeof nm, "%s.g.bias", key);
  ref_compare(cs, want(cs, nm), dg_tensor_grad(e->b), 1.0, REF_TOL, 1);
}

static void compare_running(bn_env *e, const char *cs, int k) {
  char nm[96];
  snprintf(nm, sizeof nm, "s%d.running_mean", k);
  ref_compare(cs, want(cs, nm), e->rm, 1.0, REF_TOL, 1);
  snprintf(nm, sizeof nm, "s%d.running_var", k);
  ref_compare(cs, want(cs, nm), e->rv, 1.0, REF_TOL, 1);
}

static void check_case(const char *cs, int two_d) {
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  bn_env e;
  env_open(&e, cs, two_d);
  char key[16];
  for (int k = 0; k < STEPS; k++) { /* one step per batch */
    dg_params_zero_grad(e.ps);
    snprintf(key, sizeof key, "s%d", k);
    run_batch(ctx, &e, cs, key, 1);
    compare_params(&e, cs, key);
    compare_running(&e, cs, k);
  }
  /* eval by the module's flag: running statistics, left as they are */
  dg_module_set_train(e.m, 0);
  dg_params_zero_grad(e.ps);
  run_batch(ctx, &e, cs, "eval", 1);
  compare_params(&e, cs, "eval");
  compare_running(&e, cs, STEPS - 1);
  /* eval by the ctx's mode alone: the same */
  dg_module_set_train(e.m, 1);
  dg_ctx_set_train(ctx, 0);
  run_batch(ctx, &e, cs, "eval", 0);
  compare_running(&e, cs, STEPS - 1);
  dg_ctx_set_train(ctx, 1);
  env_close(&e);

  /* the batches as micro-batches of one step: gradients add up, and the
   * running statistics move once per micro-batch */
  env_open(&e, cs, two_d);
  dg_params_zero_grad(e.ps);
  for (int k = 0; k < STEPS; k++) {
    snprintf(key, sizeof key, "s%d", k);
    run_batch(ctx, &e, cs, key, 1);
  }
  compare_params(&e, cs, "acc");
  compare_running(&e, cs, STEPS - 1);
  env_close(&e);
  dg_ctx_free(ctx);
}

int main(int argc, char **argv) {
  static ref_fixture f;
  char err[1024];
  if (argc < 2 || ref_load(argv[1], &f, err, sizeof err)) {
    T_FAIL_("%s", argc < 2 ? "usage: test_ref_batchnorm FIXTURE.dgref" : err);
    return 1;
  }
  fx = &f;
  check_case("bn2d", 1);
  check_case("bn1d", 0);
  check_case("bn1d3", 0);
  ref_fixture_free(&f);
  return TEST_DONE();
}
