/* Checkpoints: round trip of parameters, optimizer state, RNG, loader
 * position and metadata; mismatched models; corrupt and truncated files;
 * atomic replacement under an injected write error and under SIGKILL;
 * streaming (no whole-file buffer). */
#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_util.h"

static char g_dir[64];
static char g_path[128];

static int synth_get(void *self, int64_t i, void *const *dst) {
  (void)self;
  ((float *)dst[0])[0] = (float)i;
  ((int64_t *)dst[1])[0] = i % 10;
  return DG_OK;
}

static dg_dataset synth(int64_t n) {
  dg_dataset d;
  memset(&d, 0, sizeof d);
  d.size = n;
  d.nfields = 2;
  d.field[0].dtype = DG_F32, d.field[0].ndim = 1, d.field[0].shape[0] = 1, d.field[0].numel = 1;
  d.field[1].dtype = DG_I64, d.field[1].numel = 1;
  d.get = synth_get;
  return d;
}

/* A trained-looking state: AdamW after 3 steps on fixed gradients. */
typedef struct {
  dg_params *ps;
  dg_module *m;
  dg_optim *o;
  dg_ctx *ctx;
  dg_loader *l;
} rig;

static void rig_new(rig *r, int64_t hidden, uint64_t seed, const dg_dataset *ds) {
  REQUIRE(dg_params_new(&r->ps) == DG_OK);
  r->m = ck_mlp(r->ps, hidden, seed);
  REQUIRE(dg_optim_new_adamw(&r->o, r->ps, NULL, NULL, 0) == DG_OK);
  dg_ctx_opts co = {.seed = seed};
  REQUIRE(dg_ctx_new(&r->ctx, &co) == DG_OK);
  dg_loader_opts lo = {10, 1, 99, 0, 0, 1, 0};
  REQUIRE(dg_loader_new(&r->l, ds, &lo, NULL, 0) == DG_OK);
}

static void rig_train(rig *r, int steps) {
  size_t n;
  for (int s = 0; s < steps; s++) {
    float *g = dg_params_grad(r->ps, &n);
    for (size_t i = 0; i < n; i++) g[i] = (float)((i * 7 + (size_t)s) % 13) * 0.01f - 0.06f;
    REQUIRE(dg_optim_step(r->o) == DG_OK);
    int64_t rows;
    REQUIRE(dg_loader_next(r->l, NULL, &rows) == DG_OK);
  }
  float tmp[5];
  dg_rng_uniform(1, 0, tmp, 5);
  dg_tensor *t = dg_rand(r->ctx, 1, (int64_t[]){37}, 0, 1); /* advances the ctx RNG */
  REQUIRE(t != NULL);
  dg_ctx_reset(r->ctx);
}

static void rig_free(rig *r) {
  dg_loader_free(r->l);
  dg_ctx_free(r->ctx);
  dg_optim_free(r->o);
  dg_module_free(r->m);
  dg_params_free(r->ps);
}

static dg_checkpoint rig_ckpt(rig *r, int64_t step) {
  static const char *const keys[] = {"model", "note"};
  static const char *const vals[] = {"mlp", "quote \" and \\ and \n newline"};
  dg_checkpoint c = {r->ps, r->o, r->ctx, r->l, step, 2, keys, vals};
  return c;
}

static int same_floats(const float *a, const float *b, size_t n) {
  return memcmp(a, b, n * sizeof *a) == 0;
}

