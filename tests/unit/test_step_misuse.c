/* Mistakes between steps are loud (issue #16 items 2 and 7): a context
 * whose arena grows across steps with no dg_ctx_reset warns once, naming the
 * likely cause; arena_limit turns that growth into DG_ENOMEM saying so; a
 * backward on a tensor from before dg_ctx_reset, or from another context,
 * is refused instead of walking nothing. */
#include <dgrad.h>

#include "test.h"

static int nwarn;
static char last_warn[1024];

static void capture(void *user, dg_log_level level, const char *msg) {
  (void)user;
  if (level != DG_LOG_WARN || !strstr(msg, "dg_ctx_reset")) return;
  nwarn++;
  snprintf(last_warn, sizeof last_warn, "%s", msg);
}

/* One training step of a small MLP: (64, 256) -> 256 -> 10, mean loss. */
static dg_tensor *step_loss(dg_ctx *ctx, dg_params *ps) {
  dg_tensor *x = dg_randn(ctx, 2, (int64_t[]){64, 256}, 0, 1);
  dg_tensor *h = dg_relu(ctx, dg_linear(ctx, x, dg_params_get(ps, 0), dg_params_get(ps, 1)));
  return dg_mean(ctx, dg_linear(ctx, h, dg_params_get(ps, 2), NULL));
}

static dg_params *mlp(void) {
  dg_params *ps;
  dg_tensor *t;
  REQUIRE(dg_params_new(&ps) == DG_OK);
  REQUIRE(dg_params_add(ps, "w1", 2, (int64_t[]){256, 256}, &t) == DG_OK);
  dg_init_normal(t, 0, 0.05f, 1);
  REQUIRE(dg_params_add(ps, "b1", 1, (int64_t[]){256}, &t) == DG_OK);
  REQUIRE(dg_params_add(ps, "w2", 2, (int64_t[]){10, 256}, &t) == DG_OK);
  dg_init_normal(t, 0, 0.05f, 2);
  return ps;
}

/* Training without a reset: one warning that says backwards piled up. */
static void no_reset_training(void) {
  dg_params *ps = mlp();
  dg_ctx *ctx;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  nwarn = 0;
  for (int s = 0; s < 3; s++) { /* with resets: the step's size is learnt, no warning */
    dg_params_zero_grad(ps);
    CHECK_OK(dg_backward(ctx, step_loss(ctx, ps)));
    dg_ctx_reset(ctx);
  }
  CHECK_EQ_INT(nwarn, 0);
  size_t step = dg_ctx_arena_peak(ctx);
  for (int s = 0; s < 1000 && dg_ctx_arena_used(ctx) < 6 * step + (40u << 20); s++) {
    dg_params_zero_grad(ps);
    CHECK_OK(dg_backward(ctx, step_loss(ctx, ps)));
  }
  CHECK_EQ_INT(nwarn, 1); /* once, not once per chunk */
  CHECK_STR_HAS(last_warn, "training steps (dg_params_zero_grad calls between backwards) since "
                           "the last dg_ctx_reset");
  dg_ctx_reset(ctx);
  dg_ctx_free(ctx);
  dg_params_free(ps);
}

/* Gradient accumulation as the guide says (8 micro-batches, one reset per
 * step after the optimizer step) is no leak: no warning, though a step is
 * 8x one micro-batch (the first backward used to be taken for a step). */
static void accumulation_is_quiet(void) {
  dg_params *ps;
  dg_tensor *w;
  REQUIRE(dg_params_new(&ps) == DG_OK);
  REQUIRE(dg_params_add(ps, "w", 2, (int64_t[]){1024, 1024}, &w) == DG_OK);
  dg_init_normal(w, 0, 0.02f, 3);
  dg_ctx *ctx;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  nwarn = 0;
  for (int step = 0; step < 2; step++) {
    dg_params_zero_grad(ps);
    for (int m = 0; m < 8; m++) { /* about 8 MiB of activations each */
      dg_tensor *x = dg_randn(ctx, 2, (int64_t[]){512, 1024}, 0, 1);
      dg_tensor *h = dg_relu(ctx, dg_linear(ctx, dg_relu(ctx, dg_linear(ctx, x, w, NULL)), w, NULL));
      CHECK_OK(dg_backward(ctx, dg_mean(ctx, h)));
    }
    dg_ctx_reset(ctx); /* after the (omitted) optimizer step */
  }
  CHECK_EQ_INT(nwarn, 0);
  dg_ctx_free(ctx);
  dg_params_free(ps);
}

