/* Store buffers and the BatchNorm modules: buffers are not parameters
 * (count, lookups, gradients, optimizers, clipping leave them alone), names
 * are shared and unique, checkpoints save and restore them by name and
 * refuse a file that lacks one, the modules' constructor checks and
 * errors, and the running statistics follow the module's and the ctx's
 * train flags. */
#include <unistd.h>

#include "dgrad.h"
#include "tests/test.h"

/* conv-free model: BatchNorm2d(3) -> flatten -> Linear(3*2*2, 2) */
static dg_module *model(void) {
  dg_module *seq, *bn, *fl, *lin;
  REQUIRE(dg_nn_sequential(&seq) == DG_OK);
  REQUIRE(dg_nn_batchnorm2d(&bn, 3, 1e-5f, 0.1f) == DG_OK);
  REQUIRE(dg_nn_flatten(&fl) == DG_OK);
  REQUIRE(dg_nn_linear(&lin, 12, 2, 1) == DG_OK);
  REQUIRE(dg_sequential_add(seq, bn, "bn") == DG_OK);
  REQUIRE(dg_sequential_add(seq, fl, NULL) == DG_OK);
  REQUIRE(dg_sequential_add(seq, lin, "fc") == DG_OK);
  return seq;
}

static dg_tensor *batch(dg_ctx *ctx, int k) {
  float x[5 * 12];
  dg_rng_normal(99, (uint64_t)k * 60, x, 60);
  for (int i = 0; i < 60; i++) x[i] = 2.0f * x[i] + 1.0f;
  return dg_from_data(ctx, DG_F32, 4, (int64_t[]){5, 3, 2, 2}, x);
}

static void buffers_api(void) {
  dg_params *ps;
  dg_tensor *p, *b, *b2;
  REQUIRE(dg_params_new(&ps) == DG_OK);
  REQUIRE(dg_params_add(ps, "w", 1, (int64_t[]){5}, &p) == DG_OK);
  REQUIRE(dg_params_add_buffer(ps, "stat", 2, (int64_t[]){2, 3}, &b) == DG_OK);
  REQUIRE(dg_params_add_buffer(ps, "stat2", 1, (int64_t[]){40}, &b2) == DG_OK);
  CHECK_EQ_INT(dg_params_count(ps), 1);
  CHECK_EQ_INT(dg_params_buffer_count(ps), 2);
  CHECK(dg_params_find(ps, "stat") == NULL);
  CHECK(dg_params_buffer_find(ps, "stat") == b);
  CHECK(dg_params_buffer_get(ps, 1) == b2 && dg_params_buffer_get(ps, 2) == NULL);
  CHECK(!strcmp(dg_tensor_name(b), "stat"));
  CHECK_EQ_INT(dg_tensor_param_index(b), -1);
  CHECK(dg_tensor_param_store(b) == NULL);
  CHECK(!dg_tensor_requires_grad(b));
  dg_tensor_set_requires_grad(b, 1); /* refused: a buffer takes no gradient */
  CHECK(!dg_tensor_requires_grad(b));
  dg_tensor_free(b); /* the store's: a no-op */
  CHECK_EQ_INT(dg_tensor_numel(b), 6);
  CHECK_EQ_INT(dg_params_add_buffer(ps, "w", 1, (int64_t[]){1}, NULL), DG_EINVAL);
  CHECK_STR_HAS(dg_params_errmsg(ps), "duplicate name \"w\" (a parameter has it)");
  CHECK_EQ_INT(dg_params_add_buffer(ps, "stat", 1, (int64_t[]){1}, NULL), DG_EINVAL);
  CHECK_EQ_INT(dg_params_add(ps, "stat2", 1, (int64_t[]){1}, NULL), DG_EINVAL);
  CHECK_STR_HAS(dg_params_errmsg(ps), "\"stat2\" is the name of a buffer");
  CHECK_EQ_INT(dg_params_add_buffer(ps, "", 1, (int64_t[]){1}, NULL), DG_EINVAL);
  CHECK_EQ_INT(dg_params_add_buffer(ps, "neg", 1, (int64_t[]){-1}, NULL), DG_EINVAL);
  /* values start at zero; the flat buffer holds both, padded */
  size_t n = 0;
  float *flat = dg_params_buffer_data(ps, &n);
  CHECK(flat == dg_tensor_data(b) && n >= 46);
  for (size_t i = 0; i < n; i++) CHECK(flat[i] == 0);
  /* many buffers: the flat buffer moves, handles stay */
  for (int i = 0; i < 100; i++) {
    char nm[16];
    snprintf(nm, sizeof nm, "s%d", i);
    REQUIRE(dg_params_add_buffer(ps, nm, 1, (int64_t[]){17}, NULL) == DG_OK);
  }
  CHECK(dg_tensor_data(b) == dg_params_buffer_data(ps, NULL));
  CHECK(!strcmp(dg_tensor_name(dg_params_buffer_get(ps, 101)), "s99"));
  dg_params_free(ps);
}