static void test_roundtrip(const dg_dataset *ds) {
  rig a, b;
  char err[512];
  rig_new(&a, 32, 1, ds);
  rig_new(&b, 32, 2, ds);
  rig_train(&a, 13);
  dg_checkpoint ca = rig_ckpt(&a, 1234);
  CHECK_OK(dg_checkpoint_save(g_path, &ca, err, sizeof err));
  dg_checkpoint cb = {b.ps, b.o, b.ctx, b.l, 0, 0, NULL, NULL};
  int rc = dg_checkpoint_load(g_path, &cb, err, sizeof err);
  if (rc) fprintf(stderr, "load: %s\n", err);
  CHECK_OK(rc);
  size_t na, nb;
  float *pa = dg_params_data(a.ps, &na), *pb = dg_params_data(b.ps, &nb);
  CHECK_EQ_INT(na, nb);
  CHECK(same_floats(pa, pb, na));
  for (int k = 0; k < dg_optim_state_count(a.o); k++) {
    const char *n1, *n2;
    float *s1, *s2;
    size_t l1, l2;
    dg_optim_state_get(a.o, k, &n1, &s1, &l1);
    dg_optim_state_get(b.o, k, &n2, &s2, &l2);
    CHECK(!strcmp(n1, n2));
    CHECK(same_floats(s1, s2, l1));
  }
  CHECK_EQ_INT(cb.step, 1234);
  CHECK_EQ_INT(dg_optim_step_count(b.o), 13);
  CHECK_NEAR(dg_optim_lr(b.o), dg_optim_lr(a.o), 0);
  uint64_t s1, o1, s2, o2;
  dg_ctx_rng_state(a.ctx, &s1, &o1);
  dg_ctx_rng_state(b.ctx, &s2, &o2);
  CHECK_EQ_INT(s1, s2);
  CHECK_EQ_INT(o1, o2);
  int64_t e1, b1, e2, b2;
  dg_loader_position(a.l, &e1, &b1);
  dg_loader_position(b.l, &e2, &b2);
  CHECK_EQ_INT(e1, 1);
  CHECK_EQ_INT(e1, e2);
  CHECK_EQ_INT(b1, b2);
  char v[64];
  CHECK_OK(dg_checkpoint_meta(g_path, "note", v, sizeof v, err, sizeof err));
  CHECK(!strcmp(v, "quote \" and \\ and \n newline"));
  CHECK_OK(dg_checkpoint_meta(g_path, "optim", v, sizeof v, err, sizeof err));
  CHECK(!strcmp(v, "adamw"));
  CHECK_EQ_INT(dg_checkpoint_meta(g_path, "nope", v, sizeof v, err, sizeof err), DG_ENOTFOUND);
  CHECK_EQ_INT(dg_checkpoint_meta(g_path, "note", v, 4, err, sizeof err), DG_EINVAL);
  /* weights only: optimizer tensors ignored, nothing else required */
  rig c;
  rig_new(&c, 32, 3, ds);
  dg_checkpoint cw = {c.ps, NULL, NULL, NULL, 0, 0, NULL, NULL};
  CHECK_OK(dg_checkpoint_load(g_path, &cw, err, sizeof err));
  CHECK(same_floats(pa, dg_params_data(c.ps, &nb), na));
  rig_free(&a);
  rig_free(&b);
  rig_free(&c);
}

/* Load `path` into a fresh hidden-32 rig; expect `code` and `msg` in the
 * error, and the parameters untouched. */
static void expect_refused_as(const char *path, int full, int code, const char *msg,
                              const dg_dataset *ds) {
  rig r;
  char err[512] = "";
  rig_new(&r, 32, 5, ds);
  size_t n;
  float *p = dg_params_data(r.ps, &n);
  float *before = malloc(n * sizeof *p);
  memcpy(before, p, n * sizeof *p);
  dg_checkpoint c = {r.ps, r.o, r.ctx, r.l, 0, 0, NULL, NULL};
  if (!full) c.optim = NULL, c.ctx = NULL, c.loader = NULL;
  int rc = dg_checkpoint_load(path, &c, err, sizeof err);
  if (rc != code) fprintf(stderr, "  (message: %s)\n", err);
  CHECK_EQ_INT(rc, code);
  CHECK_STR_HAS(err, msg);
  CHECK(same_floats(before, p, n));
  fprintf(stderr, "refused as expected: %s\n", err);
  free(before);
  rig_free(&r);
}

static void expect_refused(const char *path, int code, const char *msg, const dg_dataset *ds) {
  expect_refused_as(path, 1, code, msg, ds);
}

