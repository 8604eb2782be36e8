/* Equivalence: DDP on W ranks, each with micro-batches of M rows, K
 * micro-batches per step (accumulation), gives the same parameters after N
 * steps as one process stepping on the concatenated W*K*M rows.
 *
 *   test_ddp_equiv W OPTIM K MODE COMM CAPS [fwd]
 *     OPTIM: sgd | adamw | lamb | lars
 *     K:     micro-batches per step (1: no accumulation)
 *     MODE:  plain | unused (a registered parameter the forward never uses)
 *            | nosync (K-1 micro-steps inside dg_ddp_set_sync(0), loss / K)
 *     COMM:  f32 | fp16 | bf16
 *     CAPS:  small (a bucket per parameter or two) | default (25 MiB / 1 MiB)
 *     fwd:   DDP steps the optimizer itself, each bucket's update landing
 *            when the next forward reads it (dg_ddp_overlap_optimizer),
 *            under a learning rate that changes every step (set before the
 *            forward, while the previous update is still pending)
 *
 * Bounds (max |ddp - ref| / max |ref| over all parameters): f32 1e-5;
 * fp16 2e-3 and bf16 2e-2 (their mantissas keep 11 and 8 bits: one rounding
 * of each averaged gradient per step, which an optimizer turns into at most
 * lr-sized differences). Ranks other than 0 start from different values, so
 * the broadcast of dg_ddp_new is tested too. */
#include "tests/ddp/ddp_util.h"
#include "bench/ddp/simlink.h"

#define STEPS 6
#define M 8

typedef struct {
  const char *optim, *mode, *comm, *caps;
  int K, fwd;
  int noshard; /* dg_ddp_opts.shard_update = -1 (rank_main's second run) */
} cfg;

/* Whether the update should be sharded: overlap mode on the shared segment
 * (f32, DG_SHM not 0) with SGD or AdamW, more than one rank. */
static int shards(const cfg *c, int W) {
  const char *e = getenv("DG_SHM");
  return c->fwd && !c->noshard && W > 1 && !strcmp(c->comm, "f32") && !(e && !strcmp(e, "0")) &&
         (!strcmp(c->optim, "sgd") || !strcmp(c->optim, "adamw"));
}

/* fwd: the rate of step s (the same schedule in the reference). */
static void schedule(const cfg *c, dg_optim *o, float base, int s) {
  if (c->fwd) dg_optim_set_lr(o, base * (1.0f - 0.1f * (float)s));
}

static double bound(const cfg *c) {
  if (!strcmp(c->comm, "fp16")) return 2e-3;
  if (!strcmp(c->comm, "bf16")) return 2e-2;
  return 1e-5;
}

