/* DDP construction checks: every rank must hold the same parameters (count,
 * names, shapes, dtypes, trainable flags) and the same DDP options. One
 * all-gather of a 64-bit hash in the common case; on a mismatch, per-item
 * hashes and then the descriptions of the first differing item are
 * exchanged, so every rank reports the same message naming the parameter and
 * the ranks. Also the broadcast of values and buffers. */
#include <stdio.h>
#include <string.h>

#include "dist/ddp_impl.h"

#define DESC_LEN 192 /* bytes per description, a multiple of 4 */

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *c = p;
  for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 1099511628211ull;
  return h;
}

/* Items: the options, the parameters, the store's buffers. */
static int nitems(const dg_ddp *d) { return 1 + d->nparams + dg_params_buffer_count(d->ps); }

/* Item 0: the options; item i in [1, nparams]: parameter i - 1; then the
 * store's buffers. */
static void describe(const dg_ddp *d, int item, char *buf, size_t cap) {
  memset(buf, 0, cap);
  if (item == 0) {
    snprintf(buf, cap, "options{bucket_cap=%zu first_bucket=%zu accum=%d hook=%s join=%d "
             "static=%d}", d->opts.bucket_cap_bytes, d->opts.first_bucket_bytes,
             d->opts.accum_steps, d->hook.name ? d->hook.name : "?", !d->opts.no_join,
             d->opts.static_buckets);
    return;
  }
  char shape[96];
  if (item > d->nparams) {
    dg_tensor *t = dg_params_buffer_get(d->ps, item - 1 - d->nparams);
    if (t) snprintf(buf, cap, "buffer '%s' %s", dg_tensor_name(t),
                    dg_tensor_shape_str(t, shape, sizeof shape));
    else snprintf(buf, cap, "(none)");
    return;
  }
  dg_tensor *t = dg_params_get(d->ps, item - 1);
  snprintf(buf, cap, "'%s' %s%s", dg_tensor_name(t), dg_tensor_shape_str(t, shape, sizeof shape),
           dg_params_trainable(d->ps, item - 1) ? "" : " frozen");
}

static uint64_t item_hash(const dg_ddp *d, int item) {
  char buf[DESC_LEN];
  describe(d, item, buf, sizeof buf);
  return fnv(1469598103934665603ull, buf, strlen(buf));
}

static int gather(dg_ddp *d, const void *in, void *out, size_t count, dg_dtype dt,
                  const char *what) {
  dg_work *w = NULL;
  int rc = dg_pg_allgather(d->pg, in, out, count, dt, &w);
  if (!rc) rc = dg_work_wait(w, 0);
  if (rc)
    dg__ddp_fail(d, rc, "ddp_new: rank %d: all-gather of %s failed: %s", d->rank, what,
                 w ? dg_work_errmsg(w) : dg_pg_errmsg(d->pg));
  dg_work_free(w);
  return rc;
}

/* Finds the first item where some rank differs from rank 0. */
static void first_diff(const int64_t *h, int W, int maxn, int *item, int *rank) {
  for (int i = 0; i < maxn; i++)
    for (int r = 1; r < W; r++)
      if (h[(size_t)r * (size_t)maxn + (size_t)i] != h[i]) {
        *item = i;
        *rank = r;
        return;
      }
  *item = 0;
  *rank = 1;
}

