/* Ranks cannot drift apart through a misplaced optimizer step (issue #16
 * item 5). With accum_steps = 2, stepping after every micro-batch used to
 * apply each rank's local gradient alone: both ranks exited 0 with different
 * weights. Now the step inside the window fails with DG_ESTATE naming the
 * rank, the window and dg_ddp_step_ready, and changes nothing; the loop
 * that steps when dg_ddp_step_ready says so ends with equal weights.
 * Also: DDP divides an accumulated gradient by accum_steps itself, on one
 * rank as on many, so the same code needs no 1/K in its loss (a world of 1
 * equals one process that scales its loss by 1/K by hand). */
#include "tests/ddp/ddp_util.h"

#define K 2
#define STEPS 3
#define ROWS 8

/* Sum of parameter values, for comparing ranks through the store. */
static double checksum(dg_params *ps) {
  double s = 0;
  for (int i = 0; i < dg_params_count(ps); i++) {
    dg_tensor *t = dg_params_get(ps, i);
    const float *p = dg_tensor_data(t);
    for (int64_t k = 0; k < dg_tensor_numel(t); k++) s += p[k] * (double)(k % 7 + 1);
  }
  return s;
}

static int drift_rank(int r, int W, void *arg) {
  (void)arg;
  dg_store *st;
  dg_pg *pg;
  if (du_pg(r, W, &st, &pg)) return 2;
  du_mlp m;
  dg_ctx *ctx;
  dg_optim *opt;
  dg_ddp *ddp;
  char err[256];
  REQUIRE(du_mlp_init(&m, 0, 11) == DG_OK && dg_ctx_new(&ctx, NULL) == DG_OK);
  REQUIRE(du_optim("adamw", m.ps, &opt) == DG_OK);
  dg_ddp_opts o = du_ddp_defaults();
  o.accum_steps = K;
  REQUIRE(dg_ddp_new(&ddp, ctx, m.ps, pg, &o, err, sizeof err) == DG_OK);
  double before = checksum(m.ps);
  int refused = 0;
  for (int s = 0; s < STEPS * K; s++) {
    dg_tensor *loss = du_loss(ctx, &m, (int64_t)(s * W + r) * ROWS, ROWS);
    REQUIRE(loss && dg_backward(ctx, loss) == DG_OK);
    int rc = dg_optim_step(opt); /* the mistake: a step on every micro-batch */
    if (!dg_ddp_step_ready(ddp)) {
      CHECK_EQ_INT(rc, DG_ESTATE);
      CHECK_STR_HAS(dg_optim_errmsg(opt), "local sum of 1 of 2 micro-batches");
      CHECK_STR_HAS(dg_optim_errmsg(opt), "dg_ddp_step_ready");
      if (s == 0) CHECK(checksum(m.ps) == before); /* nothing changed */
      refused++;
    } else {
      CHECK_OK(rc);
      dg_params_zero_grad(m.ps);
    }
    dg_ctx_reset(ctx);
  }
  CHECK_EQ_INT(refused, STEPS);
  /* a manual no-sync scope is the user's own: local steps are allowed */
  dg_ddp_set_sync(ddp, 0);
  dg_tensor *loss = du_loss(ctx, &m, 1000 + r * ROWS, ROWS);
  REQUIRE(loss && dg_backward(ctx, loss) == DG_OK);
  double synced = checksum(m.ps);
  CHECK_OK(dg_optim_step(opt));
  dg_ddp_set_sync(ddp, 1);
  /* every rank held the same weights before the local step */
  float sums[2] = {(float)synced, -(float)synced};
  CHECK_OK(dg_pg_allreduce_sync(pg, sums, 2, DG_F32, DG_RED_MAX));
  CHECK(sums[0] == (float)synced && -sums[1] == (float)synced);
  dg_ddp_free(ddp);
  dg_optim_free(opt);
  dg_ctx_free(ctx);
  dg_params_free(m.ps);
  du_leave(st, pg, W);
  return dg_test_failures ? 1 : 0;
}

/* A world of 1 with accum_steps K against one process scaling by 1/K. */
static int one_rank(int r, int W, void *arg) {
  (void)arg;
  dg_store *st;
  dg_pg *pg;
  if (du_pg(r, W, &st, &pg)) return 2;
  du_mlp a, b;
  dg_ctx *ctx, *cb; /* b on a context of its own: DDP's hooks are on ctx */
  dg_optim *oa, *ob;
  dg_ddp *ddp;
  char err[256];
  REQUIRE(du_mlp_init(&a, 0, 5) == DG_OK && du_mlp_init(&b, 0, 5) == DG_OK);
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK && dg_ctx_new(&cb, NULL) == DG_OK);
  REQUIRE(du_optim("sgd", a.ps, &oa) == DG_OK && du_optim("sgd", b.ps, &ob) == DG_OK);
  dg_ddp_opts o = du_ddp_defaults();
  o.accum_steps = K;
  REQUIRE(dg_ddp_new(&ddp, ctx, a.ps, pg, &o, err, sizeof err) == DG_OK);
  for (int s = 0; s < STEPS * K; s++) {
    dg_tensor *la = du_loss(ctx, &a, (int64_t)s * ROWS, ROWS); /* no 1/K: DDP divides */
    REQUIRE(la && dg_backward(ctx, la) == DG_OK);
    if (dg_ddp_step_ready(ddp)) {
      CHECK_OK(dg_optim_step(oa));
      dg_params_zero_grad(a.ps);
    }
    dg_ctx_reset(ctx);
    dg_tensor *lb = dg_scale(cb, du_loss(cb, &b, (int64_t)s * ROWS, ROWS), 1.0f / K);
    REQUIRE(lb && dg_backward(cb, lb) == DG_OK);
    if ((s + 1) % K == 0) {
      CHECK_OK(dg_optim_step(ob));
      dg_params_zero_grad(b.ps);
    }
    dg_ctx_reset(cb);
  }
  double rel = du_rel_diff(a.ps, b.ps);
  if (!(rel < 1e-6)) fprintf(stderr, "world of 1 vs one process: relative difference %g\n", rel);
  CHECK(rel < 1e-6);
  dg_ddp_free(ddp);
  dg_optim_free(oa);
  dg_optim_free(ob);
  dg_ctx_free(cb);
  dg_ctx_free(ctx);
  dg_params_free(a.ps);
  dg_params_free(b.ps);
  du_leave(st, pg, W);
  return dg_test_failures ? 1 : 0;
}

int main(void) {
  int bad = du_run(2, drift_rank, NULL, 60, NULL);
  bad += du_run(1, one_rank, NULL, 60, NULL);
  CHECK_EQ_INT(bad, 0);
  return TEST_DONE();
}
