/* The optimizer step fused into backward gives the same parameters, bit for
 * bit, as backward then dg_optim_step (SGD with momentum, AdamW), on 1 and 2
 * threads; LAMB refuses; unfusing restores the separate step. */
#include <dgrad.h>

#include "../unit/mlp_step.h"
#include "test.h"

typedef int (*mk_fn)(dg_optim **o, dg_params *ps);

static int mk_sgd(dg_optim **o, dg_params *ps) {
  dg_sgd_opts so = dg_sgd_defaults();
  so.lr = 0.05f, so.momentum = 0.9f, so.weight_decay = 1e-3f;
  return dg_optim_new_sgd(o, ps, &so, NULL, 0);
}

static int mk_adamw(dg_optim **o, dg_params *ps) { return dg_optim_new_adamw(o, ps, NULL, NULL, 0); }

/* Trains 6 steps; fused or not. Returns the final flat parameters (malloc). */
static float *train(mk_fn mk, int fused, size_t *n) {
  enum { B = 16 };
  static float x[B * 20];
  static int64_t y[B];
  mlp_data(x, y, B);
  dg_ctx *ctx = NULL;
  dg_params *ps = NULL;
  dg_optim *o = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK && dg_params_new(&ps) == DG_OK);
  REQUIRE(mlp_build(ps) == DG_OK && mk(&o, ps) == DG_OK);
  if (fused) CHECK_OK(dg_optim_fuse_backward(o, ctx));
  if (fused) CHECK_EQ_INT(dg_optim_fuse_backward(o, ctx), DG_ESTATE);
  int64_t xs[2] = {B, 20}, ys[1] = {B};
  for (int s = 0; s < 6; s++) {
    dg_params_zero_grad(ps);
    dg_tensor *h = dg_relu(ctx, dg_linear(ctx, dg_wrap(ctx, DG_F32, 2, xs, x),
                                          dg_params_get(ps, 0), dg_params_get(ps, 1)));
    dg_tensor *l = dg_cross_entropy(ctx, dg_linear(ctx, h, dg_params_get(ps, 2),
                                                   dg_params_get(ps, 3)),
                                    dg_wrap(ctx, DG_I64, 1, ys, y));
    REQUIRE(l);
    CHECK_OK(dg_backward(ctx, l));
    if (!fused) CHECK_OK(dg_optim_step(o));
    dg_ctx_reset(ctx);
  }
  CHECK_EQ_INT(dg_optim_step_count(o), 6);
  float *d = dg_params_data(ps, n), *out = malloc(*n * sizeof *out);
  memcpy(out, d, *n * sizeof *out);
  if (fused) CHECK_OK(dg_optim_unfuse_backward(o));
  dg_optim_free(o);
  dg_params_free(ps);
  dg_ctx_free(ctx);
  return out;
}

int main(void) {
  mk_fn mks[2] = {mk_sgd, mk_adamw};
  for (int threads = 1; threads <= 2; threads++) {
    dg_set_num_threads(threads);
    for (int k = 0; k < 2; k++) {
      size_t n1, n2;
      float *a = train(mks[k], 0, &n1), *b = train(mks[k], 1, &n2);
      CHECK(n1 == n2);
      CHECK(!memcmp(a, b, n1 * sizeof(float)));
      free(a);
      free(b);
    }
  }
  dg_params *ps = NULL;
  dg_ctx *ctx = NULL;
  dg_optim *o = NULL;
  REQUIRE(dg_params_new(&ps) == DG_OK && dg_ctx_new(&ctx, NULL) == DG_OK);
  REQUIRE(mlp_build(ps) == DG_OK && dg_optim_new_lamb(&o, ps, NULL, NULL, 0) == DG_OK);
  CHECK_EQ_INT(dg_optim_fuse_backward(o, ctx), DG_EUNSUPPORTED);
  CHECK(strstr(dg_optim_errmsg(o), "whole-parameter norms") != NULL);
  CHECK_EQ_INT(dg_optim_unfuse_backward(o), DG_ESTATE); /* never fused */
  CHECK(strstr(dg_optim_errmsg(o), "not fused") != NULL);
  dg_optim_free(o);
  dg_params_free(ps);
  dg_ctx_free(ctx);
  return TEST_DONE();
}
