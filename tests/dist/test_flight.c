/* Flight recorder and collective fingerprints (issue #17, items 1-2), on 3
 * forked ranks over loopback:
 *
 *   count | dtype | root | skip   a rank posts a different collective
 *       (allreduce count, dtype, broadcast root, or skips one allreduce):
 *       every rank fails with DG_EMISMATCH naming both ranks and both calls,
 *       instead of hanging or corrupting the operation;
 *   stall    rank 2 sleeps past the timeout: the others' error names it
 *       with the last seq and op it completed, and where they wait;
 *       DG_FLIGHT_DIR gets one file of records per failing rank;
 *   sigstop  rank 2 is stopped (SIGSTOP): as stall;
 *   behind   rank 2 waits in a receive while ranks 0-1 wait in an
 *       allreduce: every rank's error has both positions (compared
 *       through the store).
 *
 *   test_flight MODE */
#include <string.h>
#include <sys/stat.h>

#include "dgrad/dist.h"
#include "tests/fault/fork_util.h"
#include "tests/test.h"

#define W 3
#define N1 1024
#define N2 262144

static const char *g_mode;
static char g_dir[256];

/* Prints and checks msg has every needle (NULL-terminated). */
static int has_all(int r, int rc, int want_rc, const char *msg, const char *const *needles) {
  fprintf(stderr, "rank %d: %s: %s\n", r, dg_err_name(rc), msg);
  if (rc != want_rc) return 0;
  for (const char *const *n = needles; *n; n++)
    if (!strstr(msg, *n)) {
      fprintf(stderr, "rank %d: message lacks \"%s\"\n", r, *n);
      return 0;
    }
  return 1;
}

/* The mismatch modes: collective #1 differs on one rank. */
static int mismatch(dg_pg *pg, int r) {
  static float a[N2], b[N2];
  double d[16] = {0};
  dg_work *w = NULL;
  int rc = DG_OK;
  const char *need[3] = {NULL, NULL, NULL};
  if (!strcmp(g_mode, "count")) {
    rc = dg_pg_allreduce(pg, a, r == 1 ? 32 : 16, DG_F32, DG_RED_SUM, &w);
    need[0] = "rank 0 called allreduce f32[16] sum";
    need[1] = "rank 1 called allreduce f32[32] sum";
  } else if (!strcmp(g_mode, "dtype")) {
    rc = r == 1 ? dg_pg_allreduce(pg, d, 16, DG_F64, DG_RED_SUM, &w)
                : dg_pg_allreduce(pg, a, 16, DG_F32, DG_RED_SUM, &w);
    need[0] = "rank 0 called allreduce f32[16] sum";
    need[1] = "rank 1 called allreduce f64[16] sum";
  } else if (!strcmp(g_mode, "root")) {
    rc = dg_pg_broadcast(pg, a, 16, DG_F32, r == 2 ? 1 : 0, &w);
    need[0] = "rank 0 called broadcast f32[16] root 0";
    need[1] = "rank 2 called broadcast f32[16] root 1";
  } else { /* skip: rank 2 goes straight to the second allreduce */
    if (r != 2) rc = dg_pg_allreduce(pg, a, N1, DG_F32, DG_RED_SUM, &w);
    if (rc == DG_OK && r != 2) {
      rc = dg_work_wait(w, 0);
      if (!has_all(r, rc, DG_EMISMATCH, dg_work_errmsg(w),
                   (const char *[]){"rank 0 called allreduce f32[1024] sum",
                                    "rank 2 called allreduce f32[262144] sum", NULL}))
        return 20;
      dg_work_free(w);
    }
    if (dg_pg_allreduce(pg, b, N2, DG_F32, DG_RED_SUM, &w) != DG_OK) return 21;
    rc = dg_work_wait(w, 0);
    int ok = rc == DG_EMISMATCH && (r != 2 || strstr(dg_work_errmsg(w), "f32[262144]"));
    fprintf(stderr, "rank %d second: %s: %s\n", r, dg_err_name(rc), dg_work_errmsg(w));
    dg_work_free(w);
    return ok ? 0 : 22;
  }
  if (rc != DG_OK) return 23;
  rc = dg_work_wait(w, 0);
  int ok = has_all(r, rc, DG_EMISMATCH, dg_work_errmsg(w), need);
  dg_work_free(w);
  /* sticky, and the group's message keeps the detail */
  if (dg_pg_barrier_sync(pg) != DG_EMISMATCH) return 24;
  if (!strstr(dg_pg_errmsg(pg), need[1])) return 25;
  return ok ? 0 : 26;
}

