/* What the pipe tests share: a rank's group, store and context, building a
 * Sequential, the loss of a micro-batch, a deterministic batch. Include after defining B (rows), IN
 * (features) and NCLS (classes). */
#ifndef DG_TESTS_PIPE_UTIL_H
#define DG_TESTS_PIPE_UTIL_H

#include "dgrad/pipe.h"
#include "tests/ddp/ddp_util.h"

/* l by address: the call that sets it is an argument too */
static inline void add(dg_module *seq, int rc, dg_module **l) {
  REQUIRE(rc == DG_OK && dg_sequential_add(seq, *l, NULL) == DG_OK);
}

/* user (may be NULL): an int counting the micro-batches seen */
static inline dg_tensor *ce(void *user, dg_ctx *ctx, dg_tensor *out, dg_tensor *t) {
  if (user) ++*(int *)user;
  return dg_cross_entropy(ctx, out, t);
}

/* step's batch: x (B, IN) normal, y (B) classes */
static inline void batch(int64_t step, float *x, int64_t *y) {
  dg_rng_normal(7, (uint64_t)step * B * IN, x, B * IN);
  for (int i = 0; i < B; i++) y[i] = (i * 5 + step) % NCLS;
}

/* Monotonic seconds (how long a failing step took to fail). */
static inline double pu_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The largest relative difference, |a - b| / (|b| + 1e-3), between the
 * gradients of the stage's parameters (ps) and those of the same names in
 * the whole model's store (ref); a gradient never allocated counts as
 * zeros. Each parameter must be in ref. */
static inline double pu_grad_diff(dg_params *ps, dg_params *ref) {
  double worst = 0;
  for (int i = 0; i < dg_params_count(ps); i++) {
    dg_tensor *a = dg_params_get(ps, i), *b = dg_params_find(ref, dg_tensor_name(a));
    REQUIRE(b && dg_tensor_numel(a) == dg_tensor_numel(b));
    const float *ga = dg_tensor_grad(a) ? dg_tensor_data(dg_tensor_grad(a)) : NULL;
    const float *gb = dg_tensor_grad(b) ? dg_tensor_data(dg_tensor_grad(b)) : NULL;
    for (int64_t j = 0; j < dg_tensor_numel(a); j++) {
      const double x = ga ? ga[j] : 0, y = gb ? gb[j] : 0;
      worst = fmax(worst, fabs(x - y) / (fabs(y) + 1e-3));
    }
  }
  return worst;
}

/* A rank of a pipe test: its group (du_pg), an empty parameter store for
 * its stage and a context. */
typedef struct {
  dg_store *st;
  dg_pg *pg;
  dg_params *ps;
  dg_ctx *ctx;
} pu_rank;

static inline int pu_open(pu_rank *k, int r, int W) {
  if (du_pg(r, W, &k->st, &k->pg)) return 2;
  REQUIRE(dg_params_new(&k->ps) == DG_OK && dg_ctx_new(&k->ctx, NULL) == DG_OK);
  return 0;
}

/* leave 1: du_leave (every rank says goodbye); 0: a peer is gone, the group
 * is freed as it is */
static inline void pu_close(pu_rank *k, int W, int leave) {
  dg_params_free(k->ps);
  dg_ctx_free(k->ctx);
  if (leave) {
    du_leave(k->st, k->pg, W);
  } else {
    dg_pg_free(k->pg);
    dg_store_free(k->st);
  }
}

#endif
