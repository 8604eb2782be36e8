/* Reference fixtures written by tests/ref/make_fixtures.py (PyTorch 1.13), and
 * the harness that checks a dgrad model against one.
 *
 * File format, little-endian, version 1 (see make_fixtures.py):
 *   "DGREF\0\0\0"  u32 version  u32 count
 *   count x { u32 name_len, name, u32 dtype (dg_dtype: 0 f32, 4 i64),
 *             u32 ndim, i64 dims[ndim], data }
 * Names: "in.<x>" inputs, "p.<param>" parameter values (registration order),
 * "out.<logits|pred>", "out.loss", "g.<param>" and "g.in.<x>" gradients.
 *
 * A test: ref_env_open(&env, path) loads the fixture, registers every "p."
 * tensor in a dg_params store with its value, and makes a persistent tensor for
 * every "in." tensor (requiring grad when the fixture has its gradient); then
 * ref_env_pass(&env, forward, user, tol, 1) runs the model's forward, compares the
 * output and the loss, runs dg_backward and compares every "g." tensor in the
 * file, so a gradient present in the fixture is never left unchecked; pass 2
 * repeats the step without zeroing and expects twice the gradients. */
#ifndef DG_REF_FIXTURE_H
#define DG_REF_FIXTURE_H

#include <dgrad.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"

#define REF_VERSION 1u
#define REF_MAX_TENSORS 256
#define REF_MAX_INPUTS 8
#define REF_TOL 1e-4 /* max |got - want| / max |want|, f32 */

typedef struct {
  char *name;
  dg_dtype dtype; /* DG_F32 or DG_I64 */
  int ndim;
  int64_t dims[DG_MAX_DIMS];
  int64_t numel;
  void *data; /* numel elements, host order */
} ref_tensor;

typedef struct {
  int count;
  ref_tensor t[REF_MAX_TENSORS];
} ref_fixture;

static inline uint32_t ref_u32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t ref_u64(const unsigned char *p) {
  return (uint64_t)ref_u32(p) | (uint64_t)ref_u32(p + 4) << 32;
}

static inline void ref_fixture_free(ref_fixture *f) {
  for (int i = 0; i < f->count; i++) {
    free(f->t[i].name);
    free(f->t[i].data);
  }
  f->count = 0;
}

