/* Helpers for the DDP tests: ranks as forked processes rendezvousing through
 * a Gloo FileStore in a fresh temp dir, a small MLP on synthetic data, a
 * single-process reference, and parameter comparison. */
#ifndef DG_TEST_DDP_UTIL_H
#define DG_TEST_DDP_UTIL_H

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dgrad.h"
#include "dgrad/dist.h"
#include "tests/fault/fork_util.h"
#include "tests/test.h"

#define DU_IN 12
#define DU_HID 24
#define DU_OUT 5

/* ---- ranks as processes ---- */

static char du_dir[256];
/* A link model for the groups du_pg makes (bench/ddp/simlink.c; NULL: none). */
static const dg_link_model *du_link;

/* A process group for rank r of W over the FileStore in du_dir, with the
 * switches of the environment (DG_BACKEND, DG_SHM, ...: the meson cases
 * set them). */
static const char *du_group; /* the group's store prefix (NULL: torch's default) */
static inline int du_pg(int r, int W, dg_store **st, dg_pg **pg) {
  int rc = dg_store_new_file(st, du_dir, 30000, NULL, 0);
  if (rc) return rc;
  dg_pg_opts o;
  memset(&o, 0, sizeof o);
  o.rank = r;
  o.world_size = W;
  o.store = *st;
  o.timeout_ms = 20000;
  o.link = du_link;
  o.group_name = du_group;
  dg_pg_opts_from_env(&o);
  char err[256];
  rc = dg_pg_new(pg, &o, err, sizeof err);
  if (rc) fprintf(stderr, "rank %d: pg: %s\n", r, err);
  return rc;
}

/* DDP defaults with DG_DDP_SHM_INLINE from the environment (1: no engine
 * in the group's thread, 0: always one), as the benchmark reads it. */
static inline dg_ddp_opts du_ddp_defaults(void) {
  dg_ddp_opts o = dg_ddp_defaults();
  const char *e = getenv("DG_DDP_SHM_INLINE");
  if (e && (*e == '0' || *e == '1')) o.engine_thread = *e == '1' ? -1 : 1;
  return o;
}

/* Frees pg and store right after the last collective (over TCP a rank
 * that leaves at once no longer fails a slower peer's last collective:
 * tests/dist/test_leave). Over UCX (DG_BACKEND=ucx) it first waits until
 * every rank has finished (a store counter, independent of the group). */
static inline void du_leave(dg_store *st, dg_pg *pg, int W) {
  const char *be = getenv("DG_BACKEND");
  int64_t n = be && !strcmp(be, "ucx") ? 0 : W;
  if (n < W) dg_store_add(st, "du_done", 1, &n);
  for (int i = 0; i < 4000 && n < W; i++) {
    usleep(5000);
    dg_store_add(st, "du_done", 0, &n);
  }
  dg_pg_free(pg);
  dg_store_free(st);
}

/* Runs fn(rank, W, arg) in W children (bounded by secs; stragglers are
 * killed and count as failures). Returns the number of ranks that did not
 * exit 0; status[r] (may be NULL) gets each wait status, -1 when killed. */
static inline int du_run(int W, int (*fn)(int, int, void *), void *arg, int secs, int *status) {
  snprintf(du_dir, sizeof du_dir, "/tmp/dg_ddp_test_XXXXXX");
  if (!mkdtemp(du_dir)) return W;
  pid_t pid[16];
  for (int r = 0; r < W; r++) {
    pid[r] = fork();
    if (pid[r] == 0) {
      alarm((unsigned)secs + 5); /* belt and braces */
      _exit(fn(r, W, arg));
    }
  }
  int st[16], bad = 0;
  fu_reap(W, pid, secs, st);
  for (int r = 0; r < W; r++) {
    if (status) status[r] = st[r];
    if (st[r] == -1) fprintf(stderr, "rank %d: still running after %d s: killed\n", r, secs);
    else if (!WIFEXITED(st[r]) || WEXITSTATUS(st[r]) != 0)
      fprintf(stderr, "rank %d: exit status 0x%x\n", r, st[r]);
    else continue;
    bad++;
  }
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", du_dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", du_dir);
  return bad;
}

/* ---- model ---- */

typedef struct {
  dg_params *ps;
  dg_tensor *w1, *b1, *w2, *b2, *unused;
} du_mlp;

