/* Partial and renamed checkpoint loads (dg_checkpoint_load_with, torch's
 * load_state_dict(strict=False) with a key map): a backbone into a bigger
 * model (missing tensors keep their values), a bigger file into a smaller
 * model (unexpected tensors skipped), a prefix map and a rename callback
 * (with optimizer state), dropped names, and what stays refused: strict
 * loads with every mismatch counted and reported, shape mismatches,
 * duplicates after renaming, bad options. */
#include <unistd.h>

#include "ckpt_util.h"

static char g_dir[64], g_path[128];

typedef struct {
  int n;
  char names[16][64];
  dg_ckpt_diff what[16];
} seen;

static void record(void *user, dg_ckpt_diff what, const char *name) {
  seen *s = user;
  if (s->n < 16) {
    snprintf(s->names[s->n], sizeof s->names[0], "%s", name);
    s->what[s->n] = what;
  }
  s->n++;
}

static int saw(const seen *s, dg_ckpt_diff what, const char *name) {
  for (int i = 0; i < s->n && i < 16; i++)
    if (s->what[i] == what && !strcmp(s->names[i], name)) return 1;
  return 0;
}

/* The values of parameter `name` of ps, copied (malloc). */
static float *values(dg_params *ps, const char *name) {
  dg_tensor *t = dg_params_find(ps, name);
  REQUIRE(t != NULL);
  size_t n = (size_t)dg_tensor_numel(t);
  float *v = malloc(n * sizeof *v);
  memcpy(v, dg_tensor_data(t), n * sizeof *v);
  return v;
}

static int same_param(dg_params *a, const char *na, dg_params *b, const char *nb) {
  dg_tensor *x = dg_params_find(a, na), *y = dg_params_find(b, nb);
  REQUIRE(x && y && dg_tensor_numel(x) == dg_tensor_numel(y));
  return !memcmp(dg_tensor_data(x), dg_tensor_data(y), (size_t)dg_tensor_numel(x) * 4);
}

/* ck_mlp under "layers" plus Linear(10, 3) under "head". */
static dg_module *bigger(dg_params *ps, uint64_t seed, dg_module **head) {
  dg_module *m = ck_mlp(ps, 32, seed);
  REQUIRE(dg_nn_linear(head, 10, 3, 1) == DG_OK);
  REQUIRE(dg_module_bind(*head, ps, "head", seed) == DG_OK);
  return m;
}

static void save(dg_params *ps, dg_optim *o) {
  char err[512];
  dg_checkpoint c = {ps, o, NULL, NULL, 0, 0, NULL, NULL};
  CHECK_OK(dg_checkpoint_save(g_path, &c, err, sizeof err));
}

/* A backbone into a bigger model; strict refuses it, naming and counting. */
static void test_missing(void) {
  char err[512];
  dg_params *small, *big;
  REQUIRE(dg_params_new(&small) == DG_OK && dg_params_new(&big) == DG_OK);
  dg_module *ms = ck_mlp(small, 32, 1), *head, *mb = bigger(big, 2, &head);
  save(small, NULL);
  float *head_w = values(big, "head.weight"), *l0 = values(big, "layers.0.weight");
  seen s = {0};
  dg_checkpoint c = {big, NULL, NULL, NULL, 0, 0, NULL, NULL};
  dg_checkpoint_load_opts o = {0};
  o.report = record, o.report_user = &s;
  CHECK_EQ_INT(dg_checkpoint_load_with(g_path, &c, &o, err, sizeof err), DG_ENOTFOUND);
  CHECK_STR_HAS(err, "head.weight: in model, missing from file");
  CHECK_STR_HAS(err, "(0 unexpected and 2 missing in all; a non_strict load skips them)");
  CHECK_EQ_INT(o.nmissing, 2);
  CHECK_EQ_INT(o.nunexpected, 0);
  CHECK(saw(&s, DG_CKPT_MISSING, "head.weight") && saw(&s, DG_CKPT_MISSING, "head.bias"));
  CHECK(!memcmp(l0, dg_tensor_data(dg_params_find(big, "layers.0.weight")), 32 * 8 * 4));
  CHECK_EQ_INT(dg_checkpoint_load(g_path, &c, err, sizeof err), DG_ENOTFOUND); /* default */
  s.n = 0;
  o.non_strict = 1;
  CHECK_OK(dg_checkpoint_load_with(g_path, &c, &o, err, sizeof err));
  CHECK_EQ_INT(o.nmissing, 2);
  CHECK_EQ_INT(s.n, 2);
  for (int i = 0; i < dg_params_count(small); i++) {
    const char *n = dg_tensor_name(dg_params_get(small, i));
    CHECK(same_param(small, n, big, n));
  }
  CHECK(!memcmp(head_w, dg_tensor_data(dg_params_find(big, "head.weight")), 30 * 4));
  /* the same with AdamW state: the head's state is missing and kept */
  dg_optim *os, *ob;
  REQUIRE(dg_optim_new_adamw(&os, small, NULL, NULL, 0) == DG_OK);
  REQUIRE(dg_optim_new_adamw(&ob, big, NULL, NULL, 0) == DG_OK);
  float *st;
  CHECK_OK(dg_optim_state_get(os, 0, NULL, &st, NULL));
  for (int i = 0; i < 8; i++) st[i] = 1.0f + (float)i;
  save(small, os);
  c.optim = ob;
  CHECK_OK(dg_checkpoint_load_with(g_path, &c, &o, err, sizeof err));
  CHECK_EQ_INT(o.nmissing, 6); /* head.{weight,bias} and their exp_avg, exp_avg_sq */
  CHECK(saw(&s, DG_CKPT_MISSING, "optim.exp_avg_sq.head.bias"));
  float *stb;
  CHECK_OK(dg_optim_state_get(ob, 0, NULL, &stb, NULL));
  CHECK(stb[dg_params_offset(big, 0) + 3] == 4.0f);
  dg_optim_free(os);
  dg_optim_free(ob);
  free(head_w);
  free(l0);
  dg_module_free(head);
  dg_module_free(ms);
  dg_module_free(mb);
  dg_params_free(small);
  dg_params_free(big);
}

