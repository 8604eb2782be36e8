/* Autograd: accumulation, grad mode, errors, and the hooks — grad-ready fires
 * once per parameter at the moment its gradient is final, unreached
 * parameters are reported, backward-end runs last, saved tensors go through
 * pack/unpack. */
#include <dgrad.h>

#include "test.h"

#define NP 4

typedef struct {
  dg_params *ps;
  int order[16], reached[16], n;
  float snapshot[NP][64]; /* the gradient as it was when the hook fired */
  int end_calls, end_after_ready;
  int packs, unpacks;
} rec;

static void on_ready(void *u, dg_params *ps, int i, int reached) {
  rec *r = u;
  if (r->ps) CHECK(ps == r->ps);
  r->order[r->n] = i;
  r->reached[r->n++] = reached;
  dg_tensor *g = dg_tensor_grad(dg_params_get(ps, i));
  memcpy(r->snapshot[i], dg_tensor_data(g), (size_t)dg_tensor_numel(g) * sizeof(float));
}

static int on_end(void *u, dg_ctx *ctx) {
  rec *r = u;
  (void)ctx;
  r->end_calls++;
  r->end_after_ready = r->n;
  return DG_OK;
}

static void *pack(void *u, dg_ctx *ctx, dg_tensor *t) {
  (void)ctx;
  ((rec *)u)->packs++;
  return t;
}

static dg_tensor *unpack(void *u, dg_ctx *ctx, void *p) {
  (void)ctx;
  ((rec *)u)->unpacks++;
  return p;
}

/* Two linear layers; "unused.weight" is registered but never used. */
static dg_tensor *forward(dg_ctx *ctx, dg_params *ps, const float *xin) {
  int64_t xs[2] = {2, 3};
  dg_tensor *x = dg_from_data(ctx, DG_F32, 2, xs, xin);
  dg_tensor *h = dg_linear(ctx, x, dg_params_get(ps, 0), dg_params_get(ps, 1));
  dg_tensor *y = dg_linear(ctx, h, dg_params_get(ps, 2), NULL);
  return dg_matmul_t(ctx, y, y, 0, 1); /* (2, 2) */
}

