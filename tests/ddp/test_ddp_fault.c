/* DDP failures.
 *   test_ddp_fault dead      rank 2 of 3 is SIGKILLed before its 4th
 *                            backward: on ranks 0 and 1 dg_backward returns
 *                            an error within 5 s naming rank 2 (no hang),
 *                            and the next backward fails at once too.
 *   test_ddp_fault dead_fwd  the same with DDP stepping the optimizer
 *                            (dg_ddp_overlap_optimizer): the failure may
 *                            surface in the forward that reads a parameter
 *                            whose update is pending, or in backward; a
 *                            backward that only publishes its buckets may
 *                            still succeed in step 3 (the averaging runs
 *                            on), so the failure must come by step 4.
 *   test_ddp_fault shape     rank 1 registers fc2.weight with another shape:
 *                            dg_ddp_new fails on every rank with
 *                            DG_EMISMATCH naming the parameter and ranks.
 *   test_ddp_fault options   rank 2 asks for accum_steps 2: DG_EMISMATCH
 *                            naming the options.
 *   test_ddp_fault count     rank 1 has one parameter more. */
#include "tests/ddp/ddp_util.h"

#define W 3
#define M 4
static const char *g_mode;

static double ms_since(const struct timespec *t0) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (t.tv_sec - t0->tv_sec) * 1e3 + (t.tv_nsec - t0->tv_nsec) / 1e6;
}

static int dead_peer(int r, dg_ctx *ctx, du_mlp *m, int fwd) {
  for (int s = 0; s < 6; s++) {
    if (r == 2 && s == 3) {
      usleep(300000); /* let the others finish step 2 before the sockets reset */
      raise(SIGKILL);
    }
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    dg_tensor *loss = du_loss(ctx, m, (s * W + r) * M, M);
    int rc = loss ? dg_backward(ctx, loss) : fwd ? dg_ctx_errcode(ctx) : DG_EINVAL;
    double ms = ms_since(&t0);
    char msg[600];
    snprintf(msg, sizeof msg, "%s", dg_ctx_errmsg(ctx));
    if (!fwd) dg_params_zero_grad(m->ps);
    dg_ctx_reset(ctx);
    if (s < 3 || (fwd && s == 3 && rc == DG_OK)) {
      CHECK_OK(rc);
      continue;
    }
    fprintf(stderr, "rank %d step %d: %s after %.0f ms: %s\n", r, s, dg_err_name(rc), ms, msg);
    CHECK(rc == DG_EPEER);
    CHECK(ms < 5000);
    CHECK_STR_HAS(msg, "rank 2");
    CHECK_STR_HAS(msg, "ddp");
  }
  return dg_test_failures ? 1 : 0;
}

static int mismatch(int r, dg_ctx *ctx, du_mlp *m, dg_pg *pg) {
  dg_ddp *ddp = NULL;
  dg_ddp_opts o = du_ddp_defaults();
  if (!strcmp(g_mode, "options") && r == 2) o.accum_steps = 2;
  char err[512] = "";
  int rc = dg_ddp_new(&ddp, ctx, m->ps, pg, &o, err, sizeof err);
  fprintf(stderr, "rank %d: %s: %s\n", r, dg_err_name(rc), err);
  CHECK(rc == DG_EMISMATCH);
  CHECK(ddp == NULL);
  if (!strcmp(g_mode, "options")) {
    CHECK_STR_HAS(err, "options differ");
    CHECK_STR_HAS(err, "rank 2");
    CHECK_STR_HAS(err, "accum=2");
  } else if (!strcmp(g_mode, "shape")) {
    CHECK_STR_HAS(err, "'fc2.weight' (5, 24) f32 vs rank 1 'fc2.weight' (5, 23)");
  } else {
    CHECK_STR_HAS(err, "rank 0 has 4, rank 1 has 5");
    CHECK_STR_HAS(err, "extra.bias");
  }
  return dg_test_failures ? 1 : 0;
}

static int rank_main(int r, int w, void *arg) {
  (void)w;
  (void)arg;
  dg_store *st = NULL;
  dg_pg *pg = NULL;
  dg_ctx *ctx = NULL;
  du_mlp m;
  if (du_pg(r, W, &st, &pg) || dg_ctx_new(&ctx, NULL)) return 2;
  if (!strcmp(g_mode, "shape") && r == 1) { /* fc2.weight (5, 23) */
    memset(&m, 0, sizeof m);
    dg_params_new(&m.ps);
    int64_t s1[2] = {DU_HID, DU_IN}, s2[2] = {DU_OUT, DU_HID - 1}, h = DU_HID, o = DU_OUT;
    dg_params_add(m.ps, "fc1.weight", 2, s1, &m.w1);
    dg_params_add(m.ps, "fc1.bias", 1, &h, &m.b1);
    dg_params_add(m.ps, "fc2.weight", 2, s2, &m.w2);
    dg_params_add(m.ps, "fc2.bias", 1, &o, &m.b2);
  } else if (du_mlp_init(&m, 0, 9)) {
    return 3;
  }
  if (!strcmp(g_mode, "count") && r == 1) {
    int64_t n = 3;
    dg_tensor *t;
    dg_params_add(m.ps, "extra.bias", 1, &n, &t);
  }
  int fwd = !strcmp(g_mode, "dead_fwd");
  if (strcmp(g_mode, "dead") && !fwd) {
    int rc = mismatch(r, ctx, &m, pg);
    du_leave(st, pg, W);
    return rc;
  }
  dg_ddp *ddp = NULL;
  dg_optim *opt = NULL;
  dg_ddp_opts o = du_ddp_defaults();
  if (dg_ddp_new(&ddp, ctx, m.ps, pg, &o, NULL, 0)) return 4;
  if (fwd && (du_optim("sgd", m.ps, &opt) || dg_ddp_overlap_optimizer(ddp, opt))) return 5;
  return dead_peer(r, ctx, &m, fwd); /* exits without cleanup: peers are gone */
}

int main(int argc, char **argv) {
  g_mode = argc > 1 ? argv[1] : "dead";
  int st[W];
  du_run(W, rank_main, NULL, 60, st);
  for (int r = 0; r < W; r++) {
    if (!strncmp(g_mode, "dead", 4) && r == 2) {
      CHECK(st[r] != -1 && WIFSIGNALED(st[r]) && WTERMSIG(st[r]) == SIGKILL);
      continue;
    }
    CHECK(st[r] != -1 && WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0);
  }
  return TEST_DONE();
}
