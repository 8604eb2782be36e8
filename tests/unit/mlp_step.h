/* A small MLP training step shared by the allocation tests:
 * x (B, 20) -> linear 32 -> relu -> linear 10 -> cross-entropy, plain SGD. */
#ifndef DG_TEST_MLP_STEP_H
#define DG_TEST_MLP_STEP_H

#include <dgrad.h>

static inline int mlp_build(dg_params *ps) {
  int64_t w0[2] = {32, 20}, b0[1] = {32}, w1[2] = {10, 32}, b1[1] = {10};
  int rc;
  if ((rc = dg_params_add(ps, "fc0.weight", 2, w0, NULL))) return rc;
  if ((rc = dg_params_add(ps, "fc0.bias", 1, b0, NULL))) return rc;
  if ((rc = dg_params_add(ps, "fc1.weight", 2, w1, NULL))) return rc;
  if ((rc = dg_params_add(ps, "fc1.bias", 1, b1, NULL))) return rc;
  size_t n;
  float *d = dg_params_data(ps, &n);
  dg_rng_uniform(1, 0, d, n);
  for (size_t i = 0; i < n; i++) d[i] = (d[i] - 0.5f) * 0.4f;
  return DG_OK;
}

/* Returns DG_OK and the loss, or an error code (detail in dg_ctx_errmsg). */
static inline int mlp_step(dg_ctx *ctx, dg_params *ps, float *x, int64_t *y, int B, float *loss) {
  int64_t xs[2] = {B, 20}, ys[1] = {B};
  dg_params_zero_grad(ps);
  dg_tensor *xt = dg_wrap(ctx, DG_F32, 2, xs, x);
  dg_tensor *yt = dg_wrap(ctx, DG_I64, 1, ys, y);
  dg_tensor *h = dg_relu(ctx, dg_linear(ctx, xt, dg_params_get(ps, 0), dg_params_get(ps, 1)));
  dg_tensor *o = dg_linear(ctx, h, dg_params_get(ps, 2), dg_params_get(ps, 3));
  dg_tensor *l = dg_cross_entropy(ctx, o, yt);
  if (!l) return dg_ctx_errcode(ctx) ? dg_ctx_errcode(ctx) : DG_EINVAL;
  int rc = dg_backward(ctx, l);
  if (rc) return rc;
  *loss = dg_tensor_item(l);
  size_t n;
  float *w = dg_params_data(ps, &n), *g = dg_params_grad(ps, &n);
  for (size_t i = 0; i < n; i++) w[i] -= 0.1f * g[i];
  dg_ctx_reset(ctx);
  return DG_OK;
}

static inline void mlp_data(float *x, int64_t *y, int B) {
  dg_rng_uniform(9, 0, x, (size_t)B * 20);
  for (int i = 0; i < B; i++) y[i] = i % 10;
}

#endif
