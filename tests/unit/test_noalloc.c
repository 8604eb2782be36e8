/* A steady-state training step performs no heap allocation: malloc & co. are
 * interposed in this binary and counted around the step. The loss must also
 * fall, so the step is real. */
#include <dlfcn.h>

#include "mlp_step.h"
#include "test.h"

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
extern void *__libc_memalign(size_t, size_t);

static volatile long g_allocs;

void *malloc(size_t n) { g_allocs++; return __libc_malloc(n); }
void *calloc(size_t a, size_t b) { g_allocs++; return __libc_calloc(a, b); }
void *realloc(void *p, size_t n) { g_allocs++; return __libc_realloc(p, n); }
void free(void *p) { __libc_free(p); }
int posix_memalign(void **p, size_t al, size_t n) {
  g_allocs++;
  *p = __libc_memalign(al, n);
  return *p ? 0 : 12;
}

int main(void) {
#if defined(__SANITIZE_ADDRESS__)
  TEST_SKIP("malloc interposition conflicts with AddressSanitizer's allocator");
#endif
  enum { B = 32 };
  static float x[B * 20];
  static int64_t y[B];
  mlp_data(x, y, B);
  dg_set_num_threads(1);
  dg_ctx *ctx = NULL;
  dg_params *ps = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  REQUIRE(dg_params_new(&ps) == DG_OK);
  REQUIRE(mlp_build(ps) == DG_OK);
  float first = 0, loss = 0;
  for (int s = 0; s < 3; s++) { /* warm-up: arena and tape reach their size */
    CHECK_OK(mlp_step(ctx, ps, x, y, B, &loss));
    if (s == 0) first = loss;
  }
  long before = g_allocs;
  for (int s = 0; s < 20; s++) CHECK_OK(mlp_step(ctx, ps, x, y, B, &loss));
  long steps_allocs = g_allocs - before;
  fprintf(stderr, "heap allocations in 20 steady-state steps: %ld; loss %.4f -> %.4f\n",
          steps_allocs, first, loss);
  CHECK_EQ_INT(steps_allocs, 0);
  CHECK(loss < first);
  CHECK(g_allocs > 0); /* the interposition is live: setup allocated */

  /* threaded: GEMMs big enough to be split over dgrad's pool */
  dg_set_num_threads(2);
  dg_tensor *w = NULL;
  int64_t ws[2] = {256, 256}, xs[2] = {128, 256};
  REQUIRE(dg_params_add(ps, "big.weight", 2, ws, &w) == DG_OK);
  for (int s = 0; s < 23; s++) {
    if (s == 3) before = g_allocs;
    dg_tensor *x = dg_full(ctx, 2, xs, 0.01f);
    dg_tensor *y = dg_relu(ctx, dg_linear(ctx, x, w, NULL));
    CHECK_OK(dg_backward(ctx, dg_mean(ctx, y)));
    dg_ctx_reset(ctx);
  }
  fprintf(stderr, "heap allocations in 20 threaded steps: %ld\n", g_allocs - before);
  CHECK_EQ_INT(g_allocs - before, 0);
  dg_set_num_threads(1);
  dg_params_free(ps);
  dg_ctx_free(ctx);
  return TEST_DONE();
}