/* A first step big enough to take several chunks: the reset merges them and
 * frees the old ones; a backward on a tensor of that step is refused
 * without reading the freed header (ASan). */
static void stale_after_merge(void) {
  dg_params *ps = mlp();
  dg_ctx *ctx;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  dg_tensor *old = NULL;
  for (int i = 0; i < 12; i++) old = step_loss(ctx, ps); /* 12 steps' worth: several chunks */
  REQUIRE(old);
  dg_ctx_reset(ctx);
  CHECK_EQ_INT(dg_backward(ctx, old), DG_ESTATE);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "before the last dg_ctx_reset");
  dg_ctx_free(ctx);
  dg_params_free(ps);
}

/* Evaluation forwards with grad on and no reset: the warning names the tape. */
static void eval_keeps_tape(void) {
  dg_params *ps = mlp();
  dg_ctx *ctx;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  CHECK_OK(dg_backward(ctx, step_loss(ctx, ps)));
  dg_ctx_reset(ctx);
  nwarn = 0;
  for (int s = 0; s < 2000 && !nwarn; s++) REQUIRE(step_loss(ctx, ps));
  CHECK_EQ_INT(nwarn, 1);
  CHECK_STR_HAS(last_warn, "tape holds");
  CHECK_STR_HAS(last_warn, "dg_ctx_set_grad_enabled(ctx, 0)");
  dg_ctx_free(ctx);
  dg_params_free(ps);
}

/* A hard limit: the op fails with DG_ENOMEM naming the limit, nothing leaks,
 * and after a reset the same context trains again. */
static void hard_limit(void) {
  dg_params *ps = mlp();
  dg_ctx *ctx;
  dg_ctx_opts o = {.arena_limit = 8u << 20};
  REQUIRE(dg_ctx_new(&ctx, &o) == DG_OK);
  int failed = 0;
  for (int s = 0; s < 500 && !failed; s++) {
    dg_tensor *loss = step_loss(ctx, ps);
    if (!loss || dg_backward(ctx, loss)) failed = 1;
  }
  CHECK_EQ_INT(failed, 1);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_ENOMEM);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "arena limit of 8.0 MiB");
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "dg_ctx_reset");
  CHECK(dg_ctx_arena_reserved(ctx) <= o.arena_limit);
  dg_ctx_reset(ctx);
  for (int s = 0; s < 3; s++) {
    CHECK_OK(dg_backward(ctx, step_loss(ctx, ps)));
    dg_ctx_reset(ctx);
  }
  dg_ctx_free(ctx);
  dg_params_free(ps);
}

/* backward on a loss of an earlier step, or of another context. */
static void stale_backward(void) {
  dg_params *ps = mlp();
  dg_ctx *ctx, *other;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  REQUIRE(dg_ctx_new(&other, NULL) == DG_OK);
  dg_tensor *old = step_loss(ctx, ps);
  REQUIRE(old);
  dg_ctx_reset(ctx);
  CHECK_EQ_INT(dg_backward(ctx, old), DG_ESTATE);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "before the last dg_ctx_reset");
  /* the next step's tensors now cover old's bytes (shifted by a block, so
   * old's address is not itself a live header of the new step): refused */
  REQUIRE(dg_zeros(ctx, DG_F32, 1, (int64_t[]){3}));
  dg_tensor *cur = step_loss(ctx, ps);
  (void)step_loss(ctx, ps);
  CHECK(dg_backward(ctx, old) != DG_OK); /* old's address is inside some tensor's bytes now */
  CHECK_EQ_INT(dg_backward(other, cur), DG_ESTATE);
  CHECK_STR_HAS(dg_ctx_errmsg(other), "another context");
  CHECK_OK(dg_backward(ctx, cur)); /* the right one still works */
  CHECK_EQ_INT(dg_backward(ctx, cur), DG_ESTATE); /* and only once */
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "already consumed");
  /* a persistent leaf that requires grad is a valid root */
  dg_tensor *leaf;
  REQUIRE(dg_tensor_new(&leaf, DG_F32, 1, (int64_t[]){1}, NULL, 0) == DG_OK);
  dg_tensor_set_requires_grad(leaf, 1);
  CHECK_OK(dg_backward(ctx, leaf));
  dg_tensor_free(leaf);
  dg_ctx_free(other);
  dg_ctx_free(ctx);
  dg_params_free(ps);
}

int main(void) {
  dg_set_log_fn(capture, NULL);
  no_reset_training();
  eval_keeps_tape();
  accumulation_is_quiet();
  stale_after_merge();
  hard_limit();
  stale_backward();
  return TEST_DONE();
}
