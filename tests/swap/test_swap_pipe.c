/* Swapping under the pipeline and re-materialization (issue #15 item 4).
 * K ranks (forked, loopback; K = 1 is one process) train a deep MLP cut
 * into K stages, M = 4 micro-batches, for GPipe and 1F1B, with and without
 * re-materialization: once without swapping and once with
 * dg_pipe_opts.swap. On every stage:
 *  - tensors really left memory and came back (dg_ctx_swap_stats of the
 *    stage's swapping contexts: bytes out > 0, tensors in > 0), on exactly
 *    the contexts that record a tape;
 *  - grad-ready fires exactly once per parameter per backward (M backwards
 *    a step), counted by hooks on every context dg_pipe_contexts returns;
 *  - DG_SWAP_FILE: every step's gradients, losses and the parameters after
 *    the last step are bit-identical to the run without swapping;
 *    DG_SWAP_BF16: the first step's gradients within swap.h's bound
 *    (relative L2 1e-2), the final parameters close.
 * Also (mode "many", one process): a GPipe stage with 66 micro-batches
 * swaps on 66 contexts at once, and 70 swapping contexts each bring a
 * released tensor back on a raw read (the registry once held 64), and
 * dg_pipe_new refuses bad swap options naming the stage and context.
 *
 * usage: test_swap_pipe K file|bf16 | test_swap_pipe many */
#include "tests/ddp/ddp_util.h"
#include "dgrad/pipe.h"
#include "swap_util.h"

#define BF16_REL 1e-2 /* swap.h: whole-gradient relative L2 error */
enum { IN = 128, HID = 128, NCLS = 8, BLOCKS = 16, STEPS = 3, MB_ROWS = 32 };

typedef struct {
  int K, M, kind, remat;
  const char *target;
  int rows, one; /* rows per micro-batch; one: GPipe without remat only */
} cfg;

/* BLOCKS x [linear, tanh, linear, layernorm, gelu] (a dropout in every
 * fourth), then linear -> NCLS: about 20 saving ops per stage for K = 3, so
 * forward releases pages (a record stays 8 ops) and backward reads them
 * back. Activations (32, 128) f32: 16 KiB. */
static dg_module *model(void) {
  dg_module *seq, *l;
  REQUIRE(dg_nn_sequential(&seq) == DG_OK);
#define ADD(call) REQUIRE((call) == DG_OK && dg_sequential_add(seq, l, NULL) == DG_OK)
  for (int b = 0; b < BLOCKS; b++) {
    ADD(dg_nn_linear(&l, b ? HID : IN, HID, 1));
    ADD(dg_nn_tanh(&l));
    ADD(dg_nn_linear(&l, HID, HID, 1));
    ADD(dg_nn_layernorm(&l, HID, 1e-5f));
    ADD(dg_nn_gelu(&l));
    if (b % 4 == 3) ADD(dg_nn_dropout(&l, 0.1f));
  }
  ADD(dg_nn_linear(&l, HID, NCLS, 1));
#undef ADD
  return seq;
}

static dg_tensor *ce(void *user, dg_ctx *ctx, dg_tensor *out, dg_tensor *t) {
  (void)user;
  return dg_cross_entropy(ctx, out, t);
}

static void batch(int step, int64_t rows, float *x, int64_t *y) {
  dg_rng_normal(31, (uint64_t)step * (uint64_t)rows * IN, x, (size_t)rows * IN);
  for (int64_t i = 0; i < rows; i++) y[i] = (i * 3 + step) % NCLS;
}

/* ---- one training run ---- */

typedef struct {
  float *grad[STEPS]; /* each step's gradients */
  float *param;       /* after the last step */
  float loss[STEPS];
  size_t n;
} run_out;

/* Swapping contexts of p: their number, summed statistics into st. */
static int swap_totals(dg_pipe *p, dg_swap_stats *st) {
  dg_ctx *cs[80];
  int n = 0, swapping = 0;
  REQUIRE(dg_pipe_contexts(p, cs, 80, &n) == DG_OK && n <= 80);
  memset(st, 0, sizeof *st);
  for (int k = 0; k < n; k++) {
    dg_swap_stats s;
    if (dg_ctx_swap_stats(cs[k], &s)) continue;
    swapping++;
    st->bytes_out += s.bytes_out, st->bytes_in += s.bytes_in;
    st->tensors_out += s.tensors_out, st->tensors_in += s.tensors_in;
    st->forward_reads += s.forward_reads, st->kept += s.kept;
    st->backwards += s.backwards;
  }
  return swapping;
}

