/* A rank is SIGKILLed: on every other rank the pending allreduce and the
 * next one fail within 2 s with DG_EPEER, naming the dead rank, the op and
 * its sequence number. The process group never aborts the process. */
#include <string.h>

#include "dgrad/dist.h"
#include "tests/fault/fork_util.h"
#include "tests/test.h"

#define VICTIM 2

static int expect_epeer(dg_work *w, dg_pg *pg, const char *seq, int r) {
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int rc = dg_work_wait(w, 0);
  double ms = fu_ms_since(&t0);
  const char *m = dg_work_errmsg(w);
  int ok = rc == DG_EPEER && ms < 2000 && strstr(m, "rank 2") && strstr(m, "allreduce") &&
           strstr(m, seq);
  fprintf(stderr, "rank %d: %s after %.0f ms: %s\n", r, dg_err_name(rc), ms, m);
  (void)pg;
  dg_work_free(w);
  return ok;
}

static int rank_main(int r, int W) {
  dg_pg *pg = NULL;
  char err[256];
  if (dg_pg_new_from_env(&pg, 60000, err, sizeof err) != DG_OK) {
    fprintf(stderr, "rank %d init: %s\n", r, err);
    return 10;
  }
  float b[1000];
  for (int i = 0; i < 1000; i++) b[i] = (float)r;
  if (dg_pg_allreduce_sync(pg, b, 1000, DG_F32, DG_RED_SUM) != DG_OK || b[0] != W * (W - 1) / 2)
    return 11;
  if (dg_pg_barrier_sync(pg) != DG_OK) return 12; /* ops #0, #1 */
  if (r == VICTIM) {
    usleep(200000); /* let the others post #2 first */
    raise(SIGKILL);
  }
  dg_work *w;
  if (dg_pg_allreduce(pg, b, 1000, DG_F32, DG_RED_SUM, &w) != DG_OK) return 13;
  if (!expect_epeer(w, pg, "#2", r)) return 14;
  if (dg_pg_allreduce(pg, b, 1000, DG_F32, DG_RED_SUM, &w) != DG_OK) return 15;
  if (!expect_epeer(w, pg, "#3", r)) return 16;
  if (!strstr(dg_pg_errmsg(pg), "rank 2")) return 17;
  dg_pg_free(pg);
  return 0;
}

int main(void) {
  int W = 4, st[4];
  fu_run(W, rank_main, 60, st);
  for (int r = 0; r < W; r++) {
    if (r == VICTIM) {
      CHECK(st[r] != -1 && WIFSIGNALED(st[r]) && WTERMSIG(st[r]) == SIGKILL);
      continue;
    }
    CHECK(st[r] != -1 && WIFEXITED(st[r]));
    CHECK_EQ_INT(st[r] != -1 && WIFEXITED(st[r]) ? WEXITSTATUS(st[r]) : -1, 0);
  }
  return TEST_DONE();
}
