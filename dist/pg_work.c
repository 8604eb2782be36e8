/* The group's runtime: collectives and tasks queue to the group's worker
 * thread and run there in call order (tags taken at call time, as
 * ProcessGroupGloo does), each through the function its poster gave;
 * send/recv go straight to the transport. Error messages name op, seq and
 * peer. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "dist/pg_work.h"
#include "dist/flight.h"
#include "dist/net/net_impl.h"
#include "base/common_impl.h"

const char *dg__work_name(const dg_work *w) {
  static const char *names[] = {"allreduce", "broadcast", "allgather", "reduce_scatter",
                                "barrier",   "send",      "recv"};
  return w->kind == DG_W_TASK ? w->name : names[w->kind];
}

static void set_err(dg_work *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_err(dg_work *w, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  dg__vfmt(w->err, sizeof w->err, fmt, ap);
  va_end(ap);
}

/* This group's rank of rank xr of its transport (-1: not a member). */
static int group_rank(const dg_pg *pg, int xr) {
  if (!pg->xrank) return xr;
  for (int r = 0; r < pg->size; r++)
    if (pg->xrank[r] == xr) return r;
  return -1;
}

/* A sub-group's failure names the rank in both numberings: r (this
 * group's) and its rank in the parent. Appended to msg. */
static void name_both(const dg_pg *pg, int r, char *msg, size_t cap) {
  size_t o = strlen(msg);
  if (!pg->members || r < 0 || r >= pg->size || o + 1 >= cap) return;
  snprintf(msg + o, cap - o, " [rank %d of sub-group %s is rank %d of its parent]", r, pg->name,
           pg->members[r]);
}

/* Makes any failure sticky (the transport aborts), and records it. peer:
 * this group's numbering. */
static int work_fail(dg_work *w, dg_xport *x, int code, int peer, const char *detail) {
  char tm[sizeof w->err];
  dg_pg *pg = w->pg;
  if (x->vt->error(x, tm, sizeof tm) == DG_OK) {
    snprintf(tm, sizeof tm, "%s #%llu: %s", dg__work_name(w), (unsigned long long)w->seq,
             detail);
    name_both(pg, peer, tm, sizeof tm);
    x->vt->abort(x, code, dg__pg_xpeer(pg, peer), tm);
    dg__flight_failed(pg, w, code, code == DG_EPEER ? peer : -1, tm, sizeof tm);
    set_err(w, "%s", tm);
  } else {
    int xr = -1; /* transport messages name the rank they blame first */
    if (pg->members && sscanf(tm, "rank %d", &xr) == 1)
      name_both(pg, group_rank(pg, xr), tm, sizeof tm);
    set_err(w, "%s #%llu failed: %s", dg__work_name(w), (unsigned long long)w->seq, tm);
    code = x->vt->error(x, NULL, 0);
    int dead = code == DG_EPEER && sscanf(tm, "rank %d", &xr) == 1 ? group_rank(pg, xr) : -1;
    dg__flight_failed(pg, w, code, dead, w->err, sizeof w->err);
  }
  return code;
}

int dg__coll_fail_peer(dg_coll *c, int code, int peer, const char *fmt, ...) {
  char d[384];
  va_list ap;
  va_start(ap, fmt);
  dg__vfmt(d, sizeof d, fmt, ap);
  va_end(ap);
  return work_fail(c->w, c->x, code, peer, d);
}

/* A grow-only buffer of at least `bytes` (contents not kept on growth). */
static void *grow(void **buf, size_t *cap, size_t bytes) {
  if (bytes > *cap) {
    dg__free(*buf);
    *buf = dg__malloc(bytes);
    *cap = *buf ? bytes : 0;
  }
  return *buf;
}

void *dg__coll_scratch(dg_coll *c, size_t bytes) {
  return grow(&c->pg->scratch, &c->pg->scratch_cap, bytes);
}

void *dg__coll_tmp(dg_coll *c, size_t bytes) {
  void *p = grow(&c->pg->tmp, &c->pg->tmp_cap, bytes);
  if (p) memset(p, 0, bytes);
  return p;
}

static int post(dg_coll *c, dg_xop *op, int peer, void *buf, size_t n, int send) {
  *op = (dg_xop){.peer = dg__pg_xpeer(c->pg, peer), .slot = dg__pg_xslot(c->pg, c->slot),
                 .buf = buf, .n = n,
                 .eager = c->eager && c->x->all_dgrad && n <= c->x->eager_max};
  int rc = send ? c->x->vt->send(c->x, op) : c->x->vt->recv(c->x, op);
  if (rc == DG_OK) return DG_OK;
  /* blame the peer, so that the abort other dgrad ranks receive names it
   * (not this rank, the sender of the abort) */
  return dg__coll_fail_peer(c, rc, peer, "cannot %s rank %d: it has left the group",
                            send ? "send to" : "receive from", peer);
}