static int train(int r, const cfg *c, dg_pg *pg, const dg_swap_opts *so, run_out *out) {
  const int64_t rows = (int64_t)c->M * c->rows;
  dg_params *ps;
  REQUIRE(dg_params_new(&ps) == DG_OK);
  dg_pipe_opts po = dg_pipe_defaults();
  po.micro_batches = c->M;
  po.schedule = (dg_pipe_schedule)c->kind;
  po.remat = c->remat;
  po.swap = so;
  dg_pipe *p;
  char err[512];
  int rc = dg_pipe_new(&p, pg, model(), ps, 11, &po, err, sizeof err);
  if (rc) fprintf(stderr, "rank %d: %s\n", r, err);
  REQUIRE(rc == DG_OK);
  sw_ready_count rdy = {.n = dg_params_count(ps)};
  REQUIRE(rdy.n > 0 && rdy.n <= SW_MAXP);
  dg_ctx *cs[80];
  int nc = 0;
  CHECK_OK(dg_pipe_contexts(p, cs, 80, &nc));
  dg_pipe_stats pst;
  CHECK_OK(dg_pipe_get_stats(p, &pst));
  CHECK_EQ_INT(nc, pst.contexts + c->remat);
  for (int k = 0; k < nc && k < 80; k++) {
    REQUIRE(dg_ctx_add_grad_ready_hook(cs[k], sw_on_ready, &rdy) > 0);
    REQUIRE(dg_ctx_add_backward_end_hook(cs[k], sw_on_end, &rdy) > 0);
  }
  dg_sgd_opts sgo = dg_sgd_defaults();
  sgo.lr = 0.05f;
  sgo.momentum = 0.9f;
  dg_optim *opt;
  REQUIRE(dg_optim_new_sgd(&opt, ps, &sgo, NULL, 0) == DG_OK);
  dg_ctx *ctx;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  float *x = malloc((size_t)rows * IN * sizeof *x);
  int64_t *y = malloc((size_t)rows * sizeof *y);
  REQUIRE(x && y);
  for (int s = 0; s < STEPS; s++) {
    batch(s, rows, x, y);
    dg_tensor *xt = dg_wrap(ctx, DG_F32, 2, (int64_t[]){rows, IN}, x);
    dg_tensor *yt = dg_wrap(ctx, DG_I64, 1, (int64_t[]){rows}, y);
    rc = dg_pipe_step(p, xt, yt, ce, NULL, &out->loss[s]);
    if (rc) fprintf(stderr, "rank %d step %d: %s\n", r, s, dg_pipe_errmsg(p));
    REQUIRE(rc == DG_OK);
    const float *g = dg_params_grad(ps, &out->n);
    out->grad[s] = malloc(out->n * sizeof *g);
    REQUIRE(out->grad[s]);
    memcpy(out->grad[s], g, out->n * sizeof *g);
    CHECK_OK(dg_optim_step(opt));
    dg_params_zero_grad(ps);
    dg_ctx_reset(ctx);
  }
  CHECK_EQ_INT(rdy.bad, 0);
  CHECK_EQ_INT(rdy.backwards, STEPS * c->M); /* one per micro-batch */
  dg_swap_stats st;
  int swapping = swap_totals(p, &st);
  if (so) {
    fprintf(stderr, "rank %d %s: %d swapping contexts: %llu tensors (%llu bytes) out, %llu "
            "(%llu bytes) in, %llu kept, %llu forward reads\n", r, c->target, swapping,
            (unsigned long long)st.tensors_out, (unsigned long long)st.bytes_out,
            (unsigned long long)st.tensors_in, (unsigned long long)st.bytes_in,
            (unsigned long long)st.kept, (unsigned long long)st.forward_reads);
    CHECK_EQ_INT(swapping, c->remat ? 1 : pst.contexts); /* the contexts with a tape */
    CHECK(st.bytes_out > 0 && st.tensors_out > 0);
    CHECK(st.tensors_in > 0 && st.bytes_in > 0); /* released in forward, read in backward */
    CHECK_EQ_INT(st.backwards, STEPS * c->M);
  } else {
    CHECK_EQ_INT(swapping, 0);
  }
  float *w = dg_params_data(ps, &out->n);
  out->param = malloc(out->n * sizeof *w);
  REQUIRE(out->param);
  memcpy(out->param, w, out->n * sizeof *w);
  free(x);
  free(y);
  dg_ctx_free(ctx);
  dg_optim_free(opt);
  dg_pipe_free(p);
  dg_params_free(ps);
  return DG_OK;
}