static int run_ddp(int r, int W, const cfg *c, du_mlp *m) {
  dg_store *st = NULL;
  dg_pg *pg = NULL;
  dg_ctx *ctx = NULL;
  dg_optim *opt = NULL;
  dg_ddp *ddp = NULL;
  if (du_pg(r, W, &st, &pg) || dg_ctx_new(&ctx, NULL)) return 2;
  if (du_mlp_init(m, !strcmp(c->mode, "unused"), 42 + (uint64_t)r)) return 3;
  if (du_optim(c->optim, m->ps, &opt)) return 4;
  dg_ddp_opts o = du_ddp_defaults();
  if (!strcmp(c->caps, "small")) o.first_bucket_bytes = 64, o.bucket_cap_bytes = 400;
  o.comm = !strcmp(c->comm, "fp16") ? DG_DDP_COMM_FP16
           : !strcmp(c->comm, "bf16") ? DG_DDP_COMM_BF16 : DG_DDP_COMM_F32;
  int manual = !strcmp(c->mode, "nosync");
  o.accum_steps = manual ? 1 : c->K;
  o.shard_update = c->noshard ? -1 : 0;
  char err[512];
  if (dg_ddp_new(&ddp, ctx, m->ps, pg, &o, err, sizeof err)) {
    fprintf(stderr, "rank %d: ddp_new: %s\n", r, err);
    return 5;
  }
  if (W == 1) { /* one DDP per store: a second is refused and disturbs nothing */
    dg_ddp *again = NULL;
    CHECK_EQ_INT(dg_ddp_new(&again, ctx, m->ps, pg, &o, err, sizeof err), DG_ESTATE);
    CHECK_STR_HAS(err, "another DDP");
    CHECK(again == NULL);
    CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_OK); /* the detail went to err, not the ctx */
  }
  const float base = dg_optim_lr(opt);
  if (c->fwd) {
    CHECK_OK(dg_ddp_overlap_optimizer(ddp, opt));
    CHECK_EQ_INT(dg_optim_step(opt), DG_ESTATE); /* owned: stepping it would double */
    CHECK_EQ_INT(dg_clip_grad_norm(m->ps, 1.0, NULL), DG_ESTATE); /* no global moment */
  }
  for (int s = 0; s < STEPS; s++) {
    schedule(c, opt, base, s);
    for (int j = 0; j < c->K; j++) {
      int64_t first = (int64_t)s * W * c->K * M + ((int64_t)j * W + r) * M;
      if (manual) dg_ddp_set_sync(ddp, j == c->K - 1);
      CHECK_EQ_INT(dg_ddp_will_sync(ddp), j == c->K - 1);
      dg_tensor *loss = du_loss(ctx, m, first, M);
      if (manual && c->K > 1) loss = dg_scale(ctx, loss, 1.0f / (float)c->K);
      int rc = loss ? dg_backward(ctx, loss) : DG_EINVAL;
      if (rc) {
        fprintf(stderr, "rank %d step %d: %s\n", r, s, dg_ctx_errmsg(ctx));
        return 6;
      }
      CHECK_EQ_INT(dg_ddp_step_ready(ddp), !c->fwd && j == c->K - 1);
      if (dg_ddp_step_ready(ddp)) {
        CHECK_OK(dg_optim_step(opt));
        dg_params_zero_grad(m->ps);
      }
      dg_ctx_reset(ctx);
    }
  }
  dg_ddp_stats sts;
  dg_ddp_get_stats(ddp, &sts);
  CHECK_EQ_INT(sts.sync_steps, STEPS);
  CHECK_EQ_INT(sts.local_steps, STEPS * (c->K - 1));
  CHECK_EQ_INT(sts.rebuilt, W > 1); /* one rank: nothing to exchange or rebuild */
  if (!strcmp(c->caps, "small")) CHECK(sts.nbuckets >= 3);
  else CHECK_EQ_INT(sts.nbuckets, 1);
  CHECK_EQ_INT(sts.sharded, shards(c, W));
  if (sts.sharded) { /* the sharded optimizer stays with its DDP */
    dg_optim *other = NULL;
    CHECK_OK(du_optim(c->optim, m->ps, &other));
    CHECK_EQ_INT(dg_ddp_overlap_optimizer(ddp, other), DG_ESTATE);
    CHECK_STR_HAS(dg_ddp_errmsg(ddp), "sharded");
    CHECK_EQ_INT(dg_ddp_overlap_optimizer(ddp, NULL), DG_ESTATE);
    CHECK_OK(dg_ddp_overlap_optimizer(ddp, opt)); /* the same one: nothing to do */
    dg_optim_free(other);
  }
  /* every update after the first (which precedes the rebuild) is deferred */
  CHECK_EQ_INT(sts.overlapped_steps, c->fwd && W > 1 ? STEPS - 1 : 0);
  /* The last update is still pending. With accumulation the optimizer is
   * freed first: that must apply it (compared with the reference later).
   * Else raw reads must see it applied (what dg_ddp_free applies later must
   * already be there), optimizer state included (what a checkpoint reads
   * first). */
  size_t n = 0, ns = 0;
  float *seen = NULL, *state = NULL, *st0 = NULL, *conv = NULL;
  if (c->fwd && c->K > 1) {
    dg_optim_free(opt);
    opt = NULL;
  } else if (c->fwd) {
    /* a conversion is an op: it must wait like any op (it read the
     * previous step's weights while raw reads saw the new ones) */
    dg_tensor *cv = dg_to_dtype(ctx, m->w1, DG_F32);
    REQUIRE(cv);
    conv = malloc((size_t)dg_tensor_numel(cv) * sizeof *conv);
    memcpy(conv, dg_tensor_data(cv), (size_t)dg_tensor_numel(cv) * sizeof *conv);
    if (dg_optim_state_count(opt) > 0) {
      CHECK_OK(dg_optim_state_get(opt, 0, NULL, &st0, &ns));
      state = malloc(ns * sizeof *state);
      memcpy(state, st0, ns * sizeof *state);
    }
    const float *w = dg_tensor_data(m->w1); /* reads wait for the update */
    n = (size_t)dg_tensor_numel(m->w1);
    seen = malloc(n * sizeof *seen);
    memcpy(seen, w, n * sizeof *seen);
    CHECK_OK(dg_ddp_flush(ddp));
  }
  dg_ddp_free(ddp);
  if (seen) CHECK(memcmp(seen, dg_tensor_data(m->w1), n * sizeof *seen) == 0);
  if (conv) CHECK(memcmp(conv, dg_tensor_data(m->w1), n * sizeof *conv) == 0);
  free(conv);
  /* the state moved back out of the shared segment: ask again */
  if (state) CHECK_OK(dg_optim_state_get(opt, 0, NULL, &st0, &ns));
  if (state) CHECK(memcmp(state, st0, ns * sizeof *state) == 0);
  free(seen);
  free(state);
  dg_optim_free(opt);
  dg_ctx_free(ctx);
  du_leave(st, pg, W);
  return 0;
}

