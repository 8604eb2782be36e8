/* The sharded update (ddp.h, "The sharded update"): overlap mode on the
 * shared segment keeps one copy of the values and the optimizer state, and
 * whoever averages a block updates it.
 *
 *   test_ddp_shard steal    rank 1 starts every backward 20 ms late: rank 0
 *                           takes over its blocks (peer_blocks > 0), update
 *                           included, and the values are bit for bit those of
 *                           the same run unsharded; pointers move at the
 *                           first step and back at dg_ddp_free
 *   test_ddp_shard groups   parameter groups set on the optimizer after the
 *                           update is sharded: the next step fails on both
 *                           ranks, naming the cause (no hang, no wrong update)
 *   test_ddp_shard freed    rank 1 frees its optimizer, then both step: rank
 *                           1 says its optimizer was freed, rank 0 that rank
 *                           1 no longer applies the update */
#include "tests/ddp/ddp_util.h"

#define STEPS 6
#define M 8

typedef struct {
  const char *mode;
  int noshard;
} cfg;

static dg_tensor *loss_of(dg_ctx *ctx, du_mlp *m, int r, int s) {
  return du_loss(ctx, m, ((int64_t)s * 2 + r) * M, M);
}

/* Steps with rank 1 late; the values end in m. */
static int run_steal(int r, const cfg *c, du_mlp *m) {
  dg_store *st = NULL;
  dg_pg *pg = NULL;
  dg_ctx *ctx = NULL;
  dg_optim *opt = NULL;
  dg_ddp *ddp = NULL;
  du_group = c->noshard ? "noshard" : NULL;
  if (du_pg(r, 2, &st, &pg) || dg_ctx_new(&ctx, NULL)) return 2;
  if (du_mlp_init(m, 0, 42) || du_optim("adamw", m->ps, &opt)) return 3;
  dg_ddp_opts o = du_ddp_defaults();
  o.first_bucket_bytes = 64, o.bucket_cap_bytes = 400; /* several buckets */
  o.shard_update = c->noshard ? -1 : 0;
  if (!o.engine_thread) o.engine_thread = -1; /* inline unless DG_DDP_SHM_INLINE=0 */
  char err[512];
  if (dg_ddp_new(&ddp, ctx, m->ps, pg, &o, err, sizeof err)) {
    fprintf(stderr, "rank %d: ddp_new: %s\n", r, err);
    return 4;
  }
  CHECK_OK(dg_ddp_overlap_optimizer(ddp, opt));
  const float *before = dg_params_data(m->ps, NULL);
  for (int s = 0; s < STEPS; s++) {
    if (r == 1) usleep(20000);
    dg_tensor *loss = loss_of(ctx, m, r, s);
    if (!loss || dg_backward(ctx, loss)) {
      fprintf(stderr, "rank %d step %d: %s\n", r, s, dg_ctx_errmsg(ctx));
      return 5;
    }
    dg_ctx_reset(ctx);
  }
  CHECK_OK(dg_ddp_flush(ddp));
  dg_ddp_stats sts;
  CHECK_OK(dg_ddp_get_stats(ddp, &sts));
  CHECK_EQ_INT(sts.sharded, !c->noshard);
  /* the shared copy is not the store's own buffer */
  CHECK_EQ_INT(dg_params_data(m->ps, NULL) != before, !c->noshard);
  /* inline, rank 0 does rank 1's share; with an engine, rank 1's engine
   * races rank 0 for every block (tests/ddp/test_ddp_steal.c): only the
   * group's total is certain to move */
  int64_t moved = sts.peer_blocks;
  CHECK_OK(dg_pg_allreduce_sync(pg, &moved, 1, DG_I64, DG_RED_SUM));
  if (o.engine_thread > 0) CHECK(moved > 0);
  else if (r == 0) CHECK(sts.peer_blocks > 0);
  dg_ddp_free(ddp);
  CHECK(dg_params_data(m->ps, NULL) == before); /* back in the store's own buffer */
  dg_optim_free(opt);
  dg_ctx_free(ctx);
  du_leave(st, pg, 2);
  return 0;
}

/* Two sharded steps, then the misuse of c->mode, then a step that must fail
 * with `want` in its message on this rank. */
