/* Failures of swapping are clean errors: an injected write or read error
 * (pwrite/pread interposed in this binary), a full file system (a 1 MiB
 * tmpfs; skipped where mount(2) is not allowed), and API misuse. Each names
 * the swap file and the saved tensor, fails the op or the backward (never
 * an abort, never a gradient from data that did not come back), and a
 * later step on the same context works again.
 *
 * usage: test_swap_fault write|read|enospc|api */
#include <dlfcn.h>
#include <errno.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include "swap_util.h"

static volatile int fail_write, fail_read; /* errno to inject, 0: none */

typedef ssize_t (*rw_fn)(int, void *, size_t, off_t);

static ssize_t inject(const char *name, int err, int fd, void *p, size_t n, off_t off) {
  if (err) {
    errno = err;
    return -1;
  }
  rw_fn real = (rw_fn)dlsym(RTLD_NEXT, name);
  return real(fd, p, n, off);
}

/* With _FILE_OFFSET_BITS=64 (the build's) these define pwrite64 and
 * pread64, what the library calls. */
ssize_t pwrite(int fd, const void *p, size_t n, off_t off) {
  return inject("pwrite64", fail_write, fd, (void *)p, n, off);
}
ssize_t pread(int fd, void *p, size_t n, off_t off) {
  return inject("pread64", fail_read, fd, p, n, off);
}

/* One step: DG_OK, or the first error (message in dg_ctx_errmsg). */
static int step(sw_model *m, dg_ctx *ctx) {
  dg_params_zero_grad(m->ps);
  dg_tensor *l = sw_loss(m, ctx);
  int rc = l ? dg_backward(ctx, l) : dg_ctx_errcode(ctx);
  if (rc) fprintf(stderr, "step failed (expected): %s\n", dg_ctx_errmsg(ctx));
  return rc;
}

static void check_named(dg_ctx *ctx, const char *dir, const char *what) {
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), what);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), dir);          /* the file */
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "saved tensor"); /* the tensor: op, node, shape */
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), " of node ");
}

/* A fault while swapping, then recovery: the next step's gradients equal
 * a reference context's. */
static void io_fault(int write_side) {
  sw_model m;
  REQUIRE(sw_gpt_new(&m, 16, 2) == DG_OK);
  dg_ctx *ctx = NULL, *ref = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK && dg_ctx_new(&ref, NULL) == DG_OK);
  dg_swap_opts o;
  sw_opts("file", 2, &o);
  REQUIRE(dg_ctx_set_swap(ctx, &o) == DG_OK);
  CHECK_OK(step(&m, ctx)); /* warm: the file has its size */
  dg_ctx_reset(ctx);
  if (write_side) fail_write = EIO;
  else fail_read = EIO;
  int rc = step(&m, ctx);
  fail_write = fail_read = 0;
  CHECK_EQ_INT(rc, DG_EIO);
  check_named(ctx, sw_dir, write_side ? "writing" : "reading back");
  dg_ctx_reset(ctx);
  size_t n;
  float *g = dg_params_grad(m.ps, &n);
  float *want = malloc(n * sizeof *want);
  REQUIRE(want);
  CHECK_OK(step(&m, ref));
  memcpy(want, dg_params_grad(m.ps, &n), n * sizeof *want);
  CHECK_OK(step(&m, ctx)); /* the context works again */
  g = dg_params_grad(m.ps, &n);
  CHECK(memcmp(g, want, n * sizeof *want) == 0);
  free(want);
  dg_ctx_free(ctx);
  dg_ctx_free(ref);
  sw_free(&m);
}

static int enospc(void) {
  char dir[64];
  snprintf(dir, sizeof dir, "/tmp/dgswap-full-XXXXXX");
  REQUIRE(mkdtemp(dir));
  if (mount("dgswap", dir, "tmpfs", 0, "size=1m")) {
    fprintf(stderr, "mount tmpfs: %s: skipped\n", strerror(errno));
    rmdir(dir);
    return 77;
  }
  sw_model m;
  REQUIRE(sw_gpt_new(&m, 16, 2) == DG_OK); /* about 10 MiB of saved tensors */
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  dg_swap_opts o;
  sw_opts("file", 2, &o);
  o.dir = dir;
  REQUIRE(dg_ctx_set_swap(ctx, &o) == DG_OK);
  int rc = step(&m, ctx);
  CHECK_EQ_INT(rc, DG_EIO);
  check_named(ctx, dir, "No space left on device");
  dg_ctx_reset(ctx);
  REQUIRE(dg_ctx_set_swap(ctx, NULL) == DG_OK); /* closes the file */
  CHECK_OK(step(&m, ctx));                      /* without swapping it trains */
  dg_ctx_free(ctx);
  sw_free(&m);
  CHECK(umount(dir) == 0);
  rmdir(dir);
  return TEST_DONE();
}

static void *upack(void *u, dg_ctx *c, dg_tensor *t) { (void)u, (void)c; return t; }
static dg_tensor *uunpack(void *u, dg_ctx *c, void *h) { (void)u, (void)c; return h; }

