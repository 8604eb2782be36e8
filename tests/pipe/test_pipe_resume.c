/* Stop and resume a pipeline (issue #18 item 6), 2 stages, 1F1B, M = 4,
 * dropout (the pipe's per-step random numbers) and AdamW (optimizer state):
 * - uninterrupted: N steps, the losses recorded;
 * - stopped: a stop request on stage 1 alone (dg_stop_request, as a
 *   SIGTERM would) is agreed by both stages (dg_stop_agree), which stop
 *   after the same step and each save its own directory; a fresh process
 *   resumes both (dg_checkpoint_dir_resume_group, dg_pipe_set_step) and the
 *   losses equal the uninterrupted run's bit for bit;
 * - killed while saving: stage 0 saved step S, stage 1 did not (it died):
 *   both resume from the previous common step, again bit-exact.
 *   test_pipe_resume */
#include <errno.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dgrad/run.h"

#define B 16
#define IN 8
#define NCLS 4

#include "tests/pipe/pipe_util.h"

#define N 12 /* steps of a whole run */

static char tmp[256]; /* the run's directory, made before the ranks fork */

typedef struct {
  int stop_after; /* step after which stage 1 requests a stop (0: none) */
  int save_every; /* periodic saves (0: none) */
  int dead_save;  /* the step at whose save stage 1 "dies" (0: none) */
  const char *dir, *log;
} scenario;

/* Linear 8-16, Tanh, Dropout 0.2 | Linear 16-16, Tanh, Linear 16-4 */
static dg_module *model(void) {
  dg_module *seq, *l;
  REQUIRE(dg_nn_sequential(&seq) == DG_OK);
  add(seq, dg_nn_linear(&l, IN, 16, 1), &l);
  add(seq, dg_nn_tanh(&l), &l);
  add(seq, dg_nn_dropout(&l, 0.2f), &l);
  add(seq, dg_nn_linear(&l, 16, 16, 1), &l);
  add(seq, dg_nn_tanh(&l), &l);
  add(seq, dg_nn_linear(&l, 16, NCLS, 1), &l);
  return seq;
}

static void stage_dir(char *out, size_t cap, const char *dir, int r) {
  snprintf(out, cap, "%s/%s/stage%d", tmp, dir, r);
}

/* Appends "<step> <loss %a>" to tmp/<log>.rank<r>. */
static void log_loss(const char *log, int r, int64_t step, float loss) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s.rank%d", tmp, log, r);
  FILE *f = fopen(p, "a");
  REQUIRE(f);
  fprintf(f, "%lld %a\n", (long long)step, (double)loss);
  fclose(f);
}

static int save(const char *dir, int r, dg_params *ps, dg_optim *opt, int64_t step) {
  char d[400], err[512];
  stage_dir(d, sizeof d, dir, r);
  REQUIRE(mkdir(tmp, 0777) == 0 || errno == EEXIST);
  char parent[400];
  snprintf(parent, sizeof parent, "%s/%s", tmp, dir);
  REQUIRE(mkdir(parent, 0777) == 0 || errno == EEXIST);
  dg_checkpoint c = {ps, opt, NULL, NULL, step, 0, NULL, NULL};
  int rc = dg_checkpoint_dir_save(d, &c, 3, NULL, 0, err, sizeof err);
  if (rc) fprintf(stderr, "rank %d: %s\n", r, err);
  return rc;
}

/* One run of a scenario: resumes when its directories hold checkpoints,
 * trains to N or to the agreed stop, saves as the scenario says. */
static int run_rank(int r, int W, void *arg) {
  const scenario *sc = arg;
  pu_rank k;
  if (pu_open(&k, r, W)) return 2;
  dg_pipe_opts po = dg_pipe_defaults();
  po.micro_batches = 4, po.schedule = DG_PIPE_1F1B;
  dg_pipe *p;
  char err[512], d[400];
  REQUIRE(dg_pipe_new(&p, k.pg, model(), k.ps, 5, &po, err, sizeof err) == DG_OK);
  dg_optim *opt;
  REQUIRE(dg_optim_new_adamw(&opt, k.ps, NULL, NULL, 0) == DG_OK);
  dg_checkpoint c = {k.ps, opt, NULL, NULL, 0, 0, NULL, NULL};
  int resumed = 0;
  if (sc->dir) {
    stage_dir(d, sizeof d, sc->dir, r);
    int rc = dg_checkpoint_dir_resume_group(d, &c, k.pg, &resumed, NULL, 0, err, sizeof err);
    if (rc) fprintf(stderr, "rank %d: %s\n", r, err);
    CHECK_OK(rc);
    if (resumed) CHECK_OK(dg_pipe_set_step(p, c.step));
    if (rc) c.step = N; /* refused: train nothing */
  }
  float x[B * IN];
  int64_t y[B];
  int64_t step = c.step;
  while (step < N) {
    batch(step, x, y);
    dg_tensor *xt = dg_wrap(k.ctx, DG_F32, 2, (int64_t[]){B, IN}, x);
    dg_tensor *yt = dg_wrap(k.ctx, DG_I64, 1, (int64_t[]){B}, y);
    float loss;
    CHECK_OK(dg_pipe_step(p, xt, yt, ce, NULL, &loss));
    CHECK_OK(dg_optim_step(opt));
    dg_params_zero_grad(k.ps);
    dg_ctx_reset(k.ctx);
    log_loss(sc->log, r, ++step, loss);
    if (sc->save_every && step % sc->save_every == 0)
      CHECK_OK(save(sc->dir, r, k.ps, opt, step));
    if (r == 1 && step == sc->stop_after) dg_stop_request(SIGTERM);
    int sig;
    CHECK_OK(dg_stop_agree(k.pg, &sig, err, sizeof err));
    if (!sig) continue;
    CHECK_EQ_INT(sig, SIGTERM);
    CHECK_EQ_INT(step, sc->stop_after); /* both stages, after the same step */
    if (!(r == 1 && step == sc->dead_save)) CHECK_OK(save(sc->dir, r, k.ps, opt, step));
    break;
  }
  CHECK_OK(dg_pg_barrier_sync(k.pg));
  dg_optim_free(opt);
  dg_pipe_free(p);
  pu_close(&k, W, 1);
  return dg_test_failures ? 1 : 0;
}