/* Optimizers, clipping and zero_grad leave buffers alone. */
static void optimizers(void) {
  dg_ctx *ctx;
  dg_params *ps;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK && dg_params_new(&ps) == DG_OK);
  dg_module *m = model();
  REQUIRE(dg_module_bind(m, ps, "", 3) == DG_OK);
  CHECK_EQ_INT(dg_params_count(ps), 4); /* bn.weight, bn.bias, fc.weight, fc.bias */
  CHECK_EQ_INT(dg_params_buffer_count(ps), 2);
  dg_tensor *rm = dg_params_buffer_find(ps, "bn.running_mean");
  dg_tensor *rv = dg_params_buffer_find(ps, "bn.running_var");
  REQUIRE(rm && rv);
  const char *names[4] = {"sgd", "adamw", "lamb", "lars"};
  for (int k = 0; k < 4; k++) {
    dg_optim *o = NULL;
    if (k == 0) {
      dg_sgd_opts s = dg_sgd_defaults();
      s.lr = 0.1f, s.momentum = 0.9f, s.weight_decay = 0.1f;
      REQUIRE(dg_optim_new_sgd(&o, ps, &s, NULL, 0) == DG_OK);
    } else if (k == 1) {
      dg_adamw_opts a = dg_adamw_defaults();
      a.weight_decay = 0.5f;
      REQUIRE(dg_optim_new_adamw(&o, ps, &a, NULL, 0) == DG_OK);
    } else if (k == 2) {
      dg_lamb_opts a = dg_lamb_defaults();
      REQUIRE(dg_optim_new_lamb(&o, ps, &a, NULL, 0) == DG_OK);
    } else {
      dg_lars_opts l = dg_lars_defaults();
      REQUIRE(dg_optim_new_lars(&o, ps, &l, NULL, 0) == DG_OK);
    }
    dg_params_zero_grad(ps);
    dg_tensor *y = dg_module_forward(m, ctx, batch(ctx, k));
    REQUIRE(y && dg_backward(ctx, dg_mean(ctx, dg_mul(ctx, y, y))) == DG_OK);
    float before[6];
    memcpy(before, dg_tensor_data(rm), 3 * sizeof(float));
    memcpy(before + 3, dg_tensor_data(rv), 3 * sizeof(float));
    double norm = 0;
    CHECK_OK(dg_clip_grad_norm(ps, 1e-3, &norm));
    CHECK_OK(dg_optim_step(o));
    CHECK(!memcmp(before, dg_tensor_data(rm), 3 * sizeof(float)));
    CHECK(!memcmp(before + 3, dg_tensor_data(rv), 3 * sizeof(float)));
    if (memcmp(before, dg_tensor_data(rm), 3 * sizeof(float))) fprintf(stderr, "%s\n", names[k]);
    dg_optim_free(o);
    dg_ctx_reset(ctx);
  }
  /* the running statistics moved once per forward (4 training batches) */
  CHECK(dg_tensor_get(rm, 0) != 0 && dg_tensor_get(rv, 0) != 1);
  dg_module_free(m);
  dg_params_free(ps);
  dg_ctx_free(ctx);
}

