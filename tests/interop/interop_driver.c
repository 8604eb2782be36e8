/* Runs a mixed group and checks it: argv[1] is a layout, one letter per
 * rank ('d' dgrad, 't' torch, 'g' C++ libgloo), e.g. "dtt"; then the paths of
 * dg_rank, torch_rank.py and gloo_rank. Every rank must exit 0 and write
 * byte-identical results. torch layouts rendezvous through a TCPStore
 * (rank 0 hosts it), libgloo ones through a Gloo FileStore. Exit 77 when
 * the layout needs torch and /usr/bin/python3 has none. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/fault/fork_util.h"
#include "tests/test.h"

static char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  *n = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc(*n + 1);
  if (fread(b, 1, *n, f) != *n) *n = 0;
  fclose(f);
  return b;
}

int main(int argc, char **argv) {
  if (argc < 5) return 2;
  const char *lay = argv[1];
  int W = (int)strlen(lay), port = fu_free_port(), gloo = strchr(lay, 'g') != NULL;
  if (strchr(lay, 't') && system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0)
    TEST_SKIP("/usr/bin/python3 cannot import torch");
  char dir[] = "/tmp/dg_interopXXXXXX";
  REQUIRE(mkdtemp(dir));
  pid_t pid[8];
  for (int r = 0; r < W; r++) {
    char out[128], ps[16], rs[16], ws[16];
    snprintf(out, sizeof out, "%s/out_%d", dir, r);
    snprintf(ps, sizeof ps, "%d", port);
    snprintf(rs, sizeof rs, "%d", r);
    snprintf(ws, sizeof ws, "%d", W);
    pid[r] = fork();
    if (pid[r] == 0) {
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", ps, 1);
      setenv("RANK", rs, 1);
      setenv("LOCAL_RANK", rs, 1);
      setenv("WORLD_SIZE", ws, 1);
      setenv("GLOO_SOCKET_IFNAME", "lo", 1);
      if (lay[r] == 'd' && gloo) execl(argv[2], argv[2], out, dir, (char *)NULL);
      if (lay[r] == 'd') execl(argv[2], argv[2], out, (char *)NULL);
      if (lay[r] == 't') execl("/usr/bin/python3", "python3", argv[3], out, (char *)NULL);
      if (lay[r] == 'g') execl(argv[4], argv[4], out, dir, (char *)NULL);
      _exit(127);
    }
  }
  int status[8] = {0};
  fu_reap(W, pid, 90, status);
  for (int r = 0; r < W; r++)
    if (status[r] == -1) {
      T_FAIL_("layout %s: rank %d (%c) still running after 90 s", lay, r, lay[r]);
    } else {
      CHECK(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0);
      if (!(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0))
        fprintf(stderr, "layout %s: rank %d (%c) ended with status 0x%x\n", lay, r, lay[r],
                status[r]);
    }
  size_t n0 = 0;
  char path[128];
  snprintf(path, sizeof path, "%s/out_0", dir);
  char *b0 = slurp(path, &n0);
  CHECK(b0 && n0 == (0 + 1 + 5 + 1000001 + 1000 + 5) * 4);
  for (int r = 1; r < W && b0; r++) {
    size_t n = 0;
    snprintf(path, sizeof path, "%s/out_%d", dir, r);
    char *b = slurp(path, &n);
    CHECK(b && n == n0 && !memcmp(b, b0, n0));
    free(b);
  }
  free(b0);
  char cmd[160];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "cleanup failed\n");
  fprintf(stderr, "layout %s: ", lay);
  return TEST_DONE();
}
