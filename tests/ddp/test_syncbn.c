/* SyncBatchNorm on 2 ranks against one BatchNorm2d on the whole batch in
 * one process, and DDP broadcasting the store's buffers.
 *
 *   test_syncbn MODE
 *     even    rows 5 | 5 of a 10-row batch, STEPS training steps: each
 *             rank's output and input gradient equal the reference's rows,
 *             the weight and bias gradients summed over the ranks equal the
 *             reference's, the running statistics equal the reference's
 *             (and are the same bits on both ranks); then eval
 *     uneven  the same with rows 7 | 3
 *     ddp     SyncBatchNorm -> flatten -> Linear under DDP on the same group
 *             (rows 6 | 4, SGD): parameters and running statistics after
 *             STEPS steps equal one process's on the whole batch; rank 1's
 *             own running statistics and weights are replaced by rank 0's
 *             at dg_ddp_new, and again by dg_ddp_broadcast_buffers
 *     empty   rows 10 | 0: both ranks' forwards fail, naming rank 1
 *     mismatch  rank 1's store has a buffer of another shape: dg_ddp_new
 *             fails on both ranks naming it
 * Tolerance: max |got - want| / max |want| <= 1e-5 per tensor. */
#include "tests/ddp/ddp_util.h"

#define NT 10 /* rows of the global batch */
#define CH 3
#define HW 4 /* 2 x 2 */
#define ROW (CH * HW)
#define STEPS 3
#define TOL 1e-5

static const char *mode;
static int rows[2];

static void global_batch(int s, float *x, float *g) {
  dg_rng_normal(500 + (uint64_t)s, 0, x, NT * ROW);
  dg_rng_normal(600 + (uint64_t)s, 0, g, NT * ROW);
  for (int i = 0; i < NT * ROW; i++) x[i] = 1.5f * x[i] + 0.3f * (float)((i / HW) % CH) + 0.7f;
}

static void set_affine(dg_params *ps) {
  float *w = dg_tensor_data(dg_params_find(ps, "bn.weight"));
  float *b = dg_tensor_data(dg_params_find(ps, "bn.bias"));
  for (int c = 0; c < CH; c++) w[c] = 1.0f + 0.25f * (float)c, b[c] = 0.1f * (float)(c - 1);
}

static double rel(const float *got, const float *want, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    num = fmax(num, fabs((double)got[i] - want[i]));
    den = fmax(den, fabs((double)want[i]));
  }
  return den > 0 ? num / den : num;
}

#define CHECK_REL(what, got, want, n)                                            \
  do {                                                                           \
    double r_ = rel(got, want, n);                                               \
    if (!(r_ <= TOL)) T_FAIL_("rank %d: %s: rel diff %.3g > %g", r, what, r_, TOL); \
  } while (0)

/* ---- the reference: one BatchNorm2d over the whole batch ---- */

typedef struct {
  float y[STEPS + 1][NT * ROW], dx[STEPS + 1][NT * ROW];
  float dw[STEPS][CH], db[STEPS][CH], rm[STEPS][CH], rv[STEPS][CH];
} reference;

static void run_reference(reference *ref) {
  dg_ctx *ctx;
  dg_params *ps;
  dg_module *m;
  REQUIRE(!dg_ctx_new(&ctx, NULL) && !dg_params_new(&ps));
  REQUIRE(!dg_nn_batchnorm2d(&m, CH, 1e-5f, 0.1f) && !dg_module_bind(m, ps, "bn", 1));
  set_affine(ps);
  for (int s = 0; s <= STEPS; s++) { /* the last one in eval mode */
    static float x[NT * ROW], g[NT * ROW];
    global_batch(s, x, g);
    if (s == STEPS) dg_module_set_train(m, 0);
    dg_params_zero_grad(ps);
    dg_tensor *xt = dg_from_data(ctx, DG_F32, 4, (int64_t[]){NT, CH, 2, 2}, x);
    dg_tensor_set_requires_grad(xt, 1);
    dg_tensor *y = dg_module_forward(m, ctx, xt);
    REQUIRE(y && !dg_backward_with(ctx, y, dg_from_data(ctx, DG_F32, 4, dg_tensor_shape(y), g)));
    memcpy(ref->y[s], dg_tensor_data(y), sizeof ref->y[s]);
    memcpy(ref->dx[s], dg_tensor_data(dg_tensor_grad(xt)), sizeof ref->dx[s]);
    if (s < STEPS) {
      memcpy(ref->dw[s], dg_tensor_data(dg_tensor_grad(dg_params_find(ps, "bn.weight"))), CH * 4);
      memcpy(ref->db[s], dg_tensor_data(dg_tensor_grad(dg_params_find(ps, "bn.bias"))), CH * 4);
      memcpy(ref->rm[s], dg_tensor_data(dg_params_buffer_find(ps, "bn.running_mean")), CH * 4);
      memcpy(ref->rv[s], dg_tensor_data(dg_params_buffer_find(ps, "bn.running_var")), CH * 4);
    }
    dg_ctx_reset(ctx);
  }
  dg_module_free(m);
  dg_params_free(ps);
  dg_ctx_free(ctx);
}