static int run_misuse(int r, const cfg *c) {
  dg_store *st = NULL;
  dg_pg *pg = NULL;
  dg_ctx *ctx = NULL;
  dg_optim *opt = NULL;
  dg_ddp *ddp = NULL;
  du_mlp m;
  if (du_pg(r, 2, &st, &pg) || dg_ctx_new(&ctx, NULL)) return 2;
  if (du_mlp_init(&m, 0, 42) || du_optim("sgd", m.ps, &opt)) return 3;
  dg_ddp_opts o = du_ddp_defaults();
  char err[512];
  if (dg_ddp_new(&ddp, ctx, m.ps, pg, &o, err, sizeof err)) return 4;
  CHECK_OK(dg_ddp_overlap_optimizer(ddp, opt));
  for (int s = 0; s < 2; s++) {
    dg_tensor *loss = loss_of(ctx, &m, r, s);
    REQUIRE(loss);
    CHECK_OK(dg_backward(ctx, loss));
    dg_ctx_reset(ctx);
  }
  CHECK_OK(dg_ddp_flush(ddp));
  dg_ddp_stats sts;
  CHECK_OK(dg_ddp_get_stats(ddp, &sts));
  CHECK_EQ_INT(sts.sharded, 1);
  { /* another optimizer on the shared values would update them once per rank */
    dg_optim *other = NULL;
    CHECK_OK(du_optim("sgd", m.ps, &other));
    CHECK_EQ_INT(dg_optim_step(other), DG_ESTATE);
    CHECK_STR_HAS(dg_optim_errmsg(other), "once per rank");
    dg_optim_free(other);
  }
  const char *want;
  if (!strcmp(c->mode, "groups")) {
    CHECK_EQ_INT(dg_optim_set_group(opt, dg_param_filter_1d, NULL, 0.0f, 0.5f), 2); /* the biases */
    want = "this rank's optimizer was given parameter groups";
  } else {
    if (r == 1) {
      dg_optim_free(opt); /* takes a copy of its state back */
      opt = NULL;
    }
    want = r == 1 ? "this rank's optimizer was freed" : "another rank no longer applies it";
  }
  dg_tensor *loss = loss_of(ctx, &m, r, 2);
  REQUIRE(loss);
  int rc = dg_backward(ctx, loss);
  if (rc == DG_OK) rc = dg_ddp_flush(ddp); /* (the update lands at the next read) */
  CHECK_EQ_INT(rc, DG_ESTATE);
  CHECK_STR_HAS(dg_ddp_errmsg(ddp), want);
  CHECK_STR_HAS(dg_ddp_errmsg(ddp), "sharded");
  dg_ctx_reset(ctx);
  dg_ddp_free(ddp);
  dg_optim_free(opt);
  dg_ctx_free(ctx);
  dg_params_free(m.ps);
  du_leave(st, pg, 2);
  return 0;
}

static int rank_main(int r, int W, void *arg) {
  (void)W;
  const cfg *c = arg;
  if (strcmp(c->mode, "steal")) {
    int rc = run_misuse(r, c);
    return rc ? rc : dg_test_failures ? 1 : 0;
  }
  du_mlp a, b;
  cfg c2 = *c;
  c2.noshard = 1;
  int rc = run_steal(r, c, &a);
  if (!rc) rc = run_steal(r, &c2, &b);
  if (rc) return rc;
  size_t n1 = 0, n2 = 0;
  const float *pa = dg_params_data(a.ps, &n1), *pb = dg_params_data(b.ps, &n2);
  CHECK(n1 == n2 && n1 > 0 && memcmp(pa, pb, n1 * sizeof *pa) == 0);
  dg_params_free(a.ps);
  dg_params_free(b.ps);
  return dg_test_failures ? 1 : 0;
}

int main(int argc, char **argv) {
  if (argc != 2 || (strcmp(argv[1], "steal") && strcmp(argv[1], "groups") &&
                    strcmp(argv[1], "freed"))) {
    fprintf(stderr, "usage: %s steal|groups|freed\n", argv[0]);
    return 2;
  }
  cfg c = {argv[1], 0};
  CHECK_EQ_INT(du_run(2, rank_main, &c, 60, NULL), 0);
  return TEST_DONE();
}