int main(void) {
  dg_ctx *ctx = NULL;
  dg_params *ps = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  REQUIRE(dg_params_new(&ps) == DG_OK);
  int64_t w0[2] = {4, 3}, b0[1] = {4}, w1[2] = {2, 4}, u[1] = {5};
  CHECK_OK(dg_params_add(ps, "l0.weight", 2, w0, NULL));
  CHECK_OK(dg_params_add(ps, "l0.bias", 1, b0, NULL));
  CHECK_OK(dg_params_add(ps, "l1.weight", 2, w1, NULL));
  CHECK_OK(dg_params_add(ps, "unused.weight", 1, u, NULL));
  size_t n;
  float *flat = dg_params_data(ps, &n);
  dg_rng_uniform(3, 0, flat, n);
  float xin[6] = {0.5f, -1, 2, 0.25f, 1, -0.5f};

  rec r;
  memset(&r, 0, sizeof r);
  r.ps = ps;
  int id1 = dg_ctx_add_grad_ready_hook(ctx, on_ready, &r);
  int id2 = dg_ctx_add_backward_end_hook(ctx, on_end, &r);
  int id3 = dg_ctx_set_saved_tensor_hooks(ctx, pack, unpack, &r);
  CHECK(id1 > 0 && id2 > 0 && id3 > 0);

  dg_tensor *loss = forward(ctx, ps, xin);
  REQUIRE(loss);
  CHECK(r.packs > 0);
  CHECK_OK(dg_backward(ctx, loss));
  CHECK_EQ_INT(r.unpacks, r.packs);
  /* every trainable parameter fired exactly once; used ones in reverse use
   * order, the unused one last with reached = 0, before backward-end */
  CHECK_EQ_INT(r.n, 4);
  CHECK_EQ_INT(r.order[0], 2);
  CHECK(r.order[1] == 0 || r.order[1] == 1);
  CHECK(r.order[2] == 0 || r.order[2] == 1);
  CHECK_EQ_INT(r.order[3], 3);
  CHECK_EQ_INT(r.reached[0], 1);
  CHECK_EQ_INT(r.reached[3], 0);
  CHECK_EQ_INT(r.end_calls, 1);
  CHECK_EQ_INT(r.end_after_ready, 4);
  CHECK_EQ_INT(dg_params_unreached_count(ps), 1);
  CHECK_EQ_INT(dg_params_reached(ps, 3), 0);
  CHECK_EQ_INT(dg_params_reached(ps, 0), 1);
  CHECK_EQ_INT(dg_ctx_tape_size(ctx), 0); /* backward consumed the tape */
  /* gradients were final when their hook fired */
  for (int i = 0; i < 3; i++) {
    dg_tensor *g = dg_tensor_grad(dg_params_get(ps, i));
    CHECK(!memcmp(r.snapshot[i], dg_tensor_data(g),
                  (size_t)dg_tensor_numel(g) * sizeof(float)));
  }
  /* accumulation: a second backward adds the same gradient again */
  float *g = dg_params_grad(ps, &n);
  float first[64];
  memcpy(first, g, 40 * sizeof(float));
  dg_ctx_reset(ctx);
  loss = forward(ctx, ps, xin);
  CHECK_OK(dg_backward(ctx, loss));
  for (int i = 0; i < 40; i++) CHECK_NEAR(g[i], 2 * first[i], 1e-5 * fabs(first[i]) + 1e-7);
  CHECK_EQ_INT(r.end_calls, 2);
  CHECK_EQ_INT(r.n, 8);

  /* grad mode off records nothing; backward then fails with a message */
  dg_ctx_reset(ctx);
  CHECK_OK(dg_ctx_remove_hook(ctx, id1));
  CHECK_OK(dg_ctx_remove_hook(ctx, id2));
  CHECK_OK(dg_ctx_remove_hook(ctx, id3));
  CHECK_EQ_INT(dg_ctx_remove_hook(ctx, id3), DG_ENOTFOUND);
  int prev = dg_ctx_set_grad_enabled(ctx, 0);
  CHECK_EQ_INT(prev, 1);
  loss = forward(ctx, ps, xin);
  CHECK_EQ_INT(dg_ctx_tape_size(ctx), 0);
  CHECK_EQ_INT(dg_backward(ctx, loss), DG_EINVAL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "backward");
  dg_ctx_set_grad_enabled(ctx, 1);
  CHECK_EQ_INT(r.n, 8); /* removed hooks stay silent */

  /* a frozen parameter gets no gradient and no hook */
  dg_ctx_reset(ctx);
  dg_params_zero_grad(ps);
  dg_params_set_trainable(ps, 0, 0);
  loss = forward(ctx, ps, xin);
  CHECK_OK(dg_backward(ctx, loss));
  float *g0 = dg_tensor_data(dg_tensor_grad(dg_params_get(ps, 0)));
  for (int i = 0; i < 12; i++) CHECK_NEAR(g0[i], 0, 0);
  dg_tensor *g2 = dg_tensor_grad(dg_params_get(ps, 2));
  CHECK(fabs(((float *)dg_tensor_data(g2))[0]) > 0);

  /* an attached store takes part even when none of its parameters is used */
  dg_params *other = NULL;
  REQUIRE(dg_params_new(&other) == DG_OK);
  CHECK_OK(dg_params_add(other, "solo", 1, u, NULL));
  rec r2;
  memset(&r2, 0, sizeof r2);
  r2.ps = other;
  dg_ctx_reset(ctx);
  dg_params_set_trainable(ps, 0, 1);
  dg_ctx *c2 = NULL;
  REQUIRE(dg_ctx_new(&c2, NULL) == DG_OK);
  CHECK_OK(dg_ctx_attach_params(c2, other));
  dg_ctx_add_grad_ready_hook(c2, on_ready, &r2);
  loss = forward(c2, ps, xin);
  r2.ps = NULL; /* hooks for `ps` are not checked here */
  CHECK_OK(dg_backward(c2, loss));
  CHECK_EQ_INT(r2.n, 4 + 1);
  CHECK_EQ_INT(dg_params_unreached_count(other), 1);
  dg_ctx_free(c2);
  dg_params_free(other);
  dg_params_free(ps);
  dg_ctx_free(ctx);
  return TEST_DONE();
}