/* ---- SyncBatchNorm alone ---- */

/* Sums n floats over the ranks in place. */
static int sum_ranks(dg_pg *pg, float *v, size_t n) {
  return dg_pg_allreduce_sync(pg, v, n, DG_F32, DG_RED_SUM);
}

static int rank_sync(int r, int W, dg_pg *pg, const reference *ref) {
  dg_ctx *ctx;
  dg_params *ps;
  dg_module *m;
  REQUIRE(!dg_ctx_new(&ctx, NULL) && !dg_params_new(&ps));
  REQUIRE(!dg_nn_sync_batchnorm2d(&m, CH, 1e-5f, 0.1f, pg) && !dg_module_bind(m, ps, "bn", 1));
  CHECK(!strcmp(dg_module_type(m), "SyncBatchNorm"));
  set_affine(ps);
  dg_tensor *rm = dg_params_buffer_find(ps, "bn.running_mean");
  dg_tensor *rv = dg_params_buffer_find(ps, "bn.running_var");
  const int64_t first = r ? rows[0] : 0, n = rows[r];
  (void)W;
  for (int s = 0; s <= STEPS; s++) {
    static float x[NT * ROW], g[NT * ROW];
    global_batch(s, x, g);
    if (s == STEPS) dg_module_set_train(m, 0);
    dg_params_zero_grad(ps);
    dg_tensor *xt = dg_from_data(ctx, DG_F32, 4, (int64_t[]){n, CH, 2, 2}, x + first * ROW);
    dg_tensor_set_requires_grad(xt, 1);
    dg_tensor *y = dg_module_forward(m, ctx, xt);
    if (!strcmp(mode, "empty")) { /* every rank fails, at the same point */
      CHECK(y == NULL);
      CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_EINVAL);
      CHECK_STR_HAS(dg_ctx_errmsg(ctx), "bn (SyncBatchNorm): sync_batchnorm: rank 1 has an "
                    "empty batch");
      break;
    }
    dg_tensor *gt = dg_from_data(ctx, DG_F32, 4, (int64_t[]){n, CH, 2, 2}, g + first * ROW);
    if (!y || dg_backward_with(ctx, y, gt)) {
      T_FAIL_("rank %d step %d: %s", r, s, dg_ctx_errmsg(ctx));
      return 1;
    }
    CHECK_REL("output", (const float *)dg_tensor_data(y), ref->y[s] + first * ROW, n * ROW);
    CHECK_REL("input gradient", (const float *)dg_tensor_data(dg_tensor_grad(xt)),
              ref->dx[s] + first * ROW, n * ROW);
    if (s < STEPS) {
      float wb[2 * CH];
      memcpy(wb, dg_tensor_data(dg_tensor_grad(dg_params_find(ps, "bn.weight"))), CH * 4);
      memcpy(wb + CH, dg_tensor_data(dg_tensor_grad(dg_params_find(ps, "bn.bias"))), CH * 4);
      REQUIRE(!sum_ranks(pg, wb, 2 * CH)); /* what DDP's all-reduce adds up */
      CHECK_REL("weight gradient (sum over ranks)", wb, ref->dw[s], CH);
      CHECK_REL("bias gradient (sum over ranks)", wb + CH, ref->db[s], CH);
      CHECK_REL("running_mean", (const float *)dg_tensor_data(rm), ref->rm[s], CH);
      CHECK_REL("running_var", (const float *)dg_tensor_data(rv), ref->rv[s], CH);
      /* the same bits on every rank: rank 0's, broadcast, compared */
      float mine[2 * CH], r0[2 * CH];
      memcpy(mine, dg_tensor_data(rm), CH * 4);
      memcpy(mine + CH, dg_tensor_data(rv), CH * 4);
      memcpy(r0, mine, sizeof r0);
      dg_work *w = NULL;
      REQUIRE(!dg_pg_broadcast(pg, r0, 2 * CH, DG_F32, 0, &w) && !dg_work_wait(w, 0));
      dg_work_free(w);
      CHECK(!memcmp(mine, r0, sizeof r0));
    }
    dg_ctx_reset(ctx);
  }
  dg_module_free(m);
  dg_params_free(ps);
  dg_ctx_free(ctx);
  return 0;
}

