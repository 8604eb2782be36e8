/* Swapping under DDP and gradient accumulation: 2 ranks (forked, loopback)
 * train the swap tests' MLP with SGD + momentum for 3 steps of K
 * micro-batches, once without swapping and once with the given target,
 * each time with a grad-ready hook counting how often each parameter's
 * hook fires in every backward (exactly once) and a backward-end hook
 * checking the counts. DG_SWAP_FILE: the parameters after both runs are
 * bit-identical; bf16: within the exact test's bound.
 *
 * usage: test_swap_ddp K file|bf16|file+bf16 */
#include "tests/ddp/ddp_util.h"
#include "swap_util.h"

enum { STEPS = 3, M = 128 }; /* rows per micro-batch: activations 128 KiB */

typedef struct {
  int K;
  const char *target;
} cfg;

/* One training run; the parameters at the end into out. */
static int train(int r, int W, const cfg *c, dg_pg *pg, int swap, float *out, size_t *n) {
  sw_model m;
  REQUIRE(sw_mlp_new(&m, (int64_t)STEPS * W * c->K * M) == DG_OK);
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  dg_swap_opts so;
  if (swap && sw_opts(c->target, 2, &so)) CHECK_OK(dg_ctx_set_swap(ctx, &so));
  sw_ready_count rc = {.n = dg_params_count(m.ps)};
  REQUIRE(dg_ctx_add_grad_ready_hook(ctx, sw_on_ready, &rc) > 0);
  REQUIRE(dg_ctx_add_backward_end_hook(ctx, sw_on_end, &rc) > 0);
  dg_optim *opt = NULL;
  REQUIRE(du_optim("sgd", m.ps, &opt) == DG_OK);
  dg_ddp_opts o = du_ddp_defaults();
  o.accum_steps = c->K;
  o.bucket_cap_bytes = 256 << 10; /* several buckets */
  dg_ddp *ddp = NULL;
  char err[256];
  if (dg_ddp_new(&ddp, ctx, m.ps, pg, &o, err, sizeof err)) {
    fprintf(stderr, "rank %d: ddp_new: %s\n", r, err);
    return 5;
  }
  for (int s = 0; s < STEPS; s++)
    for (int j = 0; j < c->K; j++) {
      int64_t first = ((int64_t)s * W * c->K + (int64_t)j * W + r) * M;
      dg_tensor *loss = sw_loss_rows(&m, ctx, first, M);
      int e = loss ? dg_backward(ctx, loss) : DG_EINVAL;
      if (e) {
        fprintf(stderr, "rank %d step %d: %s\n", r, s, dg_ctx_errmsg(ctx));
        return 6;
      }
      CHECK_EQ_INT(dg_ddp_step_ready(ddp), j == c->K - 1);
      if (dg_ddp_step_ready(ddp)) {
        CHECK_OK(dg_optim_step(opt));
        dg_params_zero_grad(m.ps);
      }
      dg_ctx_reset(ctx);
    }
  CHECK_EQ_INT(rc.bad, 0);
  CHECK_EQ_INT(rc.backwards, STEPS * c->K);
  if (swap) {
    dg_swap_stats st;
    CHECK_OK(dg_ctx_swap_stats(ctx, &st));
    fprintf(stderr, "rank %d %s: %llu tensors out, %llu in\n", r, c->target,
            (unsigned long long)st.tensors_out, (unsigned long long)st.tensors_in);
    CHECK(st.tensors_out > 0 && st.tensors_in > 0);
  }
  dg_ddp_free(ddp);
  dg_optim_free(opt);
  float *p = dg_params_data(m.ps, n);
  memcpy(out, p, *n * sizeof *p);
  dg_ctx_free(ctx);
  sw_free(&m);
  return DG_OK;
}

static int rank_main(int r, int W, void *arg) {
  const cfg *c = arg;
  dg_store *st = NULL;
  dg_pg *pg = NULL;
  if (du_pg(r, W, &st, &pg)) return 3;
  static float a[1 << 19], b[1 << 19];
  size_t na = 0, nb = 0;
  if (train(r, W, c, pg, 0, a, &na) || train(r, W, c, pg, 1, b, &nb)) return 4;
  du_leave(st, pg, W);
  CHECK_EQ_INT(na, nb);
  double worst = 0, scale = 0;
  size_t differ = 0;
  for (size_t i = 0; i < na; i++) {
    differ += memcmp(&a[i], &b[i], sizeof a[i]) != 0;
    if (fabs((double)a[i] - b[i]) > worst) worst = fabs((double)a[i] - b[i]);
    if (fabs(a[i]) > scale) scale = fabs(a[i]);
  }
  fprintf(stderr, "rank %d K=%d %s: %zu of %zu parameters differ (max |diff| %.3g of %.3g)\n", r,
          c->K, c->target, differ, na, worst, scale);
  if (!strcmp(c->target, "file")) CHECK_EQ_INT(differ, 0);
  else CHECK(worst <= 1e-2 * scale);
  sw_rmdir();
  return TEST_DONE();
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s K file|bf16|file+bf16\n", argv[0]);
    return 2;
  }
  sw_tmpdir(); /* one directory, made before the fork, for both ranks' files */
  cfg c = {atoi(argv[1]), argv[2]};
  int bad = du_run(2, rank_main, &c, 60, NULL);
  sw_rmdir();
  CHECK_EQ_INT(bad, 0);
  return TEST_DONE();
}