/* Parses a whole file image. Returns 0, or -1 with a message in err. */
static inline int ref_parse(const unsigned char *buf, size_t len, ref_fixture *f,
                            char *err, size_t errcap) {
  static const unsigned char magic[8] = {'D', 'G', 'R', 'E', 'F', 0, 0, 0};
  size_t off = 16;
  memset(f, 0, sizeof *f);
  if (len < 16 || memcmp(buf, magic, 8) != 0) {
    snprintf(err, errcap, "not a dgrad reference fixture (bad magic; expected \"DGREF\")");
    return -1;
  }
  uint32_t version = ref_u32(buf + 8), count = ref_u32(buf + 12);
  if (version != REF_VERSION) {
    snprintf(err, errcap,
             "fixture format version %u, this test reads version %u "
             "(regenerate with tests/ref/make_fixtures.py)",
             (unsigned)version, (unsigned)REF_VERSION);
    return -1;
  }
  if (count > REF_MAX_TENSORS) {
    snprintf(err, errcap, "fixture holds %u tensors, at most %d supported",
             (unsigned)count, REF_MAX_TENSORS);
    return -1;
  }
#define REF_NEED(n, what)                                                     \
  do {                                                                        \
    if ((n) > len - off) {                                                    \
      snprintf(err, errcap, "fixture truncated in %s of tensor %d (offset %zu)", \
               what, f->count, off);                                          \
      goto fail;                                                              \
    }                                                                         \
  } while (0)
  for (uint32_t i = 0; i < count; i++) {
    ref_tensor *t = &f->t[f->count];
    REF_NEED(4, "name length");
    uint32_t nl = ref_u32(buf + off);
    off += 4;
    if (nl == 0 || nl > 1024) {
      snprintf(err, errcap, "tensor %d: bad name length %u", f->count, (unsigned)nl);
      goto fail;
    }
    REF_NEED(nl, "name");
    t->name = malloc(nl + 1);
    if (!t->name) goto oom;
    memcpy(t->name, buf + off, nl);
    t->name[nl] = 0;
    f->count++; /* owns name from here on */
    off += nl;
    REF_NEED(8, "dtype/ndim");
    uint32_t code = ref_u32(buf + off), ndim = ref_u32(buf + off + 4);
    off += 8;
    if (code != DG_F32 && code != DG_I64) {
      snprintf(err, errcap, "tensor %s: unsupported dtype code %u", t->name, (unsigned)code);
      goto fail;
    }
    if (ndim > DG_MAX_DIMS) {
      snprintf(err, errcap, "tensor %s: %u dims, at most %d", t->name, (unsigned)ndim,
               DG_MAX_DIMS);
      goto fail;
    }
    t->dtype = (dg_dtype)code;
    t->ndim = (int)ndim;
    REF_NEED(8 * (size_t)ndim, "dims");
    t->numel = 1;
    for (uint32_t d = 0; d < ndim; d++) {
      int64_t v = (int64_t)ref_u64(buf + off);
      off += 8;
      if (v < 0 || v > (1 << 28)) {
        snprintf(err, errcap, "tensor %s: bad dim %lld", t->name, (long long)v);
        goto fail;
      }
      t->dims[d] = v;
      t->numel *= v;
    }
    if (t->numel > (1 << 28)) {
      snprintf(err, errcap, "tensor %s: too many elements", t->name);
      goto fail;
    }
    size_t esz = code == DG_F32 ? 4 : 8;
    size_t nbytes = (size_t)t->numel * esz;
    REF_NEED(nbytes, "data");
    t->data = malloc(nbytes ? nbytes : 1);
    if (!t->data) goto oom;
    for (int64_t k = 0; k < t->numel; k++) {
      const unsigned char *p = buf + off + (size_t)k * esz;
      if (code == DG_F32) {
        uint32_t u = ref_u32(p);
        float v;
        memcpy(&v, &u, 4);
        ((float *)t->data)[k] = v;
      } else {
        ((int64_t *)t->data)[k] = (int64_t)ref_u64(p);
      }
    }
    off += nbytes;
    for (int j = 0; j < f->count - 1; j++)
      if (!strcmp(f->t[j].name, t->name)) {
        snprintf(err, errcap, "tensor %s appears twice", t->name);
        goto fail;
      }
  }
#undef REF_NEED
  if (off != len) {
    snprintf(err, errcap, "%zu trailing bytes after the last tensor", len - off);
    goto fail;
  }
  return 0;
oom:
  snprintf(err, errcap, "out of memory");
fail:
  ref_fixture_free(f);
  return -1;
}

static inline int ref_load(const char *path, ref_fixture *f, char *err, size_t errcap) {
  FILE *fp = fopen(path, "rb");
  if (!fp) {
    snprintf(err, errcap, "%.400s: cannot open (fixtures are committed under tests/ref/fixtures; "
             "regenerate with /usr/bin/python3 tests/ref/make_fixtures.py)", path);
    return -1;
  }
  unsigned char *buf = NULL;
  size_t len = 0, cap = 0, n;
  int rc = -1;
  for (;;) {
    if (len == cap) {
      cap = cap ? 2 * cap : 1 << 16;
      unsigned char *nb = realloc(buf, cap);
      if (!nb) {
        snprintf(err, errcap, "%.400s: out of memory", path);
        goto out;
      }
      buf = nb;
    }
    n = fread(buf + len, 1, cap - len, fp);
    len += n;
    if (n == 0) break;
  }
  if (ferror(fp)) {
    snprintf(err, errcap, "%.400s: read error", path);
    goto out;
  }
  char inner[512];
  rc = ref_parse(buf, len, f, inner, sizeof inner);
  if (rc) snprintf(err, errcap, "%.400s: %.500s", path, inner);
out:
  free(buf);
  fclose(fp);
  return rc;
}