static void api(void) {
  sw_model m;
  REQUIRE(sw_mlp_new(&m, 256) == DG_OK);
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  dg_swap_opts o;
  dg_swap_opts_init(&o);
  CHECK_EQ_INT(o.lookahead, 2);
  CHECK_EQ_INT(dg_ctx_set_swap(ctx, &o), DG_EINVAL); /* no target */
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "target");
  o.target = DG_SWAP_HOST;
  CHECK_EQ_INT(dg_ctx_set_swap(ctx, &o), DG_EUNSUPPORTED);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "CUDA");
  o.target = DG_SWAP_FILE;
  o.dir = "/nonexistent/dgswap";
  CHECK_EQ_INT(dg_ctx_set_swap(ctx, &o), DG_EIO);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "/nonexistent/dgswap");
  o.dir = sw_tmpdir();
  o.lookahead = -1;
  CHECK_EQ_INT(dg_ctx_set_swap(ctx, &o), DG_EINVAL);
  o.lookahead = 1;
  o.min_bytes = 64 << 10;
  o.staging_bytes = 256 << 10; /* forward waits for the stores: the counts below are exact */
  dg_ctx_clear_error(ctx);
  /* user hooks and swapping exclude each other */
  int id = dg_ctx_set_saved_tensor_hooks(ctx, upack, uunpack, NULL);
  CHECK(id > 0);
  CHECK_EQ_INT(dg_ctx_set_swap(ctx, &o), DG_ESTATE);
  CHECK_OK(dg_ctx_remove_hook(ctx, id));
  CHECK_OK(dg_ctx_set_swap(ctx, &o));
  CHECK_EQ_INT(dg_ctx_set_saved_tensor_hooks(ctx, upack, uunpack, NULL), DG_ESTATE);
  /* not while a tape is pending */
  dg_tensor *l = sw_loss(&m, ctx);
  REQUIRE(l);
  CHECK_EQ_INT(dg_ctx_set_swap(ctx, NULL), DG_ESTATE);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "tape");
  CHECK_OK(dg_backward(ctx, l));
  CHECK_EQ_INT(dg_ctx_set_swap(ctx, NULL), DG_ESTATE); /* tensors still out: reset first */
  dg_ctx_reset(ctx);
  /* scope off: nothing saved in it goes out */
  dg_ctx_swap_stats_reset(ctx);
  CHECK_EQ_INT(dg_ctx_swap_scope(ctx, 0), 1);
  CHECK_OK(step(&m, ctx));
  dg_swap_stats st;
  CHECK_OK(dg_ctx_swap_stats(ctx, &st));
  CHECK_EQ_INT(st.tensors_out, 0);
  CHECK_EQ_INT(dg_ctx_swap_scope(ctx, 1), 0);
  dg_ctx_reset(ctx);
  CHECK_OK(step(&m, ctx));
  CHECK_OK(dg_ctx_swap_stats(ctx, &st));
  CHECK(st.tensors_out > 0);
  dg_ctx_reset(ctx);
  CHECK_OK(dg_ctx_set_swap(ctx, NULL));
  CHECK_EQ_INT(dg_ctx_swap_scope(ctx, 1), 0); /* off: no scope */
  dg_ctx_free(ctx);
  sw_free(&m);
}

/* A tensor read through dg_tensor_data after forward (its pages released
 * meanwhile) reads forward's values, before and after backward. */
static void raw_read(void) {
  sw_model m;
  REQUIRE(sw_mlp_new(&m, 256) == DG_OK);
  dg_ctx *ctx = NULL, *ref = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK && dg_ctx_new(&ref, NULL) == DG_OK);
  dg_swap_opts o;
  sw_opts("file", 2, &o);
  REQUIRE(dg_ctx_set_swap(ctx, &o) == DG_OK);
  int64_t xs[2] = {m.B, SW_MLP_IN};
  dg_tensor *h[2];
  dg_ctx *cs[2] = {ref, ctx};
  for (int k = 0; k < 2; k++) { /* the first hidden activation, then many ops */
    dg_tensor *x = dg_wrap(cs[k], DG_F32, 2, xs, m.x);
    h[k] = dg_gelu(cs[k], dg_linear(cs[k], x, dg_params_get(m.ps, 0), dg_params_get(m.ps, 1)));
    dg_tensor *y = h[k];
    for (int j = 0; j < 12; j++) y = dg_tanh(cs[k], y);
    REQUIRE(y && dg_backward(cs[k], dg_sum(cs[k], y)) == DG_OK);
  }
  dg_swap_stats st;
  CHECK_OK(dg_ctx_swap_stats(ctx, &st));
  CHECK(st.tensors_out > 0);
  size_t bytes = (size_t)m.B * SW_MLP_HID * sizeof(float);
  CHECK(memcmp(dg_tensor_data(h[0]), dg_tensor_data(h[1]), bytes) == 0);
  dg_ctx_free(ctx);
  dg_ctx_free(ref);
  sw_free(&m);
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  sw_tmpdir();
  if (!strcmp(argv[1], "enospc")) {
    int rc = enospc();
    sw_rmdir();
    return rc;
  }
  if (!strcmp(argv[1], "write")) io_fault(1);
  else if (!strcmp(argv[1], "read")) io_fault(0);
  else if (!strcmp(argv[1], "api")) api(), raw_read();
  else return 2;
  sw_rmdir();
  return TEST_DONE();
}
