/* A steady-state training step with swapping on makes no heap allocation
 * (the records, the prefetch ring, the file's blocks and the bf16 slab are
 * kept across steps): malloc & co. are interposed in this binary and
 * counted around 10 steps of the char-GPT after 3 warm-up steps.
 *
 * usage: test_swap_noalloc file|bf16|file+bf16 */
#include "swap_util.h"

#if !defined(__SANITIZE_ADDRESS__) /* ASan's allocator must see every block */
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
#else
static volatile long g_allocs;
#endif

static int step(sw_model *m, dg_ctx *ctx) {
  dg_params_zero_grad(m->ps);
  dg_tensor *l = sw_loss(m, ctx);
  int rc = l ? dg_backward(ctx, l) : dg_ctx_errcode(ctx);
  if (rc) fprintf(stderr, "step: %s\n", dg_ctx_errmsg(ctx));
  dg_ctx_reset(ctx);
  return rc;
}

int main(int argc, char **argv) {
#if defined(__SANITIZE_ADDRESS__)
  TEST_SKIP("malloc interposition conflicts with AddressSanitizer's allocator");
#endif
  if (argc < 2) return 2;
  dg_set_num_threads(1);
  sw_model m;
  REQUIRE(sw_gpt_new(&m, 16, 2) == DG_OK);
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  dg_swap_opts o;
  REQUIRE(sw_opts(argv[1], 2, &o));
  REQUIRE(dg_ctx_set_swap(ctx, &o) == DG_OK);
  for (int s = 0; s < 3; s++) CHECK_OK(step(&m, ctx));
  long before = g_allocs;
  for (int s = 0; s < 10; s++) CHECK_OK(step(&m, ctx));
  long n = g_allocs - before;
  dg_swap_stats st;
  CHECK_OK(dg_ctx_swap_stats(ctx, &st));
  fprintf(stderr, "%s: heap allocations in 10 steady-state steps: %ld (%llu tensors out, %llu in)\n",
          argv[1], n, (unsigned long long)st.tensors_out, (unsigned long long)st.tensors_in);
  CHECK_EQ_INT(n, 0);
  CHECK(st.tensors_out > 0 && st.tensors_in > 0);
  CHECK(g_allocs > 0); /* the interposition is live */
  dg_ctx_free(ctx);
  sw_free(&m);
  sw_rmdir();
  return TEST_DONE();
}
