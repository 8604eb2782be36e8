/* Optimizers, gradient clipping and LR schedules against the reference
 * trajectories written by make_optim_fixtures.py (torch.optim.SGD / AdamW;
 * LAMB and LARS from the papers' formulas). argv[1]: the fixture. */
#include <dgrad.h>
#include <dgrad/optim.h>

#include "backends/cpu/cpu_impl.h"
#include "test.h"

uint64_t dg__alloc_count(void); /* internal counter, linked from the static lib */

#define MAX_P 4
#define MAX_CASES 16
#define MAX_STEPS 8

typedef struct {
  char name[17];
  uint32_t kind;
  float h[9]; /* lr, momentum, dampening, nesterov, wd, beta1, beta2, eps, trust */
  float *traj; /* (n_steps, total) */
} fx_case;

typedef struct {
  uint32_t np, ndim[MAX_P], dims[MAX_P][4], nsteps, ncases, nclip, nsched;
  size_t total, numel[MAX_P];
  float *init, *grads; /* (total), (n_steps, total) */
  fx_case cases[MAX_CASES];
  double clip_max[4], clip_total[4];
  float *clip_g[4];
  unsigned char *buf, *p, *end;
} fixture;

static fixture F;

static void *take(size_t n) {
  REQUIRE((size_t)(F.end - F.p) >= n);
  void *r = F.p;
  F.p += n;
  return r;
}
static uint32_t u32(void) { uint32_t v; memcpy(&v, take(4), 4); return v; }
static int64_t i64(void) { int64_t v; memcpy(&v, take(8), 8); return v; }
static float f32(void) { float v; memcpy(&v, take(4), 4); return v; }
static double f64(void) { double v; memcpy(&v, take(8), 8); return v; }
static float *f32s(size_t n) { return (float *)take(n * 4); } /* file is LE; so is x86 */

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
  REQUIRE(!memcmp(take(8), "DGOPTFX", 8));
  CHECK_EQ_INT(u32(), 1);
  F.np = u32();
  REQUIRE(F.np <= MAX_P);
  for (uint32_t i = 0; i < F.np; i++) {
    F.ndim[i] = u32();
    REQUIRE(F.ndim[i] <= 4);
    F.numel[i] = 1;
    for (uint32_t d = 0; d < F.ndim[i]; d++) F.numel[i] *= (F.dims[i][d] = u32());
    F.total += F.numel[i];
  }
  F.nsteps = u32();
  REQUIRE(F.nsteps <= MAX_STEPS);
  F.init = f32s(F.total);
  F.grads = f32s(F.total * F.nsteps);
  F.ncases = u32();
  REQUIRE(F.ncases <= MAX_CASES);
  for (uint32_t c = 0; c < F.ncases; c++) {
    memcpy(F.cases[c].name, take(16), 16);
    F.cases[c].kind = u32();
    for (int k = 0; k < 9; k++) F.cases[c].h[k] = f32();
    F.cases[c].traj = f32s(F.total * F.nsteps);
  }
  F.nclip = u32();
  REQUIRE(F.nclip <= 4);
  for (uint32_t c = 0; c < F.nclip; c++) {
    F.clip_max[c] = f64();
    F.clip_total[c] = f64();
    F.clip_g[c] = f32s(F.total);
  }
  F.nsched = u32(); /* read by test_schedules */
}

/* Copies a packed (all parameters concatenated) vector into the flat buffer. */
static void put(dg_params *ps, float *flat, const float *packed) {
  size_t k = 0;
  for (uint32_t i = 0; i < F.np; i++) {
    memcpy(flat + dg_params_offset(ps, (int)i), packed + k, F.numel[i] * 4);
    k += F.numel[i];
  }
}

static int close_to(float a, float ref) {
  return fabsf(a - ref) <= 1e-5f * fabsf(ref) + 1e-7f;
}

/* Compares parameter `only` (or all when -1) against a packed reference. */
static int compare(dg_params *ps, const float *ref, int only, const char *what, int step) {
  float *w = dg_params_data(ps, NULL);
  size_t k = 0;
  int bad = 0;
  for (uint32_t i = 0; i < F.np; i++) {
    for (size_t j = 0; j < F.numel[i]; j++, k++) {
      if (only >= 0 && (int)i != only) continue;
      float a = w[dg_params_offset(ps, (int)i) + j];
      if (!close_to(a, ref[k]) && bad++ < 3)
        T_FAIL_("%s step %d param %u[%zu]: %.9g vs ref %.9g", what, step + 1, i, j, a, ref[k]);
    }
  }
  return bad;
}