/* Save after some training, load into a fresh model: the running
 * statistics come back (and the eval output with them). */
static void checkpoint(void) {
  char dir[] = "/tmp/dg_bn_ckpt_XXXXXX", path[64], err[512];
  REQUIRE(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/bn.safetensors", dir);
  dg_ctx *ctx;
  dg_params *a, *b;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK && dg_params_new(&a) == DG_OK &&
          dg_params_new(&b) == DG_OK);
  dg_module *ma = model(), *mb = model();
  REQUIRE(dg_module_bind(ma, a, "", 3) == DG_OK && dg_module_bind(mb, b, "", 4) == DG_OK);
  for (int k = 0; k < 3; k++) {
    REQUIRE(dg_module_forward(ma, ctx, batch(ctx, k)));
    dg_ctx_reset(ctx);
  }
  dg_checkpoint ck = {.params = a};
  REQUIRE(dg_checkpoint_save(path, &ck, err, sizeof err) == DG_OK);
  dg_checkpoint cl = {.params = b};
  CHECK_OK(dg_checkpoint_load(path, &cl, err, sizeof err));
  size_t na, nb;
  float *fa = dg_params_buffer_data(a, &na), *fb = dg_params_buffer_data(b, &nb);
  CHECK(na == nb && !memcmp(fa, fb, na * sizeof(float)));
  CHECK(fa[0] != 0); /* trained: not the initial values */
  float *pa = dg_params_data(a, &na), *pb = dg_params_data(b, &nb);
  CHECK(na == nb && !memcmp(pa, pb, na * sizeof(float)));
  dg_module_set_train(ma, 0);
  dg_module_set_train(mb, 0);
  dg_tensor *x = batch(ctx, 9);
  dg_tensor *ya = dg_module_forward(ma, ctx, x), *yb = dg_module_forward(mb, ctx, x);
  REQUIRE(ya && yb);
  CHECK(!memcmp(dg_tensor_data(ya), dg_tensor_data(yb), 10 * sizeof(float)));
  /* the file names the buffers as torch's state_dict does */
  char v[8];
  CHECK_EQ_INT(dg_checkpoint_meta(path, "format", v, sizeof v, err, sizeof err), DG_OK);
  FILE *f = fopen(path, "rb");
  REQUIRE(f);
  char hdr[4096] = {0};
  CHECK(fread(hdr, 1, sizeof hdr - 1, f) > 0);
  fclose(f);
  CHECK(memmem(hdr, sizeof hdr, "\"bn.running_mean\"", 17) != NULL);
  CHECK(memmem(hdr, sizeof hdr, "\"bn.running_var\"", 16) != NULL);
  /* a model with a buffer the file lacks is refused, naming it */
  dg_params *c;
  REQUIRE(dg_params_new(&c) == DG_OK);
  dg_module *mc = model();
  REQUIRE(dg_module_bind(mc, c, "", 3) == DG_OK);
  REQUIRE(dg_params_add_buffer(c, "extra.stat", 1, (int64_t[]){2}, NULL) == DG_OK);
  dg_checkpoint cc = {.params = c};
  CHECK_EQ_INT(dg_checkpoint_load(path, &cc, err, sizeof err), DG_ENOTFOUND);
  CHECK_STR_HAS(err, "extra.stat: buffer in model, missing from file");
  /* and a buffer of another shape */
  dg_params *d;
  REQUIRE(dg_params_new(&d) == DG_OK);
  REQUIRE(dg_params_add(d, "bn.weight", 1, (int64_t[]){3}, NULL) == DG_OK);
  REQUIRE(dg_params_add(d, "bn.bias", 1, (int64_t[]){3}, NULL) == DG_OK);
  REQUIRE(dg_params_add(d, "fc.weight", 2, (int64_t[]){2, 12}, NULL) == DG_OK);
  REQUIRE(dg_params_add(d, "fc.bias", 1, (int64_t[]){2}, NULL) == DG_OK);
  REQUIRE(dg_params_add_buffer(d, "bn.running_mean", 1, (int64_t[]){4}, NULL) == DG_OK);
  REQUIRE(dg_params_add_buffer(d, "bn.running_var", 1, (int64_t[]){3}, NULL) == DG_OK);
  dg_checkpoint cd = {.params = d};
  CHECK_EQ_INT(dg_checkpoint_load(path, &cd, err, sizeof err), DG_ESHAPE);
  CHECK_STR_HAS(err, "bn.running_mean: shape (3,) in file, (4,) in model");
  unlink(path);
  rmdir(dir);
  dg_module_free(ma);
  dg_module_free(mb);
  dg_module_free(mc);
  dg_params_free(a);
  dg_params_free(b);
  dg_params_free(c);
  dg_params_free(d);
  dg_ctx_free(ctx);
}

