/* Batch normalisation with statistics combined across processes: the seam
 * between the op (ops/batchnorm.c) and SyncBatchNorm (dist/ddp_syncbn.c),
 * which supplies the combining. Not API. */
#ifndef DG_BATCHNORM_IMPL_H
#define DG_BATCHNORM_IMPL_H

#include "core/core_impl.h"

/* How training-mode statistics are combined. Both calls are collective:
 * every process of the group reaches them in the same order (forward: the
 * op, backward: its node). A failure returns a DG_E* code with the reason
 * in err. */
typedef struct {
  const char *op; /* the op's name in messages ("sync_batchnorm") */
  /* st (1 + 2C) host doubles: this process's count of values per channel
   * (N * L), then per channel the mean (C) and the sum of squared
   * deviations from it (C); replaced by those of the group's whole batch */
  int (*stats)(void *user, double *st, int64_t C, char *err, size_t cap);
  /* sums (2C) host doubles: per channel sum dy, then sum dy * xhat, over
   * this process's batch; replaced by the sums over the group's batch */
  int (*grad_sums)(void *user, double *sums, int64_t C, char *err, size_t cap);
  void *user; /* must outlive every backward through the op */
} dg__bn_sync;

/* dg_batchnorm with the statistics of training mode combined by sync
 * (NULL: this batch's only, which is dg_batchnorm). */
dg_tensor *dg__batchnorm_ex(dg_ctx *ctx, dg_tensor *x, dg_tensor *w, dg_tensor *b,
                            dg_tensor *running_mean, dg_tensor *running_var, int train,
                            float momentum, float eps, const dg__bn_sync *sync);

#endif