static dg_params *make_store(void) {
  dg_params *ps;
  REQUIRE(dg_params_new(&ps) == DG_OK);
  for (uint32_t i = 0; i < F.np; i++) {
    int64_t shape[4];
    char name[32];
    for (uint32_t d = 0; d < F.ndim[i]; d++) shape[d] = F.dims[i][d];
    snprintf(name, sizeof name, i == 0 ? "layer.weight" : "layer.bias");
    REQUIRE(dg_params_add(ps, name, (int)F.ndim[i], shape, NULL) == DG_OK);
  }
  put(ps, dg_params_data(ps, NULL), F.init);
  return ps;
}

static dg_optim *make_optim(const fx_case *c, dg_params *ps) {
  dg_optim *o = NULL;
  const float *h = c->h;
  if (c->kind == 0) {
    dg_sgd_opts op = {h[0], h[1], h[2], (int)h[3], h[4]};
    CHECK_OK(dg_optim_new_sgd(&o, ps, &op, NULL, 0));
  } else if (c->kind == 1 || c->kind == 2) {
    dg_adamw_opts op = {h[0], h[5], h[6], h[7], h[4]};
    CHECK_OK(c->kind == 1 ? dg_optim_new_adamw(&o, ps, &op, NULL, 0) : dg_optim_new_lamb(&o, ps, &op, NULL, 0));
  } else {
    dg_lars_opts op = dg_lars_defaults();
    op.lr = h[0];
    op.momentum = h[1];
    op.weight_decay = h[4];
    op.trust_coef = h[8];
    op.eps = 0;
    CHECK_OK(dg_optim_new_lars(&o, ps, &op, NULL, 0));
  }
  REQUIRE(o);
  return o;
}

/* Runs steps [from, to) of case c on ps with optimizer o. */
static void run_steps(const fx_case *c, dg_params *ps, dg_optim *o, uint32_t from, uint32_t to,
                      int only) {
  for (uint32_t s = from; s < to; s++) {
    put(ps, dg_params_grad(ps, NULL), F.grads + s * F.total);
    CHECK_OK(dg_optim_step(o));
    compare(ps, c->traj + s * F.total, only, c->name, (int)s);
  }
}

static void test_trajectories(void) {
  for (uint32_t c = 0; c < F.ncases; c++) {
    dg_params *ps = make_store();
    dg_optim *o = make_optim(&F.cases[c], ps);
    uint64_t before = dg__alloc_count();
    run_steps(&F.cases[c], ps, o, 0, F.nsteps, -1);
    CHECK_EQ_INT(dg__alloc_count() - before, 0);
    CHECK_EQ_INT(dg_optim_step_count(o), F.nsteps);
    dg_optim_free(o);
    dg_params_free(ps);
  }
}

/* Frozen bias: unchanged; the weight follows the reference (every update is
 * per parameter, so the bias does not influence it). */
static void test_frozen(void) {
  for (uint32_t c = 0; c < F.ncases; c++) {
    dg_params *ps = make_store();
    dg_params_set_trainable(ps, 1, 0);
    dg_optim *o = make_optim(&F.cases[c], ps);
    float *w = dg_params_data(ps, NULL);
    float b0 = w[dg_params_offset(ps, 1)];
    run_steps(&F.cases[c], ps, o, 0, F.nsteps, 0);
    CHECK_EQ_INT(w[dg_params_offset(ps, 1)] == b0, 1);
    dg_optim_free(o);
    dg_params_free(ps);
  }
}

/* Checkpoint resume: 2 steps, save state, restore into a fresh optimizer on
 * a fresh store, 3 more steps: same trajectory. */
static void test_state_restore(void) {
  for (uint32_t c = 0; c < F.ncases; c++) {
    dg_params *ps = make_store(), *ps2 = make_store();
    dg_optim *o = make_optim(&F.cases[c], ps), *o2 = make_optim(&F.cases[c], ps2);
    run_steps(&F.cases[c], ps, o, 0, 2, -1);
    size_t n;
    float *w = dg_params_data(ps, &n);
    memcpy(dg_params_data(ps2, NULL), w, n * 4);
    CHECK_EQ_INT(dg_optim_state_count(o), dg_optim_state_count(o2));
    for (int k = 0; k < dg_optim_state_count(o); k++) {
      const char *name, *name2;
      float *b, *b2;
      size_t n1, n2;
      CHECK_OK(dg_optim_state_get(o, k, &name, &b, &n1));
      CHECK_OK(dg_optim_state_get(o2, k, &name2, &b2, &n2));
      CHECK(!strcmp(name, name2) && n1 == n && n2 == n);
      memcpy(b2, b, n * 4);
    }
    CHECK_OK(dg_optim_set_step(o2, dg_optim_step_count(o)));
    run_steps(&F.cases[c], ps2, o2, 2, F.nsteps, -1);
    CHECK_EQ_INT(dg_optim_state_get(o, dg_optim_state_count(o), NULL, NULL, NULL), DG_EINVAL);
    dg_optim_free(o);
    dg_optim_free(o2);
    dg_params_free(ps);
    dg_params_free(ps2);
  }
}

