/* The pipe trains the same model as one process (issue #13 item 9, first
 * part): K ranks, one stage each, GPipe and 1F1B, M = 1, 2, 3, 8 (M < K
 * included). Each rank also trains the whole model on one process (a
 * store of its own) and compares, after every step, the mean loss and
 * every parameter of its stage (relative 1e-5: the micro-batch sums are
 * added in another order); with re-materialization too. With a BatchNorm in stage 0 the reference is
 * the same model trained with gradient accumulation over the M micro-batches
 * (each normalised with its own statistics, running statistics updated once
 * per micro-batch, as nn.h states for the pipe), and the running statistics
 * are compared too. Ranks that disagree on M fail in dg_pipe_new naming
 * both; a killed stage fails the other at once, naming it; a steady-state
 * step makes no heap allocation.
 *   test_pipe_equiv W */
#define B 24
#define IN 8
#define HID 16
#define NCLS 4
#define STEPS 3
#include "tests/pipe/pipe_util.h"

typedef struct {
  int M, kind, bn, remat, transport; /* transport: opts.transport_boundaries */
} cfg;

static dg_module *model_bn(int bn) {
  dg_module *seq, *l;
  REQUIRE(dg_nn_sequential(&seq) == DG_OK);
  REQUIRE(dg_nn_linear(&l, IN, HID, 1) == DG_OK && dg_sequential_add(seq, l, NULL) == DG_OK);
  if (bn)
    REQUIRE(dg_nn_batchnorm1d(&l, HID, 1e-5f, 0.1f) == DG_OK &&
            dg_sequential_add(seq, l, NULL) == DG_OK);
  REQUIRE(dg_nn_tanh(&l) == DG_OK && dg_sequential_add(seq, l, NULL) == DG_OK);
  REQUIRE(dg_nn_linear(&l, HID, HID, 1) == DG_OK && dg_sequential_add(seq, l, NULL) == DG_OK);
  REQUIRE(dg_nn_tanh(&l) == DG_OK && dg_sequential_add(seq, l, NULL) == DG_OK);
  REQUIRE(dg_nn_linear(&l, HID, NCLS, 1) == DG_OK && dg_sequential_add(seq, l, NULL) == DG_OK);
  return seq;
}

static dg_module *model(void) { return model_bn(0); }