/* ---- under DDP ---- */

static dg_module *net(dg_pg *pg) {
  dg_module *seq, *bn, *fl, *fc;
  REQUIRE(!dg_nn_sequential(&seq) && !dg_nn_flatten(&fl) && !dg_nn_linear(&fc, ROW, 2, 1));
  REQUIRE(!(pg ? dg_nn_sync_batchnorm2d(&bn, CH, 1e-5f, 0.1f, pg)
               : dg_nn_batchnorm2d(&bn, CH, 1e-5f, 0.1f)));
  REQUIRE(!dg_sequential_add(seq, bn, "bn") && !dg_sequential_add(seq, fl, NULL) &&
          !dg_sequential_add(seq, fc, "fc"));
  return seq;
}

/* sum(net(x) * G) * scale over rows [first, first + n) of batch s; G (n, 2) */
static dg_tensor *net_loss(dg_ctx *ctx, dg_module *m, int s, int64_t first, int64_t n,
                           float scale) {
  static float x[NT * ROW], g[NT * ROW];
  global_batch(s, x, g);
  dg_tensor *xt = dg_from_data(ctx, DG_F32, 4, (int64_t[]){n, CH, 2, 2}, x + first * ROW);
  dg_tensor *gt = dg_from_data(ctx, DG_F32, 2, (int64_t[]){n, 2}, g + first * 2);
  return dg_scale(ctx, dg_sum(ctx, dg_mul(ctx, dg_module_forward(m, ctx, xt), gt)), scale);
}

/* SGD on the whole batch, loss the mean over its rows. */
static void ddp_reference(dg_params **out) {
  dg_ctx *ctx;
  dg_module *m = net(NULL);
  dg_optim *o;
  dg_sgd_opts so = dg_sgd_defaults();
  so.lr = 0.1f;
  REQUIRE(!dg_ctx_new(&ctx, NULL) && !dg_params_new(out) && !dg_module_bind(m, *out, "", 5));
  REQUIRE(!dg_optim_new_sgd(&o, *out, &so, NULL, 0));
  for (int s = 0; s < STEPS; s++) {
    dg_params_zero_grad(*out);
    dg_tensor *loss = net_loss(ctx, m, s, 0, NT, 1.0f / NT);
    REQUIRE(loss && !dg_backward(ctx, loss) && !dg_optim_step(o));
    dg_ctx_reset(ctx);
  }
  dg_optim_free(o);
  dg_module_free(m);
  dg_ctx_free(ctx);
}