/* The store re-laid out (reverse order, as DDP may do) after two steps: the
 * optimizer state moves with its parameters (companion buffers) and the
 * trajectory is unchanged. */
static void test_relayout(void) {
  for (uint32_t c = 0; c < F.ncases; c++) {
    dg_params *ps = make_store();
    dg_optim *o = make_optim(&F.cases[c], ps);
    run_steps(&F.cases[c], ps, o, 0, 2, -1);
    int order[MAX_P];
    for (uint32_t i = 0; i < F.np; i++) order[i] = (int)(F.np - 1 - i);
    CHECK_OK(dg_params_relayout(ps, order));
    CHECK(dg_params_offset(ps, 1) < dg_params_offset(ps, 0));
    run_steps(&F.cases[c], ps, o, 2, F.nsteps, -1);
    dg_optim_free(o);
    dg_params_free(ps);
  }
}

static void test_clip(void) {
  for (uint32_t c = 0; c < F.nclip; c++) {
    dg_params *ps = make_store();
    float *g = dg_params_grad(ps, NULL);
    put(ps, g, F.grads);
    double total = -1;
    CHECK_OK(dg_clip_grad_norm(ps, F.clip_max[c], &total));
    CHECK_NEAR(total, F.clip_total[c], 1e-5 * F.clip_total[c]);
    size_t k = 0;
    for (uint32_t i = 0; i < F.np; i++)
      for (size_t j = 0; j < F.numel[i]; j++, k++)
        if (!close_to(g[dg_params_offset(ps, (int)i) + j], F.clip_g[c][k]))
          T_FAIL_("clip %g: grad %u[%zu] %.9g vs %.9g", F.clip_max[c], i, j,
                  g[dg_params_offset(ps, (int)i) + j], F.clip_g[c][k]);
    CHECK_EQ_INT(dg_clip_grad_norm(ps, -1, NULL), DG_EINVAL);
    dg_params_free(ps);
  }
}

static void test_schedules(void) {
  for (uint32_t s = 0; s < F.nsched; s++) {
    dg_lr_schedule sc;
    memset(&sc, 0, sizeof sc);
    sc.kind = (dg_lr_kind)u32();
    sc.base_lr = f32();
    sc.warmup_steps = i64();
    sc.total_steps = i64();
    sc.step_size = i64();
    sc.gamma = f32();
    sc.min_lr = f32();
    uint32_t n = u32();
    for (uint32_t i = 0; i < n; i++) {
      float ref = f32(), got = dg_lr_at(&sc, i);
      if (!(fabsf(got - ref) <= 1e-5f * fabsf(ref) + 1e-8f))
        T_FAIL_("schedule kind %d step %u: %.9g vs ref %.9g", (int)sc.kind, i, got, ref);
    }
  }
  CHECK_EQ_INT(F.p == F.end, 1);
  CHECK_NEAR(dg_lr_scale_linear(0.1f, 256, 8192), 3.2, 1e-6);
  CHECK_NEAR(dg_lr_scale_linear(0.1f, 0, 8192), 0.1, 1e-7);
}

static void test_misuse(void) {
  dg_optim_free(NULL);
  dg_params *ps = make_store();
  dg_optim *o = NULL;
  dg_sgd_opts bad = {0.1f, 0.0f, 0.0f, 1, 0.0f}; /* nesterov without momentum */
  char err[256] = "";
  CHECK_EQ_INT(dg_optim_new_sgd(&o, ps, &bad, err, sizeof err), DG_EINVAL);
  CHECK(o == NULL);
  CHECK(strstr(err, "nesterov 1") != NULL); /* the detail names the options */
  dg_adamw_opts ab = dg_adamw_defaults();
  ab.beta1 = 1.0f;
  CHECK_EQ_INT(dg_optim_new_adamw(&o, ps, &ab, err, sizeof err), DG_EINVAL);
  CHECK(strstr(err, "betas 1 0.999") != NULL);
  CHECK_EQ_INT(dg_optim_new_lamb(&o, NULL, NULL, NULL, 0), DG_EINVAL);
  CHECK_OK(dg_optim_new_adamw(&o, ps, NULL, NULL, 0));
  CHECK(!strcmp(dg_optim_name(o), "adamw"));
  dg_optim_set_lr(o, 0.5f);
  CHECK_EQ_INT(dg_optim_lr(o) == 0.5f, 1);
  int64_t shape[1] = {7};
  CHECK_OK(dg_params_add(ps, "late", 1, shape, NULL));
  CHECK_EQ_INT(dg_optim_step(o), DG_ESTATE);
  CHECK(strstr(dg_optim_errmsg(o), "store changed") != NULL);
  dg_optim_free(o);
  dg_params_free(ps);
}