static void run_free(run_out *o) {
  for (int s = 0; s < STEPS; s++) free(o->grad[s]);
  free(o->param);
}

/* Relative L2 distance of b from a; count of elements that differ in bits. */
static double rel_l2(const float *a, const float *b, size_t n, size_t *differ) {
  double d2 = 0, r2 = 0;
  *differ = 0;
  for (size_t i = 0; i < n; i++) {
    *differ += memcmp(&a[i], &b[i], sizeof *a) != 0;
    d2 += ((double)b[i] - a[i]) * ((double)b[i] - a[i]);
    r2 += (double)a[i] * a[i];
  }
  return sqrt(d2 / (r2 > 0 ? r2 : 1));
}

static void compare(int r, const cfg *c, const run_out *a, const run_out *b) {
  const int lossless = !strcmp(c->target, "file");
  CHECK_EQ_INT(a->n, b->n);
  for (int s = 0; s < STEPS; s++) {
    size_t differ;
    double rel = rel_l2(a->grad[s], b->grad[s], a->n, &differ);
    fprintf(stderr, "rank %d K=%d %s%s %s step %d: %zu of %zu gradient elements differ, "
            "relative L2 %.3g; loss %.9g / %.9g\n", r, c->K, c->kind ? "1f1b" : "gpipe",
            c->remat ? " remat" : "", c->target, s, differ, a->n, rel, a->loss[s], b->loss[s]);
    if (lossless) {
      CHECK_EQ_INT(differ, 0);
      CHECK(memcmp(&a->loss[s], &b->loss[s], sizeof a->loss[s]) == 0);
    } else if (s == 0) {
      CHECK(rel <= BF16_REL);
    }
  }
  size_t differ;
  double rel = rel_l2(a->param, b->param, a->n, &differ);
  if (lossless) CHECK_EQ_INT(differ, 0);
  else CHECK(rel <= BF16_REL);
}

static int rank_main(int r, int W, void *arg) {
  cfg c = *(const cfg *)arg;
  dg_store *st;
  dg_pg *pg;
  if (du_pg(r, W, &st, &pg)) return 3;
  dg_swap_opts so;
  REQUIRE(sw_opts(c.target, 2, &so));
  so.min_bytes = 8 << 10;
  so.staging_bytes = 16 << 10; /* one record in flight: stored before it is 8 ops old */
  for (int kind = 0; kind < (c.one ? 1 : 2); kind++)
    for (int remat = 0; remat < (c.one ? 1 : 2); remat++) {
      c.kind = kind, c.remat = remat;
      run_out a, b;
      memset(&a, 0, sizeof a);
      memset(&b, 0, sizeof b);
      if (train(r, &c, pg, NULL, &a) || train(r, &c, pg, &so, &b)) return 4;
      compare(r, &c, &a, &b);
      run_free(&a);
      run_free(&b);
    }
  du_leave(st, pg, W);
  return dg_test_failures ? 1 : 0;
}

/* ---- many swapping contexts at once ---- */

/* On each of n contexts, all swapping (bf16): a chain of tanh whose first
 * output is released after DG_SWAP_LAG ops; a raw read brings it back. */
