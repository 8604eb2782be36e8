/* Parameter groups (dg_optim_set_group) against the reference trajectories
 * of make_group_fixtures.py: torch.optim.SGD / AdamW with the corresponding
 * param_groups, LAMB and LARS from the papers with a per-group lr and weight
 * decay, with the base lr changed mid-run. Also: the step stays
 * allocation-free, the store re-laid out (reverse order) and the step taken
 * piecewise as DDP's overlap takes it give the same numbers, a fused
 * backward with groups equals backward + step bit for bit, a checkpoint
 * resume with the groups set again continues the trajectory, and misuse is
 * refused. argv[1]: the fixture. */
#include <unistd.h>

#include <dgrad.h>

#include "../unit/mlp_step.h"
#include "test.h"

uint64_t dg__alloc_count(void); /* internal, linked from the static lib */
/* optim/optim_impl.h: the step as DDP's overlap takes it, bucket by bucket */
int dg__optim_begin_step(dg_optim *o);
void dg__optim_step_span(dg_optim *o, size_t lo, size_t hi, float lr);

#define MAX_P 8
#define MAX_CASES 16
#define MAX_G 4

typedef struct {
  char name[17];
  uint32_t kind, lr_change, ngroups, sel[MAX_G];
  float h[9], new_lr, wd[MAX_G], scale[MAX_G];
  float *traj; /* (n_steps, total) */
} fx_case;

static struct {
  uint32_t np, ndim[MAX_P], dims[MAX_P][4], nsteps, ncases;
  char names[MAX_P][25];
  size_t total, numel[MAX_P];
  float *init, *grads;
  fx_case cases[MAX_CASES];
  unsigned char *buf, *p, *end;
} F;

static void *take(size_t n) {
  REQUIRE((size_t)(F.end - F.p) >= n);
  void *r = F.p;
  F.p += n;
  return r;
}
static uint32_t u32(void) { uint32_t v; memcpy(&v, take(4), 4); return v; }
static float f32(void) { float v; memcpy(&v, take(4), 4); return v; }
static float *f32s(size_t n) { return (float *)take(n * 4); } /* LE file, LE host */

static void load(const char *path) {
  FILE *f = fopen(path, "rb");
  REQUIRE(f);
  fseek(f, 0, SEEK_END);
  long sz = ftell(f);
  fseek(f, 0, SEEK_SET);
  F.buf = malloc((size_t)sz);
  REQUIRE(F.buf && fread(F.buf, 1, (size_t)sz, f) == (size_t)sz);
  fclose(f);
  F.p = F.buf;
  F.end = F.buf + sz;
  REQUIRE(!memcmp(take(8), "DGGRPFX", 8));
  CHECK_EQ_INT(u32(), 1);
  F.np = u32();
  REQUIRE(F.np <= MAX_P);
  for (uint32_t i = 0; i < F.np; i++) {
    memcpy(F.names[i], take(24), 24);
    F.ndim[i] = u32();
    REQUIRE(F.ndim[i] <= 4);
    F.numel[i] = 1;
    for (uint32_t d = 0; d < F.ndim[i]; d++) F.numel[i] *= (F.dims[i][d] = u32());
    F.total += F.numel[i];
  }
  F.nsteps = u32();
  F.init = f32s(F.total);
  F.grads = f32s(F.total * F.nsteps);
  F.ncases = u32();
  REQUIRE(F.ncases <= MAX_CASES);
  for (uint32_t c = 0; c < F.ncases; c++) {
    fx_case *k = &F.cases[c];
    memcpy(k->name, take(16), 16);
    k->kind = u32();
    for (int j = 0; j < 9; j++) k->h[j] = f32();
    k->lr_change = u32();
    k->new_lr = f32();
    k->ngroups = u32();
    REQUIRE(k->ngroups <= MAX_G);
    for (uint32_t g = 0; g < k->ngroups; g++) {
      k->sel[g] = u32();
      k->wd[g] = f32();
      k->scale[g] = f32();
    }
    k->traj = f32s(F.total * F.nsteps);
  }
  CHECK(F.p == F.end);
}

/* Packed (parameters concatenated) <-> the store's flat layout. */
static void put(dg_params *ps, float *flat, const float *packed) {
  size_t k = 0;
  for (uint32_t i = 0; i < F.np; i++) {
    memcpy(flat + dg_params_offset(ps, (int)i), packed + k, F.numel[i] * 4);
    k += F.numel[i];
  }
}