static int rank_main(int r, int W, void *arg) {
  const cfg *c = arg;
  dg_store *st;
  dg_pg *pg;
  if (du_pg(r, W, &st, &pg)) return 2;
  dg_params *ps, *ref;
  dg_ctx *ctx;
  dg_pipe *pipe;
  char err[512];
  REQUIRE(dg_params_new(&ps) == DG_OK && dg_params_new(&ref) == DG_OK);
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  dg_pipe_opts po = dg_pipe_defaults();
  po.micro_batches = c->M;
  po.schedule = (dg_pipe_schedule)c->kind;
  po.remat = c->remat;
  po.transport_boundaries = c->transport;
  int rc = dg_pipe_new(&pipe, pg, model_bn(c->bn), ps, 5, &po, err, sizeof err);
  if (rc) fprintf(stderr, "rank %d: %s\n", r, err);
  REQUIRE(rc == DG_OK);
  dg_module *whole = model_bn(c->bn);
  REQUIRE(dg_module_bind(whole, ref, "", 5) == DG_OK);
  dg_sgd_opts so = dg_sgd_defaults();
  so.lr = 0.5f;
  so.momentum = 0.9f;
  dg_optim *opt, *oref;
  REQUIRE(dg_optim_new_sgd(&opt, ps, &so, NULL, 0) == DG_OK);
  REQUIRE(dg_optim_new_sgd(&oref, ref, &so, NULL, 0) == DG_OK);
  float x[B * IN];
  int64_t y[B];
  for (int s = 0; s < STEPS; s++) {
    batch(s, x, y); /* pipe_util.h */
    dg_tensor *xt = dg_wrap(ctx, DG_F32, 2, (int64_t[]){B, IN}, x);
    dg_tensor *yt = dg_wrap(ctx, DG_I64, 1, (int64_t[]){B}, y);
    float loss;
    rc = dg_pipe_step(pipe, xt, yt, ce, NULL, &loss);
    if (rc) fprintf(stderr, "rank %d: %s\n", r, dg_pipe_errmsg(pipe));
    REQUIRE(rc == DG_OK);
    /* ranks on one host: from the second step (the rings sized by the
     * first) every boundary goes into the neighbour's ring, unless asked */
    dg_pipe_stats pst;
    CHECK_OK(dg_pipe_get_stats(pipe, &pst));
    if (W > 1 && s > 0 && !c->transport)
      CHECK(pst.bytes_direct > 0 && pst.bytes_transport == 0);
    else if (W > 1)
      CHECK(pst.bytes_direct == 0 && pst.bytes_transport > 0);
    CHECK_OK(dg_optim_step(opt));
    dg_params_zero_grad(ps);
    double want = 0;
    if (!c->bn) { /* the whole batch at once */
      dg_tensor *lr = dg_cross_entropy(ctx, dg_module_forward(whole, ctx, xt), yt);
      REQUIRE(lr && dg_backward(ctx, lr) == DG_OK);
      want = dg_tensor_item(lr);
    } else { /* accumulation over the M micro-batches, each loss scaled by 1/M */
      const int64_t mb = B / c->M;
      for (int m = 0; m < c->M; m++) {
        dg_tensor *xm = dg_slice(ctx, xt, m * mb, (m + 1) * mb);
        dg_tensor *lm = dg_cross_entropy(ctx, dg_module_forward(whole, ctx, xm),
                                         dg_slice(ctx, yt, m * mb, (m + 1) * mb));
        REQUIRE(lm && dg_backward(ctx, dg_scale(ctx, lm, 1.0f / c->M)) == DG_OK);
        want += dg_tensor_item(lm) / c->M;
      }
    }
    CHECK_NEAR(loss, want, 1e-5 * fabs(want) + 1e-7);
    CHECK_OK(dg_optim_step(oref));
    dg_params_zero_grad(ref);
    dg_ctx_reset(ctx);
    /* every parameter of this stage against the whole model's */
    double rel = 0;
    for (int i = 0; i < dg_params_count(ps); i++) {
      dg_tensor *a = dg_params_get(ps, i), *b = dg_params_find(ref, dg_tensor_name(a));
      REQUIRE(b && dg_tensor_numel(a) == dg_tensor_numel(b));
      const float *pa = dg_tensor_data(a), *pb = dg_tensor_data(b);
      for (int64_t k = 0; k < dg_tensor_numel(a); k++)
        rel = fmax(rel, fabs((double)pa[k] - pb[k]) / (fabs((double)pb[k]) + 1e-3));
    }
    for (int i = 0; i < dg_params_buffer_count(ps); i++) { /* running statistics */
      dg_tensor *a = dg_params_buffer_get(ps, i), *b = dg_params_buffer_find(ref, dg_tensor_name(a));
      REQUIRE(b && dg_tensor_numel(a) == dg_tensor_numel(b));
      const float *pa = dg_tensor_data(a), *pb = dg_tensor_data(b);
      for (int64_t k = 0; k < dg_tensor_numel(a); k++)
        rel = fmax(rel, fabs((double)pa[k] - pb[k]) / (fabs((double)pb[k]) + 1e-3));
    }
    if (c->bn && r == 0) CHECK_EQ_INT(dg_params_buffer_count(ps), 2); /* stage 0 holds the BN */
    if (!(rel < 1e-5))
      fprintf(stderr, "rank %d step %d M=%d %s%s: parameters differ by %g\n", r, s, c->M,
              c->kind ? "1f1b" : "gpipe", c->remat ? " remat" : "", rel);
    CHECK(rel < 1e-5);
  }
  dg_optim_free(opt);
  dg_optim_free(oref);
  dg_pipe_free(pipe);
  dg_module_free(whole);
  dg_params_free(ps);
  dg_params_free(ref);
  dg_ctx_free(ctx);
  du_leave(st, pg, W);
  return dg_test_failures ? 1 : 0;
}

