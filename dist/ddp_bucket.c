/* DDP buckets: contiguous slices of the flat gradient buffer, built over the
 * memory order of the parameters (descending at first, i.e. reverse
 * registration; ascending after the rebuild that lays the store out in the
 * observed ready order), started in bucket order, finished at backward end,
 * each through the reducer (ddp_reducer.h). */
#include <stdlib.h>
#include <string.h>

#include "dist/ddp_impl.h"
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
  if (d->red && d->red->layout) d->red->layout(d);
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
  b->work = NULL;
  d->st.bytes_reduced += (double)(b->hi - b->lo) * sizeof(float);
  b->started = 1;
  b->trace_t0 = dg__trace_t0();
  d->red->start(d, k);
}

void dg__ddp_start_rest(dg_ddp *d) {
  while (d->next_start < d->nb) dg__ddp_start_bucket(d, d->next_start++);
}

float dg__ddp_round_scale(const dg_ddp *d) {
  return d->active > 0 ? 1.0f / ((float)d->active * (float)d->accum_div) : 0.0f;
}

/* Closes the traced all-reduce span of every bucket this rank now sees
 * finished (a finish may finish earlier buckets with it). */
static void trace_finished(dg_ddp *d) {
  for (int j = 0; j < d->nb; j++) {
    dg__ddp_bucket *b = &d->b[j];
    if (!b->trace_t0 || !b->finished) continue;
    DG__TRACE_ASYNC(b->trace_t0, "allreduce", j, "bucket", j,
                    "bytes", (int64_t)((b->hi - b->lo) * sizeof(float)));
    b->trace_t0 = 0;
  }
}

int dg__ddp_finish_bucket(dg_ddp *d, int k) {
  if (d->err || d->b[k].finished) return d->err;
  uint64_t tr0 = dg__trace_t0();
  int rc = d->red->finish(d, k);
  DG__TRACE_END(tr0, "bucket wait", NULL, "bucket", k, NULL, 0);
  if (tr0) trace_finished(d);
  return rc;
}

void dg__ddp_end_round(dg_ddp *d) {
  if (!d->red) return; /* a DDP whose set-up failed early */
  d->red->end_round(d);
  for (int k = 0; k < d->nb; k++) {
    d->b[k].started = 0;
    d->b[k].work = NULL;
    d->b[k].trace_t0 = 0;
  }
}

int dg__ddp_finish_all(dg_ddp *d) {
  for (int k = 0; k < d->nb && !d->err; k++)
    if (d->b[k].started) dg__ddp_finish_bucket(d, k);
  dg__ddp_end_round(d);
  return d->err;
}