/* A bigger file into a smaller model: the head is unexpected. */
static void test_unexpected(void) {
  char err[512];
  dg_params *small, *big;
  REQUIRE(dg_params_new(&small) == DG_OK && dg_params_new(&big) == DG_OK);
  dg_module *head, *mb = bigger(big, 3, &head), *ms = ck_mlp(small, 32, 4);
  save(big, NULL);
  seen s = {0};
  dg_checkpoint c = {small, NULL, NULL, NULL, 0, 0, NULL, NULL};
  dg_checkpoint_load_opts o = {0};
  o.report = record, o.report_user = &s;
  CHECK_EQ_INT(dg_checkpoint_load_with(g_path, &c, &o, err, sizeof err), DG_ENOTFOUND);
  CHECK_STR_HAS(err, "head.weight: tensor in file, not in model (2 unexpected and 0 missing");
  o.non_strict = 1;
  s.n = 0;
  CHECK_OK(dg_checkpoint_load_with(g_path, &c, &o, err, sizeof err));
  CHECK_EQ_INT(o.nunexpected, 2);
  CHECK_EQ_INT(o.nmissing, 0);
  CHECK(saw(&s, DG_CKPT_UNEXPECTED, "head.weight") && saw(&s, DG_CKPT_UNEXPECTED, "head.bias"));
  CHECK(same_param(small, "layers.3.weight", big, "layers.3.weight"));
  dg_module_free(head);
  dg_module_free(ms);
  dg_module_free(mb);
  dg_params_free(small);
  dg_params_free(big);
}

/* "model.layers.*" (and its AdamW state) into "layers.*" by a prefix map;
 * a name renamed to nothing the model has is unexpected, naming both. */
