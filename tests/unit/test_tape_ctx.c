/* Backward state lives on the tape, not in the parameter store:
 *  - two contexts over one store with tapes alive at once (a 1F1B stage's
 *    state): grad-ready fires once per parameter per backward, when that
 *    backward's gradient is final;
 *  - two threads running forwards over one store (built under
 *    ThreadSanitizer in CI, see scripts/test.sh);
 *  - attaching a store can be undone, and freeing a store that is still
 *    attached is reported and safe (run under ASan in CI). */
#include <dgrad.h>
#include <pthread.h>

#include "core/core_impl.h"
#include "test.h"

typedef struct {
  int fired;
  float seen; /* dL/dw when the hook fired */
} ready_rec;

static void on_ready(void *u, dg_params *ps, int i, int reached) {
  ready_rec *r = u;
  (void)reached;
  r->fired++;
  r->seen = dg_tensor_get(dg_tensor_grad(dg_params_get(ps, i)), 0);
}

/* A persistent scalar leaf that requires grad (its ops record nodes). */
static dg_tensor *leaf(float v) {
  dg_tensor *t = NULL;
  if (dg_tensor_new(&t, DG_F32, 1, (int64_t[]){1}, NULL, 0)) return NULL;
  *(float *)dg_tensor_data(t) = v;
  dg_tensor_set_requires_grad(t, 1);
  return t;
}

/* Context A uses w at its tape nodes 0 and 2, context B first at its node
 * 2. Before the fix B's forward rewrote the store's first-use mark, so A's
 * backward fired w's hook at node 2, before node 0 had added its part. */
static void test_interleaved(void) {
  dg_params *ps = NULL;
  dg_tensor *w = NULL;
  REQUIRE(dg_params_new(&ps) == DG_OK);
  REQUIRE(dg_params_add(ps, "w", 1, (int64_t[]){1}, &w) == DG_OK);
  *(float *)dg_tensor_data(w) = 3.0f;
  dg_ctx *a = NULL, *b = NULL;
  REQUIRE(dg_ctx_new(&a, NULL) == DG_OK && dg_ctx_new(&b, NULL) == DG_OK);
  ready_rec ra = {0}, rb = {0};
  REQUIRE(dg_ctx_add_grad_ready_hook(a, on_ready, &ra) > 0);
  REQUIRE(dg_ctx_add_grad_ready_hook(b, on_ready, &rb) > 0);
  dg_tensor *x = leaf(2.0f), *z = leaf(2.0f);
  REQUIRE(x && z);
  dg_params_zero_grad(ps);
  /* A: L = x w x w, dL/dw = 2 x^2 w = 24 */
  dg_tensor *la = dg_sum(a, dg_mul(a, dg_mul(a, dg_mul(a, x, w), x), w));
  /* B: L = z z z w, dL/dw = z^3 = 8 */
  dg_tensor *lb = dg_sum(b, dg_mul(b, dg_mul(b, dg_mul(b, z, z), z), w));
  REQUIRE(la && lb);
  CHECK_OK(dg_backward(a, la));
  CHECK_EQ_INT(ra.fired, 1);
  float fa = dg_tensor_get(dg_tensor_grad(w), 0);
  CHECK_NEAR(fa, 24.0, 1e-5);
  CHECK_NEAR(ra.seen, fa, 0); /* the hook saw the final gradient */
  CHECK_OK(dg_backward(b, lb));
  CHECK_EQ_INT(rb.fired, 1);
  CHECK_NEAR(dg_tensor_get(dg_tensor_grad(w), 0), 32.0, 1e-5); /* accumulated */
  CHECK_NEAR(rb.seen, 32.0, 1e-5);
  CHECK_EQ_INT(ra.fired, 1); /* A's hook did not fire for B's backward */
  dg_tensor_free(x);
  dg_tensor_free(z);
  dg_ctx_free(a);
  dg_ctx_free(b);
  dg_params_free(ps);
}

typedef struct {
  dg_params *ps;
  float loss;
  int rc;
} fwd_job;

static void *forward_thread(void *arg) {
  fwd_job *j = arg;
  dg_ctx *ctx = NULL;
  if ((j->rc = dg_ctx_new(&ctx, NULL))) return NULL;
  for (int step = 0; step < 50; step++) {
    dg_tensor *x = dg_full(ctx, 2, (int64_t[]){4, 8}, 0.5f);
    dg_tensor *h = dg_linear(ctx, x, dg_params_get(j->ps, 0), dg_params_get(j->ps, 1));
    dg_tensor *y = dg_sum(ctx, dg_relu(ctx, h));
    if (!y) {
      j->rc = dg_ctx_errcode(ctx);
      break;
    }
    j->loss = dg_tensor_item(y);
    dg_ctx_reset(ctx);
  }
  dg_ctx_free(ctx);
  return NULL;
}