static uint64_t g_allocs;
static void *count_malloc(size_t n) {
  __atomic_add_fetch(&g_allocs, 1, __ATOMIC_RELAXED);
  return malloc(n);
}
static void *count_realloc(void *p, size_t n) {
  __atomic_add_fetch(&g_allocs, 1, __ATOMIC_RELAXED);
  return realloc(p, n);
}

/* A steady-state pipe step (both schedules' tables, sends, receives, the
 * micro-batch contexts, the optimizer) makes no heap allocation in dgrad:
 * counted through dg_set_allocator after 3 warm-up steps. */
static int alloc_rank(int r, int W, void *arg) {
  const cfg *c = arg;
  dg_set_allocator(count_malloc, count_realloc, free);
  dg_store *st;
  dg_pg *pg;
  if (du_pg(r, W, &st, &pg)) return 2;
  dg_params *ps;
  dg_ctx *ctx;
  dg_pipe *pipe;
  dg_optim *opt;
  char err[512];
  REQUIRE(dg_params_new(&ps) == DG_OK && dg_ctx_new(&ctx, NULL) == DG_OK);
  dg_pipe_opts po = dg_pipe_defaults();
  po.micro_batches = c->M;
  po.schedule = (dg_pipe_schedule)c->kind;
  po.remat = c->remat;
  REQUIRE(dg_pipe_new(&pipe, pg, model_bn(c->bn), ps, 5, &po, err, sizeof err) == DG_OK);
  REQUIRE(dg_optim_new_adamw(&opt, ps, NULL, NULL, 0) == DG_OK);
  float x[B * IN];
  int64_t y[B];
  batch(0, x, y);
  uint64_t before = 0;
  for (int s = 0; s < 8; s++) {
    if (s == 3) before = __atomic_load_n(&g_allocs, __ATOMIC_RELAXED);
    dg_tensor *xt = dg_wrap(ctx, DG_F32, 2, (int64_t[]){B, IN}, x);
    dg_tensor *yt = dg_wrap(ctx, DG_I64, 1, (int64_t[]){B}, y);
    REQUIRE(dg_pipe_step(pipe, xt, yt, ce, NULL, NULL) == DG_OK);
    if (dg_params_count(ps)) CHECK_OK(dg_optim_step(opt));
    dg_params_zero_grad(ps);
    dg_ctx_reset(ctx);
  }
  uint64_t n = __atomic_load_n(&g_allocs, __ATOMIC_RELAXED) - before;
  if (n) fprintf(stderr, "rank %d: %llu heap allocations in 5 steady-state steps\n", r,
                 (unsigned long long)n);
  CHECK_EQ_INT(n, 0);
  dg_optim_free(opt);
  dg_pipe_free(pipe);
  dg_params_free(ps);
  dg_ctx_free(ctx);
  du_leave(st, pg, W);
  return dg_test_failures ? 1 : 0;
}

/* Stage 1 dies after one step: stage 0's next step fails at once (the
 * connection closes; no wait for the group's 20 s timeout), naming the
 * step, the micro-batch and stage 1. */
