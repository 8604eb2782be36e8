/* Lending a waiting peer's core (base/lend.c, gemm.c's sgemm_lend).
 * 1. dg__lend_for runs every task exactly once, on the caller and on the
 *    lend worker: the caller's first task holds until the worker has run
 *    one (10 s deadline), so a worker that never wakes fails the test.
 * 2. With a probe that always says "a peer waits", the products the MLP
 *    and char-GPT steps run give the bits of the same products not lent,
 *    with and without the fused residual and bias, and they were lent
 *    (the job count grew). Part 2 needs the own kernel (DG_GEMM=own pins
 *    it; on a CPU without AVX2 and FMA it is skipped).
 * 3. Clearing the probe waits for a probe call in flight on another thread:
 *    the DDP frees the probe's state right after (a use after free before). */
#include <dgrad.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/cpu/cpu_impl.h"
#include "base/lend_impl.h"
#include "test.h"

#define NT 16
static pthread_t g_main;
static atomic_int g_ran[NT], g_by_worker;

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void task(void *arg, int i) {
  (void)arg;
  atomic_fetch_add(&g_ran[i], 1);
  if (!pthread_equal(pthread_self(), g_main)) {
    atomic_fetch_add(&g_by_worker, 1);
    return;
  }
  static int held;
  if (held++) return;
  for (int64_t end = now_ms() + 10000; !atomic_load(&g_by_worker) && now_ms() < end;) continue;
}

static int always(void *arg) {
  (void)arg;
  return 1;
}

/* A probe that is still running when the main thread clears it. */
static atomic_int g_inside, g_clearing;
static int slow_probe(void *arg) {
  (void)arg;
  atomic_store(&g_inside, 1);
  for (int64_t end = now_ms() + 10000; !atomic_load(&g_clearing) && now_ms() < end;) continue;
  struct timespec ts = {0, 50 * 1000000L}; /* the clearing thread is in clear by now */
  nanosleep(&ts, NULL);
  atomic_store(&g_inside, 0);
  return 0;
}
static void noop(void *arg, int i) { (void)arg, (void)i; }
static void *asker(void *arg) {
  (void)arg;
  (void)dg__lend_for(2, noop, NULL); /* asks the probe, under the lend lock */
  return NULL;
}

static void clear_waits_for_probe(void) {
  int tag;
  dg__lend_set_probe(slow_probe, &tag);
  pthread_t t;
  REQUIRE(!pthread_create(&t, NULL, asker, NULL));
  for (int64_t end = now_ms() + 10000; !atomic_load(&g_inside) && now_ms() < end;) continue;
  REQUIRE(atomic_load(&g_inside));
  atomic_store(&g_clearing, 1);
  dg__lend_clear_probe(&tag);
  CHECK_EQ_INT(atomic_load(&g_inside), 0); /* the probe returned before clear did */
  pthread_join(t, NULL);
  CHECK(!dg__lend_armed());
}

static uint32_t g_x = 2463534242u;
static float *rnd_buf(size_t n) {
  float *p = malloc(n * sizeof *p);
  for (size_t i = 0; p && i < n; i++) {
    g_x ^= g_x << 13, g_x ^= g_x >> 17, g_x ^= g_x << 5;
    p[i] = (float)(g_x >> 8) * (2.0f / 16777216.0f) - 1.0f;
  }
  return p;
}

/* One product, lent and not: the same bits, and it was lent. add: 0 a
 * plain product, 1 with res and bias, 2 with ReLU too, 3 masked (a linear's
 * input gradient after dg_linear_relu; the lent blocks are columns, so the
 * mask moves with each block's first column). */
static void same_bits(int ta, int tb, int64_t M, int64_t N, int64_t K, int add) {
  if (!dg__sgemm_own_fits(M, N, K)) { /* not the own kernel's: never lent */
    printf("%lldx%lldx%lld: not the own kernel's, not checked\n", (long long)M, (long long)N,
           (long long)K);
    return;
  }
  float *A = rnd_buf((size_t)(M * K)), *B = rnd_buf((size_t)(K * N));
  float *res = rnd_buf((size_t)(M * N)), *bias = rnd_buf((size_t)N);
  float *c1 = rnd_buf((size_t)(M * N)), *c2 = malloc((size_t)(M * N) * sizeof(float));
  float *mask = rnd_buf((size_t)(M * N));
  REQUIRE(A && B && res && bias && c1 && c2 && mask);
  dg__gemm_epi e = {res, bias, NULL, add == 2};
  if (add == 3) e = (dg__gemm_epi){.mask = mask};
  memcpy(c2, c1, (size_t)(M * N) * sizeof(float));
  int64_t lda = ta ? M : K, ldb = tb ? K : N;
  long before, after;
  for (int lent = 0; lent < 2; lent++) {
    float *c = lent ? c2 : c1;
    if (lent) dg__lend_set_probe(always, &g_x), before = dg__lend_count();
    if (add) dg__sgemm_add(ta, tb, M, N, K, A, lda, B, ldb, &e, c, N);
    else dg__sgemm(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, 1.0f, c, N);
    if (lent) after = dg__lend_count(), dg__lend_clear_probe(&g_x);
  }
  if (memcmp(c1, c2, (size_t)(M * N) * sizeof(float)) || after != before + 1)
    fprintf(stderr, "ta %d tb %d %lldx%lldx%lld add %d: %s\n", ta, tb, (long long)M,
            (long long)N, (long long)K, add, after != before + 1 ? "not lent" : "bits differ");
  CHECK(!memcmp(c1, c2, (size_t)(M * N) * sizeof(float)));
  CHECK_EQ_INT(after, before + 1);
  free(A), free(B), free(res), free(bias), free(c1), free(c2), free(mask);
}

int main(void) {
  dg_set_num_threads(1);
  g_main = pthread_self();
  dg__lend_set_probe(always, &g_x); /* starts the worker */
  CHECK(dg__lend_armed()); /* and the probe says yes: lent below */
  CHECK_EQ_INT(dg__lend_for(NT, task, NULL), 1);
  for (int i = 0; i < NT; i++) CHECK_EQ_INT(atomic_load(&g_ran[i]), 1);
  CHECK(atomic_load(&g_by_worker) >= 1);
  dg__lend_clear_probe(&g_x);
  CHECK(!dg__lend_armed() && !dg__lend_for(NT, noop, NULL)); /* nothing lent */
  clear_waits_for_probe();

  if (!dg__sgemm_own_fits(64, 512, 784)) {
    printf("the own kernel is not used on this CPU: lent products not checked\n");
    return TEST_DONE();
  }
  /* MLP batch 64 and 256 (forward x W^T, dx, dW), char-GPT-like, ragged N */
  static const int64_t shapes[][5] = {
      {0, 1, 64, 512, 784},  {0, 0, 64, 784, 512},  {1, 0, 512, 784, 64}, {0, 1, 256, 512, 784},
      {1, 0, 256, 512, 256}, {0, 1, 128, 384, 128}, {0, 0, 100, 200, 300}, {1, 1, 96, 130, 500}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
    for (int add = 0; add < 4; add++) {
      const int64_t *s = shapes[i];
      same_bits((int)s[0], (int)s[1], s[2], s[3], s[4], add);
    }
  return TEST_DONE();
}