static int compare(dg_params *ps, const float *ref, const char *what, int step) {
  float *w = dg_params_data(ps, NULL);
  size_t k = 0;
  int bad = 0;
  for (uint32_t i = 0; i < F.np; i++)
    for (size_t j = 0; j < F.numel[i]; j++, k++) {
      float a = w[dg_params_offset(ps, (int)i) + j];
      if (!(fabsf(a - ref[k]) <= 1e-5f * fabsf(ref[k]) + 1e-7f) && bad++ < 3)
        T_FAIL_("%s step %d %s[%zu]: %.9g vs ref %.9g", what, step + 1, F.names[i], j, a, ref[k]);
    }
  return bad;
}

static dg_params *make_store(void) {
  dg_params *ps;
  REQUIRE(dg_params_new(&ps) == DG_OK);
  for (uint32_t i = 0; i < F.np; i++) {
    int64_t shape[4];
    for (uint32_t d = 0; d < F.ndim[i]; d++) shape[d] = F.dims[i][d];
    REQUIRE(dg_params_add(ps, F.names[i], (int)F.ndim[i], shape, NULL) == DG_OK);
  }
  put(ps, dg_params_data(ps, NULL), F.init);
  return ps;
}

static const char *const k_head[] = {"head.", NULL};
static const char *const k_bias[] = {".bias", NULL};

static void set_groups(const fx_case *c, dg_optim *o) {
  for (uint32_t g = 0; g < c->ngroups; g++) {
    dg_param_filter_fn f = c->sel[g] == 0   ? dg_param_filter_1d
                           : c->sel[g] == 1 ? dg_param_filter_prefix
                                            : dg_param_filter_suffix;
    void *user = c->sel[g] == 1 ? (void *)k_head : c->sel[g] == 2 ? (void *)k_bias : NULL;
    int n = dg_optim_set_group(o, f, user, c->wd[g], c->scale[g]);
    CHECK(n > 0);
  }
}

static dg_optim *make_optim(const fx_case *c, dg_params *ps) {
  dg_optim *o = NULL;
  const float *h = c->h;
  if (c->kind == 0) {
    dg_sgd_opts op = {h[0], h[1], h[2], (int)h[3], h[4]};
    CHECK_OK(dg_optim_new_sgd(&o, ps, &op, NULL, 0));
  } else if (c->kind == 1 || c->kind == 2) {
    dg_adamw_opts op = {h[0], h[5], h[6], h[7], h[4]};
    CHECK_OK(c->kind == 1 ? dg_optim_new_adamw(&o, ps, &op, NULL, 0)
                          : dg_optim_new_lamb(&o, ps, &op, NULL, 0));
  } else {
    dg_lars_opts op = dg_lars_defaults();
    op.lr = h[0], op.momentum = h[1], op.weight_decay = h[4], op.trust_coef = h[8], op.eps = 0;
    CHECK_OK(dg_optim_new_lars(&o, ps, &op, NULL, 0));
  }
  REQUIRE(o);
  set_groups(c, o);
  return o;
}

/* piece: 0 dg_optim_step; 1 the step in two spans split at parameter
 * `split` (the overlap's bucket-by-bucket path). */
static void run_steps(const fx_case *c, dg_params *ps, dg_optim *o, uint32_t from, uint32_t to,
                      int piece) {
  for (uint32_t s = from; s < to; s++) {
    if (s == c->lr_change) dg_optim_set_lr(o, c->new_lr);
    put(ps, dg_params_grad(ps, NULL), F.grads + s * F.total);
    if (!piece) {
      CHECK_OK(dg_optim_step(o));
    } else {
      size_t n, cut = dg_params_offset(ps, 2);
      dg_params_data(ps, &n);
      CHECK_OK(dg__optim_begin_step(o));
      dg__optim_step_span(o, cut, n, dg_optim_lr(o));
      dg__optim_step_span(o, 0, cut, dg_optim_lr(o));
    }
    compare(ps, c->traj + s * F.total, c->name, (int)s);
  }
}

static void test_trajectories(void) {
  for (uint32_t c = 0; c < F.ncases; c++)
    for (int mode = 0; mode < 3; mode++) { /* plain, re-laid out, piecewise */
      dg_params *ps = make_store();
      if (mode == 1) {
        int order[MAX_P];
        for (uint32_t i = 0; i < F.np; i++) order[i] = (int)(F.np - 1 - i);
        CHECK_OK(dg_params_relayout(ps, order));
      }
      dg_optim *o = make_optim(&F.cases[c], ps);
      uint64_t before = dg__alloc_count();
      run_steps(&F.cases[c], ps, o, 0, F.nsteps, mode == 2);
      if (mode == 0) CHECK_EQ_INT(dg__alloc_count() - before, 0);
      CHECK_EQ_INT(dg_optim_step_count(o), F.nsteps);
      dg_optim_free(o);
      dg_params_free(ps);
    }
}