/* The losses of tmp/<log>.rank<r>, the last line of each step (a resumed
 * run re-logs the steps after the checkpoint it resumed from). */
static int losses(const char *log, int r, char lines[N + 1][64]) {
  char p[512], line[64];
  snprintf(p, sizeof p, "%s/%s.rank%d", tmp, log, r);
  FILE *f = fopen(p, "r");
  if (!f) return 0;
  int n = 0;
  for (int i = 0; i <= N; i++) lines[i][0] = 0;
  while (fgets(line, sizeof line, f)) {
    int s = atoi(line);
    if (s >= 1 && s <= N) snprintf(lines[s], 64, "%s", line), n++;
  }
  fclose(f);
  return n;
}

static void expect_equal(const char *log, const char *what) {
  for (int r = 0; r < 2; r++) {
    char a[N + 1][64], b[N + 1][64];
    CHECK(losses("full", r, a) == N);
    CHECK(losses(log, r, b) >= N);
    int same = 0;
    for (int s = 1; s <= N; s++) same += !strcmp(a[s], b[s]) && a[s][0];
    if (same != N) fprintf(stderr, "%s, stage %d: %d of %d losses equal\n", what, r, same, N);
    CHECK_EQ_INT(same, N);
  }
  fprintf(stderr, "ok %s: %d losses of both stages equal the uninterrupted run's\n", what, N);
}

int main(void) {
  snprintf(tmp, sizeof tmp, "/tmp/dg_pipe_resume_XXXXXX");
  REQUIRE(mkdtemp(tmp));
  scenario full = {0, 0, 0, NULL, "full"};
  CHECK_EQ_INT(du_run(2, run_rank, &full, 60, NULL), 0);

  /* stage 1 alone is signalled after step 5; both save; a new process resumes */
  scenario stop = {5, 0, 0, "stop", "stop"};
  CHECK_EQ_INT(du_run(2, run_rank, &stop, 60, NULL), 0);
  scenario again = {0, 0, 0, "stop", "stop"};
  CHECK_EQ_INT(du_run(2, run_rank, &again, 60, NULL), 0);
  expect_equal("stop", "stop after step 5 and resume");

  /* saves every 3 steps; at the stop after step 7 stage 1 dies before its
   * save: both resume from step 6, the newest both have */
  scenario dead = {7, 3, 7, "dead", "dead"};
  CHECK_EQ_INT(du_run(2, run_rank, &dead, 60, NULL), 0);
  char d0[400], d1[400], path[512], err[512];
  int64_t s0 = -1, s1 = -1;
  stage_dir(d0, sizeof d0, "dead", 0);
  stage_dir(d1, sizeof d1, "dead", 1);
  CHECK_OK(dg_checkpoint_dir_latest(d0, path, sizeof path, &s0, err, sizeof err));
  CHECK_OK(dg_checkpoint_dir_latest(d1, path, sizeof path, &s1, err, sizeof err));
  CHECK(s0 == 7 && s1 == 6);
  scenario after = {0, 3, 0, "dead", "dead"};
  CHECK_EQ_INT(du_run(2, run_rank, &after, 60, NULL), 0);
  expect_equal("dead", "stage 1 died while saving step 7, resumed from 6");

  /* a stage whose directory is gone: both refuse, neither starts over */
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf %s", d1);
  REQUIRE(system(cmd) == 0);
  int status[2] = {0, 0};
  scenario gone = {0, 0, 0, "dead", "gone"};
  CHECK(du_run(2, run_rank, &gone, 60, status) != 0);
  CHECK(status[0] != 0 && status[1] != 0);
  char none[N + 1][64];
  CHECK_EQ_INT(losses("gone", 0, none) + losses("gone", 1, none), 0); /* no step trained */
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
  REQUIRE(system(cmd) == 0);
  return TEST_DONE();
}
