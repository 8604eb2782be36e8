/* Uneven inputs: three ranks with 10, 7 and 3 batches. Each calls
 * dg_ddp_join when its data runs out; nobody hangs, the divisor follows the
 * ranks still training, and every rank ends with the parameters of one
 * process that averages, at step s, the batches of the ranks that still had
 * data at s.
 *
 * With the built-in hooks the count of ranks with data rides in bucket 0's
 * all-reduce; with a user hook ("user": a plain f32 sum written here) it is
 * a separate all-reduce.
 *
 * With "fwd" DDP steps the optimizer itself (dg_ddp_overlap_optimizer): the
 * last update of a rank is still pending when it joins.
 *
 *   test_ddp_join OPTIM COMM [fwd]    (COMM: f32 | fp16 | bf16 | user) */
#include "tests/ddp/ddp_util.h"

#define W 3
#define M 6
static const int k_batches[W] = {10, 7, 3};

typedef struct {
  const char *optim, *comm;
  int fwd;
} cfg;

/* A user comm hook: sum in f32, times scale. */
static int user_start(void *state, dg_pg *pg, const dg_ddp_bucket *b, void **pending) {
  (void)state;
  dg_work *w = NULL;
  int rc = dg_pg_allreduce(pg, b->grad, b->n, DG_F32, DG_RED_SUM, &w);
  *pending = w;
  return rc;
}
static int user_finish(void *state, dg_pg *pg, const dg_ddp_bucket *b, void *pending,
                       float scale) {
  (void)state;
  (void)pg;
  int rc = dg_work_wait(pending, 0);
  dg_work_free(pending);
  for (size_t i = 0; !rc && i < b->n; i++) b->grad[i] *= scale;
  return rc;
}
static void user_release(void *state, void *pending) {
  (void)state;
  dg_work_free(pending);
}
static const dg_ddp_comm_hook k_user_hook = {.name = "test:f32-sum", .start = user_start,
                                             .finish = user_finish, .release = user_release};

static int64_t first_row(int s, int r) { return ((int64_t)s * W + r) * M; }

static int train(int r, const cfg *c, du_mlp *m, double *elapsed_ms) {
  dg_store *st = NULL;
  dg_pg *pg = NULL;
  dg_ctx *ctx = NULL;
  dg_optim *opt = NULL;
  dg_ddp *ddp = NULL;
  if (du_pg(r, W, &st, &pg) || dg_ctx_new(&ctx, NULL) || du_mlp_init(m, 0, 5 + (uint64_t)r) ||
      du_optim(c->optim, m->ps, &opt))
    return 2;
  dg_ddp_opts o = du_ddp_defaults();
  o.first_bucket_bytes = 64;
  o.bucket_cap_bytes = 600;
  o.comm = !strcmp(c->comm, "fp16")   ? DG_DDP_COMM_FP16
           : !strcmp(c->comm, "bf16") ? DG_DDP_COMM_BF16
                                      : DG_DDP_COMM_F32;
  if (!strcmp(c->comm, "user")) o.hook = &k_user_hook;
  if (dg_ddp_new(&ddp, ctx, m->ps, pg, &o, NULL, 0)) return 3;
  if (c->fwd && dg_ddp_overlap_optimizer(ddp, opt)) return 3;
  struct timespec t0, t1;
  for (int s = 0; s < k_batches[r]; s++) {
    dg_tensor *loss = du_loss(ctx, m, first_row(s, r), M);
    if (!loss || dg_backward(ctx, loss)) {
      fprintf(stderr, "rank %d step %d: %s\n", r, s, dg_ctx_errmsg(ctx));
      return 4;
    }
    CHECK_EQ_INT(dg_ddp_step_ready(ddp), !c->fwd);
    if (!c->fwd) {
      dg_optim_step(opt);
      dg_params_zero_grad(m->ps);
    }
    dg_ctx_reset(ctx);
  }
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int rc = dg_ddp_join(ddp);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  *elapsed_ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
  if (rc) {
    fprintf(stderr, "rank %d join: %s\n", r, dg_ddp_errmsg(ddp));
    return 5;
  }
  dg_ddp_stats sts;
  dg_ddp_get_stats(ddp, &sts);
  CHECK_EQ_INT(sts.sync_steps, k_batches[r]);
  CHECK_EQ_INT(sts.shadow_steps, k_batches[0] - k_batches[r]);
  CHECK_EQ_INT(sts.overlapped_steps, c->fwd ? k_batches[r] - 1 : 0);
  /* a sharded update keeps one optimizer state: each rank's step count
   * follows it to the longest run's (else each counts its own steps) */
  if (sts.sharded) CHECK_EQ_INT(dg_optim_step_count(opt), k_batches[0]);
  else CHECK_EQ_INT(dg_optim_step_count(opt), k_batches[r]);
  dg_ddp_free(ddp);
  dg_optim_free(opt);
  dg_ctx_free(ctx);
  du_leave(st, pg, W);
  return 0;
}

/* One process: step s averages the batch means of the ranks with data. */
static int reference(const cfg *c, du_mlp *m) {
  dg_ctx *ctx = NULL;
  dg_optim *opt = NULL;
  if (dg_ctx_new(&ctx, NULL) || du_mlp_init(m, 0, 5) || du_optim(c->optim, m->ps, &opt)) return 7;
  for (int s = 0; s < k_batches[0]; s++) {
    int active = 0;
    dg_tensor *sum = NULL;
    for (int r = 0; r < W; r++) {
      if (s >= k_batches[r]) continue;
      dg_tensor *l = du_loss(ctx, m, first_row(s, r), M);
      sum = sum ? dg_add(ctx, sum, l) : l;
      active++;
    }
    dg_tensor *loss = dg_scale(ctx, sum, 1.0f / (float)active);
    if (!loss || dg_backward(ctx, loss)) return 8;
    dg_optim_step(opt);
    dg_params_zero_grad(m->ps);
    dg_ctx_reset(ctx);
  }
  dg_optim_free(opt);
  dg_ctx_free(ctx);
  return 0;
}

static int rank_main(int r, int w, void *arg) {
  (void)w;
  const cfg *c = arg;
  du_mlp d, ref;
  double ms = 0;
  int rc = train(r, c, &d, &ms);
  if (rc) return rc;
  if ((rc = reference(c, &ref))) return rc;
  double rel = du_rel_diff(d.ps, ref.ps), bound = !strcmp(c->comm, "fp16")   ? 2e-3
                                        : !strcmp(c->comm, "bf16") ? 2e-2
                                                                   : 1e-5;
  fprintf(stderr, "rank %d (%d batches): join took %.1f ms; max rel diff %.3g (bound %.0e)\n",
          r, k_batches[r], ms, rel, bound);
  CHECK(rel <= bound);
  dg_params_free(d.ps);
  dg_params_free(ref.ps);
  return dg_test_failures ? 1 : 0;
}

int main(int argc, char **argv) {
  cfg c = {argc > 1 ? argv[1] : "sgd", argc > 2 ? argv[2] : "f32",
           argc > 3 && !strcmp(argv[3], "fwd")};
  CHECK_EQ_INT(du_run(W, rank_main, &c, 60, NULL), 0);
  return TEST_DONE();
}
