/* A steady-state DDP step allocates nothing: W forked ranks train an MLP
 * whose buckets take every allreduce path (a tiny first bucket: recursive
 * doubling, eager messages; a 128 KiB one: the algorithm under test), and
 * dgrad's heap allocations, counted through dg_set_allocator on every
 * thread of each rank (progress and worker threads included), must be 0
 * over N steps after two warm-up steps (bucket rebuild, pools filled).
 *
 *   test_ddp_alloc W ALGO     (ALGO: auto | ring | hd | direct) */
#include "tests/ddp/ddp_util.h"

#define IN 64
#define HID 512
#define OUT 5
#define B 8
#define STEPS 40

static uint64_t g_allocs;
static void *count_malloc(size_t n) {
  __atomic_add_fetch(&g_allocs, 1, __ATOMIC_RELAXED);
  return malloc(n);
}
static void *count_realloc(void *p, size_t n) {
  __atomic_add_fetch(&g_allocs, 1, __ATOMIC_RELAXED);
  return realloc(p, n);
}

static dg_algo algo_of(const char *s) {
  return !strcmp(s, "ring") ? DG_ALGO_RING
         : !strcmp(s, "hd") ? DG_ALGO_HALVING_DOUBLING
         : !strcmp(s, "direct") ? DG_ALGO_DIRECT
                                : DG_ALGO_AUTO;
}

static int rank_main(int r, int W, void *arg) {
  const char *algo = arg;
  dg_set_allocator(count_malloc, count_realloc, free);
  dg_store *st = NULL;
  dg_pg *pg = NULL;
  dg_ctx *ctx = NULL;
  dg_params *ps = NULL;
  dg_optim *opt = NULL;
  dg_ddp *ddp = NULL;
  dg_tensor *w1, *b1, *w2, *b2;
  int64_t s1[2] = {HID, IN}, s2[2] = {OUT, HID}, h = HID, o = OUT;
  if (du_pg(r, W, &st, &pg) || dg_ctx_new(&ctx, NULL) || dg_params_new(&ps)) return 2;
  CHECK_OK(dg_pg_set_algo(pg, algo_of(algo)));
  CHECK_OK(dg_params_add(ps, "fc1.weight", 2, s1, &w1));
  CHECK_OK(dg_params_add(ps, "fc1.bias", 1, &h, &b1));
  CHECK_OK(dg_params_add(ps, "fc2.weight", 2, s2, &w2));
  CHECK_OK(dg_params_add(ps, "fc2.bias", 1, &o, &b2));
  for (int i = 0; i < dg_params_count(ps); i++) {
    dg_tensor *t = dg_params_get(ps, i);
    dg_rng_normal(3, (uint64_t)i << 20, dg_tensor_data(t), (size_t)dg_tensor_numel(t));
    float *p = dg_tensor_data(t);
    for (int64_t k = 0; k < dg_tensor_numel(t); k++) p[k] *= 0.05f;
  }
  dg_sgd_opts so = dg_sgd_defaults();
  so.lr = 0.01f;
  CHECK_OK(dg_optim_new_sgd(&opt, ps, &so, NULL, 0));
  dg_ddp_opts dop = du_ddp_defaults();
  dop.first_bucket_bytes = 64; /* fc2.bias alone: small, eager */
  if (dg_ddp_new(&ddp, ctx, ps, pg, &dop, NULL, 0)) return 3;
  static float x[B * IN];
  static int64_t y[B];
  uint64_t steady = 0;
  for (int s = 0; s < STEPS + 2; s++) {
    dg_rng_normal(11, ((uint64_t)s * (uint64_t)W + (uint64_t)r) * B * IN, x, B * IN);
    for (int i = 0; i < B; i++) y[i] = (s + i + r) % OUT;
    uint64_t a0 = __atomic_load_n(&g_allocs, __ATOMIC_RELAXED);
    int64_t xs[2] = {B, IN}, n = B;
    dg_tensor *xt = dg_from_data(ctx, DG_F32, 2, xs, x);
    dg_tensor *yt = dg_from_data(ctx, DG_I64, 1, &n, y);
    dg_tensor *hh = dg_relu(ctx, dg_linear(ctx, xt, w1, b1));
    dg_tensor *loss = dg_cross_entropy(ctx, dg_linear(ctx, hh, w2, b2), yt);
    if (!loss || dg_backward(ctx, loss)) {
      fprintf(stderr, "rank %d step %d: %s\n", r, s, dg_ctx_errmsg(ctx));
      return 4;
    }
    CHECK(dg_ddp_step_ready(ddp));
    dg_optim_step(opt);
    dg_params_zero_grad(ps);
    dg_ctx_reset(ctx);
    if (s >= 2) steady += __atomic_load_n(&g_allocs, __ATOMIC_RELAXED) - a0;
  }
  dg_ddp_stats sts;
  dg_ddp_get_stats(ddp, &sts);
  fprintf(stderr, "rank %d/%d algo %s: %d buckets, %llu heap allocations in %d steady-state "
          "steps\n", r, W, algo, sts.nbuckets, (unsigned long long)steady, STEPS);
  CHECK(sts.nbuckets >= 2);
  CHECK_EQ_INT((long long)steady, 0);
  dg_ddp_free(ddp);
  dg_optim_free(opt);
  dg_params_free(ps);
  dg_ctx_free(ctx);
  dg_pg_free(pg);
  dg_store_free(st);
  return dg_test_failures ? 1 : 0;
}

int main(int argc, char **argv) {
  int W = argc > 1 ? atoi(argv[1]) : 2;
  char *algo = argc > 2 ? argv[2] : "auto";
  CHECK_EQ_INT(du_run(W, rank_main, algo, 60, NULL), 0);
  return TEST_DONE();
}