/* Slow path after the hashes differ: name the difference. */
static int explain(dg_ddp *d) {
  int W = d->world, n = nitems(d), maxn = 0, item, rk;
  int32_t *counts = dg__malloc(2 * (size_t)W * sizeof *counts); /* (items, params) per rank */
  if (!counts) return DG_ENOMEM;
  int rc = gather(d, (int32_t[2]){n, d->nparams}, counts, 2, DG_I32, "parameter counts");
  for (int r = 0; !rc && r < W; r++) maxn = DG_MAX(maxn, counts[2 * r]);
  int64_t *mine = dg__calloc((size_t)maxn + 1, sizeof *mine);
  int64_t *all = dg__calloc((size_t)maxn * (size_t)W + 1, sizeof *all);
  char *desc = dg__calloc((size_t)W, DESC_LEN);
  if (!rc && (!mine || !all || !desc)) rc = DG_ENOMEM;
  for (int i = 0; !rc && i < n; i++) mine[i] = (int64_t)item_hash(d, i);
  if (!rc) rc = gather(d, mine, all, (size_t)maxn, DG_I64, "parameter hashes");
  if (!rc) {
    first_diff(all, W, maxn, &item, &rk);
    char my[DESC_LEN];
    describe(d, item, my, sizeof my);
    rc = gather(d, my, desc, DESC_LEN / 4, DG_I32, "parameter descriptions");
  }
  if (!rc) {
    const char *a = desc, *b = desc + (size_t)rk * DESC_LEN;
    if (item == 0)
      rc = dg__ddp_fail(d, DG_EMISMATCH, "ddp_new: DDP options differ between ranks: rank 0 "
                        "%.*s vs rank %d %.*s", DESC_LEN, a, rk, DESC_LEN, b);
    else { /* items after rank 0's parameters are its buffers */
      int isbuf = item - 1 >= counts[1], nbuf0 = counts[0] - 1 - counts[1];
      rc = dg__ddp_fail(d, DG_EMISMATCH, "ddp_new: parameters differ between ranks: rank 0 has "
                        "%d, rank %d has %d (buffers: %d vs %d); first difference at %s %d: "
                        "rank 0 %.*s vs rank %d %.*s", counts[1], rk, counts[2 * rk + 1], nbuf0,
                        counts[2 * rk] - 1 - counts[2 * rk + 1], isbuf ? "buffer" : "parameter",
                        isbuf ? item - 1 - counts[1] : item - 1, DESC_LEN, a, rk, DESC_LEN, b);
    }
  }
  dg__free(counts);
  dg__free(mine);
  dg__free(all);
  dg__free(desc);
  return rc;
}

int dg__ddp_verify(dg_ddp *d) {
  uint64_t h = fnv(1469598103934665603ull, &d->nparams, sizeof d->nparams);
  for (int i = 0; i < nitems(d); i++) {
    uint64_t ih = item_hash(d, i);
    h = fnv(h, &ih, sizeof ih);
  }
  int64_t *all = dg__malloc((size_t)d->world * sizeof *all);
  if (!all) return DG_ENOMEM;
  int rc = gather(d, &(int64_t){(int64_t)h}, all, 1, DG_I64, "the parameter hash");
  int same = 1;
  for (int r = 1; !rc && r < d->world; r++) same &= all[r] == all[0];
  dg__free(all);
  if (rc) return rc;
  return same ? DG_OK : explain(d);
}

static int bcast(dg_ddp *d, void *buf, size_t n, dg_dtype dt, int root, const char *what) {
  dg_work *w = NULL;
  int rc = dg_pg_broadcast(d->pg, buf, n, dt, root, &w);
  if (!rc) rc = dg_work_wait(w, 0);
  if (rc)
    dg__ddp_fail(d, rc, "ddp: rank %d: broadcast of %s from rank %d failed: %s", d->rank, what,
                 root, w ? dg_work_errmsg(w) : dg_pg_errmsg(d->pg));
  dg_work_free(w);
  return rc;
}

/* The store's buffers, in one broadcast of their flat buffer (the check of
 * dg__ddp_verify made it the same size on every rank), then, with_opts,
 * opts->buffers. */
int dg__ddp_broadcast_buffers(dg_ddp *d, int root, int with_opts) {
  size_t n = 0;
  float *v = dg_params_buffer_data(d->ps, &n);
  int rc = n ? bcast(d, v, n, DG_F32, root, "the store's buffers") : DG_OK;
  for (int k = 0; !rc && with_opts && k < d->opts.nbuffers; k++) {
    dg_tensor *t = d->opts.buffers[k];
    if (!t || !dg_tensor_is_contiguous(t))
      return dg__ddp_fail(d, DG_EINVAL, "ddp: buffer %d is NULL or not contiguous", k);
    rc = bcast(d, dg_tensor_data(t), (size_t)dg_tensor_numel(t), dg_tensor_dtype(t), root,
               "a buffer");
  }
  return rc;
}

int dg__ddp_broadcast_state(dg_ddp *d, int root, int with_buffers) {
  size_t n = 0;
  float *v = dg_params_data(d->ps, &n);
  /* a sharded update keeps one copy of the values for all ranks: equal already */
  int rc = d->shard ? DG_OK : bcast(d, v, n, DG_F32, root, "the parameter values");
  return rc ? rc : dg__ddp_broadcast_buffers(d, root, with_buffers);
}
