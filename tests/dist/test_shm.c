/* The shared-memory allreduce between processes on one host:
 *   test_shm on    - the segment exists (DG_ALGO_SHM accepted) and sums
 *                    agree, for sizes around the slot size;
 *   test_shm full  - run where /dev/shm is too small for the segment
 *                    (tests/dist/small_shm.sh): the group still forms,
 *                    DG_ALGO_SHM is refused with DG_EUNSUPPORTED, and the
 *                    other algorithms give the same sums (no SIGBUS). */
#include <stdlib.h>
#include <string.h>

#include "dgrad/dist.h"
#include "tests/fault/fork_util.h"
#include "tests/test.h"

static int expect_on;

static int rank_main(int r, int W) {
  dg_pg *pg = NULL;
  char err[256];
  if (dg_pg_new_from_env(&pg, 60000, err, sizeof err) != DG_OK) {
    fprintf(stderr, "rank %d: %s\n", r, err);
    return 10;
  }
  int rc = dg_pg_set_algo(pg, DG_ALGO_SHM);
  if (rc != (expect_on ? DG_OK : DG_EUNSUPPORTED)) {
    fprintf(stderr, "rank %d: set_algo(SHM) = %s\n", r, dg_err_name(rc));
    return 11;
  }
  dg_pg_set_algo(pg, DG_ALGO_AUTO);
  size_t sizes[] = {1, 65535, 65536, 65537, 3 * 65536 + 5, 1000003};
  float *b = malloc(1000003 * sizeof *b);
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
    size_t n = sizes[s];
    for (size_t i = 0; i < n; i++) b[i] = (float)(r + (int)(i % 7));
    if (dg_pg_allreduce_sync(pg, b, n, DG_F32, DG_RED_AVG) != DG_OK) {
      fprintf(stderr, "rank %d n %zu: %s\n", r, n, dg_pg_errmsg(pg));
      return 12;
    }
    for (size_t i = 0; i < n; i++)
      if (b[i] != (float)(W - 1) / 2 + (float)(i % 7)) {
        fprintf(stderr, "rank %d n %zu: [%zu] = %g\n", r, n, i, b[i]);
        return 13;
      }
  }
  free(b);
  dg_pg_free(pg);
  return 0;
}

int main(int argc, char **argv) {
  expect_on = !(argc > 1 && !strcmp(argv[1], "full"));
  for (int W = 2; W <= 4; W += 2) {
    int st[4];
    fu_run(W, rank_main, 60, st);
    for (int r = 0; r < W; r++)
      CHECK_EQ_INT(st[r] != -1 && WIFEXITED(st[r]) ? WEXITSTATUS(st[r]) : -1, 0);
  }
  return TEST_DONE();
}
