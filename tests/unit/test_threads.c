/* dgrad's compute pool: every task runs exactly once per job (stress), split
 * GEMMs (by rows or by columns, as each shape's timing picks) give
 * bit-identical results to one thread (cut where OpenBLAS's tiles allow,
 * without giving up the split), a forked child can still
 * compute, and a threaded step allocates nothing (see test_noalloc too). */
#include <dgrad.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backends/cpu/cpu_impl.h"
#include "base/threads_impl.h"
#include "test.h"

static atomic_int counts[16];

static void bump(void *arg, int i) {
  (void)arg;
  atomic_fetch_add(&counts[i], 1);
}

static void test_exactly_once(void) {
  dg_set_num_threads(3);
  int bad = 0;
  for (int job = 0; job < 20000; job++) {
    int n = 1 + job % 16;
    for (int i = 0; i < 16; i++) atomic_store(&counts[i], 0);
    dg__parallel_for(n, bump, NULL);
    for (int i = 0; i < 16; i++) bad += atomic_load(&counts[i]) != (i < n);
  }
  CHECK_EQ_INT(bad, 0);
}

static dg_tensor *mm(dg_ctx *ctx, int threads, int ta, int tb, int64_t M, int64_t N, int64_t K) {
  dg_set_num_threads(threads);
  int64_t as[2] = {ta ? K : M, ta ? M : K}, bs[2] = {tb ? N : K, tb ? K : N};
  dg_ctx_seed(ctx, 5);
  dg_tensor *a = dg_randn(ctx, 2, as, 0, 1), *b = dg_randn(ctx, 2, bs, 0, 1);
  return dg_matmul_t(ctx, a, b, ta, tb);
}

/* The product on 1 thread, then `reps` times on `t0` threads and on t0 + 1
 * in turn (alt 0: t0 only): the same bits every call. Each shape times both
 * splits (rows, columns) on its first calls, then keeps one. */
static void check_split(dg_ctx *ctx, int ta, int tb, int64_t M, int64_t N, int64_t K, int t0,
                        int alt, int reps) {
  dg_tensor *c1 = mm(ctx, 1, ta, tb, M, N, K);
  REQUIRE(c1);
  for (int rep = 0; rep < reps; rep++) {
    dg_tensor *ct = mm(ctx, t0 + (alt ? rep % 2 : 0), ta, tb, M, N, K);
    REQUIRE(ct);
    CHECK(!memcmp(dg_tensor_data(c1), dg_tensor_data(ct), (size_t)(M * N) * sizeof(float)));
  }
  dg_ctx_reset(ctx);
}

static void test_gemm_split(void) {
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  /* the last two: OpenBLAS rounds their column halves (or row halves)
   * differently from the whole (its small-matrix and direct paths take the
   * smaller blocks), so they may not be split that way */
  int64_t shapes[5][3] = {{300, 150, 200}, {40, 700, 64}, {513, 9, 257}, {32, 96, 512},
                          {32, 96, 784}};
  for (int s = 0; s < 5; s++)
    for (int f = 0; f < 4; f++)
      check_split(ctx, f & 1, f >> 1, shapes[s][0], shapes[s][1], shapes[s][2], 2, 1, 10);
  dg_ctx_free(ctx);
}

/* Products whose blocks OpenBLAS rounds like the whole only at cuts that
 * line up with its tiles (on a Zen 3 EPYC: rows at multiples of 24 for the
 * first two, of 48 for the third, no column cut at all), which the split's
 * probe finds: split, with the bits of one thread. The third's halves are
 * past the size below which splits used to be probed at all. */
static void test_gemm_split_aligned(void) {
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  int64_t shapes[3][5] = {{256, 256, 512, 0, 1}, {512, 784, 256, 1, 0}, {512, 512, 784, 0, 1}};
  for (int s = 0; s < 3; s++) {
    int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
    int ta = (int)shapes[s][3], tb = (int)shapes[s][4];
    check_split(ctx, ta, tb, M, N, K, 2, 0, 8); /* past the timing of both splits */
    int how = dg__sgemm_split_of(ta, tb, M, N, K, 2);
    if (how < 0) fprintf(stderr, "%ldx%ldx%ld (ta %d tb %d) on 2 threads: split %d\n", (long)M,
                         (long)N, (long)K, ta, tb, how);
    CHECK(how >= 0);
  }
  dg_ctx_free(ctx);
}

static void test_fork(void) {
  dg_set_num_threads(2);
  dg__parallel_for(4, bump, NULL); /* workers exist in the parent */
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    for (int i = 0; i < 16; i++) atomic_store(&counts[i], 0);
    dg__parallel_for(8, bump, NULL);
    int ok = 1;
    for (int i = 0; i < 8; i++) ok &= atomic_load(&counts[i]) == 1;
    _exit(ok ? 0 : 1);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

int main(void) {
  test_exactly_once();
  test_gemm_split();
  test_gemm_split_aligned();
  test_fork();
  dg_set_num_threads(1);
  return TEST_DONE();
}
