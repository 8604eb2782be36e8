/* Boundaries of several tensors (issue #13 item 3): a model whose layers
 * pass tuples (a skip connection carried across stages, integer ids, an
 * f32 tensor without grad, a tensor the later stages drop) trains in the
 * pipe exactly as on one process: the loss and every gradient (and the
 * eval loss), K = 2, 3, 4,
 * GPipe and 1F1B, with and without re-materialization, through the rings
 * and through the transport. A tensor of the tuple that changes shape
 * between micro-batches fails both stages naming it; a last stage that
 * returns two tensors is refused naming the loss. A stage between an f32
 * boundary and an integer one sends its input a zero gradient (K = 3).
 * Balance by time times tuple layers (K = 2). A layer that asks for an
 * input's gradient on its own does not change what crosses back; a step of
 * 0 rows sends its empty gradients; a forged header whose sizes overflow is
 * refused (K = 2).
 *   test_pipe_tuple W */
#define B 24
#define IN 8
#define HID 16
#define NCLS 4
#include "tests/pipe/pipe_util.h"

/* ---- tuple modules, as a user writes them ---- */

/* x (b, HID) -> (tanh(x), x, argmax(x) as a strided (1, b) i64 view, 0.5 (b, 1) f32 without
 * grad, 2x); with `grow` set, the ids of the second call on a process are
 * (b, 2): a shape that changes between micro-batches. */
typedef struct {
  dg_module base;
  int grow, calls;
} fork_m;

static int fork_fwd(dg_module *m, dg_ctx *c, dg_tensor *const *xs, int nx, dg_tensor **ys,
                    int *ny) {
  if (nx != 1) return DG_EINVAL;
  fork_m *f = (fork_m *)m;
  dg_tensor *x = xs[0];
  const int64_t b = dg_tensor_dim(x, 0);
  ys[0] = dg_tanh(c, x);
  ys[1] = x;
  ys[2] = dg_argmax(c, x, 1, f->grow && f->calls++ == 1);
  if (ys[2] && dg_tensor_ndim(ys[2]) == 1) { /* as a strided (1, b) view: [ids; ids]^T row 0 */
    dg_tensor *r = dg_reshape(c, dg_to_dtype(c, ys[2], DG_F32), 2, (int64_t[]){b, 1});
    dg_tensor *two = dg_to_dtype(c, dg_concat(c, 2, (dg_tensor *const[]){r, r}, 1), DG_I64);
    ys[2] = dg_slice(c, dg_transpose(c, two, 0, 1), 0, 1);
  }
  ys[3] = dg_full(c, 2, (int64_t[]){b, 1}, 0.5f);
  ys[4] = dg_scale(c, x, 2.0f);
  *ny = 5;
  return DG_OK;
}

/* (h, skip, ids, w, extra) -> (child(h), skip, ids, w, extra) */
static int body_fwd(dg_module *m, dg_ctx *c, dg_tensor *const *xs, int nx, dg_tensor **ys,
                    int *ny) {
  if (nx != 5) return DG_EINVAL;
  ys[0] = dg_module_forward(m->children[0], c, xs[0]);
  for (int i = 1; i < 5; i++) ys[i] = xs[i];
  *ny = 5;
  return ys[0] ? DG_OK : dg_ctx_errcode(c);
}

/* (h, skip, ids, w, extra) -> h * w + skip + emb(ids): extra is dropped.
 * It asks for w's gradient, which no stage sends back: the pipe must owe
 * back only what the boundary's header marked. */
static int join_fwd(dg_module *m, dg_ctx *c, dg_tensor *const *xs, int nx, dg_tensor **ys,
                    int *ny) {
  if (nx != 5) return DG_EINVAL;
  dg_tensor_set_requires_grad(xs[3], 1);
  dg_tensor *ids = dg_tensor_ndim(xs[2]) == 2 && dg_tensor_dim(xs[2], 0) == 1
                      ? dg_reshape(c, xs[2], 1, (int64_t[]){dg_tensor_dim(xs[2], 1)})
                      : xs[2];
  dg_tensor *e = dg_module_forward(m->children[0], c, ids);
  ys[0] = dg_add(c, dg_add(c, dg_mul(c, xs[0], xs[3]), xs[1]), e);
  *ny = 1;
  return ys[0] ? DG_OK : dg_ctx_errcode(c);
}