/* LARS exclusions by suffix and callback: an excluded 2-D weight moves by
 * plain momentum SGD (lr * g on the first step). */
static int exclude_all(void *user, int index, const char *name, const dg_tensor *t) {
  (void)user, (void)name, (void)t;
  return index == 0;
}

static void test_lars_exclusion(void) {
  for (int mode = 0; mode < 2; mode++) {
    dg_params *ps = make_store();
    dg_lars_opts op = dg_lars_defaults();
    const char *suffixes[] = {".weight"};
    op.lr = 0.5f;
    op.weight_decay = 0.1f;
    if (mode == 0) {
      op.exclude_suffixes = suffixes;
      op.n_exclude_suffixes = 1;
    } else {
      op.exclude = exclude_all;
    }
    dg_optim *o = NULL;
    CHECK_OK(dg_optim_new_lars(&o, ps, &op, NULL, 0));
    float *w = dg_params_data(ps, NULL), *g = dg_params_grad(ps, NULL);
    put(ps, g, F.grads);
    CHECK_OK(dg_optim_step(o));
    for (size_t j = 0; j < F.numel[0]; j++)
      CHECK_NEAR(w[j], F.init[j] - 0.5f * F.grads[j], 1e-6);
    dg_optim_free(o);
    dg_params_free(ps);
  }
}

/* SGD gives the same bits on every ISA level (backends/cpu/optim.c: the
 * 512-bit and AVX2 forms round each multiply and add as the baseline loop
 * does): three steps of each form of the update on parameters of odd
 * lengths (the tail), baseline against each level this CPU has. */
static float *sgd_run(const dg_sgd_opts *op, int isa, size_t *n) {
  dg__simd_force(isa);
  dg_params *ps;
  REQUIRE(dg_params_new(&ps) == DG_OK);
  int64_t s0[1] = {37}, s1[2] = {33, 31};
  REQUIRE(dg_params_add(ps, "a", 1, s0, NULL) == DG_OK);
  REQUIRE(dg_params_add(ps, "b", 2, s1, NULL) == DG_OK);
  size_t total = 0;
  float *w = dg_params_data(ps, &total), *g = dg_params_grad(ps, NULL);
  dg_rng_uniform(7, 0, w, total);
  dg_optim *o = NULL;
  CHECK_OK(dg_optim_new_sgd(&o, ps, op, NULL, 0));
  REQUIRE(o);
  float *out = malloc(3 * total * sizeof *out);
  REQUIRE(out);
  for (int s = 0; s < 3; s++) {
    dg_rng_uniform(100 + (uint64_t)s, 0, g, total);
    for (size_t j = 0; j < total; j++) g[j] = g[j] * 2.0f - 1.0f;
    CHECK_OK(dg_optim_step(o));
    memcpy(out + s * total, w, total * sizeof *w);
  }
  *n = 3 * total;
  dg_optim_free(o);
  dg_params_free(ps);
  dg__simd_force(-1);
  return out;
}

static void test_sgd_isa_bits(void) {
  const dg_sgd_opts cases[] = {{0.1f, 0, 0, 0, 0},
                               {0.1f, 0, 0, 0, 0.01f},
                               {0.05f, 0.9f, 0.1f, 0, 0.01f},
                               {0.05f, 0.9f, 0, 1, 0.01f}};
  if (dg__simd_isa() == DG_ISA_BASE)
    printf("# test_sgd_isa_bits: this CPU has only the baseline level; nothing to compare\n");
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
    for (int isa = dg__simd_isa(); isa > DG_ISA_BASE; isa--) { /* each level the CPU has */
      size_t n = 0, n2 = 0;
      float *base = sgd_run(&cases[c], DG_ISA_BASE, &n), *best = sgd_run(&cases[c], isa, &n2);
      CHECK_EQ_INT((int)n, (int)n2);
      size_t bad = 0;
      for (size_t j = 0; j < n; j++)
        if (memcmp(&base[j], &best[j], sizeof(float)) && bad++ < 3)
          T_FAIL_("sgd case %zu float %zu: baseline %.9g, isa %d %.9g", c, j, base[j], isa,
                  best[j]);
      CHECK_EQ_INT((int)bad, 0);
      free(base), free(best);
    }
}

int main(int argc, char **argv) {
  REQUIRE(argc > 1);
  load(argv[1]);
  test_trajectories();
  test_frozen();
  test_state_restore();
  test_relayout();
  test_clip();
  test_schedules();
  test_misuse();
  test_lars_exclusion();
  test_sgd_isa_bits();
  free(F.buf);
  return TEST_DONE();
}
