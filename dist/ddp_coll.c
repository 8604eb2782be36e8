/* DDP's reducer through the transport collectives: the comm hook (built-in,
 * ddp_hook.c, or the user's) posts dg_pg collectives per bucket at start
 * and waits for them at finish, in bucket order. Join's ranks-with-data
 * count rides in bucket 0 (built-in hooks that can carry it) or is a
 * separate one-integer all-reduce posted when the round begins, so that it
 * overlaps backward. */
#include "dist/ddp_impl.h"

static void post_count(dg_ddp *d, int32_t have) {
  d->has_data = have;
  d->count_work = NULL;
  int rc = dg_pg_allreduce(d->pg, &d->has_data, 1, DG_I32, DG_RED_SUM, &d->count_work);
  if (rc) dg__ddp_fail(d, rc, "ddp: rank %d: posting the ranks-with-data count failed: %s",
                       d->rank, dg_pg_errmsg(d->pg));
}

/* Waits for the count; returns it (0 on failure, with the error recorded). */
static int32_t wait_count(dg_ddp *d) {
  if (!d->count_work) return d->err ? 0 : d->world;
  int rc = dg_work_wait(d->count_work, 0);
  if (rc)
    dg__ddp_fail(d, rc, "ddp: rank %d: step %lld: all-reduce of the ranks-with-data count "
                 "failed: %s", d->rank, (long long)d->st.sync_steps, dg_work_errmsg(d->count_work));
  dg_work_free(d->count_work);
  d->count_work = NULL;
  return rc ? 0 : d->has_data;
}

static void coll_begin_round(dg_ddp *d, int32_t have) {
  if (!d->opts.no_join && !d->piggy) post_count(d, have);
}

static void coll_start(dg_ddp *d, int k) {
  dg__ddp_bucket *b = &d->b[k];
  dg_ddp_bucket v;
  dg__ddp_view(d, k, &v);
  int rc = d->hook.start(d->hook.state, d->pg, &v, &b->work);
  if (rc) {
    b->started = 0;
    if (!d->err)
      dg__ddp_fail(d, rc, "ddp: rank %d: starting the reduction of bucket %d (%zu floats) "
                   "failed: %s", d->rank, k, v.n, d->errmsg[0] ? d->errmsg : dg_pg_errmsg(d->pg));
  }
}

/* Hooks finish in bucket order, so bucket k finishes 0..k. */
static int coll_finish(dg_ddp *d, int k) {
  if (d->active < 0) d->active = dg__ddp_round_count(d);
  for (int j = 0; j <= k && !d->err; j++) {
    dg__ddp_bucket *b = &d->b[j];
    if (b->finished || !b->started) continue;
    dg_ddp_bucket v;
    dg__ddp_view(d, j, &v);
    d->errmsg[0] = '\0';
    int rc = d->hook.finish(d->hook.state, d->pg, &v, b->work, dg__ddp_round_scale(d));
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

/* With the count in bucket 0 every bucket starts, then bucket 0 is waited
 * for; else the separate all-reduce. */
static int32_t coll_count(dg_ddp *d) {
  if (!d->piggy) return wait_count(d);
  dg__ddp_start_rest(d);
  if (d->err || !d->b[0].started) return 0;
  int32_t n = dg__ddp_piggy_count(d, d->b[0].work);
  if (n < 0) {
    dg__ddp_fail(d, DG_EPEER, "ddp: rank %d: step %lld: all-reduce of bucket 0 (with the "
                 "ranks-with-data count) failed: %s", d->rank, (long long)d->st.sync_steps,
                 d->errmsg[0] ? d->errmsg : dg_pg_errmsg(d->pg));
    return 0;
  }
  return n;
}

static void coll_end_round(dg_ddp *d) {
  for (int k = 0; k < d->nb; k++)
    if (d->b[k].started && d->hook.release) d->hook.release(d->hook.state, d->b[k].work);
}

static void coll_free(dg_ddp *d) {
  if (d->count_work) dg_work_free(d->count_work);
  d->count_work = NULL;
}

const dg__ddp_reducer dg__ddp_coll_reducer = {
    .name = "collectives", .count_rides = 0, .layout = NULL,
    .begin_round = coll_begin_round, .start = coll_start, .progress = NULL,
    .finish = coll_finish, .count = coll_count, .end_round = coll_end_round, .free = coll_free};