static const dg_module_vtable fork_vt = {"Fork", NULL, NULL, NULL, fork_fwd};
static const dg_module_vtable body_vt = {"Body", NULL, NULL, NULL, body_fwd};
static const dg_module_vtable join_vt = {"Join", NULL, NULL, NULL, join_fwd};

static dg_module *wrap1(const dg_module_vtable *vt, dg_module *child, const char *name) {
  dg_module *m;
  REQUIRE(dg_module_new(&m, sizeof(dg_module), vt) == DG_OK);
  REQUIRE(dg_module_add_child(m, child, name) == DG_OK);
  return m;
}

/* Linear, Fork, Body(Linear), Body(Tanh), Join(Embedding), Linear: six
 * layers; `tail` adds a Fork after the last (two stages' worth of tuple at
 * the loss). */
static dg_module *model(int grow, int tail) {
  dg_module *seq, *l, *f;
  REQUIRE(dg_nn_sequential(&seq) == DG_OK);
  add(seq, dg_nn_linear(&l, IN, HID, 1), &l);
  REQUIRE(dg_module_new(&f, sizeof(fork_m), &fork_vt) == DG_OK);
  ((fork_m *)f)->grow = grow;
  REQUIRE(dg_sequential_add(seq, f, NULL) == DG_OK);
  REQUIRE(dg_nn_linear(&l, HID, HID, 1) == DG_OK);
  REQUIRE(dg_sequential_add(seq, wrap1(&body_vt, l, "lin"), NULL) == DG_OK);
  REQUIRE(dg_nn_tanh(&l) == DG_OK);
  REQUIRE(dg_sequential_add(seq, wrap1(&body_vt, l, "act"), NULL) == DG_OK);
  REQUIRE(dg_nn_embedding(&l, HID, HID) == DG_OK);
  REQUIRE(dg_sequential_add(seq, wrap1(&join_vt, l, "emb"), NULL) == DG_OK);
  add(seq, dg_nn_linear(&l, HID, NCLS, 1), &l);
  if (tail) {
    REQUIRE(dg_module_new(&f, sizeof(fork_m), &fork_vt) == DG_OK);
    REQUIRE(dg_sequential_add(seq, f, NULL) == DG_OK);
  }
  return seq;
}

typedef struct {
  int M, kind, remat, transport;
} cfg;

/* Layers per stage: every boundary inside the tuple section. */
static const int *balance(int W) {
  static const int b2[] = {2, 4}, b3[] = {2, 2, 2}, b4[] = {2, 1, 1, 2};
  return W == 2 ? b2 : W == 3 ? b3 : W == 4 ? b4 : NULL;
}

/* Two steps: the loss and every gradient of this stage against the whole
 * model's on one process (accumulated over the micro-batches: rows are
 * independent, so the whole batch at once gives the same). */
