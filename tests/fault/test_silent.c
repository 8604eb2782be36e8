/* A peer that stays connected but never joins the collective: the op fails
 * with DG_ETIMEDOUT at the group's deadline, naming the silent rank; a
 * send/recv to it likewise. Waiting with a short timeout is DG_EAGAIN and
 * leaves the op running. */
#include <string.h>

#include "dgrad/dist.h"
#include "tests/fault/fork_util.h"
#include "tests/test.h"

static int rank_main(int r, int W) {
  (void)W;
  dg_pg *pg = NULL;
  char err[256];
  (void)W;
  if (dg_pg_new_from_env(&pg, 1500, err, sizeof err) != DG_OK) {
    fprintf(stderr, "rank %d init: %s\n", r, err);
    return 10;
  }
  if (r == 1) { /* silent: alive, connected, does nothing */
    usleep(4000000);
    dg_pg_free(pg);
    return 0;
  }
  float b[10] = {0};
  dg_work *w;
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  if (dg_pg_allreduce(pg, b, 10, DG_F32, DG_RED_SUM, &w) != DG_OK) return 11;
  int rc = dg_work_wait(w, 100);
  if (rc != DG_EAGAIN) return 12;
  rc = dg_work_wait(w, 0);
  double ms = fu_ms_since(&t0);
  fprintf(stderr, "rank 0: %s after %.0f ms: %s\n", dg_err_name(rc), ms, dg_work_errmsg(w));
  if (rc != DG_ETIMEDOUT || ms < 1400 || ms > 3000) return 13;
  if (!strstr(dg_work_errmsg(w), "rank 1") || !strstr(dg_work_errmsg(w), "allreduce #0"))
    return 14;
  dg_work_free(w);
  /* sticky: the next op fails at once with the same cause */
  if (dg_pg_barrier(pg, &w) != DG_OK) return 15;
  rc = dg_work_wait(w, 0);
  if (rc != DG_ETIMEDOUT || !strstr(dg_work_errmsg(w), "rank 1")) return 16;
  dg_work_free(w);
  dg_pg_free(pg);
  return 0;
}

/* Point to point: a recv nobody sends to times out naming the peer. */
static int p2p_main(int r, int W) {
  (void)W;
  dg_pg *pg = NULL;
  char err[256];
  if (dg_pg_new_from_env(&pg, 1000, err, sizeof err) != DG_OK) return 10;
  if (r == 1) {
    usleep(2500000);
    dg_pg_free(pg);
    return 0;
  }
  int v = 0;
  dg_work *w;
  if (dg_pg_recv(pg, &v, 1, DG_I32, 1, 5, &w) != DG_OK) return 11;
  int rc = dg_work_wait(w, 0);
  fprintf(stderr, "rank 0 recv: %s: %s\n", dg_err_name(rc), dg_work_errmsg(w));
  if (rc != DG_ETIMEDOUT || !strstr(dg_work_errmsg(w), "rank 1")) return 12;
  dg_work_free(w);
  dg_pg_free(pg);
  return 0;
}

int main(void) {
  int st[2];
  fu_run(2, rank_main, 30, st);
  for (int r = 0; r < 2; r++)
    CHECK_EQ_INT(st[r] != -1 && WIFEXITED(st[r]) ? WEXITSTATUS(st[r]) : -1, 0);
  fu_run(2, p2p_main, 30, st);
  for (int r = 0; r < 2; r++)
    CHECK_EQ_INT(st[r] != -1 && WIFEXITED(st[r]) ? WEXITSTATUS(st[r]) : -1, 0);
  return TEST_DONE();
}
