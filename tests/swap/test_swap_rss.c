/* Released pages really leave the resident set: the char-GPT (4 layers)
 * runs 2 steps in each of two child processes, without and with file
 * swapping, and each reports VmRSS at the end of the second forward (the
 * step's peak). With swapping it is lower by at least half the bytes the
 * swap says it had released at that moment. */
#include <sys/wait.h>

#include "swap_util.h"

typedef struct {
  size_t rss, out;
} report;

static report child(int swap) {
  report r = {0, 0};
  sw_model m;
  REQUIRE(sw_gpt_new(&m, 32, 4) == DG_OK);
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  dg_swap_opts o;
  if (swap) {
    sw_opts("file", 2, &o);
    REQUIRE(dg_ctx_set_swap(ctx, &o) == DG_OK);
  }
  for (int s = 0; s < 2; s++) {
    dg_tensor *l = sw_loss(&m, ctx);
    REQUIRE(l);
    if (s == 1) {
      r.rss = sw_rss();
      dg_swap_stats st;
      if (swap && !dg_ctx_swap_stats(ctx, &st)) r.out = st.bytes_out; /* this step's, below */
    }
    REQUIRE(dg_backward(ctx, l) == DG_OK);
    dg_ctx_reset(ctx);
    if (swap && s == 0) dg_ctx_swap_stats_reset(ctx);
  }
  dg_ctx_free(ctx);
  sw_free(&m);
  return r;
}

static report run(int swap) {
  int fd[2];
  REQUIRE(pipe(fd) == 0);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (!pid) {
    report r = child(swap);
    _exit(write(fd[1], &r, sizeof r) == (ssize_t)sizeof r ? 0 : 1);
  }
  close(fd[1]);
  report r = {0, 0};
  CHECK(read(fd[0], &r, sizeof r) == (ssize_t)sizeof r);
  close(fd[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  return r;
}

int main(void) {
  sw_tmpdir();
  report off = run(0), on = run(1);
  fprintf(stderr, "VmRSS at the end of forward: %.1f MiB without swapping, %.1f MiB with "
          "(%.1f MiB stored by then)\n", off.rss / 1048576.0, on.rss / 1048576.0,
          on.out / 1048576.0);
  CHECK(on.out > ((size_t)8 << 20));
  CHECK(on.rss + on.out / 2 <= off.rss);
  sw_rmdir();
  return TEST_DONE();
}
