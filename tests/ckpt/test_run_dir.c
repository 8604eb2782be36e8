/* Checkpoint directories (dgrad/run.h) and resuming on another world size:
 *  - dg_checkpoint_dir_save names by step and keeps the newest K;
 *  - dg_checkpoint_dir_latest ignores temporaries and skips a file cut
 *    short, resume of an empty directory is a fresh start, of a directory
 *    holding only broken files an error;
 *  - a saver SIGKILLed while writing leaves a loadable latest checkpoint;
 *  - a loader position saved on 4 ranks resumed on 2 (and 2 on 4, and on a
 *    batch size that does not divide it) covers every sample of the epoch
 *    exactly once, and the next epoch is the ordinary one. */
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <dgrad.h>

#include "test.h"

static char g_dir[64];

static int idx_get(void *self, int64_t i, void *const *dst) {
  (void)self;
  ((int64_t *)dst[0])[0] = i;
  return DG_OK;
}

static dg_dataset index_dataset(int64_t n) {
  dg_dataset ds = {n, 1, {{DG_I64, 0, {0}, 1}}, idx_get, NULL};
  return ds;
}

static dg_params *tiny_store(float v) {
  dg_params *ps;
  dg_tensor *w;
  REQUIRE(dg_params_new(&ps) == DG_OK);
  REQUIRE(dg_params_add(ps, "w", 1, (int64_t[]){1000}, &w) == DG_OK);
  float *d = dg_tensor_data(w);
  for (int i = 0; i < 1000; i++) d[i] = v;
  return ps;
}

static int count_files(const char *dir) {
  DIR *d = opendir(dir);
  int n = 0;
  for (struct dirent *e; d && (e = readdir(d));) n += e->d_name[0] != '.';
  if (d) closedir(d);
  return n;
}

static void test_dir(void) {
  char sub[128], path[256], err[512];
  snprintf(sub, sizeof sub, "%s/ck", g_dir);
  int64_t step = -1;
  int resumed = 7;
  CHECK_EQ_INT(dg_checkpoint_dir_latest(sub, path, sizeof path, &step, err, sizeof err),
               DG_ENOTFOUND);
  dg_params *ps = tiny_store(0);
  dg_checkpoint c = {ps, NULL, NULL, NULL, 0, 0, NULL, NULL};
  CHECK_OK(dg_checkpoint_dir_resume(sub, &c, &resumed, NULL, 0, err, sizeof err));
  CHECK_EQ_INT(resumed, 0); /* no directory: a first start */
  for (int s = 1; s <= 5; s++) {
    ((float *)dg_tensor_data(dg_params_get(ps, 0)))[0] = (float)s;
    c.step = s * 10;
    CHECK_OK(dg_checkpoint_dir_save(sub, &c, 3, path, sizeof path, err, sizeof err));
  }
  CHECK_STR_HAS(path, "/ckpt-000000000050.safetensors");
  CHECK_EQ_INT(count_files(sub), 3); /* 30, 40, 50 */
  /* what a killed save leaves, and a newer checkpoint cut short */
  snprintf(path, sizeof path, "%s/ckpt-000000000090.safetensors.tmp.Ab12Cd", sub);
  FILE *f = fopen(path, "w");
  fputs("partial", f);
  fclose(f);
  char src[256];
  snprintf(src, sizeof src, "%s/ckpt-000000000050.safetensors", sub);
  snprintf(path, sizeof path, "%s/ckpt-000000000060.safetensors", sub);
  struct stat st;
  stat(src, &st);
  FILE *in = fopen(src, "rb"), *out = fopen(path, "wb");
  char buf[4096];
  size_t left = (size_t)st.st_size - 100, k;
  while (left && (k = fread(buf, 1, left < sizeof buf ? left : sizeof buf, in)) > 0)
    fwrite(buf, 1, k, out), left -= k;
  fclose(in), fclose(out);
  CHECK(dg_checkpoint_verify(path, err, sizeof err) == DG_EFORMAT);
  CHECK_STR_HAS(err, "truncated");
  CHECK_OK(dg_checkpoint_dir_latest(sub, path, sizeof path, &step, err, sizeof err));
  CHECK_EQ_INT(step, 50);
  dg_params *ps2 = tiny_store(0);
  dg_checkpoint c2 = {ps2, NULL, NULL, NULL, 0, 0, NULL, NULL};
  CHECK_OK(dg_checkpoint_dir_resume(sub, &c2, &resumed, path, sizeof path, err, sizeof err));
  CHECK_EQ_INT(resumed, 1);
  CHECK_EQ_INT(c2.step, 50);
  CHECK(((float *)dg_tensor_data(dg_params_get(ps2, 0)))[0] == 5.0f);
  /* only broken files: an error, not a silent fresh start */
  char bad[128];
  snprintf(bad, sizeof bad, "%s/bad", g_dir);
  mkdir(bad, 0777);
  snprintf(path, sizeof path, "%s/ckpt-000000000001.safetensors", bad);
  f = fopen(path, "w");
  fputs("not a checkpoint", f);
  fclose(f);
  CHECK_EQ_INT(dg_checkpoint_dir_resume(bad, &c2, &resumed, NULL, 0, err, sizeof err),
               DG_EFORMAT);
  CHECK_STR_HAS(err, "no complete checkpoint among 1");
  CHECK_EQ_INT(resumed, 0);
  c.step = -1;
  CHECK_EQ_INT(dg_checkpoint_dir_save(sub, &c, 0, NULL, 0, err, sizeof err), DG_EINVAL);
  dg_params_free(ps);
  dg_params_free(ps2);
}