int dg__coll_send(dg_coll *c, dg_xop *op, int peer, const void *buf, size_t n) {
  return post(c, op, peer, (void *)buf, n, 1);
}

int dg__coll_recv(dg_coll *c, dg_xop *op, int peer, void *buf, size_t n) {
  return post(c, op, peer, buf, n, 0);
}

int dg__coll_wait(dg_coll *c, dg_xop *op) {
  int rc = c->x->vt->wait(c->x, op, c->deadline);
  if (rc == DG_OK) return DG_OK;
  /* the progress thread completes ops with an atomic store */
  if (rc == DG_ETIMEDOUT && __atomic_load_n(&op->status, __ATOMIC_ACQUIRE) == DG_XOP_PENDING) {
    char d[256];
    int peer = group_rank(c->pg, op->peer);
    snprintf(d, sizeof d, "timed out after %d ms waiting for rank %d (%s of %zu bytes, slot "
             "0x%llx)", c->pg->timeout_ms, peer, op->is_send ? "send" : "receive", op->n,
             (unsigned long long)op->slot);
    return work_fail(c->w, c->x, DG_ETIMEDOUT, peer, d);
  }
  return work_fail(c->w, c->x, rc, group_rank(c->pg, op->peer), "transport failed");
}

int64_t dg__coll_deadline(const dg_coll *c) { return c->deadline; }

/* Runs a collective or task: nothing starts on a failed group. */
static int run_work(dg_pg *pg, dg_work *w) {
  dg_coll c = {.pg = pg, .w = w, .x = pg->x, .rank = pg->rank, .size = pg->size,
               .deadline = w->deadline};
  int e = pg->x->vt->error(pg->x, NULL, 0);
  if (e != DG_OK) return work_fail(w, pg->x, e, -1, "");
  if ((e = dg__flight_check(&c)) != DG_OK) return e; /* fingerprints: first collectives */
  return w->run(&c, w->arg);
}

/* Pops the queue head and runs it; called and returns with the lock held.
 * `busy` keeps the worker and an inline caller from running two at once. */
static void run_locked(dg_pg *pg) {
  dg_work *w = pg->qhead;
  pg->qhead = w->next;
  if (!pg->qhead) pg->qtail = NULL;
  pg->busy = 1;
  pthread_mutex_unlock(&pg->mu);
  w->deadline = dg__deadline(0, pg->timeout_ms);
  dg__flight_start(pg, w);
  int rc = run_work(pg, w);
  pthread_mutex_lock(&pg->mu);
  dg__flight_end(pg, w, rc);
  pg->busy = 0;
  if (rc != DG_OK && !pg->err[0]) snprintf(pg->err, sizeof pg->err, "%s", w->err);
  __atomic_store_n(&w->status, rc, __ATOMIC_RELEASE);
  pthread_cond_broadcast(&pg->dcv);
  /* wake the worker only for work it may run (a wake-up costs a switch) */
  if (pg->stop || (pg->qhead && !pg->qhead->caller_runs)) pthread_cond_broadcast(&pg->qcv);
}

static void *worker_main(void *arg) {
  dg_pg *pg = arg;
  pthread_mutex_lock(&pg->mu);
  for (;;) {
    /* a caller-run work at the head waits for its caller (but not a stop) */
    while ((!pg->qhead || pg->busy || (pg->qhead->caller_runs && !pg->stop)) &&
           !(pg->stop && !pg->busy && !pg->qhead))
      pthread_cond_wait(&pg->qcv, &pg->mu);
    if (!pg->qhead) break;
    run_locked(pg);
  }
  pthread_mutex_unlock(&pg->mu);
  return NULL;
}

int dg__pg_start_worker(dg_pg *pg) {
  if (pthread_create(&pg->worker, NULL, worker_main, pg) != 0) return DG_ESYS;
  pg->worker_started = 1;
  return DG_OK;
}

/* Runs what is queued (bounded by each work's deadline), then stops. */
void dg__pg_stop_worker(dg_pg *pg) {
  if (!pg->worker_started) return;
  pthread_mutex_lock(&pg->mu);
  pg->stop = 1;
  pthread_cond_broadcast(&pg->qcv);
  pthread_mutex_unlock(&pg->mu);
  pthread_join(pg->worker, NULL);
  pg->worker_started = 0;
}

dg_work *dg__work_new(dg_pg *pg, dg_wkind k, dg_dtype dt) {
  if (!pg || (unsigned)dt >= DG_NDTYPES) return NULL;
  pthread_mutex_lock(&pg->mu);
  dg_work *w = pg->wfree;
  if (w) pg->wfree = w->next;
  pthread_mutex_unlock(&pg->mu);
  if (w) memset(w, 0, sizeof *w);
  else if (!(w = dg__calloc(1, sizeof *w))) return NULL;
  w->pg = pg;
  w->kind = k;
  w->dt = dt;
  w->status = DG_XOP_PENDING;
  w->algo = pg->algo;
  return w;
}

