/* DDP's shared gradient segment moves a late rank's share of the averaging
 * to the ranks waiting for it (dist/ddp_shm.c, progress): with one rank
 * sleeping before each backward, the others average its blocks
 * (dg_ddp_stats.peer_blocks > 0; it is also slow between its gradients
 * in backward, so that they wake up while it goes on), and the parameters after every step are
 * bit-identical to a run where no rank sleeps: who averages a block does
 * not change a bit.
 *
 *   test_ddp_steal W     (W ranks; the last one sleeps; skip 77 without
 *                         the shared segment, e.g. DG_SHM=0)
 */
#include "tests/ddp/ddp_util.h"

#define STEPS 5
#define M 8
#define SLEEP_MS 30

/* The late rank is slow in backward too: after each gradient (DDP's hook,
 * added first, has posted what became ready), so that the waiting ranks
 * wake up while it goes on. */
static void slow_hook(void *user, dg_params *ps, int index, int reached) {
  (void)user, (void)ps, (void)index, (void)reached;
  usleep(5000);
}

/* Trains STEPS steps of SGD (rank `slow` sleeping before each backward,
 * -1: none); *final gets the parameters, *peer the rank's peer_blocks. */
static int train(int r, int W, dg_pg *pg, int slow, dg_params **final, int64_t *peer) {
  dg_ctx *ctx = NULL;
  dg_optim *opt = NULL;
  dg_ddp *ddp = NULL;
  du_mlp m;
  if (dg_ctx_new(&ctx, NULL) || du_mlp_init(&m, 0, 42) || du_optim("sgd", m.ps, &opt)) return 3;
  dg_ddp_opts o = du_ddp_defaults();
  o.first_bucket_bytes = 64, o.bucket_cap_bytes = 400; /* several buckets */
  if (!o.engine_thread) o.engine_thread = -1; /* inline unless DG_DDP_SHM_INLINE=0 */
  char err[512];
  if (dg_ddp_new(&ddp, ctx, m.ps, pg, &o, err, sizeof err)) {
    fprintf(stderr, "rank %d: ddp_new: %s\n", r, err);
    return 4;
  }
  if (r == slow) REQUIRE(dg_ctx_add_grad_ready_hook(ctx, slow_hook, NULL) > 0);
  for (int s = 0; s < STEPS; s++) {
    dg_tensor *loss = du_loss(ctx, &m, ((int64_t)s * W + r) * M, M);
    if (r == slow) usleep(SLEEP_MS * 1000);
    if (!loss || dg_backward(ctx, loss)) {
      fprintf(stderr, "rank %d step %d: %s\n", r, s, dg_ctx_errmsg(ctx));
      return 5;
    }
    CHECK_OK(dg_optim_step(opt));
    dg_params_zero_grad(m.ps);
    dg_ctx_reset(ctx);
  }
  dg_ddp_stats st;
  CHECK_OK(dg_ddp_get_stats(ddp, &st));
  *peer = st.peer_blocks;
  dg_ddp_free(ddp);
  dg_optim_free(opt);
  dg_ctx_free(ctx);
  *final = m.ps;
  return 0;
}

static int bit_equal(dg_params *a, dg_params *b) {
  size_t na = 0, nb = 0;
  const float *pa = dg_params_data(a, &na), *pb = dg_params_data(b, &nb);
  return na == nb && memcmp(pa, pb, na * sizeof *pa) == 0;
}

static int rank_main(int r, int W, void *arg) {
  (void)arg;
  dg_store *st = NULL;
  dg_pg *pg = NULL;
  if (du_pg(r, W, &st, &pg)) return 2;
  dg_params *plain = NULL, *late = NULL;
  int64_t peer_plain = 0, peer_late = 0;
  int rc = train(r, W, pg, -1, &plain, &peer_plain);
  if (!rc) rc = train(r, W, pg, W - 1, &late, &peer_late);
  float moved = (float)peer_late; /* the group's total, late run */
  if (!rc) rc = dg_pg_allreduce_sync(pg, &moved, 1, DG_F32, DG_RED_SUM) ? 6 : 0;
  du_leave(st, pg, W);
  if (rc) return rc;
  fprintf(stderr, "rank %d: peer blocks averaged: %lld (no rank late), %lld (rank %d late)\n", r,
          (long long)peer_plain, (long long)peer_late, W - 1);
  CHECK(bit_equal(plain, late));
  /* Inline, rank 0 waits SLEEP_MS for the late rank in every step and the
   * late rank's hooks leave every block to it. With an engine (a thread of
   * its own) the late rank's engine is a waiter too and races rank 0 for
   * the blocks (it won all of them once under TSan): only the group's
   * total is certain to move. */
  if (du_ddp_defaults().engine_thread > 0)
    CHECK(moved > 0);
  else if (r == 0)
    CHECK(peer_late > 0);
  dg_params_free(plain);
  dg_params_free(late);
  return dg_test_failures ? 1 : 0;
}

int main(int argc, char **argv) {
  REQUIRE(argc == 2);
  int W = atoi(argv[1]);
  REQUIRE(W >= 2 && W <= 8);
  const char *shm = getenv("DG_SHM");
  if (shm && !strcmp(shm, "0")) {
    fprintf(stderr, "SKIP: DG_SHM=0: no shared gradient segment\n");
    return 77;
  }
  CHECK_EQ_INT(du_run(W, rank_main, NULL, 60, NULL), 0);
  return TEST_DONE();
}