/* What a group gives each parameter; later calls take parameters over. */
static void test_membership(void) {
  dg_params *ps = make_store();
  dg_optim *o = NULL;
  dg_adamw_opts op = dg_adamw_defaults();
  op.lr = 0.01f, op.weight_decay = 0.1f;
  CHECK_OK(dg_optim_new_adamw(&o, ps, &op, NULL, 0));
  float lr, wd;
  CHECK_EQ_INT(dg_optim_param_group(o, 0, &lr, &wd), 0);
  CHECK(lr == 0.01f && wd == 0.1f);
  CHECK_EQ_INT(dg_optim_set_group(o, dg_param_filter_1d, NULL, 0.0f, 1.0f), 3);
  CHECK_EQ_INT(dg_optim_set_group(o, dg_param_filter_prefix, (void *)k_head, 0.05f, 0.5f), 2);
  static const char *const none[] = {"nothing.", NULL};
  CHECK_EQ_INT(dg_optim_set_group(o, dg_param_filter_prefix, (void *)none, 0.0f, 1.0f), 0);
  int want[5] = {0, 1, 1, 2, 2}; /* enc.weight, enc.bias, norm.weight, head.* */
  for (int i = 0; i < 5; i++) CHECK_EQ_INT(dg_optim_param_group(o, i, NULL, NULL), want[i]);
  dg_optim_set_lr(o, 0.2f);
  CHECK_EQ_INT(dg_optim_param_group(o, 3, &lr, &wd), 2);
  CHECK(lr == 0.1f && wd == 0.05f);
  CHECK_EQ_INT(dg_optim_param_group(o, 1, &lr, &wd), 1);
  CHECK(lr == 0.2f && wd == 0.0f);
  CHECK_EQ_INT(dg_optim_param_group(o, 5, NULL, NULL), DG_EINVAL);
  CHECK_EQ_INT(dg_optim_set_group(o, NULL, NULL, -1.0f, 1.0f), DG_EINVAL);
  CHECK_STR_HAS(dg_optim_errmsg(o), "weight_decay -1");
  CHECK_EQ_INT(dg_optim_set_group(o, NULL, NULL, 0.0f, NAN), DG_EINVAL);
  CHECK_EQ_INT(dg_optim_set_group(NULL, NULL, NULL, 0.0f, 1.0f), DG_EINVAL);
  CHECK_EQ_INT(dg_optim_set_group(o, NULL, NULL, 0.0f, 3.0f), 5); /* NULL selects all */
  CHECK_EQ_INT(dg_optim_param_group(o, 0, NULL, NULL), 4);
  int64_t shape[1] = {3};
  CHECK_OK(dg_params_add(ps, "late", 1, shape, NULL));
  CHECK_EQ_INT(dg_optim_set_group(o, NULL, NULL, 0.0f, 1.0f), DG_ESTATE);
  dg_optim_free(o);
  dg_params_free(ps);
}

/* The one-liner for no decay on biases and norm weights: with zero
 * gradients AdamW's update is the decay alone, so the 1-D parameters keep
 * their values and the others shrink by 1 - lr * wd. */
static void test_no_decay_one_liner(void) {
  dg_params *ps = make_store();
  dg_optim *o = NULL;
  dg_adamw_opts op = dg_adamw_defaults();
  op.lr = 0.1f, op.weight_decay = 0.5f;
  CHECK_OK(dg_optim_new_adamw(&o, ps, &op, NULL, 0));
  CHECK_EQ_INT(dg_optim_set_group(o, dg_param_filter_1d, NULL, 0.0f, 1.0f), 3);
  size_t n;
  float *g = dg_params_grad(ps, &n), *w = dg_params_data(ps, NULL);
  memset(g, 0, n * sizeof *g);
  CHECK_OK(dg_optim_step(o));
  size_t k = 0;
  for (uint32_t i = 0; i < F.np; i++)
    for (size_t j = 0; j < F.numel[i]; j++, k++) {
      float want = F.ndim[i] <= 1 ? F.init[k] : F.init[k] * (1.0f - 0.1f * 0.5f);
      CHECK_NEAR(w[dg_params_offset(ps, (int)i) + j], want, 1e-7);
    }
  dg_optim_free(o);
  dg_params_free(ps);
}