static int kill_rank(int r, int W, void *arg) {
  (void)arg;
  dg_store *st;
  dg_pg *pg;
  if (du_pg(r, W, &st, &pg)) return 2;
  dg_params *ps;
  dg_ctx *ctx;
  dg_pipe *pipe;
  char err[512];
  REQUIRE(dg_params_new(&ps) == DG_OK && dg_ctx_new(&ctx, NULL) == DG_OK);
  dg_pipe_opts po = dg_pipe_defaults();
  po.micro_batches = 2;
  REQUIRE(dg_pipe_new(&pipe, pg, model(), ps, 5, &po, err, sizeof err) == DG_OK);
  float x[B * IN];
  int64_t y[B];
  batch(0, x, y);
  dg_tensor *xt = dg_wrap(ctx, DG_F32, 2, (int64_t[]){B, IN}, x);
  dg_tensor *yt = dg_wrap(ctx, DG_I64, 1, (int64_t[]){B}, y);
  REQUIRE(dg_pipe_step(pipe, xt, yt, ce, NULL, NULL) == DG_OK);
  if (r == 1) _exit(0); /* dies without leaving the group */
  const double t0 = pu_now();
  int rc = dg_pipe_step(pipe, xt, yt, ce, NULL, NULL);
  const double secs = pu_now() - t0;
  CHECK(rc != DG_OK);
  CHECK_STR_HAS(dg_pipe_errmsg(pipe), "pipe step 1: stage 0");
  CHECK_STR_HAS(dg_pipe_errmsg(pipe), "stage 1"); /* from it, or to it */
  CHECK(secs < 10); /* far below the timeout: the failure is seen, not waited out */
  dg_pipe_free(pipe);
  dg_params_free(ps);
  dg_ctx_free(ctx);
  dg_pg_free(pg);
  dg_store_free(st);
  return dg_test_failures ? 1 : 0;
}

/* Rank 1 asks for another M: both fail in dg_pipe_new, naming both. */
static int mismatch_rank(int r, int W, void *arg) {
  (void)arg;
  dg_store *st;
  dg_pg *pg;
  if (du_pg(r, W, &st, &pg)) return 2;
  dg_params *ps;
  dg_pipe *pipe = NULL;
  char err[512];
  REQUIRE(dg_params_new(&ps) == DG_OK);
  dg_pipe_opts po = dg_pipe_defaults();
  po.micro_batches = r == 1 ? 4 : 2;
  CHECK_EQ_INT(dg_pipe_new(&pipe, pg, model(), ps, 5, &po, err, sizeof err), DG_EMISMATCH);
  CHECK_STR_HAS(err, "micro-batches");
  CHECK(pipe == NULL);
  po.micro_batches = 2;
  po.transport_boundaries = r == 1;
  CHECK_EQ_INT(dg_pipe_new(&pipe, pg, model(), ps, 5, &po, err, sizeof err), DG_EMISMATCH);
  CHECK_STR_HAS(err, "transport_boundaries");
  po.transport_boundaries = 0;
  int bal[2] = {4, 4}; /* 8 layers for a model of 5 */
  po.micro_batches = 2;
  po.balance = bal;
  CHECK_EQ_INT(dg_pipe_new(&pipe, pg, model(), ps, 5, &po, err, sizeof err), DG_EINVAL);
  CHECK_STR_HAS(err, "the stages hold 8 layers, the model has 5");
  dg_params_free(ps);
  du_leave(st, pg, W);
  return dg_test_failures ? 1 : 0;
}

/* The batch grows and shrinks between steps: a boundary bigger than the
 * rings goes through the transport, the rings grow after it, a smaller one
 * fits; the loss and every gradient match the whole model's each step. */
