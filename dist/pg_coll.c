/* The collectives API: each call checks its arguments, picks the function
 * that runs it (the algorithm choice for allreduce) and posts it to the
 * runtime (pg_work.c), which runs it in call order on the group's worker
 * or on the thread that waits for it. */
#include <stdio.h>
#include <string.h>

#include "dist/coll_impl.h"
#include "base/common_impl.h"

/* dgrad-only allreduce choice: latency-bound up to this many bytes. */
#define DG_SMALL_BYTES (64u << 10)

static uint64_t slot_of(int prefix, uint32_t tag) {
  return ((uint64_t)prefix << 56) | ((uint64_t)tag << 24);
}

/* The algorithm an allreduce of `bytes` runs with algorithm `a` asked. */
static dg_algo choose(const dg_pg *pg, dg_algo a, size_t bytes) {
  if (!pg->all_dgrad) return DG_ALGO_RING;
  /* Over TCP alone, Gloo's ring (two segments in flight) beats moving all
   * blocks at once on loopback; across hosts DIRECT can be forced. Over
   * several hosts whose ranks share memory, the hierarchy moves each byte
   * over the network once per host instead of once per rank. */
  if (a == DG_ALGO_AUTO)
    a = pg->shm                    ? DG_ALGO_SHM
        : pg->hier == 2            ? DG_ALGO_HIER
        : bytes <= DG_SMALL_BYTES  ? DG_ALGO_HALVING_DOUBLING
        : pg->cma                  ? DG_ALGO_CMA
                                   : DG_ALGO_RING;
  /* a forced algorithm the group lost (none: dg_pg_set_algo refused it) */
  if ((a == DG_ALGO_SHM && !pg->shm) || (a == DG_ALGO_CMA && !pg->cma) ||
      (a == DG_ALGO_HIER && !pg->hier))
    a = DG_ALGO_DIRECT;
  return a;
}

dg_algo dg_pg_allreduce_algo(dg_pg *pg, size_t count, dg_dtype dt) {
  if (!pg || (unsigned)dt >= DG_NDTYPES) return DG_ALGO_AUTO;
  pthread_mutex_lock(&pg->mu);
  dg_algo a = pg->algo;
  pthread_mutex_unlock(&pg->mu);
  return choose(pg, a, count * dg_dtype_size(dt));
}

/* Algorithm a on c's group (its slot set); AVG divides at the end. */
static int run_algo(dg_coll *c, dg_algo a, void *buf, size_t count, dg_dtype dt, dg_redop op) {
  c->eager = a != DG_ALGO_RING;
  int rc;
  if (c->size == 1 || count == 0) rc = DG_OK;
  else if (a == DG_ALGO_RING) rc = dg__gloo_allreduce_ring(c, buf, count, dt, op);
  else if (a == DG_ALGO_HALVING_DOUBLING) rc = dg__allreduce_rd(c, buf, count, dt, op);
  else if (a == DG_ALGO_SHM) rc = dg__allreduce_shm(c, buf, count, dt, op);
  else if (a == DG_ALGO_CMA) rc = dg__allreduce_cma(c, buf, count, dt, op);
  else if (a == DG_ALGO_HIER) rc = dg__allreduce_hier(c, buf, count, dt, op);
  else rc = dg__allreduce_direct(c, buf, count, dt, op);
  if (rc == DG_OK && op == DG_RED_AVG && a != DG_ALGO_SHM) dg__scale_div(buf, count, dt, c->size);
  return rc;
}

int dg__allreduce_auto(dg_coll *c, void *buf, size_t count, dg_dtype dt, dg_redop op) {
  return run_algo(c, choose(c->pg, DG_ALGO_AUTO, count * dg_dtype_size(dt)), buf, count, dt, op);
}

static int run_allreduce(dg_coll *c, void *arg) {
  (void)arg;
  dg_work *w = c->w;
  c->slot = slot_of(DG_SLOT_ALLREDUCE, w->tag);
  return run_algo(c, choose(c->pg, w->algo, w->count * dg_dtype_size(w->dt)), w->buf, w->count,
                  w->dt, w->op);
}

static int run_broadcast(dg_coll *c, void *arg) {
  (void)arg;
  dg_work *w = c->w;
  c->slot = slot_of(DG_SLOT_BROADCAST, w->tag);
  return c->size == 1 ? DG_OK
                      : dg__gloo_broadcast(c, w->buf, w->count * dg_dtype_size(w->dt), w->root);
}

static int run_allgather(dg_coll *c, void *arg) {
  (void)arg;
  dg_work *w = c->w;
  c->slot = slot_of(DG_SLOT_ALLGATHER, w->tag);
  return dg__gloo_allgather(c, w->in, w->out, w->count * dg_dtype_size(w->dt));
}

static int run_reduce_scatter(dg_coll *c, void *arg) {
  (void)arg;
  dg_work *w = c->w;
  c->slot = slot_of(DG_SLOT_ALLREDUCE, w->tag);
  c->eager = 1;
  return dg__reduce_scatter(c, w->in, w->out, w->count, w->dt, w->op);
}

