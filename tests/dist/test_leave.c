/* Leaving right after the last collective: W ranks run many small
 * allreduces and call dg_pg_free the moment their last one completes (no
 * store barrier or other workaround), while the peers are a little late, at
 * random, to post theirs. A rank that has already delivered everything the
 * others need must not make their pending or later operations of that
 * collective fail ("it has left the group"). Several groups in a row, each
 * over eager messages, Gloo's ring and dgrad's direct algorithm.
 *
 *   test_leave W */
#include "tests/ddp/ddp_util.h"

#define NCOLL 60
#define TRIALS 8

static const size_t k_sizes[] = {1, 5, 300, 40000};
static const dg_algo k_algos[] = {DG_ALGO_AUTO, DG_ALGO_RING, DG_ALGO_DIRECT};

static int trial(int r, int W, int t) {
  dg_store *st = NULL;
  dg_pg *pg = NULL;
  if (du_pg(r, W, &st, &pg)) return 2;
  dg_algo algo = k_algos[t % 3];
  size_t n = k_sizes[(t / 3 + (size_t)t) % 4];
  if (dg_pg_set_algo(pg, algo)) return 3;
  float *b = malloc(n * sizeof *b);
  srand((unsigned)(r * 7919 + t));
  for (int k = 0; k < NCOLL; k++) {
    for (size_t i = 0; i < n; i++) b[i] = (float)(r + k);
    if (k >= NCOLL - 3 && rand() % 2) usleep((useconds_t)(rand() % 3000)); /* late, at random */
    int rc = dg_pg_allreduce_sync(pg, b, n, DG_F32, DG_RED_SUM);
    if (rc) {
      fprintf(stderr, "rank %d trial %d (algo %d, %zu floats) allreduce %d: %s: %s\n", r, t,
              algo, n, k, dg_err_name(rc), dg_pg_errmsg(pg));
      return 4;
    }
    float want = (float)(W * (W - 1) / 2 + W * k);
    if (b[0] != want || b[n - 1] != want) {
      fprintf(stderr, "rank %d trial %d allreduce %d: %g, want %g\n", r, t, k, b[0], want);
      return 5;
    }
  }
  free(b);
  dg_pg_free(pg); /* at once: the slowest peer may still be in the last one */
  dg_store_free(st);
  return 0;
}

static int rank_main(int r, int W, void *arg) {
  int t = *(int *)arg;
  return trial(r, W, t);
}

int main(int argc, char **argv) {
  int W = argc > 1 ? atoi(argv[1]) : 3;
  for (int t = 0; t < TRIALS; t++) {
    int st[16];
    int bad = du_run(W, rank_main, &t, 60, st);
    if (bad) fprintf(stderr, "trial %d: %d rank(s) failed\n", t, bad);
    CHECK_EQ_INT(bad, 0);
  }
  return TEST_DONE();
}