/* Set around the posts of the _sync wrappers (dg__work_caller_runs). */
static __thread int tl_caller_runs;

void dg__work_caller_runs(int on) { tl_caller_runs = on; }

int dg__work_post(dg_pg *pg, dg_work *w, dg__task_fn run, dg_work **out) {
  w->run = run;
  w->caller_runs |= tl_caller_runs;
  pthread_mutex_lock(&pg->mu);
  w->tag = pg->tag++;
  w->seq = pg->seq++;
  dg__flight_post(pg, w);
  if (pg->qtail) pg->qtail->next = w;
  else pg->qhead = w;
  pg->qtail = w;
  if (!w->caller_runs) pthread_cond_signal(&pg->qcv); /* else nothing for the worker */
  pthread_mutex_unlock(&pg->mu);
  *out = w;
  return DG_OK;
}

int dg__pg_post_task(dg_pg *pg, const char *name, dg__task_fn fn, void *arg, dg_work **w) {
  *w = NULL;
  dg_work *k = dg__work_new(pg, DG_W_TASK, DG_F32);
  if (!k) return DG_ENOMEM;
  k->name = name;
  k->arg = arg;
  return dg__work_post(pg, k, fn, w);
}

static int p2p(dg_pg *pg, void *buf, size_t count, dg_dtype dt, int peer, uint32_t tag,
               dg_work **w, dg_wkind kind) {
  if (w) *w = NULL;
  if (!w || !pg || (count && !buf) || peer < 0 || peer >= pg->size || peer == pg->rank)
    return DG_EINVAL;
  dg_work *k = dg__work_new(pg, kind, dt);
  if (!k) return DG_ENOMEM;
  pthread_mutex_lock(&pg->mu);
  k->seq = pg->seq++;
  pthread_mutex_unlock(&pg->mu);
  k->buf = buf;
  k->count = count;
  k->peer = peer;
  k->tag = tag;
  k->deadline = dg__deadline(0, pg->timeout_ms);
  k->xop = (dg_xop){.peer = dg__pg_xpeer(pg, peer), .slot = dg__pg_xslot_p2p(pg, tag),
                    .buf = buf, .n = count * dg_dtype_size(dt)};
  dg__flight_post(pg, k);
  dg_xport *x = pg->x;
  int rc = kind == DG_W_SEND ? x->vt->send(x, &k->xop) : x->vt->recv(x, &k->xop);
  if (rc != DG_OK) {
    char tm[400];
    const int failed = x->vt->error(x, tm, sizeof tm) != DG_OK;
    set_err(k, "%s #%llu (rank %d, tag %u) failed: %s", dg__work_name(k),
            (unsigned long long)k->seq, peer, tag, failed ? tm : "the peer has left the group");
    /* posted on a failed group: the comparison of positions all the same
     * (as its wait would; bounded: up to an eighth of the timeout, 1.25 s) */
    if (failed) dg__flight_failed(pg, k, rc, -1, k->err, sizeof k->err);
    k->status = rc;
    dg__flight_end(pg, k, rc);
  }
  *w = k;
  return DG_OK;
}

int dg_pg_send(dg_pg *pg, const void *buf, size_t count, dg_dtype dt, int dst, uint32_t tag,
               dg_work **w) {
  return p2p(pg, (void *)buf, count, dt, dst, tag, w, DG_W_SEND);
}

int dg_pg_recv(dg_pg *pg, void *buf, size_t count, dg_dtype dt, int src, uint32_t tag,
               dg_work **w) {
  return p2p(pg, buf, count, dt, src, tag, w, DG_W_RECV);
}

/* send/recv: wait on the transport; past the op's deadline, abort. */
static int p2p_wait(dg_work *w, int64_t until) {
  if (w->status != DG_XOP_PENDING) return w->status;
  dg_xport *x = w->pg->x;
  int rc = x->vt->wait(x, &w->xop, DG_MIN(until, w->deadline));
  if (rc == DG_ETIMEDOUT && w->xop.status == DG_XOP_PENDING) {
    if (dg__now_ms() < w->deadline) return DG_EAGAIN;
    char d[256];
    snprintf(d, sizeof d, "timed out after %d ms waiting for rank %d (tag %u)",
             w->pg->timeout_ms, w->peer, w->tag);
    w->status = work_fail(w, x, DG_ETIMEDOUT, w->peer, d);
    dg__flight_end(w->pg, w, w->status);
    return w->status;
  }
  if (rc != DG_OK) {
    work_fail(w, x, rc, w->peer, "transport failed");
  }
  w->status = rc;
  dg__flight_end(w->pg, w, rc);
  return rc;
}

