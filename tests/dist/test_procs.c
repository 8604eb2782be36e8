/* Ranks as processes through torch's env:// rendezvous (rank 0 hosts the
 * TCPStore): every allreduce algorithm, including cross-memory attach
 * between processes, on 1,000,003 floats; local rank from the environment. */
#include <stdlib.h>

#include "dgrad/dist.h"
#include "tests/fault/fork_util.h"
#include "tests/test.h"

static int rank_main(int r, int W) {
  char lr[16];
  snprintf(lr, sizeof lr, "%d", r);
  setenv("LOCAL_RANK", lr, 1);
  dg_pg *pg = NULL;
  char err[256];
  if (dg_pg_new_from_env(&pg, 60000, err, sizeof err) != DG_OK) {
    fprintf(stderr, "rank %d: %s\n", r, err);
    return 10;
  }
  if (dg_pg_rank(pg) != r || dg_pg_size(pg) != W || dg_pg_local_rank(pg) != r) return 11;
  size_t n = 1000003;
  float *b = malloc(n * sizeof *b);
  dg_algo algos[] = {DG_ALGO_AUTO, DG_ALGO_RING, DG_ALGO_DIRECT, DG_ALGO_CMA,
                     DG_ALGO_HALVING_DOUBLING, DG_ALGO_SHM};
  for (size_t a = 0; a < sizeof algos / sizeof *algos; a++) {
    if (dg_pg_set_algo(pg, algos[a]) != DG_OK) return 12;
    for (size_t i = 0; i < n; i++) b[i] = (float)(r + (int)(i % 5));
    if (dg_pg_allreduce_sync(pg, b, n, DG_F32, DG_RED_SUM) != DG_OK) {
      fprintf(stderr, "rank %d algo %d: %s\n", r, algos[a], dg_pg_errmsg(pg));
      return 13;
    }
    for (size_t i = 0; i < n; i++)
      if (b[i] != (float)(W * (W - 1) / 2 + W * (int)(i % 5))) {
        fprintf(stderr, "rank %d algo %d: [%zu] = %g\n", r, algos[a], i, b[i]);
        return 14;
      }
  }
  free(b);
  dg_pg_free(pg);
  return 0;
}

int main(void) {
  for (int W = 2; W <= 3; W++) {
    int st[3];
    fu_run(W, rank_main, 60, st);
    for (int r = 0; r < W; r++)
      CHECK_EQ_INT(st[r] != -1 && WIFEXITED(st[r]) ? WEXITSTATUS(st[r]) : -1, 0);
  }
  return TEST_DONE();
}