static int rank_main(int r, int W, void *arg) {
  const cfg *c = arg;
  pu_rank k;
  if (pu_open(&k, r, W)) return 2;
  dg_params *ref;
  dg_pipe *pipe;
  char err[512];
  REQUIRE(dg_params_new(&ref) == DG_OK);
  dg_pipe_opts po = dg_pipe_defaults();
  po.micro_batches = c->M;
  po.schedule = (dg_pipe_schedule)c->kind;
  po.remat = c->remat;
  po.transport_boundaries = c->transport;
  po.balance = balance(W);
  int rc = dg_pipe_new(&pipe, k.pg, model(0, 0), k.ps, 5, &po, err, sizeof err);
  if (rc) fprintf(stderr, "rank %d: %s\n", r, err);
  REQUIRE(rc == DG_OK);
  dg_module *whole = model(0, 0);
  REQUIRE(dg_module_bind(whole, ref, "", 5) == DG_OK);
  float x[B * IN];
  int64_t y[B];
  for (int s = 0; s < 2; s++) {
    batch(s, x, y);
    dg_tensor *xt = dg_wrap(k.ctx, DG_F32, 2, (int64_t[]){B, IN}, x);
    dg_tensor *yt = dg_wrap(k.ctx, DG_I64, 1, (int64_t[]){B}, y);
    float loss;
    rc = dg_pipe_step(pipe, xt, yt, ce, NULL, &loss);
    if (rc) fprintf(stderr, "rank %d: %s\n", r, dg_pipe_errmsg(pipe));
    REQUIRE(rc == DG_OK);
    dg_pipe_stats pst;
    CHECK_OK(dg_pipe_get_stats(pipe, &pst));
    if (s > 0 && !c->transport) CHECK(pst.bytes_direct > 0 && pst.bytes_transport == 0);
    else CHECK(pst.bytes_direct == 0 && pst.bytes_transport > 0);
    dg_tensor *lr = dg_cross_entropy(k.ctx, dg_module_forward(whole, k.ctx, xt), yt);
    REQUIRE(lr && dg_backward(k.ctx, lr) == DG_OK);
    CHECK_NEAR(loss, dg_tensor_item(lr), 1e-5 * fabs(dg_tensor_item(lr)) + 1e-7);
    CHECK(dg_params_count(k.ps) > 0 || (W == 4 && r == 2)); /* Body(Tanh) alone: none */
    const double worst = pu_grad_diff(k.ps, ref);
    if (!(worst < 1e-5))
      fprintf(stderr, "rank %d step %d M=%d %s%s%s: gradients differ by %g\n", r, s, c->M,
              c->kind ? "1f1b" : "gpipe", c->remat ? " remat" : "",
              c->transport ? " transport" : "", worst);
    CHECK(worst < 1e-5);
    dg_params_zero_grad(k.ps), dg_params_zero_grad(ref);
    dg_ctx_reset(k.ctx);
  }
  batch(2, x, y); /* eval: the tuples cross, no gradient comes back */
  dg_tensor *xt = dg_wrap(k.ctx, DG_F32, 2, (int64_t[]){B, IN}, x);
  dg_tensor *yt = dg_wrap(k.ctx, DG_I64, 1, (int64_t[]){B}, y);
  float el = 0;
  int seen = 0;
  rc = dg_pipe_eval(pipe, xt, yt, ce, &seen, &el);
  if (rc) fprintf(stderr, "rank %d: eval: %s\n", r, dg_pipe_errmsg(pipe));
  CHECK_OK(rc);
  CHECK_EQ_INT(seen, r == W - 1 ? c->M : 0);
  dg_ctx_set_grad_enabled(k.ctx, 0);
  dg_tensor *lr = dg_cross_entropy(k.ctx, dg_module_forward(whole, k.ctx, xt), yt);
  REQUIRE(lr);
  CHECK_NEAR(el, dg_tensor_item(lr), 1e-5 * fabs(dg_tensor_item(lr)) + 1e-7);
  dg_pipe_free(pipe);
  dg_module_free(whole);
  dg_params_free(ref);
  pu_close(&k, W, 1);
  return dg_test_failures ? 1 : 0;
}

/* Misuse. grow: the ids of micro-batch 1 come as (b, 2) where micro-batch
 * 0's were (b,): stage 1 fails naming both, and stage 0 with it. tail: the
 * last stage returns five tensors to a loss that takes one. */