static void test_mismatch(const dg_dataset *ds) {
  char err[512], other[160];
  rig a;
  rig_new(&a, 64, 1, ds);
  dg_checkpoint ca = rig_ckpt(&a, 1);
  snprintf(other, sizeof other, "%s/wide.safetensors", g_dir);
  CHECK_OK(dg_checkpoint_save(other, &ca, err, sizeof err));
  expect_refused(other, DG_ESHAPE, "layers.0.weight: shape (64, 8) in file, (32, 8) in model", ds);
  rig_free(&a);
  /* a model with one more layer: layers.4.* missing from the file */
  dg_params *ps;
  REQUIRE(dg_params_new(&ps) == DG_OK);
  dg_module *m = ck_mlp(ps, 32, 1), *extra;
  REQUIRE(dg_nn_linear(&extra, 10, 10, 1) == DG_OK);
  dg_sequential_add(m, extra, NULL);
  REQUIRE(dg_module_bind(extra, ps, "layers.4", 1) == DG_OK);
  dg_checkpoint c = {ps, NULL, NULL, NULL, 0, 0, NULL, NULL};
  CHECK_OK(dg_checkpoint_save(other, &c, err, sizeof err));
  expect_refused_as(other, 0, DG_ENOTFOUND, "layers.4.weight: tensor in file, not in model", ds);
  dg_params *ps2;
  REQUIRE(dg_params_new(&ps2) == DG_OK);
  dg_module *m2 = ck_mlp(ps2, 32, 1);
  dg_checkpoint c2 = {ps2, NULL, NULL, NULL, 0, 0, NULL, NULL};
  CHECK_EQ_INT(dg_checkpoint_load(other, &c2, err, sizeof err), DG_ENOTFOUND);
  /* the other way round: the model wants layers.4.weight */
  CHECK_OK(dg_checkpoint_save(other, &c2, err, sizeof err));
  CHECK_EQ_INT(dg_checkpoint_load(other, &c, err, sizeof err), DG_ENOTFOUND);
  CHECK_STR_HAS(err, "layers.4.weight: in model, missing from file");
  /* saved without optimizer, loaded with one: its state is missing */
  expect_refused(other, DG_EMISMATCH, "optimizer (none) in file, adamw in the program", ds);
  dg_module_free(m);
  dg_module_free(m2);
  dg_params_free(ps);
  dg_params_free(ps2);
  /* optimizer kind */
  rig b;
  rig_new(&b, 32, 1, ds);
  dg_optim *sgd;
  dg_sgd_opts so = dg_sgd_defaults();
  so.momentum = 0.9f;
  REQUIRE(dg_optim_new_sgd(&sgd, b.ps, &so, NULL, 0) == DG_OK);
  dg_checkpoint cs = {b.ps, sgd, b.ctx, b.l, 0, 0, NULL, NULL};
  CHECK_OK(dg_checkpoint_save(other, &cs, err, sizeof err));
  expect_refused(other, DG_EMISMATCH, "optimizer sgd in file, adamw in the program", ds);
  /* the right kind, but a state tensor of another kind in the file */
  dg_optim *sgd2;
  REQUIRE(dg_optim_new_sgd(&sgd2, b.ps, NULL, NULL, 0) == DG_OK); /* no momentum: no state */
  dg_checkpoint c3 = {b.ps, sgd2, NULL, NULL, 0, 0, NULL, NULL};
  CHECK_EQ_INT(dg_checkpoint_load(other, &c3, err, sizeof err), DG_ENOTFOUND);
  CHECK_STR_HAS(err, "optim.momentum_buffer.layers.0.weight: the sgd optimizer has no such state");
  dg_optim_free(sgd2);
  dg_optim_free(sgd);
  rig_free(&b);
}

static void write_variant(const char *name, const char *src, size_t n, char *out, size_t cap) {
  snprintf(out, cap, "%s/%s", g_dir, name);
  ck_write_file(out, src, n);
}

/* Random byte edits of the header never crash the loader; an accepted edit
 * (e.g. a changed metadata digit) still loads. f: a valid file of n bytes
 * with header length hl; g: scratch of n bytes. */
static void fuzz_header(const char *f, char *g, size_t n, uint64_t hl, const dg_dataset *ds) {
  char err[512], p[160];
  uint32_t st = 12345;
  rig r;
  rig_new(&r, 32, 5, ds);
  int refused = 0;
  for (int it = 0; it < 1500; it++) {
    memcpy(g, f, n);
    for (int k = 0; k < 1 + it % 4; k++) {
      st = st * 1103515245u + 12345u;
      size_t at = 8 + (st >> 8) % hl;
      st = st * 1103515245u + 12345u;
      g[at] = (char)(st >> 16);
    }
    write_variant("fuzz", g, n, p, sizeof p);
    dg_checkpoint c = {r.ps, r.o, r.ctx, r.l, 0, 0, NULL, NULL};
    refused += dg_checkpoint_load(p, &c, err, sizeof err) != DG_OK;
  }
  rig_free(&r);
  CHECK(refused > 1000);
  fprintf(stderr, "header fuzz: %d of 1500 edited files refused, none crashed\n", refused);
}