/* Registers fc1, fc2 (and an unused parameter) and fills them from seed. */
static inline int du_mlp_init(du_mlp *m, int with_unused, uint64_t seed) {
  memset(m, 0, sizeof *m);
  int rc = dg_params_new(&m->ps);
  int64_t s1[2] = {DU_HID, DU_IN}, s2[2] = {DU_OUT, DU_HID}, su[2] = {3, 7};
  int64_t h = DU_HID, o = DU_OUT;
  if (!rc) rc = dg_params_add(m->ps, "fc1.weight", 2, s1, &m->w1);
  if (!rc) rc = dg_params_add(m->ps, "fc1.bias", 1, &h, &m->b1);
  if (!rc && with_unused) rc = dg_params_add(m->ps, "aux.weight", 2, su, &m->unused);
  if (!rc) rc = dg_params_add(m->ps, "fc2.weight", 2, s2, &m->w2);
  if (!rc) rc = dg_params_add(m->ps, "fc2.bias", 1, &o, &m->b2);
  if (rc) return rc;
  for (int i = 0; i < dg_params_count(m->ps); i++) {
    dg_tensor *t = dg_params_get(m->ps, i);
    float *p = dg_tensor_data(t);
    size_t n = (size_t)dg_tensor_numel(t);
    dg_rng_uniform(seed, (uint64_t)i * 100000u, p, n);
    for (size_t k = 0; k < n; k++) p[k] = (p[k] - 0.5f) * 0.6f;
  }
  return DG_OK;
}

/* Synthetic data: sample i of the global set. x (n, DU_IN), y (n). */
static inline void du_data(int64_t first, int64_t n, float *x, int64_t *y) {
  dg_rng_normal(777, (uint64_t)first * DU_IN, x, (size_t)(n * DU_IN));
  for (int64_t i = 0; i < n; i++) y[i] = (first + i) * 7 % DU_OUT;
}

/* Forward + mean cross-entropy over rows [first, first + n) of the data. */
static inline dg_tensor *du_loss(dg_ctx *ctx, du_mlp *m, int64_t first, int64_t n) {
  float *x = malloc((size_t)(n * DU_IN) * sizeof *x);
  int64_t *y = malloc((size_t)n * sizeof *y);
  du_data(first, n, x, y);
  int64_t xs[2] = {n, DU_IN};
  dg_tensor *xt = dg_from_data(ctx, DG_F32, 2, xs, x);
  dg_tensor *yt = dg_from_data(ctx, DG_I64, 1, &n, y);
  free(x);
  free(y);
  dg_tensor *h = dg_relu(ctx, dg_linear(ctx, xt, m->w1, m->b1));
  return dg_cross_entropy(ctx, dg_linear(ctx, h, m->w2, m->b2), yt);
}

/* ---- optimizers by name ---- */

static inline int du_optim(const char *name, dg_params *ps, dg_optim **o) {
  if (!strcmp(name, "sgd")) {
    dg_sgd_opts s = dg_sgd_defaults();
    s.lr = 0.1f;
    s.momentum = 0.9f;
    s.weight_decay = 1e-3f;
    return dg_optim_new_sgd(o, ps, &s, NULL, 0);
  }
  if (!strcmp(name, "adamw")) {
    dg_adamw_opts a = dg_adamw_defaults();
    a.lr = 1e-2f;
    return dg_optim_new_adamw(o, ps, &a, NULL, 0);
  }
  if (!strcmp(name, "lamb")) {
    dg_lamb_opts a = dg_lamb_defaults();
    a.lr = 1e-2f;
    return dg_optim_new_lamb(o, ps, &a, NULL, 0);
  }
  if (!strcmp(name, "lars")) {
    dg_lars_opts l = dg_lars_defaults();
    l.lr = 0.5f;
    l.trust_coef = 0.02f;
    return dg_optim_new_lars(o, ps, &l, NULL, 0);
  }
  return DG_EINVAL;
}

/* max |a - b| / max |b| over every parameter (by name). */
static inline double du_rel_diff(dg_params *a, dg_params *b) {
  double num = 0, den = 0;
  for (int i = 0; i < dg_params_count(b); i++) {
    dg_tensor *tb = dg_params_get(b, i);
    dg_tensor *ta = dg_params_find(a, dg_tensor_name(tb));
    if (!ta) return INFINITY;
    const float *pa = dg_tensor_data(ta), *pb = dg_tensor_data(tb);
    for (int64_t k = 0; k < dg_tensor_numel(tb); k++) {
      num = fmax(num, fabs((double)pa[k] - pb[k]));
      den = fmax(den, fabs((double)pb[k]));
    }
  }
  return den > 0 ? num / den : num;
}

#endif
