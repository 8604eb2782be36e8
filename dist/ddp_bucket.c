/* DDP buckets: contiguous slices of the flat gradient buffer, built over the
 * memory order of the parameters (descending at first, i.e. reverse
 * registration; ascending after the rebuild that lays the store out in the
 * observed ready order), started in bucket order, finished at backward end. */
#include <stdlib.h>
#include <string.h>

#include "dist/ddp_impl.h"
#include "dist/pg_impl.h"
#include "core/core_impl.h"

/* Parameter indices sorted by offset (insertion sort: stores are small and
 * this avoids qsort's global comparator state across threads). */
static void sort_by_offset(const dg_params *ps, int *idx, int n) {
  for (int i = 0; i < n; i++) idx[i] = i;
  for (int i = 1; i < n; i++) {
    int v = idx[i], j = i - 1;
    size_t ov = dg_params_offset(ps, v);
    while (j >= 0 && dg_params_offset(ps, idx[j]) > ov) {
      idx[j + 1] = idx[j];
      j--;
    }
    idx[j + 1] = v;
  }
}

static void close_bucket(dg_ddp *d, dg__ddp_bucket *cur, int *open) {
  if (!*open) return;
  d->b[d->nb++] = *cur;
  *open = 0;
}

int dg__ddp_build_buckets(dg_ddp *d, int ascending) {
  int n = d->nparams;
  int *idx = dg__malloc((size_t)(n ? n : 1) * sizeof *idx);
  dg__ddp_bucket *nb = dg__calloc((size_t)(n ? n : 1), sizeof *nb);
  if (!idx || !nb) {
    dg__free(idx);
    dg__free(nb);
    return DG_ENOMEM;
  }
  sort_by_offset(d->ps, idx, n);
  dg__free(d->b);
  d->b = nb;
  d->nb = 0;
  dg__ddp_bucket cur = {0};
  int open = 0;
  size_t cap0 = d->opts.first_bucket_bytes, cap = d->opts.bucket_cap_bytes;
  for (int k = 0; k < n; k++) {
    int i = idx[ascending ? k : n - 1 - k];
    d->pbucket[i] = -1;
    if (!dg_params_trainable(d->ps, i)) {
      close_bucket(d, &cur, &open); /* never straddle a frozen parameter */
      continue;
    }
    size_t lo = dg_params_offset(d->ps, i);
    size_t hi = lo + (size_t)dg_tensor_numel(dg_params_get(d->ps, i));
    size_t capk = d->nb == 0 ? cap0 : cap;
    /* a parameter that would overflow a non-empty bucket starts the next one,
     * so a small first bucket is not swallowed by a large parameter */
    if (open && (DG_MAX(cur.hi, hi) - DG_MIN(cur.lo, lo)) * sizeof(float) > capk)
      close_bucket(d, &cur, &open);
    if (!open) {
      cur = (dg__ddp_bucket){.lo = lo, .hi = hi, .first = i};
      open = 1;
    }
    cur.lo = DG_MIN(cur.lo, lo);
    cur.hi = DG_MAX(cur.hi, hi);
    cur.nparams++;
    d->pbucket[i] = d->nb;
    if ((cur.hi - cur.lo) * sizeof(float) >= (d->nb == 0 ? cap0 : cap))
      close_bucket(d, &cur, &open); /* full */
  }
  close_bucket(d, &cur, &open);
  dg__free(idx);
  d->st.nbuckets = d->nb;
  for (int k = 0; d->shmg && k < d->nb; k++)
    dg__shmgrad_bucket(d->shmg, k, d->nb, d->b[k].lo, d->b[k].hi - d->b[k].lo);
  return DG_OK;
}

/* The full permutation for dg_params_relayout: the ready order, then any
 * parameter it lacks (frozen ones) in registration order. */
static void complete_order(const dg_ddp *d, int *order) {
  int n = d->nparams, k = 0;
  uint8_t *seen = dg__calloc((size_t)n + 1, 1);
  DG_ASSERT(seen);
  for (int j = 0; j < d->norder; j++) {
    int i = d->order[j];
    if (i >= 0 && i < n && !seen[i]) seen[i] = 1, order[k++] = i;
  }
  for (int i = 0; i < n; i++)
    if (!seen[i]) order[k++] = i;
  dg__free(seen);
}

int dg__ddp_rebuild(dg_ddp *d) {
  int n = d->nparams;
  int32_t *order = dg__malloc((size_t)(n ? n : 1) * sizeof *order);
  if (!order) return DG_ENOMEM;
  complete_order(d, order);
  dg_work *w = NULL;
  int rc = dg_pg_broadcast(d->pg, order, (size_t)n, DG_I32, 0, &w);
  if (!rc) rc = dg_work_wait(w, 0);
  if (rc)
    dg__ddp_fail(d, rc, "ddp: broadcast of the bucket order failed: %s",
                 w ? dg_work_errmsg(w) : dg_pg_errmsg(d->pg));
  dg_work_free(w);
  for (int k = 0; !rc && k < n; k++)
    if (order[k] < 0 || order[k] >= n) rc = dg__ddp_fail(d, DG_EFORMAT, "ddp: bad bucket order");
  if (!rc) rc = dg_params_relayout(d->ps, order);
  if (!rc) rc = dg__ddp_build_buckets(d, 1);
  if (!rc) d->rebuilt = d->st.rebuilt = 1;
  dg__free(order);
  if (!rc) DG_LOGD("ddp: rank %d: buckets rebuilt from the ready order (%d buckets)", d->rank,
                   d->nb);
  return rc;
}