static int misuse_rank(int r, int W, void *arg) {
  const int tail = *(const int *)arg;
  pu_rank k;
  if (pu_open(&k, r, W)) return 2;
  dg_pipe *pipe;
  char err[512];
  dg_pipe_opts po = dg_pipe_defaults();
  po.micro_batches = 2;
  po.balance = tail ? (const int[]){2, 5} : balance(2);
  REQUIRE(dg_pipe_new(&pipe, k.pg, model(!tail, tail), k.ps, 5, &po, err, sizeof err) == DG_OK);
  float x[B * IN];
  int64_t y[B];
  batch(0, x, y);
  dg_tensor *xt = dg_wrap(k.ctx, DG_F32, 2, (int64_t[]){B, IN}, x);
  dg_tensor *yt = dg_wrap(k.ctx, DG_I64, 1, (int64_t[]){B}, y);
  const double t0 = pu_now();
  int rc = dg_pipe_step(pipe, xt, yt, ce, NULL, NULL);
  CHECK(rc != DG_OK);
  CHECK(pu_now() - t0 < 10); /* failed at once, not at the group's timeout */
  const char *e = dg_pipe_errmsg(pipe);
  if (tail && r == 1) {
    CHECK_EQ_INT(rc, DG_EINVAL);
    CHECK_STR_HAS(e, "the last stage returns 5 tensors; the loss takes one");
  } else if (!tail && r == 1) {
    CHECK_EQ_INT(rc, DG_ESHAPE);
    CHECK_STR_HAS(e, "micro-batch 1 arrives as [f32 (12, 16) grad, f32 (12, 16) grad, "
                  "i64 (12, 1), f32 (12, 1), f32 (12, 16) grad]");
    CHECK_STR_HAS(e, "micro-batch 0 as [f32 (12, 16) grad, f32 (12, 16) grad, i64 (1, 12), ");
  } else {
    CHECK_STR_HAS(e, "stage 1"); /* the failure came from it */
  }
  dg_pipe_free(pipe);
  pu_close(&k, W, 0);
  return dg_test_failures ? 1 : 0;
}

/* (b, HID) f32 -> its argmax (b,) i64: no gradient crosses back */
static dg_tensor *argmax_fwd(dg_module *m, dg_ctx *c, dg_tensor *x) {
  (void)m;
  return dg_argmax(c, x, 1, 0);
}
static const dg_module_vtable argmax_vt = {"Argmax", argmax_fwd, NULL, NULL, NULL};

/* Linear | Argmax | Embedding, Linear on 3 ranks: stage 1 takes an f32
 * input that requires grad and sends integers on, so no gradient comes
 * back to it; it still owes stage 0 one (zeros: the argmax has none).
 * Before, it sent nothing and stage 0 waited out the group's timeout. */
static dg_module *int_model(void) {
  dg_module *seq, *l;
  REQUIRE(dg_nn_sequential(&seq) == DG_OK);
  add(seq, dg_nn_linear(&l, IN, HID, 1), &l);
  REQUIRE(dg_module_new(&l, sizeof(dg_module), &argmax_vt) == DG_OK);
  REQUIRE(dg_sequential_add(seq, l, NULL) == DG_OK);
  add(seq, dg_nn_embedding(&l, HID, HID), &l);
  add(seq, dg_nn_linear(&l, HID, NCLS, 1), &l);
  return seq;
}

static int int_rank(int r, int W, void *arg) {
  (void)arg;
  pu_rank k;
  if (pu_open(&k, r, W)) return 2;
  dg_params *ref;
  dg_pipe *pipe;
  char err[512];
  REQUIRE(dg_params_new(&ref) == DG_OK);
  dg_pipe_opts po = dg_pipe_defaults();
  po.micro_batches = 2;
  po.balance = (const int[]){1, 1, 2};
  REQUIRE(dg_pipe_new(&pipe, k.pg, int_model(), k.ps, 5, &po, err, sizeof err) == DG_OK);
  dg_module *whole = int_model();
  REQUIRE(dg_module_bind(whole, ref, "", 5) == DG_OK);
  float x[B * IN];
  int64_t y[B];
  batch(0, x, y);
  dg_tensor *xt = dg_wrap(k.ctx, DG_F32, 2, (int64_t[]){B, IN}, x);
  dg_tensor *yt = dg_wrap(k.ctx, DG_I64, 1, (int64_t[]){B}, y);
  float loss;
  const double t0 = pu_now();
  int rc = dg_pipe_step(pipe, xt, yt, ce, NULL, &loss);
  if (rc) fprintf(stderr, "rank %d: %s\n", r, dg_pipe_errmsg(pipe));
  REQUIRE(rc == DG_OK);
  CHECK(pu_now() - t0 < 10);
  dg_tensor *lr = dg_cross_entropy(k.ctx, dg_module_forward(whole, k.ctx, xt), yt);
  REQUIRE(lr && dg_backward(k.ctx, lr) == DG_OK);
  CHECK_NEAR(loss, dg_tensor_item(lr), 1e-5 * fabs(dg_tensor_item(lr)) + 1e-7);
  CHECK(pu_grad_diff(k.ps, ref) < 1e-5); /* stage 0's: zero, as nothing reaches them */
  dg_pipe_free(pipe);
  dg_module_free(whole);
  dg_params_free(ref);
  pu_close(&k, W, 1);
  return dg_test_failures ? 1 : 0;
}