static void test_prefix_map(void) {
  char err[512];
  dg_params *src, *dst;
  REQUIRE(dg_params_new(&src) == DG_OK && dg_params_new(&dst) == DG_OK);
  dg_module *b = ck_mlp(dst, 32, 6), *mm, *l;
  /* ck_mlp's layers under "model.layers" */
  REQUIRE(dg_nn_sequential(&mm) == DG_OK);
  REQUIRE(dg_nn_linear(&l, 8, 32, 1) == DG_OK && dg_sequential_add(mm, l, NULL) == DG_OK);
  REQUIRE(dg_nn_relu(&l) == DG_OK && dg_sequential_add(mm, l, NULL) == DG_OK);
  REQUIRE(dg_nn_dropout(&l, 0.0f) == DG_OK && dg_sequential_add(mm, l, NULL) == DG_OK);
  REQUIRE(dg_nn_linear(&l, 32, 10, 1) == DG_OK && dg_sequential_add(mm, l, NULL) == DG_OK);
  REQUIRE(dg_module_bind(mm, src, "model.layers", 7) == DG_OK);
  dg_optim *os, *od;
  REQUIRE(dg_optim_new_adamw(&os, src, NULL, NULL, 0) == DG_OK);
  REQUIRE(dg_optim_new_adamw(&od, dst, NULL, NULL, 0) == DG_OK);
  float *st;
  size_t n;
  CHECK_OK(dg_optim_state_get(os, 1, NULL, &st, &n));
  for (size_t i = 0; i < n; i++) st[i] = 0.5f;
  dg_optim_set_step(os, 9);
  save(src, os);
  static const char *const from[] = {"model."}, *const to[] = {""};
  dg_checkpoint c = {dst, od, NULL, NULL, 0, 0, NULL, NULL};
  dg_checkpoint_load_opts o = {0};
  o.nrename = 1, o.rename_from = from, o.rename_to = to;
  CHECK_OK(dg_checkpoint_load_with(g_path, &c, &o, err, sizeof err)); /* strict */
  CHECK_EQ_INT(o.nmissing + o.nunexpected, 0);
  for (int i = 0; i < dg_params_count(dst); i++) {
    char nm[96];
    const char *d = dg_tensor_name(dg_params_get(dst, i));
    snprintf(nm, sizeof nm, "model.%s", d);
    CHECK(same_param(src, nm, dst, d));
  }
  float *sd;
  CHECK_OK(dg_optim_state_get(od, 1, NULL, &sd, NULL));
  CHECK(sd[0] == 0.5f);
  CHECK_EQ_INT(dg_optim_step_count(od), 9);
  /* without the map: every name unexpected, every parameter missing */
  CHECK_EQ_INT(dg_checkpoint_load(g_path, &c, err, sizeof err), DG_ENOTFOUND);
  CHECK_STR_HAS(err, "model.layers.0.weight: tensor in file, not in model (12 unexpected and 12 "
                     "missing in all");
  /* a map to the wrong place: the message names the renamed name too */
  static const char *const to2[] = {"net."};
  o.rename_to = to2;
  CHECK_EQ_INT(dg_checkpoint_load_with(g_path, &c, &o, err, sizeof err), DG_ENOTFOUND);
  CHECK_STR_HAS(err, "model.layers.0.weight (renamed net.layers.0.weight): tensor in file, "
                     "not in model");
  dg_optim_free(os);
  dg_optim_free(od);
  dg_module_free(mm);
  dg_module_free(b);
  dg_params_free(src);
  dg_params_free(dst);
}

/* The callback: layers.3 -> classifier, and dropping names. */
static int to_classifier(void *user, const char *name, char *out, size_t cap) {
  (void)user;
  if (strncmp(name, "layers.3.", 9)) return 0;
  snprintf(out, cap, "classifier.%s", name + 9);
  return 1;
}

static int drop_layer3(void *user, const char *name, char *out, size_t cap) {
  (void)user, (void)out, (void)cap;
  return strncmp(name, "layers.3.", 9) ? 0 : -1;
}

static void test_callback(void) {
  char err[512];
  dg_params *src, *dst, *one;
  REQUIRE(dg_params_new(&src) == DG_OK && dg_params_new(&dst) == DG_OK &&
          dg_params_new(&one) == DG_OK);
  dg_module *ms = ck_mlp(src, 32, 8), *l0, *cls, *solo;
  save(src, NULL);
  REQUIRE(dg_nn_linear(&l0, 8, 32, 1) == DG_OK && dg_module_bind(l0, dst, "layers.0", 9) == DG_OK);
  REQUIRE(dg_nn_linear(&cls, 32, 10, 1) == DG_OK &&
          dg_module_bind(cls, dst, "classifier", 9) == DG_OK);
  dg_checkpoint c = {dst, NULL, NULL, NULL, 0, 0, NULL, NULL};
  dg_checkpoint_load_opts o = {0};
  o.rename = to_classifier;
  CHECK_OK(dg_checkpoint_load_with(g_path, &c, &o, err, sizeof err));
  CHECK(same_param(src, "layers.3.weight", dst, "classifier.weight"));
  CHECK(same_param(src, "layers.0.bias", dst, "layers.0.bias"));
  /* dropped tensors are neither loaded nor reported: a strict load of the rest */
  REQUIRE(dg_nn_linear(&solo, 8, 32, 1) == DG_OK && dg_module_bind(solo, one, "layers.0", 1) == DG_OK);
  dg_checkpoint c1 = {one, NULL, NULL, NULL, 0, 0, NULL, NULL};
  dg_checkpoint_load_opts od = {0};
  od.rename = drop_layer3;
  CHECK_OK(dg_checkpoint_load_with(g_path, &c1, &od, err, sizeof err));
  CHECK_EQ_INT(od.nunexpected, 0);
  CHECK(same_param(src, "layers.0.weight", one, "layers.0.weight"));
  dg_module_free(ms);
  dg_module_free(l0);
  dg_module_free(cls);
  dg_module_free(solo);
  dg_params_free(src);
  dg_params_free(dst);
  dg_params_free(one);
}

/* Shape mismatches, duplicates after renaming and bad options stay errors
 * in non-strict loads, and nothing is written. */