void dg__ddp_view(const dg_ddp *d, int k, dg_ddp_bucket *out) {
  /* raw: every parameter of a started bucket has a final (materialised)
   * gradient; dg_params_grad would zero the lazily cleared rest */
  float *g = dg__params_grad_raw(d->ps);
  out->index = k;
  out->nbuckets = d->nb;
  out->grad = g + d->b[k].lo;
  out->n = d->b[k].hi - d->b[k].lo;
  out->world_size = d->world;
}

void dg__ddp_start_bucket(dg_ddp *d, int k) {
  dg__ddp_bucket *b = &d->b[k];
  if (d->err) return; /* the group is broken: post nothing more */
  dg_ddp_bucket v;
  dg__ddp_view(d, k, &v);
  b->work = NULL;
  d->st.bytes_reduced += (double)v.n * sizeof(float);
  b->started = 1;
  if (d->shmg) { /* average what is ready everywhere (cooperative) */
    dg__shmgrad_ready(d->shmg, k);
    dg__shmgrad_progress(d->shmg);
    return;
  }
  int rc = d->hook.start(d->hook.state, d->pg, &v, &b->work);
  if (rc) {
    b->started = 0;
    if (!d->err)
      dg__ddp_fail(d, rc, "ddp: rank %d: starting the reduction of bucket %d (%zu floats) "
                   "failed: %s", d->rank, k, v.n, d->errmsg[0] ? d->errmsg : dg_pg_errmsg(d->pg));
  }
}

void dg__ddp_start_rest(dg_ddp *d) {
  while (d->next_start < d->nb) dg__ddp_start_bucket(d, d->next_start++);
}

static float round_scale(const dg_ddp *d) {
  return d->active > 0 ? 1.0f / ((float)d->active * (float)d->accum_div) : 0.0f;
}

/* Shared segment: waits until every rank averaged its block of bucket k
 * (doing this rank's blocks meanwhile), then scales. */
static int shm_finish(dg_ddp *d, int k) {
  char err[400];
  err[0] = '\0';
  int rc = dg__shmgrad_wait(d->pg, d->shmg, k, d->engine, err, sizeof err);
  if (rc)
    return dg__ddp_fail(d, rc, "ddp: rank %d: step %lld: averaging bucket %d (%d params, %zu "
                        "floats) failed: %s", d->rank, (long long)d->st.sync_steps, k,
                        d->b[k].nparams, d->b[k].hi - d->b[k].lo, err[0] ? err : dg_pg_errmsg(d->pg));
  if (d->active < 0) d->active = d->opts.no_join ? d->world : dg__shmgrad_count(d->shmg);
  const float f = round_scale(d) * (float)d->world; /* the segment divided by world */
  if (f != 1.0f) {
    float *g = dg__params_grad_raw(d->ps);
    for (size_t i = d->b[k].lo; i < d->b[k].hi; i++) g[i] *= f;
  }
  return DG_OK;
}

/* Hooks: finish runs in bucket order, so bucket k finishes 0..k. */
static int hook_finish(dg_ddp *d, int k) {
  if (d->active < 0) d->active = dg__ddp_round_count(d);
  for (int j = 0; j <= k && !d->err; j++) {
    dg__ddp_bucket *b = &d->b[j];
    if (b->finished || !b->started) continue;
    dg_ddp_bucket v;
    dg__ddp_view(d, j, &v);
    d->errmsg[0] = '\0';
    int rc = d->hook.finish(d->hook.state, d->pg, &v, b->work, round_scale(d));
    b->work = NULL;
    b->started = 0;
    b->finished = 1;
    if (rc)
      dg__ddp_fail(d, rc, "ddp: rank %d: step %lld: all-reduce of bucket %d (%d params, %zu "
                   "floats) failed: %s", d->rank, (long long)d->st.sync_steps, j, b->nparams,
                   v.n, d->errmsg[0] ? d->errmsg : dg_pg_errmsg(d->pg));
  }
  return d->err;
}

int dg__ddp_finish_bucket(dg_ddp *d, int k) {
  if (d->err || d->b[k].finished) return d->err;
  if (!d->shmg) return hook_finish(d, k);
  if (shm_finish(d, k) == DG_OK) d->b[k].finished = 1;
  return d->err;
}

void dg__ddp_end_round(dg_ddp *d) {
  for (int k = 0; k < d->nb; k++) {
    dg__ddp_bucket *b = &d->b[k];
    if (b->started && !d->shmg && d->hook.release) d->hook.release(d->hook.state, b->work);
    b->started = 0;
    b->work = NULL;
  }
  if (d->engine) { /* done with every block once every bucket completed; a
                      failed round has it fail by its deadline */
    (void)dg_work_wait(d->engine, 0);
    dg_work_free(d->engine);
    d->engine = NULL;
  }
}

int dg__ddp_finish_all(dg_ddp *d) {
  for (int k = 0; k < d->nb && !d->err; k++)
    if (d->b[k].started) dg__ddp_finish_bucket(d, k);
  dg__ddp_end_round(d);
  return d->err;
}
