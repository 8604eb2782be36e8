/* What the pipe tests share: building a Sequential, the loss of a
 * micro-batch, a deterministic batch. Include after defining B (rows), IN
 * (features) and NCLS (classes). */
#ifndef DG_TESTS_PIPE_UTIL_H
#define DG_TESTS_PIPE_UTIL_H

#include "dgrad/pipe.h"
#include "tests/ddp/ddp_util.h"

/* l by address: the call that sets it is an argument too */
static void add(dg_module *seq, int rc, dg_module **l) {
  REQUIRE(rc == DG_OK && dg_sequential_add(seq, *l, NULL) == DG_OK);
}

/* user (may be NULL): an int counting the micro-batches seen */
static dg_tensor *ce(void *user, dg_ctx *ctx, dg_tensor *out, dg_tensor *t) {
  if (user) ++*(int *)user;
  return dg_cross_entropy(ctx, out, t);
}

/* step's batch: x (B, IN) normal, y (B) classes */
static void batch(int64_t step, float *x, int64_t *y) {
  dg_rng_normal(7, (uint64_t)step * B * IN, x, B * IN);
  for (int i = 0; i < B; i++) y[i] = (i * 5 + step) % NCLS;
}

#endif