static inline const ref_tensor *ref_find(const ref_fixture *f, const char *name) {
  for (int i = 0; i < f->count; i++)
    if (!strcmp(f->t[i].name, name)) return &f->t[i];
  return NULL;
}

/* ---- comparing a dgrad tensor with a fixture tensor ---- */

static inline void ref_index_str(const ref_tensor *r, int64_t flat, char *buf, size_t cap) {
  int64_t idx[DG_MAX_DIMS];
  for (int d = r->ndim - 1; d >= 0; d--) {
    idx[d] = r->dims[d] ? flat % r->dims[d] : 0;
    flat = r->dims[d] ? flat / r->dims[d] : 0;
  }
  size_t o = (size_t)snprintf(buf, cap, "[");
  for (int d = 0; d < r->ndim && o < cap; d++)
    o += (size_t)snprintf(buf + o, cap - o, "%s%lld", d ? "," : "", (long long)idx[d]);
  if (o < cap) snprintf(buf + o, cap - o, "]");
}

/* Compares got with mult * want. Prints one line per tensor (when verbose or
 * failing); returns 0 when within tol, else 1 (and counts a test failure).
 * got may be NULL (reported as missing). */
static inline int ref_compare(const char *model, const ref_tensor *want, const dg_tensor *got,
                              double mult, double tol, int verbose) {
  char shp[96] = "", at[64] = "";
  if (!got) {
    T_FAIL_("%s %s: dgrad produced no tensor (no gradient reached it?)", model, want->name);
    return 1;
  }
  int same = dg_tensor_ndim(got) == want->ndim && dg_tensor_dtype(got) == DG_F32;
  for (int d = 0; same && d < want->ndim; d++) same = dg_tensor_dim(got, d) == want->dims[d];
  dg_tensor_shape_str(got, shp, sizeof shp);
  if (!same || want->dtype != DG_F32) {
    T_FAIL_("%s %s: shape/dtype %s, fixture has %d dims (f32 expected)", model, want->name,
            shp, want->ndim);
    return 1;
  }
  const float *w = want->data;
  double scale = 0, worst = -1, wg = 0, ww = 0;
  int64_t wi = 0;
  int nonfinite = 0;
  for (int64_t i = 0; i < want->numel; i++) scale = fmax(scale, fabs(mult * w[i]));
  for (int64_t i = 0; i < want->numel; i++) {
    double g = dg_tensor_get(got, i), e = fabs(g - mult * w[i]);
    if (!isfinite(g)) {
      nonfinite++;
      e = INFINITY;
    }
    if (e > worst) {
      worst = e;
      wi = i;
      wg = g;
      ww = mult * w[i];
    }
  }
  double rel = scale > 0 ? worst / scale : worst;
  int bad = !(rel <= tol);
  if (want->numel) ref_index_str(want, wi, at, sizeof at);
  if (verbose || bad)
    printf("%-4s %-5s %-26s %-16s rel %.2e  worst %-12s got % .8g want % .8g (max|want| %.3g)%s\n",
           bad ? "FAIL" : "ok", model, want->name, shp, rel, at, wg, ww, scale,
           nonfinite ? "  NON-FINITE" : "");
  if (bad)
    T_FAIL_("%s %s%s: max abs error %.3g relative to max |want| %.3g = %.3g > tol %.1g "
            "(worst at %s: got %.9g want %.9g)",
            model, want->name, mult == 1 ? "" : " (accumulated twice)", worst, scale, rel, tol,
            at, wg, ww);
  return bad;
}

/* ---- the harness ---- */