static void test_threads_forward(void) {
  dg_params *ps = NULL;
  dg_tensor *w, *bias;
  REQUIRE(dg_params_new(&ps) == DG_OK);
  REQUIRE(dg_params_add(ps, "w", 2, (int64_t[]){3, 8}, &w) == DG_OK);
  REQUIRE(dg_params_add(ps, "b", 1, (int64_t[]){3}, &bias) == DG_OK);
  float *wd = dg_tensor_data(w);
  for (int i = 0; i < 24; i++) wd[i] = 0.1f * (float)(i % 5);
  dg_tensor_data(bias); /* settle before the threads start */
  fwd_job j[2] = {{ps, 0, 0}, {ps, 0, 0}};
  pthread_t t[2];
  for (int i = 0; i < 2; i++) REQUIRE(pthread_create(&t[i], NULL, forward_thread, &j[i]) == 0);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  CHECK_OK(j[0].rc);
  CHECK_OK(j[1].rc);
  CHECK(j[0].loss > 0);
  CHECK_NEAR(j[0].loss, j[1].loss, 0);
  dg_params_free(ps);
}

/* The scenario of a DDP freed and then its store: the context kept the
 * attachment and the next backward read the freed store. */
static void test_attach_lifetime(void) {
  dg_ctx *ctx = NULL;
  dg_params *ps = NULL, *other = NULL;
  dg_tensor *w, *v;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  REQUIRE(dg_params_new(&ps) == DG_OK && dg_params_new(&other) == DG_OK);
  REQUIRE(dg_params_add(ps, "w", 1, (int64_t[]){2}, &w) == DG_OK);
  REQUIRE(dg_params_add(other, "v", 1, (int64_t[]){2}, &v) == DG_OK);
  CHECK_OK(dg_ctx_attach_params(ctx, ps));
  CHECK_OK(dg_ctx_attach_params(ctx, ps)); /* twice is once */
  CHECK_OK(dg_ctx_detach_params(ctx, ps));
  CHECK_EQ_INT(dg_ctx_detach_params(ctx, ps), DG_ENOTFOUND);
  CHECK_OK(dg_ctx_attach_params(ctx, ps));
  dg_params_free(ps); /* still attached: reported, and detached */
  dg_tensor *l = dg_sum(ctx, dg_mul(ctx, v, v));
  REQUIRE(l);
  CHECK_OK(dg_backward(ctx, l)); /* ASan: no use of the freed store */
  CHECK_EQ_INT(dg_ctx_detach_params(ctx, ps), DG_ENOTFOUND);
  /* a context freed first leaves the store with no dangling attachment */
  dg_ctx *c2 = NULL;
  REQUIRE(dg_ctx_new(&c2, NULL) == DG_OK);
  CHECK_OK(dg_ctx_attach_params(c2, other));
  dg_ctx_free(c2);
  dg_params_free(other); /* must not touch c2 */
  dg_ctx_free(ctx);
}

/* Step scratch of 0 bytes (an op with an empty dim, e.g. a fused MLP with
 * no hidden units) used to join an unused slot of the scratch pool: the
 * next size to claim that slot inherited the empty block and handed it
 * out, 64 bytes long, for its own size, and later tape nodes were
 * overwritten (found by tests/diff, seed 229). */
static void test_scratch_empty(void) {
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  void *empty = dg__scratch_take(ctx, 0);
  REQUIRE(empty);
  dg__scratch_give(ctx, empty, 0);
  void *a = dg__scratch_take(ctx, 4096);
  REQUIRE(a);
  dg__scratch_give(ctx, a, 4096); /* claims a slot for 4096 bytes */
  void *b = dg__scratch_take(ctx, 4096), *c = dg__scratch_take(ctx, 4096);
  CHECK(b == a);     /* reused */
  CHECK(c != empty); /* a real 4096-byte block, not the empty one */
  CHECK(c != a);
  memset(c, 1, 4096); /* ASan: inside the arena block */
  dg_ctx_free(ctx);
}

int main(void) {
  test_scratch_empty();
  test_interleaved();
  test_threads_forward();
  test_attach_lifetime();
  if (dg_test_failures) return 1;
  printf("ok\n");
  return 0;
}