static void raw_reads(int n) {
  dg_ctx **cs = calloc((size_t)n, sizeof *cs);
  REQUIRE(cs);
  dg_swap_opts so;
  REQUIRE(sw_opts("bf16", 2, &so));
  so.min_bytes = 8 << 10;
  so.staging_bytes = 1; /* each op starts once every earlier save is stored */
  for (int k = 0; k < n; k++) {
    REQUIRE(dg_ctx_new(&cs[k], NULL) == DG_OK);
    REQUIRE(dg_ctx_set_swap(cs[k], &so) == DG_OK);
  }
  dg_params *ps;
  REQUIRE(dg_params_new(&ps) == DG_OK);
  dg_tensor *w = NULL;
  REQUIRE(dg_params_add(ps, "w", 2, (int64_t[]){HID, HID}, &w) == DG_OK);
  size_t nw;
  float *wd = dg_params_data(ps, &nw);
  dg_rng_normal(3, 0, wd, nw);
  for (size_t i = 0; i < nw; i++) wd[i] *= 0.05f;
  static float xd[64 * HID], want[64 * HID];
  dg_rng_normal(4, 0, xd, 64 * HID);
  for (int i = 0; i < 64 * HID; i++) want[i] = tanhf(xd[i]);
  int bad = 0;
  for (int k = n - 1; k >= 0; k--) { /* the last registered first */
    dg_ctx *c = cs[k];
    dg_tensor *x = dg_wrap(c, DG_F32, 2, (int64_t[]){64, HID}, xd);
    dg_tensor *first = dg_tanh(c, x); /* (64, 128): saved by tanh and the matmul */
    dg_tensor *h = dg_matmul(c, first, w);
    for (int j = 0; j < 12; j++) h = dg_tanh(c, dg_matmul(c, h, w));
    REQUIRE(h);
    const float *got = dg_tensor_data(first); /* released by now: comes back */
    for (int i = 0; i < 64 * HID; i++)
      if (fabsf(got[i] - want[i]) > 1e-2f * fabsf(want[i]) + 1e-6f) {
        if (!bad++) fprintf(stderr, "context %d: element %d reads %g, want %g\n", k, i, got[i],
                            want[i]);
        break;
      }
    CHECK_OK(dg_backward(c, dg_sum(c, h)));
    dg_swap_stats st;
    CHECK_OK(dg_ctx_swap_stats(c, &st));
    CHECK(st.forward_reads > 0); /* the read went through the registry */
    dg_ctx_reset(c);
  }
  CHECK_EQ_INT(bad, 0);
  for (int k = 0; k < n; k++) dg_ctx_free(cs[k]);
  free(cs);
  dg_params_free(ps);
}

/* dg_pipe_new with swap options dg_ctx_set_swap refuses: the error names
 * the stage and the context, and the store is left empty. */
static int bad_opts_rank(int r, int W, void *arg) {
  (void)arg;
  dg_store *st;
  dg_pg *pg;
  if (du_pg(r, W, &st, &pg)) return 3;
  dg_swap_opts so;
  dg_swap_opts_init(&so); /* target 0 */
  dg_pipe_opts po = dg_pipe_defaults();
  po.swap = &so;
  dg_params *ps;
  REQUIRE(dg_params_new(&ps) == DG_OK);
  dg_pipe *p = (dg_pipe *)1;
  char err[512] = "";
  CHECK_EQ_INT(dg_pipe_new(&p, pg, model(), ps, 1, &po, err, sizeof err), DG_EINVAL);
  CHECK(p == NULL);
  CHECK_STR_HAS(err, "stage 0");
  CHECK_STR_HAS(err, "micro-batch context 0");
  CHECK_STR_HAS(err, "target");
  CHECK_EQ_INT(dg_params_count(ps), 0); /* refused before the stage was bound */
  so.target = DG_SWAP_FILE;
  so.dir = "/nonexistent/dgswap";
  po.remat = 1;
  CHECK_EQ_INT(dg_pipe_new(&p, pg, model(), ps, 1, &po, err, sizeof err), DG_EIO);
  CHECK_STR_HAS(err, "recomputation context");
  CHECK_STR_HAS(err, "/nonexistent/dgswap");
  CHECK_EQ_INT(dg_params_count(ps), 0);
  dg_params_free(ps);
  du_leave(st, pg, W);
  return dg_test_failures ? 1 : 0;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s K file|bf16 | %s many\n", argv[0], argv[0]);
    return 2;
  }
  sw_tmpdir(); /* one directory, made before the fork, for every rank's files */
  if (!strcmp(argv[1], "many")) {
    /* a GPipe stage keeps M micro-batches alive: 66 swapping contexts */
    cfg c = {1, 66, DG_PIPE_GPIPE, 0, "bf16", 16, 1};
    CHECK_EQ_INT(du_run(1, rank_main, &c, 120, NULL), 0);
    raw_reads(70);
    CHECK_EQ_INT(du_run(1, bad_opts_rank, NULL, 30, NULL), 0);
  } else {
    cfg c = {atoi(argv[1]), 4, 0, 0, argc > 2 ? argv[2] : "file", MB_ROWS, 0};
    REQUIRE(c.K >= 1 && c.K <= 3);
    CHECK_EQ_INT(du_run(c.K, rank_main, &c, 150, NULL), 0);
  }
  sw_rmdir();
  return TEST_DONE();
}