/* Balance by time over tuple layers: every layer timed with its tuple (a
 * positive cost each), a valid split, and a step that trains. */
static int profile_rank(int r, int W, void *arg) {
  (void)arg;
  pu_rank k;
  if (pu_open(&k, r, W)) return 2;
  dg_pipe *pipe;
  char err[512];
  float x[B * IN];
  int64_t y[B];
  batch(0, x, y);
  dg_tensor *xt = dg_wrap(k.ctx, DG_F32, 2, (int64_t[]){B, IN}, x);
  dg_tensor *yt = dg_wrap(k.ctx, DG_I64, 1, (int64_t[]){B}, y);
  dg_pipe_opts po = dg_pipe_defaults();
  po.micro_batches = 2;
  po.profile_input = dg_slice(k.ctx, xt, 0, B / 2);
  int rc = dg_pipe_new(&pipe, k.pg, model(0, 0), k.ps, 5, &po, err, sizeof err);
  if (rc) fprintf(stderr, "rank %d: %s\n", r, err);
  REQUIRE(rc == DG_OK);
  double cost[6] = {0}, cut[5] = {0};
  int n = 0, first = -1, last = -1;
  CHECK_OK(dg_pipe_layer_cost(pipe, cost, 6, &n));
  CHECK_EQ_INT(n, 6);
  for (int i = 0; i < 6; i++) CHECK(cost[i] > 0);
  CHECK_OK(dg_pipe_boundary_cost(pipe, cut, 5, &n));
  for (int i = 0; i < 5; i++) CHECK(cut[i] > 0);
  dg_pipe_stage(pipe, &first, &last);
  CHECK(first < last && (r == 0 ? first == 0 : last == 6));
  rc = dg_pipe_step(pipe, xt, yt, ce, NULL, NULL);
  if (rc) fprintf(stderr, "rank %d: %s\n", r, dg_pipe_errmsg(pipe));
  CHECK_OK(rc);
  dg_pipe_free(pipe);
  pu_close(&k, W, 1);
  return dg_test_failures ? 1 : 0;
}

/* The tuple model's pipe over k's group, M micro-batches, the split of
 * balance(W). */
static dg_pipe *tuple_pipe(pu_rank *k, int W, int M) {
  dg_pipe *pipe = NULL;
  char err[512];
  dg_pipe_opts po = dg_pipe_defaults();
  po.micro_batches = M;
  po.balance = balance(W);
  int rc = dg_pipe_new(&pipe, k->pg, model(0, 0), k->ps, 5, &po, err, sizeof err);
  if (rc) fprintf(stderr, "%s\n", err);
  REQUIRE(rc == DG_OK);
  return pipe;
}

/* A step of 0 rows: every gradient of the boundary is empty, and still
 * owed (a stage that sent nothing left its neighbour waiting out the
 * group's timeout). */
static int empty_rank(int r, int W, void *arg) {
  (void)arg;
  pu_rank k;
  if (pu_open(&k, r, W)) return 2;
  dg_pipe *pipe = tuple_pipe(&k, W, 2);
  float x[IN];
  int64_t y[1];
  dg_tensor *xt = dg_wrap(k.ctx, DG_F32, 2, (int64_t[]){0, IN}, x);
  dg_tensor *yt = dg_wrap(k.ctx, DG_I64, 1, (int64_t[]){0}, y);
  const double t0 = pu_now();
  int rc = dg_pipe_step(pipe, xt, yt, ce, NULL, NULL);
  if (rc) fprintf(stderr, "rank %d: %s\n", r, dg_pipe_errmsg(pipe));
  CHECK_OK(rc);
  CHECK(pu_now() - t0 < 10);
  dg_pipe_free(pipe);
  pu_close(&k, W, rc == DG_OK);
  return dg_test_failures ? 1 : 0;
}