static int rank_ddp(int r, int W, dg_pg *pg) {
  dg_ctx *ctx;
  dg_params *ps, *ref;
  dg_module *m = net(pg);
  dg_ddp *ddp;
  dg_optim *o;
  dg_sgd_opts so = dg_sgd_defaults();
  so.lr = 0.1f;
  char err[512];
  REQUIRE(!dg_ctx_new(&ctx, NULL) && !dg_params_new(&ps));
  REQUIRE(!dg_module_bind(m, ps, "", r ? 77 : 5)); /* rank 1: other weights */
  dg_tensor *rm = dg_params_buffer_find(ps, "bn.running_mean");
  if (r) dg_init_constant(rm, 5.0f); /* and other running statistics */
  REQUIRE(!dg_optim_new_sgd(&o, ps, &so, NULL, 0));
  if (dg_ddp_new(&ddp, ctx, ps, pg, NULL, err, sizeof err)) {
    T_FAIL_("rank %d: ddp_new: %s", r, err);
    return 1;
  }
  CHECK(dg_tensor_get(rm, 0) == 0 && dg_tensor_get(rm, CH - 1) == 0); /* rank 0's */
  const int64_t first = r ? rows[0] : 0;
  for (int s = 0; s < STEPS; s++) {
    /* DDP averages over the ranks: each rank's loss is W / NT of its sum */
    dg_tensor *loss = net_loss(ctx, m, s, first, rows[r], (float)W / NT);
    if (!loss || dg_backward(ctx, loss)) {
      T_FAIL_("rank %d step %d: %s", r, s, dg_ctx_errmsg(ctx));
      return 1;
    }
    CHECK(dg_ddp_step_ready(ddp));
    CHECK_OK(dg_optim_step(o));
    dg_params_zero_grad(ps);
    dg_ctx_reset(ctx);
  }
  ddp_reference(&ref);
  double d = du_rel_diff(ps, ref);
  fprintf(stderr, "rank %d: parameters after %d steps: max rel diff %.3g\n", r, STEPS, d);
  CHECK(d <= TOL);
  for (int i = 0; i < 2; i++) {
    dg_tensor *a = dg_params_buffer_get(ps, i), *b = dg_params_buffer_find(ref, dg_tensor_name(a));
    REQUIRE(b);
    CHECK_REL(dg_tensor_name(a), (const float *)dg_tensor_data(a),
              (const float *)dg_tensor_data(b), CH);
  }
  /* rank 1's statistics wander off; the broadcast brings rank 0's back */
  float want[CH];
  memcpy(want, dg_tensor_data(rm), sizeof want);
  if (r) dg_init_constant(rm, -3.0f);
  CHECK_OK(dg_ddp_broadcast_buffers(ddp));
  CHECK(!memcmp(dg_tensor_data(rm), want, sizeof want));
  dg_ddp_free(ddp);
  dg_optim_free(o);
  dg_module_free(m);
  dg_params_free(ps);
  dg_params_free(ref);
  dg_ctx_free(ctx);
  return 0;
}

static int rank_mismatch(int r, dg_pg *pg) {
  dg_ctx *ctx;
  dg_params *ps;
  dg_module *m = net(NULL);
  dg_ddp *ddp = NULL;
  char err[512] = "";
  REQUIRE(!dg_ctx_new(&ctx, NULL) && !dg_params_new(&ps) && !dg_module_bind(m, ps, "", 5));
  REQUIRE(!dg_params_add_buffer(ps, "extra.count", 1, (int64_t[]){r ? 3 : 2}, NULL));
  CHECK_EQ_INT(dg_ddp_new(&ddp, ctx, ps, pg, NULL, err, sizeof err), DG_EMISMATCH);
  CHECK(ddp == NULL);
  CHECK_STR_HAS(err, "rank 0 has 4, rank 1 has 4 (buffers: 3 vs 3); first difference at buffer 2");
  CHECK_STR_HAS(err, "buffer 'extra.count' (2) f32 vs rank 1 buffer 'extra.count' (3) f32");
  dg_module_free(m);
  dg_params_free(ps);
  dg_ctx_free(ctx);
  return 0;
}

static int rank_main(int r, int W, void *arg) {
  const reference *ref = arg;
  dg_store *st = NULL;
  dg_pg *pg = NULL;
  if (du_pg(r, W, &st, &pg)) return 2;
  int rc = !strcmp(mode, "ddp")        ? rank_ddp(r, W, pg)
           : !strcmp(mode, "mismatch") ? rank_mismatch(r, pg)
                                       : rank_sync(r, W, pg, ref);
  du_leave(st, pg, W);
  return rc || dg_test_failures ? 1 : 0;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s even|uneven|ddp|empty|mismatch\n", argv[0]);
    return 2;
  }
  mode = argv[1];
  int split = !strcmp(mode, "uneven") ? 7 : !strcmp(mode, "ddp") ? 6
              : !strcmp(mode, "empty") ? 10 : 5;
  rows[0] = split, rows[1] = NT - split;
  static reference ref;
  run_reference(&ref);
  CHECK_EQ_INT(du_run(2, rank_main, &ref, 60, NULL), 0);
  return TEST_DONE();
}