typedef struct {
  const char *model;
  ref_fixture fx;
  dg_ctx *ctx;
  dg_params *ps;
  int nin;
  const char *in_name[REF_MAX_INPUTS]; /* without the "in." prefix */
  dg_tensor *in[REF_MAX_INPUTS];
} ref_env;

/* The model's forward: returns the loss and sets *out (logits / predictions),
 * or returns NULL on an op error. */
typedef dg_tensor *(*ref_forward_fn)(ref_env *env, dg_tensor **out, void *user);

static inline dg_tensor *ref_input(const ref_env *env, const char *name) {
  for (int i = 0; i < env->nin; i++)
    if (!strcmp(env->in_name[i], name)) return env->in[i];
  T_FAIL_("%s: no input \"in.%s\" in the fixture", env->model, name);
  return NULL;
}

static inline dg_tensor *ref_param(const ref_env *env, const char *name) {
  dg_tensor *p = dg_params_find(env->ps, name);
  if (!p) T_FAIL_("%s: no parameter \"p.%s\" in the fixture", env->model, name);
  return p;
}

static inline dg_tensor *ref_new_tensor(const ref_tensor *r) {
  dg_tensor *t = NULL;
  if (dg_tensor_new(&t, r->dtype, r->ndim, r->dims, NULL, 0)) return NULL;
  memcpy(dg_tensor_data(t), r->data, (size_t)r->numel * dg_dtype_size(r->dtype));
  return t;
}

/* Exits the test with a failure when the fixture is missing or malformed. */
static inline void ref_env_open(ref_env *env, const char *model, const char *path) {
  char err[1024], gname[300];
  memset(env, 0, sizeof *env);
  env->model = model;
  if (!path) {
    T_FAIL_("usage: test_ref_%s FIXTURE.dgref", model);
    exit(1);
  }
  if (ref_load(path, &env->fx, err, sizeof err)) {
    T_FAIL_("%s", err);
    exit(1);
  }
  REQUIRE(dg_ctx_new(&env->ctx, NULL) == DG_OK);
  REQUIRE(dg_params_new(&env->ps) == DG_OK);
  /* Register every parameter first (data pointers may move while adding),
   * then copy the values. */
  for (int i = 0; i < env->fx.count; i++) {
    const ref_tensor *r = &env->fx.t[i];
    dg_tensor *p = NULL;
    if (strncmp(r->name, "p.", 2)) continue;
    REQUIRE(r->dtype == DG_F32);
    int rc = dg_params_add(env->ps, r->name + 2, r->ndim, r->dims, &p);
    if (rc) {
      T_FAIL_("dg_params_add(%s): %s", r->name + 2, dg_strerror(rc));
      exit(1);
    }
  }
  for (int i = 0; i < env->fx.count; i++) {
    const ref_tensor *r = &env->fx.t[i];
    if (strncmp(r->name, "p.", 2)) continue;
    dg_tensor *p = dg_params_find(env->ps, r->name + 2);
    REQUIRE(p && dg_tensor_numel(p) == r->numel);
    memcpy(dg_tensor_data(p), r->data, (size_t)r->numel * sizeof(float));
  }
  for (int i = 0; i < env->fx.count; i++) {
    const ref_tensor *r = &env->fx.t[i];
    if (strncmp(r->name, "in.", 3)) continue;
    REQUIRE(env->nin < REF_MAX_INPUTS);
    dg_tensor *t = ref_new_tensor(r);
    REQUIRE(t != NULL);
    snprintf(gname, sizeof gname, "g.%s", r->name);
    if (ref_find(&env->fx, gname)) dg_tensor_set_requires_grad(t, 1);
    env->in_name[env->nin] = r->name + 3;
    env->in[env->nin++] = t;
  }
  printf("%s: %s, %d tensors, %d parameters\n", model, path, env->fx.count,
         dg_params_count(env->ps));
}