static void test_corrupt(const dg_dataset *ds) {
  char err[512], p[160];
  rig a;
  rig_new(&a, 32, 1, ds);
  dg_checkpoint ca = rig_ckpt(&a, 1);
  CHECK_OK(dg_checkpoint_save(g_path, &ca, err, sizeof err));
  size_t n;
  char *f = ck_read_file(g_path, &n), *g = malloc(n + 16);
  uint64_t hl = 0;
  for (int i = 7; i >= 0; i--) hl = (hl << 8) | (uint8_t)f[i];
  CHECK_EQ_INT(hl % 8, 0);
  write_variant("empty", f, 0, p, sizeof p);
  expect_refused(p, DG_EFORMAT, "too short for the 8-byte header length", ds);
  write_variant("short", f, 5, p, sizeof p);
  expect_refused(p, DG_EFORMAT, "too short", ds);
  write_variant("in_header", f, 8 + hl / 2, p, sizeof p);
  expect_refused(p, DG_EFORMAT, "header length", ds);
  write_variant("in_data", f, n - 100, p, sizeof p);
  expect_refused(p, DG_EFORMAT, "truncated: tensors need", ds);
  memcpy(g, f, n);
  memcpy(g + n, "garbage!", 8);
  write_variant("trailing", g, n + 8, p, sizeof p);
  expect_refused(p, DG_EFORMAT, "trailing data", ds);
  memcpy(g, f, n);
  g[7] = 0x7f;
  write_variant("huge_len", g, n, p, sizeof p);
  expect_refused(p, DG_EFORMAT, "header length", ds);
  memcpy(g, f, n);
  *strchr(g + 8, ':') = ';';
  write_variant("bad_json", g, n, p, sizeof p);
  expect_refused(p, DG_EFORMAT, "header JSON: expected ':' at byte", ds);
  memcpy(g, f, n);
  memcpy(strstr(g + 8, "\"F32\""), "\"F16\"", 5);
  write_variant("dtype", g, n, p, sizeof p);
  expect_refused(p, DG_EDTYPE, "layers.0.weight: dtype F16 in file, F32 in model", ds);
  memcpy(g, f, n);
  char *off = strstr(g + 8, "\"data_offsets\":[0,");
  REQUIRE(off != NULL);
  off[16] = '4'; /* begin 0 -> 4: wrong byte size */
  write_variant("offsets", g, n, p, sizeof p);
  expect_refused(p, DG_EFORMAT, "layers.0.weight: data_offsets [4, ", ds);
  memcpy(g, f, n);
  memcpy(strstr(g + 8, "\"shape\":["), "\"shapx\":[", 9);
  write_variant("no_shape", g, n, p, sizeof p);
  expect_refused(p, DG_EFORMAT, "layers.0.weight: entry lacks \"shape\"", ds);
  /* every prefix of the header fails cleanly, whatever the cut */
  for (size_t cut = 0; cut < 8 + hl; cut += 7) {
    write_variant("prefix", f, cut, p, sizeof p);
    rig r;
    rig_new(&r, 32, 5, ds);
    dg_checkpoint c = {r.ps, r.o, r.ctx, r.l, 0, 0, NULL, NULL};
    CHECK_EQ_INT(dg_checkpoint_load(p, &c, err, sizeof err), DG_EFORMAT);
    rig_free(&r);
  }
  fuzz_header(f, g, n, hl, ds);
  snprintf(p, sizeof p, "%s/does_not_exist", g_dir);
  expect_refused(p, DG_EIO, "does_not_exist: cannot open", ds);
  free(f);
  free(g);
  rig_free(&a);
}

static void fill_params(dg_params *ps, float v) {
  for (int k = 0; k < dg_params_count(ps); k++) {
    dg_tensor *t = dg_params_get(ps, k);
    float *p = dg_tensor_data(t);
    for (int64_t i = 0; i < dg_tensor_numel(t); i++) p[i] = v;
  }
}

static int count_tmp_files(void) {
  DIR *d = opendir(g_dir);
  int k = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strstr(e->d_name, ".tmp.")) k++;
  closedir(d);
  return k;
}

/* Loads g_path; returns the value every parameter holds, or NAN when the
 * parameters are not all equal or the load fails. */
static float load_uniform(dg_params *ps) {
  char err[512];
  fill_params(ps, -1.0f);
  dg_checkpoint c = {ps, NULL, NULL, NULL, 0, 0, NULL, NULL};
  int rc = dg_checkpoint_load(g_path, &c, err, sizeof err);
  if (rc) {
    fprintf(stderr, "load after crash: %s\n", err);
    return NAN;
  }
  float v0 = *(float *)dg_tensor_data(dg_params_get(ps, 0));
  for (int k = 0; k < dg_params_count(ps); k++) {
    dg_tensor *t = dg_params_get(ps, k);
    float *p = dg_tensor_data(t);
    for (int64_t i = 0; i < dg_tensor_numel(t); i++)
      if (p[i] != v0) return NAN;
  }
  return v0;
}