static int run_barrier(dg_coll *c, void *arg) {
  (void)arg;
  /* on one host: a one-element all-reduce in the segment (nobody leaves
   * before everyone arrived), microseconds, no wake-ups */
  int32_t one = 1;
  if (c->pg->shm) return dg__allreduce_shm(c, &one, 1, DG_I32, DG_RED_SUM);
  c->slot = slot_of(DG_SLOT_BARRIER, c->w->tag);
  return dg__gloo_barrier(c);
}

int dg_pg_allreduce(dg_pg *pg, void *buf, size_t count, dg_dtype dt, dg_redop op,
                    dg_work **w) {
  if (w) *w = NULL;
  if (!w || (count && !buf) || (unsigned)op > DG_RED_PROD) return DG_EINVAL;
  dg_work *k = dg__work_new(pg, DG_W_ALLREDUCE, dt);
  if (!k) return pg ? DG_ENOMEM : DG_EINVAL;
  k->buf = buf;
  k->count = count;
  k->op = op;
  return dg__work_post(pg, k, run_allreduce, w);
}

int dg_pg_broadcast(dg_pg *pg, void *buf, size_t count, dg_dtype dt, int root, dg_work **w) {
  if (w) *w = NULL;
  if (!w || !pg || (count && !buf) || root < 0 || root >= pg->size) return DG_EINVAL;
  dg_work *k = dg__work_new(pg, DG_W_BROADCAST, dt);
  if (!k) return DG_ENOMEM;
  k->buf = buf;
  k->count = count;
  k->root = root;
  return dg__work_post(pg, k, run_broadcast, w);
}

int dg_pg_allgather(dg_pg *pg, const void *in, void *out, size_t count, dg_dtype dt,
                    dg_work **w) {
  if (w) *w = NULL;
  if (!w || (count && (!in || !out))) return DG_EINVAL;
  dg_work *k = dg__work_new(pg, DG_W_ALLGATHER, dt);
  if (!k) return pg ? DG_ENOMEM : DG_EINVAL;
  k->in = in;
  k->out = out;
  k->count = count;
  return dg__work_post(pg, k, run_allgather, w);
}

int dg_pg_reduce_scatter(dg_pg *pg, const void *in, void *out, size_t count, dg_dtype dt,
                         dg_redop op, dg_work **w) {
  if (w) *w = NULL;
  if (!w || (count && (!in || !out)) || (unsigned)op > DG_RED_PROD) return DG_EINVAL;
  dg_work *k = dg__work_new(pg, DG_W_REDUCE_SCATTER, dt);
  if (!k) return pg ? DG_ENOMEM : DG_EINVAL;
  k->in = in;
  k->out = out;
  k->count = count;
  k->op = op;
  if (!pg->all_dgrad && pg->size > 1) { /* failed at once, the group untouched */
    k->status = DG_EUNSUPPORTED;
    snprintf(k->err, sizeof k->err, "reduce_scatter: not supported in a group with torch or "
             "libgloo ranks (torch 1.13's gloo backend has no reduce_scatter; use allreduce)");
    *w = k;
    return DG_OK;
  }
  return dg__work_post(pg, k, run_reduce_scatter, w);
}

int dg_pg_barrier(dg_pg *pg, dg_work **w) {
  if (w) *w = NULL;
  if (!w) return DG_EINVAL;
  dg_work *k = dg__work_new(pg, DG_W_BARRIER, DG_F32);
  if (!k) return pg ? DG_ENOMEM : DG_EINVAL;
  return dg__work_post(pg, k, run_barrier, w);
}

/* The _sync wrappers' caller waits at once: it runs the work itself
 * (caller_runs around the post), then waits and frees. The post's code is
 * taken first: it sets w, so it cannot be an argument beside w. */
static int sync_end(int rc, dg_work *w) {
  dg__work_caller_runs(0);
  if (rc == DG_OK) rc = dg_work_wait(w, 0);
  dg_work_free(w);
  return rc;
}

int dg_pg_allreduce_sync(dg_pg *pg, void *buf, size_t count, dg_dtype dt, dg_redop op) {
  dg_work *w = NULL;
  dg__work_caller_runs(1);
  int rc = dg_pg_allreduce(pg, buf, count, dt, op, &w);
  return sync_end(rc, w);
}

int dg_pg_broadcast_sync(dg_pg *pg, void *buf, size_t count, dg_dtype dt, int root) {
  dg_work *w = NULL;
  dg__work_caller_runs(1);
  int rc = dg_pg_broadcast(pg, buf, count, dt, root, &w);
  return sync_end(rc, w);
}

int dg_pg_allgather_sync(dg_pg *pg, const void *in, void *out, size_t count, dg_dtype dt) {
  dg_work *w = NULL;
  dg__work_caller_runs(1);
  int rc = dg_pg_allgather(pg, in, out, count, dt, &w);
  return sync_end(rc, w);
}

int dg_pg_barrier_sync(dg_pg *pg) {
  dg_work *w = NULL;
  dg__work_caller_runs(1);
  int rc = dg_pg_barrier(pg, &w);
  return sync_end(rc, w);
}
