/* Failures and misuse in mixed groups, against real torch ranks (#17):
 *
 *   fault_driver kill LAYOUT V  every rank all-reduces in a loop; rank V (a
 *                               torch rank) is killed with SIGKILL; every
 *                               dgrad rank must fail well before the group's
 *                               timeout, naming rank V
 *   fault_driver kill_idle ...  the same with the dgrad ranks pausing 300 ms
 *                               between all-reduces, so that V dies while
 *                               they are in none
 *   fault_driver rs LAYOUT      reduce_scatter fails at once with
 *                               DG_EUNSUPPORTED and the group goes on
 *   fault_driver ucx LAYOUT     DG_BACKEND=ucx with torch ranks fails the
 *                               join at once with DG_EUNSUPPORTED
 *   fault_driver store          a torch TCPStore client sets keys with NUL
 *                               bytes and the empty key on a dgrad server
 * then the paths of dg_fault and torch_fault.py. LAYOUT: one letter per
 * rank, 'd' dgrad, 't' torch. Exit 77 without torch. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/fault/fork_util.h"
#include "tests/test.h"

#define GROUP_TIMEOUT_MS 60000 /* dg_fault's */

static const char *dg_exe, *torch_py;
static char dir[] = "/tmp/dg_ifaultXXXXXX";

static long long now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static pid_t spawn(int r, int W, int port, char kind, const char *mode, int ucx) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  char ps[16], rs[16], ws[16], out[256];
  snprintf(ps, sizeof ps, "%d", port);
  snprintf(rs, sizeof rs, "%d", r);
  snprintf(ws, sizeof ws, "%d", W);
  snprintf(out, sizeof out, "%s/out_%d", dir, r);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", ps, 1);
  setenv("RANK", rs, 1);
  setenv("LOCAL_RANK", rs, 1);
  setenv("WORLD_SIZE", ws, 1);
  setenv("GLOO_SOCKET_IFNAME", "lo", 1);
  if (kind == 'd' && ucx) setenv("DG_BACKEND", "ucx", 1);
  if (kind == 'd') execl(dg_exe, dg_exe, mode, dir, out, (char *)NULL);
  else execl("/usr/bin/python3", "python3", torch_py, ucx ? "once" : mode, dir, (char *)NULL);
  _exit(127);
}

static int all_ready(int W) {
  for (int r = 0; r < W; r++) {
    char p[256];
    struct stat st;
    snprintf(p, sizeof p, "%s/ready_%d", dir, r);
    if (stat(p, &st) != 0) return 0;
  }
  return 1;
}

static void kill_one(const char *lay, int victim) {
  int W = (int)strlen(lay), port = fu_free_port(), st[16];
  pid_t pid[16];
  REQUIRE(victim >= 0 && victim < W && lay[victim] == 't');
  for (int r = 0; r < W; r++) pid[r] = spawn(r, W, port, lay[r], "loop", 0);
  long long end = now_ms() + 90000;
  while (!all_ready(W) && now_ms() < end) usleep(20000);
  CHECK(all_ready(W));
  usleep(500000); /* all in the loop */
  kill(pid[victim], SIGKILL);
  long long t_kill = now_ms();
  fu_reap(W, pid, GROUP_TIMEOUT_MS / 1000 + 30, st);
  char want[32];
  snprintf(want, sizeof want, "rank %d", victim);
  for (int r = 0; r < W; r++) {
    if (lay[r] != 'd') continue;
    CHECK(st[r] != -1 && WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 3);
    char p[256], line[1024] = "";
    snprintf(p, sizeof p, "%s/out_%d", dir, r);
    FILE *f = fopen(p, "r");
    long long t = 0;
    if (f) {
      if (fscanf(f, "%lld ", &t) != 1) t = 0;
      if (!fgets(line, sizeof line, f)) line[0] = 0;
      fclose(f);
    }
    fprintf(stderr, "layout %s, rank %d killed: dgrad rank %d failed %lld ms later: %s", lay,
            victim, r, t ? t - t_kill : -1, line);
    CHECK(t > 0);
    /* promptly: far below the group's timeout (the failure before #17) */
    CHECK(t - t_kill < GROUP_TIMEOUT_MS / 4);
    CHECK_STR_HAS(line, want);
  }
}

static void run_all(const char *lay, const char *mode, int ucx) {
  int W = (int)strlen(lay), port = fu_free_port(), st[16];
  pid_t pid[16];
  for (int r = 0; r < W; r++) pid[r] = spawn(r, W, port, lay[r], mode, ucx);
  if (!ucx) {
    fu_reap(W, pid, 90, st);
    for (int r = 0; r < W; r++) CHECK(st[r] != -1 && WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0);
    return;
  }
  /* UCX: the dgrad ranks must give up at once; the torch ranks then wait
   * for them to their own timeout: stop them */
  pid_t dpid[16], tpid[16];
  int nd = 0, nt = 0, dst[16];
  for (int r = 0; r < W; r++) {
    if (lay[r] == 'd') dpid[nd++] = pid[r];
    else tpid[nt++] = pid[r];
  }
  fu_reap(nd, dpid, GROUP_TIMEOUT_MS / 2000, dst);
  for (int i = 0; i < nd; i++) CHECK(dst[i] != -1 && WIFEXITED(dst[i]) && WEXITSTATUS(dst[i]) == 0);
  for (int i = 0; i < nt; i++) kill(tpid[i], SIGKILL);
  fu_reap(nt, tpid, 10, dst);
}

static void store_keys(void) {
  char out[256], ps[16];
  snprintf(out, sizeof out, "%s/port", dir);
  pid_t pid[2];
  pid[0] = fork();
  if (pid[0] == 0) {
    execl(dg_exe, dg_exe, "store", out, (char *)NULL);
    _exit(127);
  }
  int port = 0;
  for (long long end = now_ms() + 20000; !port && now_ms() < end; usleep(20000)) {
    FILE *f = fopen(out, "r");
    if (f && fscanf(f, "%d", &port) != 1) port = 0;
    if (f) fclose(f);
  }
  REQUIRE(port > 0);
  snprintf(ps, sizeof ps, "%d", port);
  pid[1] = fork();
  if (pid[1] == 0) {
    execl("/usr/bin/python3", "python3", torch_py, "store", ps, (char *)NULL);
    _exit(127);
  }
  int st[2];
  fu_reap(2, pid, 60, st);
  for (int r = 0; r < 2; r++) CHECK(st[r] != -1 && WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0);
}

int main(int argc, char **argv) {
  if (argc < 4) return 2;
  const char *what = argv[1];
  int store = !strcmp(what, "store"), kill_ = !strcmp(what, "kill");
  if (!strcmp(what, "kill_idle")) { /* the kill lands while the dgrad ranks are between ops */
    kill_ = 1;
    setenv("DG_FAULT_PAUSE_MS", "300", 1);
  }
  const char *lay = store ? "" : argv[2];
  dg_exe = argv[argc - 2];
  torch_py = argv[argc - 1];
  if (system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0)
    TEST_SKIP("/usr/bin/python3 cannot import torch");
  REQUIRE(mkdtemp(dir));
  if (store) store_keys();
  else if (kill_) kill_one(lay, atoi(argv[3]));
  else if (!strcmp(what, "rs")) run_all(lay, "once", 0);
  else if (!strcmp(what, "ucx")) run_all(lay, "ucx", 1);
  else T_FAIL_("unknown scenario %s", what);
  char cmd[160];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "cleanup failed\n");
  fprintf(stderr, "%s %s: ", what, lay);
  return TEST_DONE();
}