/* A child saves 4 MB checkpoints in a loop; SIGKILL lands mid-write in
 * most rounds (after the first save, told through a pipe). The latest
 * complete one must load, whatever the timing. */
static void test_kill_during_save(void) {
  char sub[128], path[256], err[512];
  snprintf(sub, sizeof sub, "%s/kill", g_dir);
  for (int round = 0; round < 5; round++) {
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      dg_params *ps;
      dg_tensor *w;
      if (dg_params_new(&ps) || dg_params_add(ps, "w", 1, (int64_t[]){1 << 20}, &w)) _exit(3);
      dg_checkpoint c = {ps, NULL, NULL, NULL, 0, 0, NULL, NULL};
      for (int64_t s = round * 1000;; s++) {
        ((float *)dg_tensor_data(w))[0] = (float)s;
        c.step = s;
        if (dg_checkpoint_dir_save(sub, &c, 2, NULL, 0, err, sizeof err)) _exit(4);
        if (s == round * 1000 && write(fds[1], "s", 1) != 1) _exit(5);
      }
    }
    close(fds[1]);
    char b;
    CHECK(read(fds[0], &b, 1) == 1); /* EOF: the child failed (status below) */
    close(fds[0]);
    usleep(3000 + 7000 * round);
    kill(pid, SIGKILL);
    int st;
    waitpid(pid, &st, 0);
    CHECK(WIFSIGNALED(st));
    int64_t step = -1;
    CHECK_OK(dg_checkpoint_dir_latest(sub, path, sizeof path, &step, err, sizeof err));
    dg_params *ps;
    dg_tensor *w;
    REQUIRE(dg_params_new(&ps) == DG_OK && dg_params_add(ps, "w", 1, (int64_t[]){1 << 20}, &w) == DG_OK);
    dg_checkpoint c = {ps, NULL, NULL, NULL, 0, 0, NULL, NULL};
    int resumed = 0;
    CHECK_OK(dg_checkpoint_dir_resume(sub, &c, &resumed, NULL, 0, err, sizeof err));
    CHECK(resumed && c.step == step && ((float *)dg_tensor_data(w))[0] == (float)step);
    dg_params_free(ps);
  }
}

/* W ranks of batch B take `take` batches each (or the rest of the epoch
 * with take < 0), counting each dataset index in seen[]; rank 0's loader
 * is saved to path first when resuming from `from` (else fresh). */
static void run_ranks(const dg_dataset *ds, int W, int B, int take, const char *from,
                      const char *save, int *seen) {
  char err[512];
  dg_params *ps = tiny_store(1);
  for (int r = 0; r < W; r++) {
    dg_loader *l;
    dg_loader_opts o = {B, 1, 99, 0, r, W, 0};
    REQUIRE(dg_loader_new(&l, ds, &o, err, sizeof err) == DG_OK);
    dg_checkpoint c = {ps, NULL, NULL, l, 0, 0, NULL, NULL};
    if (from) CHECK_OK(dg_checkpoint_load(from, &c, err, sizeof err));
    int64_t ep0, ep, rows;
    dg_loader_position(l, &ep0, NULL);
    for (int k = 0; take < 0 || k < take; k++) {
      CHECK_OK(dg_loader_next(l, NULL, &rows));
      if (rows == 0) break;
      for (int64_t i = 0; i < rows; i++) seen[((int64_t *)dg_loader_buffer(l, 0))[i]]++;
    }
    dg_loader_position(l, &ep, NULL);
    CHECK_EQ_INT(ep, take < 0 ? ep0 + 1 : ep0);
    if (save && r == 0) CHECK_OK(dg_checkpoint_save(save, &c, err, sizeof err));
    dg_loader_free(l);
  }
  dg_params_free(ps);
}