static int run_ref(int W, const cfg *c, du_mlp *m) {
  dg_ctx *ctx = NULL;
  dg_optim *opt = NULL;
  if (dg_ctx_new(&ctx, NULL) || du_mlp_init(m, !strcmp(c->mode, "unused"), 42) ||
      du_optim(c->optim, m->ps, &opt))
    return 7;
  int64_t n = (int64_t)W * c->K * M;
  const float base = dg_optim_lr(opt);
  for (int s = 0; s < STEPS; s++) {
    schedule(c, opt, base, s);
    dg_tensor *loss = du_loss(ctx, m, s * n, n);
    if (!loss || dg_backward(ctx, loss)) return 8;
    dg_optim_step(opt);
    dg_params_zero_grad(m->ps);
    dg_ctx_reset(ctx);
  }
  dg_optim_free(opt);
  dg_ctx_free(ctx);
  return 0;
}

static int rank_main(int r, int W, void *arg) {
  const cfg *c = arg;
  du_mlp d, ref;
  int rc = run_ddp(r, W, c, &d);
  if (rc) return rc;
  if ((rc = run_ref(W, c, &ref))) return rc;
  double rel = du_rel_diff(d.ps, ref.ps);
  fprintf(stderr, "rank %d: %s K=%d %s %s %s%s: max rel diff %.3g (bound %.0e)\n", r,
          c->optim, c->K, c->mode, c->comm, c->caps, c->fwd ? " fwd" : "", rel, bound(c));
  CHECK(rel <= bound(c));
  if (strcmp(c->comm, "f32")) CHECK(rel > 0); /* compression must actually round */
  if (shards(c, W)) { /* sharded: bit for bit what every rank updating all gives */
    cfg c2 = *c;
    c2.noshard = 1;
    du_mlp e;
    du_group = "noshard"; /* a second group in the same store */
    if ((rc = run_ddp(r, W, &c2, &e))) return rc;
    size_t n1 = 0, n2 = 0;
    const float *a = dg_params_data(d.ps, &n1), *b = dg_params_data(e.ps, &n2);
    CHECK_EQ_INT((long long)n1, (long long)n2);
    CHECK(n1 == n2 && memcmp(a, b, n1 * sizeof *a) == 0);
    dg_params_free(e.ps);
  }
  dg_params_free(d.ps);
  dg_params_free(ref.ps);
  return dg_test_failures ? 1 : 0;
}

int main(int argc, char **argv) {
  if (argc != 7 && !(argc == 8 && !strcmp(argv[7], "fwd"))) {
    fprintf(stderr, "usage: %s W OPTIM K MODE COMM CAPS [fwd]\n", argv[0]);
    return 2;
  }
  int W = atoi(argv[1]);
  cfg c = {argv[2], argv[4], argv[5], argv[6], atoi(argv[3]), argc == 8, 0};
  REQUIRE(W >= 1 && W <= 8 && c.K >= 1);
  du_link = simlink_from_env(); /* the simlink cases: DG_SIM_LINK_GBIT */
  CHECK_EQ_INT(du_run(W, rank_main, &c, 60, NULL), 0);
  return TEST_DONE();
}
