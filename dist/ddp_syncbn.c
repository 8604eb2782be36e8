/* SyncBatchNorm: BatchNorm whose training statistics are those of the whole
 * process group's batch, as torch.nn.SyncBatchNorm. The module is
 * BatchNorm's (nn/batchnorm.c: bind, forward, buffers) with a sync
 * (ops/batchnorm_impl.h) that the op calls at two points:
 *   forward   all-gather each rank's (count, mean, M2) per channel (f64) and
 *             combine them in rank order (Chan's parallel update: no
 *             cancellation, ranks of any batch size, and the same bits on
 *             every rank, so the running statistics stay identical);
 *   backward  all-reduce (sum dy, sum dy * xhat) per channel (f64), from
 *             which every rank's dx follows as on one process.
 * Weight and bias gradients stay this rank's own sums (as torch): DDP's
 * averaging, or a sum over ranks, completes them. */
#include <string.h>

#include "dgrad/ddp.h"
#include "nn/nn_impl.h"

typedef struct {
  dg__bn_module bn; /* first: the module */
  dg__bn_sync sync;
  dg_pg *pg;
  double *gather; /* (world * (1 + 2C)) f64: every rank's statistics */
  size_t gather_cap;
} syncbn_m;

/* Waits for w (posted with rc) and frees it; on failure the reason names
 * the rank, what and the group's message. */
static int finish(syncbn_m *s, int rc, dg_work *w, const char *what, char *err, size_t cap) {
  if (!rc) rc = dg_work_wait(w, 0);
  if (rc)
    dg__fail_msg(err, cap, rc, "rank %d: %s failed: %s", dg_pg_rank(s->pg), what,
                 w ? dg_work_errmsg(w) : dg_pg_errmsg(s->pg));
  dg_work_free(w);
  return rc;
}

/* Combines the gathered (count, mean (C), M2 (C)) of every rank into st. */
static void combine(const double *g, int W, int64_t C, double *st) {
  const size_t per = 1 + 2 * (size_t)C;
  double n = 0, *mean = st + 1, *m2 = st + 1 + C;
  memset(st, 0, per * sizeof *st);
  for (int r = 0; r < W; r++) {
    const double nr = g[r * per], *mr = g + r * per + 1, *qr = mr + C;
    if (nr == 0) continue;
    const double tot = n + nr;
    for (int64_t c = 0; c < C; c++) {
      double delta = mr[c] - mean[c];
      mean[c] += delta * (nr / tot);
      m2[c] += qr[c] + delta * delta * (n * nr / tot);
    }
    n = tot;
  }
  st[0] = n;
}

static int sb_stats(void *user, double *st, int64_t C, char *err, size_t cap) {
  syncbn_m *s = user;
  const int W = dg_pg_size(s->pg);
  const size_t per = 1 + 2 * (size_t)C;
  if (s->gather_cap < (size_t)W * per) {
    double *g = dg__realloc(s->gather, (size_t)W * per * sizeof *g);
    if (!g) return dg__fail_msg(err, cap, DG_ENOMEM, "out of memory for %d ranks' statistics", W);
    s->gather = g, s->gather_cap = (size_t)W * per;
  }
  dg_work *w = NULL;
  int rc = dg_pg_allgather(s->pg, st, s->gather, per, DG_F64, &w);
  if ((rc = finish(s, rc, w, "the all-gather of the batch statistics", err, cap))) return rc;
  /* a rank with no values would skip the backward's all-reduce (the tape
   * does not run a node with an empty output): refused on every rank */
  for (int r = 0; r < W; r++)
    if (s->gather[(size_t)r * per] == 0)
      return dg__fail_msg(err, cap, DG_EINVAL, "rank %d has an empty batch; in training every "
                          "rank needs at least one value per channel (ranks may differ in batch "
                          "size)", r);
  combine(s->gather, W, C, st);
  return DG_OK;
}

static int sb_grad_sums(void *user, double *sums, int64_t C, char *err, size_t cap) {
  syncbn_m *s = user;
  /* the calling thread runs it: no wake-up of the group's worker per layer */
  int rc = dg_pg_allreduce_sync(s->pg, sums, 2 * (size_t)C, DG_F64, DG_RED_SUM);
  if (rc)
    dg__fail_msg(err, cap, rc, "rank %d: the all-reduce of the gradient sums failed: %s",
                 dg_pg_rank(s->pg), dg_pg_errmsg(s->pg));
  return rc;
}

static void sb_destroy(dg_module *m) {
  syncbn_m *s = (syncbn_m *)m;
  dg__free(s->gather);
  s->gather = NULL;
  s->gather_cap = 0;
}

static const dg_module_vtable sb_vt = {"SyncBatchNorm", dg__bn_forward, dg__bn_bind, sb_destroy,
                                       NULL};

static int sb_new(dg_module **out, int64_t C, float eps, float momentum, dg_pg *pg, int min_dims,
                  int max_dims, const char *desc) {
  if (out) *out = NULL;
  if (!pg) return DG_EINVAL;
  int rc = dg__bn_new(out, sizeof(syncbn_m), &sb_vt, C, eps, momentum, min_dims, max_dims, desc);
  if (rc) return rc;
  syncbn_m *s = (syncbn_m *)*out;
  s->pg = pg;
  s->sync = (dg__bn_sync){"sync_batchnorm", sb_stats, sb_grad_sums, s};
  s->bn.sync = &s->sync;
  return DG_OK;
}

int dg_nn_sync_batchnorm1d(dg_module **out, int64_t C, float eps, float momentum, dg_pg *pg) {
  return sb_new(out, C, eps, momentum, pg, 2, 3, "(N, C) or (N, C, L)");
}

int dg_nn_sync_batchnorm2d(dg_module **out, int64_t C, float eps, float momentum, dg_pg *pg) {
  return sb_new(out, C, eps, momentum, pg, 4, 4, "(N, C, H, W)");
}