/* take batches on (W1, B1), checkpoint, the rest of the epoch on (W2, B2):
 * every index of the epoch exactly once. */
static void reshard_case(int64_t n, int W1, int B1, int take, int W2, int B2) {
  char path[128], err[512];
  snprintf(path, sizeof path, "%s/loader.safetensors", g_dir);
  dg_dataset ds = index_dataset(n);
  int *seen = calloc((size_t)n, sizeof *seen);
  run_ranks(&ds, W1, B1, take, NULL, path, seen);
  char v[64];
  CHECK_OK(dg_checkpoint_meta(path, "data_samples", v, sizeof v, err, sizeof err));
  CHECK_EQ_INT(atoll(v), (int64_t)take * B1 * W1);
  run_ranks(&ds, W2, B2, -1, path, NULL, seen);
  int64_t once = 0;
  for (int64_t i = 0; i < n; i++) once += seen[i] == 1;
  if (once != n)
    fprintf(stderr, "reshard %lld samples: W %d B %d x%d -> W %d B %d: %lld seen once\n",
            (long long)n, W1, B1, take, W2, B2, (long long)once);
  CHECK_EQ_INT(once, n);
  free(seen);
}

static void test_reshard(void) {
  reshard_case(96, 4, 4, 3, 2, 4);  /* 4 -> 2, on a batch boundary of neither */
  reshard_case(96, 2, 6, 2, 4, 3);  /* 2 -> 4: 24 taken, 72 = 4 x 6 x 3 dealt */
  reshard_case(96, 4, 4, 3, 2, 5);  /* rest 48 on 2 x 5: last batches partial */
  reshard_case(96, 4, 4, 2, 2, 8);  /* 32 = 2 x 8 x 2: the plain batch seek */
  reshard_case(96, 2, 4, 0, 4, 4);  /* nothing taken yet */
  /* after the resumed epoch, the next one is dealt whole and equals a fresh
   * loader's; a same-world resume of it is the exact batch position */
  char path[128], err[512];
  snprintf(path, sizeof path, "%s/loader.safetensors", g_dir);
  dg_dataset ds = index_dataset(50);
  dg_params *ps = tiny_store(1);
  dg_loader *a, *b;
  dg_loader_opts o = {4, 1, 5, 0, 1, 2, 0};
  REQUIRE(dg_loader_new(&a, &ds, &o, err, sizeof err) == DG_OK);
  REQUIRE(dg_loader_new(&b, &ds, &o, err, sizeof err) == DG_OK);
  CHECK_OK(dg_loader_seek_samples(a, 0, 13)); /* mid-batch: rest dealt from 13 */
  CHECK_EQ_INT(dg_loader_batches_left(a), 5); /* ceil(37 / 2) = 19 rows: 5 batches */
  int64_t rows, ep, s;
  for (int k = 0; k < 6; k++) CHECK_OK(dg_loader_next(a, NULL, &rows));
  CHECK_EQ_INT(rows, 0);
  CHECK_OK(dg_loader_seek(b, 1, 0));
  for (int k = 0; k < 3; k++) {
    int64_t ra, rb;
    CHECK_OK(dg_loader_next(a, NULL, &ra));
    CHECK_OK(dg_loader_next(b, NULL, &rb));
    CHECK(ra == rb && !memcmp(dg_loader_buffer(a, 0), dg_loader_buffer(b, 0), 8 * (size_t)ra));
  }
  dg_loader_tell(a, &ep, &s);
  CHECK(ep == 1 && s == 3 * 4 * 2);
  dg_checkpoint c = {ps, NULL, NULL, a, 0, 0, NULL, NULL};
  CHECK_OK(dg_checkpoint_save(path, &c, err, sizeof err));
  c.loader = b;
  CHECK_OK(dg_loader_seek(b, 0, 0));
  CHECK_OK(dg_checkpoint_load(path, &c, err, sizeof err));
  int64_t bt;
  dg_loader_position(b, &ep, &bt);
  CHECK(ep == 1 && bt == 3);
  CHECK_EQ_INT(dg_loader_seek_samples(b, 0, 51), DG_EINVAL);
  dg_loader_free(a);
  dg_loader_free(b);
  dg_params_free(ps);
}

int main(void) {
  snprintf(g_dir, sizeof g_dir, "/tmp/dg_run_dir_XXXXXX");
  REQUIRE(mkdtemp(g_dir));
  test_dir();
  test_kill_during_save();
  test_reshard();
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
  if (system(cmd)) fprintf(stderr, "cannot remove %s\n", g_dir);
  return TEST_DONE();
}