static void test_refused(void) {
  char err[512];
  dg_params *src, *wide, *two;
  REQUIRE(dg_params_new(&src) == DG_OK && dg_params_new(&wide) == DG_OK &&
          dg_params_new(&two) == DG_OK);
  dg_module *ms = ck_mlp(src, 32, 10), *mw = ck_mlp(wide, 64, 11), *x, *y;
  save(src, NULL);
  float *before = values(wide, "layers.0.weight");
  dg_checkpoint c = {wide, NULL, NULL, NULL, 0, 0, NULL, NULL};
  dg_checkpoint_load_opts o = {0};
  o.non_strict = 1;
  CHECK_EQ_INT(dg_checkpoint_load_with(g_path, &c, &o, err, sizeof err), DG_ESHAPE);
  CHECK_STR_HAS(err, "layers.0.weight: shape (32, 8) in file, (64, 8) in model");
  CHECK(!memcmp(before, dg_tensor_data(dg_params_find(wide, "layers.0.weight")), 64 * 8 * 4));
  /* two file tensors renamed onto one */
  REQUIRE(dg_nn_linear(&x, 4, 4, 0) == DG_OK && dg_module_bind(x, two, "x", 1) == DG_OK);
  REQUIRE(dg_nn_linear(&y, 4, 4, 0) == DG_OK && dg_module_bind(y, two, "y", 1) == DG_OK);
  save(two, NULL);
  static const char *const from[] = {"x.", "y."}, *const to[] = {"x.", "x."};
  dg_checkpoint c2 = {two, NULL, NULL, NULL, 0, 0, NULL, NULL};
  dg_checkpoint_load_opts o2 = {0};
  o2.non_strict = 1, o2.nrename = 2, o2.rename_from = from, o2.rename_to = to;
  CHECK_EQ_INT(dg_checkpoint_load_with(g_path, &c2, &o2, err, sizeof err), DG_EFORMAT);
  CHECK_STR_HAS(err, "y.weight: duplicate tensor (after renaming)");
  o2.rename_to = NULL;
  CHECK_EQ_INT(dg_checkpoint_load_with(g_path, &c2, &o2, err, sizeof err), DG_EINVAL);
  o2.nrename = -1;
  CHECK_EQ_INT(dg_checkpoint_load_with(g_path, &c2, &o2, err, sizeof err), DG_EINVAL);
  free(before);
  dg_module_free(ms);
  dg_module_free(mw);
  dg_module_free(x);
  dg_module_free(y);
  dg_params_free(src);
  dg_params_free(wide);
  dg_params_free(two);
}

/* A buffer the file lacks is missing like a parameter. */
static void test_buffers(void) {
  char err[512];
  dg_params *src, *dst;
  REQUIRE(dg_params_new(&src) == DG_OK && dg_params_new(&dst) == DG_OK);
  dg_module *ms = ck_mlp(src, 32, 12), *md = ck_mlp(dst, 32, 13);
  save(src, NULL);
  dg_tensor *b;
  REQUIRE(dg_params_add_buffer(dst, "layers.0.running_mean", 1, (int64_t[]){32}, &b) == DG_OK);
  ((float *)dg_tensor_data(b))[0] = 7.0f;
  seen s = {0};
  dg_checkpoint c = {dst, NULL, NULL, NULL, 0, 0, NULL, NULL};
  dg_checkpoint_load_opts o = {0};
  o.report = record, o.report_user = &s;
  CHECK_EQ_INT(dg_checkpoint_load_with(g_path, &c, &o, err, sizeof err), DG_ENOTFOUND);
  CHECK_STR_HAS(err, "layers.0.running_mean: buffer in model, missing from file");
  o.non_strict = 1;
  CHECK_OK(dg_checkpoint_load_with(g_path, &c, &o, err, sizeof err));
  CHECK_EQ_INT(o.nmissing, 1);
  CHECK(saw(&s, DG_CKPT_MISSING, "layers.0.running_mean"));
  CHECK(((float *)dg_tensor_data(b))[0] == 7.0f);
  CHECK(same_param(src, "layers.3.bias", dst, "layers.3.bias"));
  dg_module_free(ms);
  dg_module_free(md);
  dg_params_free(src);
  dg_params_free(dst);
}

int main(void) {
  snprintf(g_dir, sizeof g_dir, "/tmp/dg_ckpt_partial_XXXXXX");
  REQUIRE(mkdtemp(g_dir) != NULL);
  snprintf(g_path, sizeof g_path, "%s/m.safetensors", g_dir);
  test_missing();
  test_unexpected();
  test_prefix_map();
  test_callback();
  test_refused();
  test_buffers();
  unlink(g_path);
  rmdir(g_dir);
  return TEST_DONE();
}
