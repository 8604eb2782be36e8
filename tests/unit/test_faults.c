/* Allocation-failure injection: the allocator hook fails the k-th
 * allocation, for every k until a whole training setup and two steps succeed.
 * Every failure must surface as an error code (no crash, no abort), and the
 * run then cleans up. ASan in CI catches leaks and bad frees on these paths. */
#include "mlp_step.h"
#include "test.h"

static long g_count, g_fail_at;

static void *f_malloc(size_t n) { return ++g_count == g_fail_at ? NULL : malloc(n); }
static void *f_realloc(void *p, size_t n) { return ++g_count == g_fail_at ? NULL : realloc(p, n); }
static void f_free(void *p) { free(p); }

/* Returns 1 when everything succeeded, 0 when an error was reported. */
static int attempt(void) {
  enum { B = 8 };
  static float x[B * 20];
  static int64_t y[B];
  mlp_data(x, y, B);
  dg_ctx *ctx = NULL;
  dg_params *ps = NULL;
  int ok = 0;
  float loss;
  int rc = dg_ctx_new(&ctx, NULL);
  if (rc) { CHECK_EQ_INT(rc, DG_ENOMEM); CHECK(ctx == NULL); goto out; }
  rc = dg_params_new(&ps);
  if (rc) { CHECK_EQ_INT(rc, DG_ENOMEM); goto out; }
  rc = mlp_build(ps);
  if (rc) { CHECK_EQ_INT(rc, DG_ENOMEM); goto out; }
  for (int s = 0; s < 2; s++) {
    rc = mlp_step(ctx, ps, x, y, B, &loss);
    if (rc) {
      CHECK_EQ_INT(rc, DG_ENOMEM);
      CHECK_STR_HAS(dg_ctx_errmsg(ctx), "memory");
      goto out;
    }
  }
  ok = 1;
out:
  dg_params_free(ps);
  dg_ctx_free(ctx);
  return ok;
}

int main(void) {
  dg_mem_empty_cache(DG_CPU);
  CHECK_OK(dg_set_allocator(f_malloc, f_realloc, f_free));
  CHECK_EQ_INT(dg_set_allocator(f_malloc, NULL, f_free), DG_EINVAL);
  int failures = 0;
  long k;
  for (k = 1; k < 10000; k++) {
    dg_mem_empty_cache(DG_CPU); /* every run reaches the allocator afresh */
    g_count = 0;
    g_fail_at = k;
    if (attempt()) break;
    failures++;
  }
  fprintf(stderr, "%d injected allocation failures reported cleanly; run %ld succeeded\n",
          failures, k);
  CHECK(failures >= 5);
  CHECK(k < 10000);
  dg_mem_empty_cache(DG_CPU);
  CHECK_OK(dg_set_allocator(NULL, NULL, NULL));
  return TEST_DONE();
}