static int grow_rank(int r, int W, void *arg) {
  (void)arg;
  pu_rank k;
  if (pu_open(&k, r, W)) return 2;
  dg_params *ref;
  dg_pipe *pipe;
  char err[512];
  REQUIRE(dg_params_new(&ref) == DG_OK);
  dg_pipe_opts po = dg_pipe_defaults();
  po.micro_batches = 2;
  po.schedule = DG_PIPE_1F1B;
  REQUIRE(dg_pipe_new(&pipe, k.pg, model(), k.ps, 5, &po, err, sizeof err) == DG_OK);
  dg_module *whole = model();
  REQUIRE(dg_module_bind(whole, ref, "", 5) == DG_OK);
  static const int rows[] = {24, 24, 48, 48, 24, 72};
  static const int direct[] = {0, 1, 0, 1, 1, 0};
  static float x[72 * IN];
  static int64_t y[72];
  for (int s = 0; s < 6; s++) {
    dg_rng_normal(11, (uint64_t)s * 72 * IN, x, (size_t)rows[s] * IN);
    for (int i = 0; i < rows[s]; i++) y[i] = (i + s) % NCLS;
    dg_tensor *xt = dg_wrap(k.ctx, DG_F32, 2, (int64_t[]){rows[s], IN}, x);
    dg_tensor *yt = dg_wrap(k.ctx, DG_I64, 1, (int64_t[]){rows[s]}, y);
    float loss;
    int rc = dg_pipe_step(pipe, xt, yt, ce, NULL, &loss);
    if (rc) fprintf(stderr, "rank %d: %s\n", r, dg_pipe_errmsg(pipe));
    REQUIRE(rc == DG_OK);
    dg_pipe_stats pst;
    CHECK_OK(dg_pipe_get_stats(pipe, &pst));
    if (direct[s]) CHECK(pst.bytes_direct > 0 && pst.bytes_transport == 0);
    else CHECK(pst.bytes_direct == 0 && pst.bytes_transport > 0);
    dg_tensor *lr = dg_cross_entropy(k.ctx, dg_module_forward(whole, k.ctx, xt), yt);
    REQUIRE(lr && dg_backward(k.ctx, lr) == DG_OK);
    CHECK_NEAR(loss, dg_tensor_item(lr), 1e-5 * fabs(dg_tensor_item(lr)) + 1e-7);
    CHECK(pu_grad_diff(k.ps, ref) < 1e-5);
    dg_params_zero_grad(k.ps), dg_params_zero_grad(ref);
    dg_ctx_reset(k.ctx);
  }
  dg_pipe_free(pipe);
  dg_module_free(whole);
  dg_params_free(ref);
  pu_close(&k, W, 1);
  return dg_test_failures ? 1 : 0;
}

/* One rank in this process (not forked, so LeakSanitizer sees its exit):
 * the pipe frees every layer it does not keep; K = 1 trains as one process. */
static void one_stage_in_process(void) {
  snprintf(du_dir, sizeof du_dir, "/tmp/dg_pipe_test_XXXXXX");
  REQUIRE(mkdtemp(du_dir));
  cfg c = {2, DG_PIPE_1F1B, 1, 1, 0};
  CHECK_EQ_INT(rank_main(0, 1, &c), 0);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", du_dir);
  CHECK_EQ_INT(system(cmd), 0);
}

int main(int argc, char **argv) {
  int W = argc > 1 ? atoi(argv[1]) : 2;
  static const int Ms[] = {1, 2, 3, 8};
  for (int remat = 0; remat < 2; remat++)
    for (int kind = 0; kind < 2; kind++)
      for (int i = 0; i < 4; i++) {
        cfg c = {Ms[i], kind, 0, remat, 0};
        int bad = du_run(W, rank_main, &c, 60, NULL);
        if (bad)
          fprintf(stderr, "K=%d M=%d %s%s: %d rank(s) failed\n", W, c.M,
                  kind ? "1f1b" : "gpipe", remat ? " remat" : "", bad);
        CHECK_EQ_INT(bad, 0);
      }
  CHECK_EQ_INT(du_run(W, grow_rank, NULL, 60, NULL), 0);
  if (W == 2) {
    one_stage_in_process();
    CHECK_EQ_INT(du_run(2, mismatch_rank, NULL, 60, NULL), 0);
    for (int kind = 0; kind < 2; kind++) { /* through the transport when asked */
      cfg c = {3, kind, 0, 0, 1};
      CHECK_EQ_INT(du_run(2, rank_main, &c, 60, NULL), 0);
    }
    CHECK_EQ_INT(du_run(2, kill_rank, NULL, 60, NULL), 0);
    for (int kind = 0; kind < 4; kind++) { /* both schedules, with and without remat */
      cfg c = {4, kind & 1, 1, kind >> 1, 0};
      CHECK_EQ_INT(du_run(2, alloc_rank, &c, 60, NULL), 0);
    }
    for (int kind = 0; kind < 4; kind++) { /* BatchNorm: micro-batch statistics */
      cfg c = {3, kind & 1, 1, kind >> 1, 0};
      CHECK_EQ_INT(du_run(2, rank_main, &c, 60, NULL), 0);
    }
  }
  return TEST_DONE();
}
