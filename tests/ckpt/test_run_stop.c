/* Graceful stop (dgrad/run.h):
 *  - a handled SIGTERM is a request, not a death; a repeat within 1 s is a
 *    duplicate, one later runs the default action; uninstall restores the
 *    program's handler; bad signals and a double install are refused;
 *  - 4 ranks: SIGTERM to rank 2 only, every rank stops after the same step
 *    and exits 0 (dg_stop_agree);
 *  - the cost of dg_stop_agree per step on 4 ranks (printed, not asserted).
 *
 *   test_run_stop [--bench N]   N agreements per rank (default 2000) */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <dgrad.h>

#include "tests/fault/fork_util.h"
#include "test.h"

static int g_bench = 2000;
static char g_dir[64];
static volatile sig_atomic_t g_user_hits;

static void user_handler(int sig) {
  (void)sig;
  g_user_hits++;
}

static void test_local(void) {
  char err[256];
  struct sigaction sa = {.sa_handler = user_handler}, cur;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR2, &sa, NULL);
  int bad[] = {SIGKILL};
  CHECK_EQ_INT(dg_stop_install(bad, 1, err, sizeof err), DG_EINVAL);
  CHECK_STR_HAS(err, "cannot request a stop");
  int sigs[] = {SIGTERM, SIGUSR2};
  CHECK_OK(dg_stop_install(sigs, 2, err, sizeof err));
  CHECK_EQ_INT(dg_stop_install(NULL, 0, err, sizeof err), DG_ESTATE);
  CHECK_EQ_INT(dg_stop_signal(), 0);
  raise(SIGTERM);
  CHECK_EQ_INT(dg_stop_signal(), SIGTERM);
  raise(SIGUSR2); /* within 1 s: a duplicate, ignored (the process lives) */
  CHECK_EQ_INT(dg_stop_signal(), SIGTERM);
  CHECK_EQ_INT(g_user_hits, 0);
  dg_stop_uninstall();
  sigaction(SIGUSR2, NULL, &cur);
  CHECK(cur.sa_handler == user_handler);
  raise(SIGUSR2);
  CHECK_EQ_INT(g_user_hits, 1);
  /* a later repeat runs the default action: SIGTERM kills */
  pid_t pid = fork();
  if (pid == 0) {
    if (dg_stop_install(NULL, 0, NULL, 0)) _exit(3);
    raise(SIGTERM);
    if (dg_stop_signal() != SIGTERM) _exit(4);
    usleep(1200000);
    raise(SIGTERM);
    _exit(5); /* not reached */
  }
  int st;
  waitpid(pid, &st, 0);
  CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM);
  dg_stop_request(SIGUSR1); /* no install needed; the first request stays */
  int sig;
  CHECK_OK(dg_stop_agree(NULL, &sig, err, sizeof err));
  CHECK_EQ_INT(sig, SIGTERM); /* from raise above, still the first */
}

/* Rank r: steps until the group agrees to stop; writes its stop step and
 * the mean agree time to g_dir/rank<r>. Rank 2 tells the parent (file
 * "ready") once it reached step 20, so the signal lands mid-run. */
static int rank_main(int rank, int W) {
  char err[512], path[128];
  (void)W;
  if (dg_stop_install(NULL, 0, err, sizeof err)) return 10;
  dg_pg *pg;
  if (dg_pg_new_from_env(&pg, 30000, err, sizeof err)) {
    fprintf(stderr, "rank %d: %s\n", rank, err);
    return 11;
  }
  /* cost: agreements with no signal pending */
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int sig = 0;
  for (int i = 0; i < g_bench && !sig; i++)
    if (dg_stop_agree(pg, &sig, err, sizeof err)) return 12;
  double us = fu_ms_since(&t0) * 1e3 / g_bench;
  if (sig) return 13;
  int64_t step = 0;
  for (; step < 100000; step++) {
    usleep(2000); /* the step's work */
    if (rank == 2 && step == 20) {
      snprintf(path, sizeof path, "%s/ready", g_dir);
      FILE *f = fopen(path, "w");
      if (f) fclose(f);
    }
    if (dg_stop_agree(pg, &sig, err, sizeof err)) {
      fprintf(stderr, "rank %d: %s\n", rank, err);
      return 14;
    }
    if (sig) break;
  }
  snprintf(path, sizeof path, "%s/rank%d", g_dir, rank);
  FILE *f = fopen(path, "w");
  if (!f) return 15;
  fprintf(f, "%lld %d %d %.2f\n", (long long)step, sig, dg_stop_signal(), us);
  fclose(f);
  dg_pg_free(pg);
  return sig == SIGTERM ? 0 : 16;
}

static void test_ranks(void) {
  enum { W = 4 };
  pid_t pid[W];
  char ps[16], ws[16], path[128];
  snprintf(ps, sizeof ps, "%d", fu_free_port());
  snprintf(ws, sizeof ws, "%d", W);
  for (int r = 0; r < W; r++) {
    if ((pid[r] = fork()) == 0) {
      char rs[16];
      snprintf(rs, sizeof rs, "%d", r);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", ps, 1);
      setenv("RANK", rs, 1);
      setenv("WORLD_SIZE", ws, 1);
      _exit(rank_main(r, W));
    }
  }
  snprintf(path, sizeof path, "%s/ready", g_dir);
  for (int t = 0; t < 6000 && access(path, F_OK); t++) usleep(10000);
  CHECK(access(path, F_OK) == 0);
  kill(pid[2], SIGTERM); /* one rank only */
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  pid_t live[W];
  memcpy(live, pid, sizeof pid);
  int status[W];
  fu_reap(W, live, 60, status);
  double ms = fu_ms_since(&t0);
  long long steps[W];
  for (int r = 0; r < W; r++) {
    CHECK(status[r] != -1 && WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0);
    if (status[r] != -1 && WIFEXITED(status[r]) && WEXITSTATUS(status[r]))
      fprintf(stderr, "rank %d exited %d\n", r, WEXITSTATUS(status[r]));
    snprintf(path, sizeof path, "%s/rank%d", g_dir, r);
    FILE *f = fopen(path, "r");
    int sig = 0, local = 0;
    double us = 0;
    steps[r] = -1;
    if (f) {
      if (fscanf(f, "%lld %d %d %lf", &steps[r], &sig, &local, &us) != 4) steps[r] = -2;
      fclose(f);
    }
    CHECK_EQ_INT(sig, SIGTERM);
    CHECK_EQ_INT(local, r == 2 ? SIGTERM : 0); /* only rank 2 was signalled */
    CHECK_EQ_INT(steps[r], steps[0]);
    printf("rank %d: stopped after step %lld; dg_stop_agree %.1f us per call (W=%d, %d "
           "calls)\n", r, steps[r], us, W, g_bench);
  }
  CHECK(steps[0] >= 20);
  printf("all ranks stopped and exited %.0f ms after SIGTERM to rank 2\n", ms);
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "--bench")) g_bench = atoi(argv[2]);
  snprintf(g_dir, sizeof g_dir, "/tmp/dg_run_stop_XXXXXX");
  REQUIRE(mkdtemp(g_dir));
  setvbuf(stdout, NULL, _IONBF, 0);
  test_local();
  test_ranks();
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
  if (system(cmd)) fprintf(stderr, "cannot remove %s\n", g_dir);
  return TEST_DONE();
}