static void test_atomic(void) {
  char err[512];
  dg_params *ps;
  REQUIRE(dg_params_new(&ps) == DG_OK);
  dg_module *m = ck_mlp(ps, 4096, 1); /* ~200k floats: 0.8 MB */
  fill_params(ps, 1.0f);
  dg_checkpoint c = {ps, NULL, NULL, NULL, 7, 0, NULL, NULL};
  CHECK_OK(dg_checkpoint_save(g_path, &c, err, sizeof err));
  /* injected write error: the file size limit cuts the new file short */
  fill_params(ps, 2.0f);
  struct rlimit old, lim;
  getrlimit(RLIMIT_FSIZE, &old);
  lim = old;
  lim.rlim_cur = 64 * 1024;
  signal(SIGXFSZ, SIG_IGN);
  REQUIRE(setrlimit(RLIMIT_FSIZE, &lim) == 0);
  int rc = dg_checkpoint_save(g_path, &c, err, sizeof err);
  setrlimit(RLIMIT_FSIZE, &old);
  CHECK_EQ_INT(rc, DG_EIO);
  CHECK_STR_HAS(err, "cannot write it");
  CHECK_STR_HAS(err, "previous checkpoint, if any, is intact");
  fprintf(stderr, "injected failure: %s\n", err);
  CHECK_EQ_INT(count_tmp_files(), 0);
  CHECK(load_uniform(ps) == 1.0f);
  /* SIGKILL at a random moment while a child rewrites the file in a loop:
   * the file always loads and holds one complete version */
  srand((unsigned)time(NULL));
  for (int round = 0; round < 6; round++) {
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      for (int k = 0;; k++) {
        fill_params(ps, (float)(k % 2 ? 3 : 4));
        if (dg_checkpoint_save(g_path, &c, err, sizeof err)) _exit(3);
      }
    }
    usleep((useconds_t)(2000 + rand() % 30000));
    kill(pid, SIGKILL);
    int st;
    waitpid(pid, &st, 0);
    CHECK(WIFSIGNALED(st));
    float v = load_uniform(ps);
    CHECK(v == 1.0f || v == 3.0f || v == 4.0f);
    /* a killed writer may leave its temporary file; never a torn checkpoint */
    DIR *d = opendir(g_dir);
    struct dirent *e;
    char tp[400];
    while ((e = readdir(d)))
      if (strstr(e->d_name, ".tmp.")) snprintf(tp, sizeof tp, "%s/%s", g_dir, e->d_name), unlink(tp);
    closedir(d);
  }
  dg_module_free(m);
  dg_params_free(ps);
}

/* Loading allocates nothing near the size of the file. */
static size_t g_max_alloc;
static void *big_malloc(size_t n) {
  if (n > g_max_alloc) g_max_alloc = n;
  return malloc(n);
}
static void *big_realloc(void *p, size_t n) {
  if (n > g_max_alloc) g_max_alloc = n;
  return realloc(p, n);
}

static void test_streaming(void) {
  char err[512];
  dg_params *ps;
  REQUIRE(dg_params_new(&ps) == DG_OK);
  dg_module *m = ck_mlp(ps, 65536, 1); /* 1.2M floats: 4.7 MB */
  dg_checkpoint c = {ps, NULL, NULL, NULL, 0, 0, NULL, NULL};
  CHECK_OK(dg_checkpoint_save(g_path, &c, err, sizeof err));
  REQUIRE(dg_set_allocator(big_malloc, big_realloc, free) == DG_OK);
  g_max_alloc = 0;
  CHECK_OK(dg_checkpoint_load(g_path, &c, err, sizeof err));
  REQUIRE(dg_set_allocator(NULL, NULL, NULL) == DG_OK);
  CHECK(g_max_alloc < 64 * 1024);
  fprintf(stderr, "largest allocation while loading a 4.7 MB checkpoint: %zu bytes\n",
          g_max_alloc);
  dg_module_free(m);
  dg_params_free(ps);
}

static void cleanup(void) {
  DIR *d = opendir(g_dir);
  struct dirent *e;
  char p[400];
  while ((e = readdir(d)))
    if (e->d_name[0] != '.') snprintf(p, sizeof p, "%s/%s", g_dir, e->d_name), unlink(p);
  closedir(d);
  rmdir(g_dir);
}

int main(void) {
  snprintf(g_dir, sizeof g_dir, "/tmp/dg_ckpt_XXXXXX");
  REQUIRE(mkdtemp(g_dir) != NULL);
  snprintf(g_path, sizeof g_path, "%s/model.safetensors", g_dir);
  dg_dataset ds = synth(100);
  test_roundtrip(&ds);
  test_mismatch(&ds);
  test_corrupt(&ds);
  test_atomic();
  test_streaming();
  cleanup();
  return TEST_DONE();
}