/* stall / sigstop / behind: two allreduces, then rank 2 stops taking part. */
static int stall(dg_pg *pg, int r) {
  static float a[N1];
  for (int i = 0; i < 2; i++)
    if (dg_pg_allreduce_sync(pg, a, N1, DG_F32, DG_RED_SUM) != DG_OK) return 30;
  dg_work *w = NULL;
  int behind = !strcmp(g_mode, "behind");
  if (r == 2 && !behind) {
    if (!strcmp(g_mode, "sigstop")) raise(SIGSTOP); /* the parent kills it */
    usleep(4000000);
    return 0; /* dg_pg_free is not reached: the process just exits */
  }
  if (r == 2) { /* waits for a message nobody sends */
    float v;
    if (dg_pg_recv(pg, &v, 1, DG_F32, 0, 7, &w) != DG_OK) return 31;
  } else if (dg_pg_allreduce(pg, a, N1, DG_F32, DG_RED_SUM, &w) != DG_OK) {
    return 32;
  }
  int rc = dg_work_wait(w, 0);
  const char *m = dg_work_errmsg(w);
  /* behind: no rank exits while another may still be comparing positions
   * or learning of the failure, or that one would see it gone: twice the
   * timeout (under TSan one rank once learned only after 1.5 s more) */
  if (behind) usleep(3000000);
  int ok;
  if (behind && m && strstr(m, " is gone;")) /* the first rank to fail closed its
     * connections before it published its position; the rank it blamed waits
     * up to 250 ms for it, and rank 2's own position must be named anyway */
    ok = (rc == DG_ETIMEDOUT || rc == DG_EPEER) &&
         has_all(r, rc, rc, m,
                 (const char *[]){"rank 2 waits in seq 3 (recv f32[1] from rank 0 tag 7)",
                                  " in seq 3 (allreduce f32[1024])", NULL});
  else if (behind)
    ok = (rc == DG_ETIMEDOUT || rc == DG_EPEER) &&
         has_all(r, rc, rc, m,
                 (const char *[]){"rank 2 waits in seq 3 (recv f32[1] from rank 0 tag 7)",
                                  "ranks 0-1 wait in seq 3 (allreduce f32[1024])", NULL});
  else
    ok = (rc == DG_ETIMEDOUT || rc == DG_EPEER) &&
         has_all(r, rc, rc, m,
                 (const char *[]){"rank 2 did not answer",
                                  "last collective completed here: seq 2 (allreduce f32[1024])",
                                  "ranks 0-1 wait in seq 3 (allreduce f32[1024])", NULL});
  dg_work_free(w);
  if (!ok) return 33;
  if (behind) return 0;
  /* this rank's records: seqs 1-2 done, 3 failed */
  char path[300], line[512];
  snprintf(path, sizeof path, "%s/rank%d.txt", g_dir, r);
  FILE *f = fopen(path, "r");
  if (!f) return 34;
  int done = 0, failed = 0;
  while (fgets(line, sizeof line, f)) {
    done += strstr(line, " done allreduce f32[1024] ") != NULL;
    failed += strstr(line, "3 failed allreduce f32[1024] ") == line;
  }
  fclose(f);
  fprintf(stderr, "rank %d: %s: %d done, %d failed\n", r, path, done, failed);
  return done == 2 && failed == 1 ? 0 : 35;
}

static int rank_main(int r, int world) {
  (void)world;
  dg_pg *pg = NULL;
  char err[512];
  int slow = !strcmp(g_mode, "stall") || !strcmp(g_mode, "sigstop") || !strcmp(g_mode, "behind");
  if (dg_pg_new_from_env(&pg, slow ? 1500 : 20000, err, sizeof err) != DG_OK) {
    fprintf(stderr, "rank %d init: %s\n", r, err);
    return 10;
  }
  /* collective #0 matches everywhere: no false alarm */
  float x[4] = {1, 1, 1, 1};
  if (dg_pg_allreduce_sync(pg, x, 4, DG_F32, DG_RED_SUM) != DG_OK || x[0] != W) return 11;
  int rc = slow ? stall(pg, r) : mismatch(pg, r);
  if (slow && r == 2 && strcmp(g_mode, "behind")) _exit(rc);
  dg_pg_free(pg);
  return rc;
}

/* sigstop: ranks 0-1 must finish on their own; rank 2 is killed after. */
static void run_sigstop(int *st) {
  pid_t pid[W];
  char ps[16];
  snprintf(ps, sizeof ps, "%d", fu_free_port());
  for (int r = 0; r < W; r++) {
    if ((pid[r] = fork()) == 0) {
      char rs[16];
      snprintf(rs, sizeof rs, "%d", r);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", ps, 1);
      setenv("RANK", rs, 1);
      setenv("WORLD_SIZE", "3", 1);
      _exit(rank_main(r, W));
    }
  }
  pid_t stopped = pid[2];
  fu_reap(W - 1, pid, 30, st); /* ranks 0 and 1 */
  kill(stopped, SIGKILL);
  waitpid(stopped, NULL, 0);
}

int main(int argc, char **argv) {
  REQUIRE(argc == 2);
  g_mode = argv[1];
  snprintf(g_dir, sizeof g_dir, "/tmp/dg_flight_test.%d", (int)getpid());
  setenv("DG_FLIGHT_DIR", g_dir, 1);
  int st[W];
  if (!strcmp(g_mode, "sigstop")) {
    run_sigstop(st);
    for (int r = 0; r < W - 1; r++)
      CHECK_EQ_INT(st[r] != -1 && WIFEXITED(st[r]) ? WEXITSTATUS(st[r]) : -1, 0);
  } else {
    fu_run(W, rank_main, 60, st);
    for (int r = 0; r < W; r++)
      CHECK_EQ_INT(st[r] != -1 && WIFEXITED(st[r]) ? WEXITSTATUS(st[r]) : -1, 0);
  }
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
  return TEST_DONE();
}