static void modules(void) {
  dg_module *m;
  CHECK_EQ_INT(dg_nn_batchnorm2d(&m, 0, 1e-5f, 0.1f), DG_EINVAL);
  CHECK(m == NULL);
  CHECK_EQ_INT(dg_nn_batchnorm1d(&m, 3, -1, 0.1f), DG_EINVAL);
  CHECK_EQ_INT(dg_nn_batchnorm1d(&m, 3, 1e-5f, 1.5f), DG_EINVAL);
  CHECK_EQ_INT(dg_nn_batchnorm1d(NULL, 3, 1e-5f, 0.1f), DG_EINVAL);
  dg_ctx *ctx;
  dg_params *ps;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK && dg_params_new(&ps) == DG_OK);
  REQUIRE(dg_nn_batchnorm1d(&m, 3, 1e-5f, 0.1f) == DG_OK);
  CHECK(!strcmp(dg_module_type(m), "BatchNorm1d"));
  dg_tensor *x = dg_zeros(ctx, DG_F32, 2, (int64_t[]){4, 3});
  CHECK(dg_module_forward(m, ctx, x) == NULL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "forward before dg_module_bind");
  dg_ctx_clear_error(ctx);
  REQUIRE(dg_module_bind(m, ps, "norm", 1) == DG_OK);
  CHECK(dg_module_forward(m, ctx, dg_zeros(ctx, DG_F32, 4, (int64_t[]){2, 3, 2, 2})) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_ESHAPE);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "norm (BatchNorm1d): expected x (N, C) or (N, C, L), got "
                "(2, 3, 2, 2)");
  dg_ctx_clear_error(ctx);
  CHECK(dg_module_forward(m, ctx, dg_zeros(ctx, DG_F32, 2, (int64_t[]){4, 5})) == NULL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "norm (BatchNorm1d): batchnorm: x (4, 5) has 5 channels");
  dg_ctx_clear_error(ctx);
  /* grad mode off still updates the running statistics in training (as
   * torch); eval by either flag does not */
  dg_tensor *rm = dg_params_buffer_find(ps, "norm.running_mean");
  float ones[12];
  for (int i = 0; i < 12; i++) ones[i] = (float)(i % 2);
  x = dg_from_data(ctx, DG_F32, 2, (int64_t[]){4, 3}, ones);
  dg_ctx_set_grad_enabled(ctx, 0);
  REQUIRE(dg_module_forward(m, ctx, x));
  float v = (float)dg_tensor_get(rm, 0);
  CHECK(v != 0);
  dg_ctx_set_train(ctx, 0);
  REQUIRE(dg_module_forward(m, ctx, x));
  dg_ctx_set_train(ctx, 1);
  dg_module_set_train(m, 0);
  REQUIRE(dg_module_forward(m, ctx, x));
  CHECK(dg_tensor_get(rm, 0) == v);
  /* binding twice: the names are taken */
  CHECK_EQ_INT(dg_module_bind(m, ps, "norm", 1), DG_EINVAL);
  CHECK_STR_HAS(dg_params_errmsg(ps), "norm.weight");
  dg_module_free(m);
  dg_params_free(ps);
  dg_ctx_free(ctx);
}

int main(void) {
  buffers_api();
  optimizers();
  checkpoint();
  modules();
  return TEST_DONE();
}