/* Stage 0 forges step 1's activation header: four i32 tensors of 2^62
 * bytes each, marked as written into the ring (their total wraps to 0 in
 * 64 bits, which fits any ring). Stage 1 refuses it as malformed before
 * sizing anything from it. The header's layout and tag are the pipe's
 * own (dist/pipe.c), copied here on purpose. */
#define F_NT 8
#define F_TSZ (3 + DG_MAX_DIMS)
#define F_SHP (1 + F_NT * F_TSZ)
static int forged_rank(int r, int W, void *arg) {
  (void)arg;
  pu_rank k;
  if (pu_open(&k, r, W)) return 2;
  dg_pipe *pipe = tuple_pipe(&k, W, 1);
  float x[B * IN];
  int64_t y[B];
  batch(0, x, y);
  dg_tensor *xt = dg_wrap(k.ctx, DG_F32, 2, (int64_t[]){B, IN}, x);
  dg_tensor *yt = dg_wrap(k.ctx, DG_I64, 1, (int64_t[]){B}, y);
  REQUIRE(dg_pipe_step(pipe, xt, yt, ce, NULL, NULL) == DG_OK); /* sizes the rings */
  if (r == 0) {
    static int64_t h[F_SHP + 2];
    h[0] = 4;
    for (int i = 0; i < 4; i++) {
      int64_t *t = h + 1 + i * F_TSZ;
      t[0] = 1, t[1] = DG_I32, t[2] = 0, t[3] = (int64_t)1 << 60; /* 2^62 bytes */
    }
    h[F_SHP] = 1, h[F_SHP + 1] = 1;
    dg_work *w = NULL;
    CHECK_OK(dg_pg_send(k.pg, h, F_SHP + 2, DG_I64, 1, 0x70690001u, &w));
    CHECK_OK(dg_work_wait(w, 0));
    dg_work_free(w);
    CHECK(dg_pg_barrier_sync(k.pg) != DG_OK); /* until stage 1 failed the group */
  } else {
    int rc = dg_pipe_step(pipe, xt, yt, ce, NULL, NULL);
    CHECK_EQ_INT(rc, DG_EPEER);
    CHECK_STR_HAS(dg_pipe_errmsg(pipe), "a malformed activation header from stage 0");
  }
  dg_pipe_free(pipe);
  pu_close(&k, W, 0);
  return dg_test_failures ? 1 : 0;
}

int main(int argc, char **argv) {
  int W = argc > 1 ? atoi(argv[1]) : 2;
  REQUIRE(balance(W));
  for (int v = 0; v < 8; v++) {
    cfg c = {v & 1 ? 3 : 1, (v >> 1) & 1, (v >> 2) & 1, 0};
    if (W == 2 && v == 7) c.M = 8;
    int bad = du_run(W, rank_main, &c, 60, NULL);
    if (bad) fprintf(stderr, "K=%d M=%d %s%s: %d rank(s) failed\n", W, c.M,
                     c.kind ? "1f1b" : "gpipe", c.remat ? " remat" : "", bad);
    CHECK_EQ_INT(bad, 0);
  }
  for (int kind = 0; kind < 2; kind++) { /* through the transport */
    cfg c = {3, kind, kind, 1};
    CHECK_EQ_INT(du_run(W, rank_main, &c, 60, NULL), 0);
  }
  if (W == 2)
    for (int tail = 0; tail < 2; tail++) CHECK_EQ_INT(du_run(2, misuse_rank, &tail, 60, NULL), 0);
  if (W == 2) CHECK_EQ_INT(du_run(2, profile_rank, NULL, 60, NULL), 0);
  if (W == 2) CHECK_EQ_INT(du_run(2, empty_rank, NULL, 60, NULL), 0);
  if (W == 2) CHECK_EQ_INT(du_run(2, forged_rank, NULL, 60, NULL), 0);
  if (W == 3) CHECK_EQ_INT(du_run(3, int_rank, NULL, 60, NULL), 0);
  return TEST_DONE();
}
