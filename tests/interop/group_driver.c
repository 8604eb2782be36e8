/* Runs the sub-group interop test: argv[1] is a layout of 4 ranks, one
 * letter each ('d' dgrad, 't' torch), then the paths of dg_group and
 * torch_group.py. Every rank must exit 0 within 90 s (a dgrad rank that
 * skipped torch's part of new_group would leave torch waiting for its
 * 60 s timeout, or longer). Exit 77 when /usr/bin/python3 has no torch. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/fault/fork_util.h"
#include "tests/test.h"

int main(int argc, char **argv) {
  if (argc < 4) return 2;
  const char *lay = argv[1];
  int W = (int)strlen(lay), port = fu_free_port();
  if (strchr(lay, 't') && system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0)
    TEST_SKIP("/usr/bin/python3 cannot import torch");
  pid_t pid[8];
  for (int r = 0; r < W; r++) {
    char ps[16], rs[16], ws[16];
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
      if (lay[r] == 'd') execl(argv[2], argv[2], (char *)NULL);
      if (lay[r] == 't') execl("/usr/bin/python3", "python3", argv[3], (char *)NULL);
      _exit(127);
    }
  }
  int status[8] = {0};
  fu_reap(W, pid, 90, status);
  for (int r = 0; r < W; r++) {
    if (status[r] == -1)
      T_FAIL_("layout %s: rank %d (%c) still running after 90 s", lay, r, lay[r]);
    else if (!WIFEXITED(status[r]) || WEXITSTATUS(status[r]) != 0)
      T_FAIL_("layout %s: rank %d (%c) ended with status 0x%x", lay, r, lay[r], status[r]);
  }
  fprintf(stderr, "layout %s: ", lay);
  return TEST_DONE();
}