/* Fused into backward, with groups: bit for bit dg_optim_step's result. */
static float *train_mlp(int adamw, int fused, size_t *n) {
  enum { B = 16 };
  static float x[B * 20];
  static int64_t y[B];
  mlp_data(x, y, B);
  dg_ctx *ctx = NULL;
  dg_params *ps = NULL;
  dg_optim *o = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK && dg_params_new(&ps) == DG_OK);
  REQUIRE(mlp_build(ps) == DG_OK);
  dg_sgd_opts so = {0.05f, 0.9f, 0.0f, 0, 1e-2f};
  dg_adamw_opts ao = {1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f};
  REQUIRE((adamw ? dg_optim_new_adamw(&o, ps, &ao, NULL, 0)
                 : dg_optim_new_sgd(&o, ps, &so, NULL, 0)) == DG_OK);
  static const char *const fc1[] = {"fc1.", NULL};
  CHECK_EQ_INT(dg_optim_set_group(o, dg_param_filter_1d, NULL, 0.0f, 1.0f), 2);
  CHECK_EQ_INT(dg_optim_set_group(o, dg_param_filter_prefix, (void *)fc1, 0.3f, 0.25f), 2);
  if (fused) CHECK_OK(dg_optim_fuse_backward(o, ctx));
  int64_t xs[2] = {B, 20}, ys[1] = {B};
  for (int s = 0; s < 4; s++) {
    dg_params_zero_grad(ps);
    dg_tensor *h = dg_relu(ctx, dg_linear(ctx, dg_wrap(ctx, DG_F32, 2, xs, x),
                                          dg_params_get(ps, 0), dg_params_get(ps, 1)));
    dg_tensor *l = dg_cross_entropy(ctx, dg_linear(ctx, h, dg_params_get(ps, 2),
                                                   dg_params_get(ps, 3)),
                                    dg_wrap(ctx, DG_I64, 1, ys, y));
    REQUIRE(l);
    CHECK_OK(dg_backward(ctx, l));
    if (!fused) CHECK_OK(dg_optim_step(o));
    dg_ctx_reset(ctx);
  }
  float *d = dg_params_data(ps, n), *out = malloc(*n * sizeof *out);
  memcpy(out, d, *n * sizeof *out);
  if (fused) CHECK_OK(dg_optim_unfuse_backward(o));
  dg_optim_free(o);
  dg_params_free(ps);
  dg_ctx_free(ctx);
  return out;
}

static void test_fused(void) {
  for (int adamw = 0; adamw < 2; adamw++) {
    size_t n1, n2;
    float *a = train_mlp(adamw, 0, &n1), *b = train_mlp(adamw, 1, &n2);
    CHECK(n1 == n2 && !memcmp(a, b, n1 * sizeof *a));
    free(a);
    free(b);
  }
}

/* Groups are configuration: a checkpoint holds the state; the resumed run
 * sets its groups again and follows the reference. */
static void test_checkpoint_resume(void) {
  char dir[] = "/tmp/dg_groups_XXXXXX", path[64], err[512];
  REQUIRE(mkdtemp(dir) != NULL);
  snprintf(path, sizeof path, "%s/g.safetensors", dir);
  for (uint32_t c = 0; c < F.ncases; c++) {
    const fx_case *k = &F.cases[c];
    dg_params *ps = make_store(), *ps2 = make_store();
    dg_optim *o = make_optim(k, ps), *o2 = make_optim(k, ps2);
    run_steps(k, ps, o, 0, 4, 0); /* past the lr change: the file holds the new lr */
    dg_checkpoint ck = {ps, o, NULL, NULL, 4, 0, NULL, NULL};
    CHECK_OK(dg_checkpoint_save(path, &ck, err, sizeof err));
    dg_checkpoint cl = {ps2, o2, NULL, NULL, 0, 0, NULL, NULL};
    CHECK_OK(dg_checkpoint_load(path, &cl, err, sizeof err));
    CHECK(dg_optim_lr(o2) == k->new_lr);
    CHECK_EQ_INT(dg_optim_param_group(o2, 3, NULL, NULL), dg_optim_param_group(o, 3, NULL, NULL));
    run_steps(k, ps2, o2, 4, F.nsteps, 0);
    dg_optim_free(o);
    dg_optim_free(o2);
    dg_params_free(ps);
    dg_params_free(ps2);
  }
  unlink(path);
  rmdir(dir);
}

int main(int argc, char **argv) {
  REQUIRE(argc > 1);
  load(argv[1]);
  test_trajectories();
  test_membership();
  test_no_decay_one_liner();
  test_fused();
  test_checkpoint_resume();
  free(F.buf);
  return TEST_DONE();
}