int dg_work_wait(dg_work *w, int timeout_ms) {
  if (!w) return DG_EINVAL;
  int64_t until = timeout_ms > 0 ? dg__now_ms() + timeout_ms : INT64_MAX;
  if (w->kind == DG_W_SEND || w->kind == DG_W_RECV) return p2p_wait(w, until);
  dg_pg *pg = w->pg;
  if (__atomic_load_n(&w->status, __ATOMIC_ACQUIRE) != DG_XOP_PENDING) return w->status;
  __atomic_add_fetch(&pg->nwaiting, 1, __ATOMIC_RELAXED);
  pthread_mutex_lock(&pg->mu);
  /* Next in line and nobody running: run it here, saving two thread
   * hand-offs (what small collectives mostly cost). */
  if (timeout_ms <= 0 && w->status == DG_XOP_PENDING && pg->qhead == w && !pg->busy)
    run_locked(pg);
  while (w->status == DG_XOP_PENDING) {
    if (pg->qhead && pg->qhead->caller_runs && !pg->busy) { /* only a caller runs those */
      run_locked(pg);
      continue;
    }
    int64_t left = until - dg__now_ms();
    if (left <= 0) break;
    dg__cond_wait_ms(&pg->dcv, &pg->mu, DG_MIN(left, 1000));
  }
  int st = w->status;
  pthread_mutex_unlock(&pg->mu);
  __atomic_sub_fetch(&pg->nwaiting, 1, __ATOMIC_RELAXED);
  return st == DG_XOP_PENDING ? DG_EAGAIN : st;
}

int dg_work_test(dg_work *w, int *done) {
  if (!w || !done) return DG_EINVAL;
  int st;
  if (w->kind == DG_W_SEND || w->kind == DG_W_RECV) {
    st = w->status;
    if (st == DG_XOP_PENDING) {
      int xs = __atomic_load_n(&w->xop.status, __ATOMIC_ACQUIRE);
      if (xs != DG_XOP_PENDING) st = p2p_wait(w, 0);
    }
  } else {
    st = __atomic_load_n(&w->status, __ATOMIC_ACQUIRE);
  }
  *done = st != DG_XOP_PENDING;
  return *done ? st : DG_OK;
}

size_t dg_work_count(const dg_work *w) {
  if (!w) return 0;
  if (w->kind == DG_W_RECV && w->status == DG_OK) return w->xop.nrecv / dg_dtype_size(w->dt);
  return w->count;
}

const char *dg_work_errmsg(const dg_work *w) {
  if (!w) return "no work";
  return w->err[0] ? w->err : "no error";
}

void dg_work_free(dg_work *w) {
  if (!w) return;
  while (dg_work_wait(w, 0) == DG_EAGAIN) {
  }
  dg_pg *pg = w->pg;
  pthread_mutex_lock(&pg->mu);
  w->next = pg->wfree;
  pg->wfree = w;
  pthread_mutex_unlock(&pg->mu);
}

void dg__pg_free_works(dg_pg *pg) {
  while (pg->wfree) {
    dg_work *w = pg->wfree;
    pg->wfree = w->next;
    dg__free(w);
  }
}

/* ---- what the layers above see of the group (pg_ext.h) ---- */

int dg__pg_error(dg_pg *pg, char *msg, size_t cap) {
  return pg->x->vt->error(pg->x, msg, cap);
}

int dg__pg_timeout_ms(const dg_pg *pg) { return pg->timeout_ms; }

void dg__pg_abort(dg_pg *pg, int code, const char *msg, int own) {
  /* claimed first: a worker woken by the abort must not take the group's
   * failure path before this rank's own error is the position it publishes */
  dg__flight_aborted(pg, msg, own);
  char m[sizeof pg->err]; /* without another group's comparison: not the peers' */
  snprintf(m, sizeof m, "%.*s", (int)dg__flight_cut(msg), msg);
  if (pg->x->vt->error(pg->x, NULL, 0) == DG_OK) pg->x->vt->abort(pg->x, code, -1, m);
}

const dg_link_model *dg__pg_link(const dg_pg *pg) {
  return pg->link.allreduce_end || pg->link.bucket_end ? &pg->link : NULL;
}

int dg__pg_peer_pid(const dg_pg *pg, int rank) {
  return pg && pg->cma && rank >= 0 && rank < pg->size ? pg->pids[rank] : 0;
}

int dg__pg_local_shm(const dg_pg *pg) {
  return pg && pg->shm && (pg->algo == DG_ALGO_AUTO || pg->algo == DG_ALGO_SHM);
}