static inline void ref_env_close(ref_env *env) {
  for (int i = 0; i < env->nin; i++) dg_tensor_free(env->in[i]);
  dg_params_free(env->ps);
  dg_ctx_free(env->ctx);
  ref_fixture_free(&env->fx);
}

/* One step: forward, compare output and loss, backward, compare every
 * gradient in the fixture with mult times its value. Pass 1 zeroes the
 * gradients first and prints every comparison; pass 2 runs again on the reset
 * context without zeroing, so gradients must have accumulated to twice the
 * reference (only failures print). Returns the number of mismatching tensors
 * (each also counted as a test failure). */
static inline int ref_env_pass(ref_env *env, ref_forward_fn fwd, void *user, double tol,
                               int pass) {
  int bad = 0, verbose = pass == 1;
  double mult = pass == 1 ? 1.0 : 2.0;
  dg_tensor *out = NULL;
  dg_ctx_reset(env->ctx);
  if (pass == 1) {
    dg_params_zero_grad(env->ps);
    for (int i = 0; i < env->nin; i++) {
      dg_tensor *g = dg_tensor_grad(env->in[i]);
      if (g) memset(dg_tensor_data(g), 0, (size_t)dg_tensor_numel(g) * sizeof(float));
    }
  }
  dg_tensor *loss = fwd(env, &out, user);
  if (!loss || !out) {
    T_FAIL_("%s: forward (pass %d) failed: %s", env->model, pass, dg_ctx_errmsg(env->ctx));
    return 1;
  }
  for (int i = 0; i < env->fx.count; i++) {
    const ref_tensor *r = &env->fx.t[i];
    if (strncmp(r->name, "out.", 4)) continue;
    bad += ref_compare(env->model, r, strcmp(r->name, "out.loss") ? out : loss, 1.0, tol,
                       verbose);
  }
  int rc = dg_backward(env->ctx, loss);
  if (rc) {
    T_FAIL_("%s: dg_backward (pass %d): %s: %s", env->model, pass, dg_strerror(rc),
            dg_ctx_errmsg(env->ctx));
    return bad + 1;
  }
  int ngrad = 0;
  for (int i = 0; i < env->fx.count; i++) {
    const ref_tensor *r = &env->fx.t[i];
    const dg_tensor *g = NULL;
    if (strncmp(r->name, "g.", 2)) continue;
    if (!strncmp(r->name, "g.in.", 5)) {
      dg_tensor *x = ref_input(env, r->name + 5);
      g = x ? dg_tensor_grad(x) : NULL;
    } else {
      dg_tensor *p = ref_param(env, r->name + 2);
      g = p ? dg_tensor_grad(p) : NULL;
    }
    bad += ref_compare(env->model, r, g, mult, tol, verbose);
    ngrad++;
  }
  if (ngrad < dg_params_count(env->ps)) {
    T_FAIL_("%s: fixture has %d gradients for %d parameters", env->model, ngrad,
            dg_params_count(env->ps));
    bad++;
  }
  int unreached = dg_params_unreached_count(env->ps);
  if (unreached) {
    T_FAIL_("%s: backward did not reach %d parameter(s)", env->model, unreached);
    bad++;
  }
  return bad;
}

/* A whole test: open, check, close; returns the process exit code. */
static inline int ref_main(const char *model, int argc, char **argv, ref_forward_fn fwd,
                           void *user) {
  ref_env env;
  ref_env_open(&env, model, argc > 1 ? argv[1] : NULL);
  int bad = ref_env_pass(&env, fwd, user, REF_TOL, 1);
  printf("%s: %d tensor(s) out of tolerance %.0e\n", model, bad, REF_TOL);
  bad = ref_env_pass(&env, fwd, user, REF_TOL, 2);
  printf("%s: second step without zero_grad: %d tensor(s) off twice the reference "
         "gradient\n", model, bad);
  fflush(stdout);
  ref_env_close(&env);
  return TEST_DONE();
}

#endif
