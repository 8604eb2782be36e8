/* Flight recorder and collective fingerprints (flight.h says what and why).
 * Records are plain stores under the ring's own lock (uncontended: tens of
 * nanoseconds per operation); the failure path may allocate, talk to the
 * store and write a file, once per group. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dist/flight.h"
#include "dist/net/net_impl.h"
#include "base/common_impl.h"

enum { FL_NONE, FL_POSTED, FL_RUNNING, FL_DONE, FL_FAILED };

/* One operation, as posted (seq, what) and as it went (state, times). */
typedef struct {
  uint64_t seq, count;
  const char *name; /* dg__work_name: a literal */
  int64_t t_post, t_start, t_end; /* ns, monotonic; 0: not yet */
  uint32_t tag;
  int32_t kind, dt, op, root, peer, state, status;
} fl_rec;

/* What every rank says of its collective before it runs: 32 bytes. */
typedef struct {
  uint32_t magic, kind, dt, op;
  uint64_t count;
  int32_t root;
  uint32_t tag;
} fl_fp;

#define FP_MAGIC 0x44474650u /* "DGFP" */
/* Slot prefixes of the fingerprint messages and of the round that follows
 * a mismatch: unused by Gloo (2..7), dgrad's CMA probe (9) and sub-group
 * point-to-point (10). */
#define FP_PREFIX 11ULL
#define FP_ACK_PREFIX 12ULL
#define POS_CAP 256 /* a position, or an aborting rank's own error */

struct dg__flight {
  pthread_mutex_t mu;
  fl_rec *ring; /* (n); NULL when the recorder is off */
  int n;
  int nrec_opt, checks_opt; /* the options, for sub-groups */
  int checks_left;          /* run by one thread at a time (the group's busy flag) */
  fl_fp *fp;                /* (size) the exchange's buffer */
  int failed;               /* the failure path ran (atomic) */
  int64_t t0;               /* ns, monotonic: the group's creation */
  char dir[256];
  /* the comparison's thread: store calls may outlast our bound (a stopped
   * store host), so the failing rank waits for it only that long and the
   * group's teardown joins it */
  pthread_t thr;
  int thr_started, cmp_done; /* cmp_done under mu */
  pthread_cond_t cv;
  int rank, size, bound, dead; /* copies: the thread may outlive the group */
  int pub_only;                /* an abort: publish this rank's error, read nothing */
  int64_t cmp_until;           /* ms: when the first failure stops waiting for the
                                  comparison (under mu; 0: no comparison to wait for) */
  dg_store *st;                /* the group's store (k_grp) */
  dg_store *own[4];            /* handed over by the group's teardown: the */
  int nown, detached;          /* thread frees them, and f (under mu) */
  char mine[POS_CAP], seen[POS_CAP], sum[1024];
};

dg__flight *dg__flight_new(int size, int nrec, int checks, const char *dir) {
  dg__flight *f = dg__calloc(1, sizeof *f);
  if (!f) return NULL;
  pthread_mutex_init(&f->mu, NULL);
  f->nrec_opt = nrec;
  f->checks_opt = checks;
  f->n = nrec < 0 ? 0 : nrec ? nrec : DG_FLIGHT_DEFAULT_RECORDS;
  f->checks_left = checks < 0 ? 0 : checks ? checks : DG_FLIGHT_DEFAULT_CHECKS;
  pthread_cond_init(&f->cv, NULL);
  f->t0 = dg__now_ns();
  if (dir) snprintf(f->dir, sizeof f->dir, "%s", dir);
  if ((f->n && !(f->ring = dg__calloc((size_t)f->n, sizeof *f->ring))) ||
      !(f->fp = dg__calloc((size_t)(size > 0 ? size : 1), sizeof *f->fp))) {
    dg__flight_free(f);
    return NULL;
  }
  return f;
}

static void flight_destroy(dg__flight *f) {
  pthread_cond_destroy(&f->cv);
  pthread_mutex_destroy(&f->mu);
  dg__free(f->ring);
  dg__free(f->fp);
  dg__free(f);
}

dg__flight *dg__flight_sub(const dg__flight *parent, int size) {
  if (!parent) return dg__flight_new(size, 0, 0, NULL);
  return dg__flight_new(size, parent->nrec_opt, parent->checks_opt, parent->dir);
}

void dg__flight_free(dg__flight *f) {
  if (!f) return;
  if (f->thr_started) pthread_join(f->thr, NULL); /* bounded by the store's timeout */
  flight_destroy(f);
}

int dg__flight_free_handing(dg__flight *f, dg_store *const *stores, int n) {
  if (!f || !f->thr_started || n > 4) {
    dg__flight_free(f);
    return 0;
  }
  pthread_mutex_lock(&f->mu);
  int busy = !f->cmp_done;
  if (busy) {
    for (int i = 0; i < n; i++) f->own[i] = stores[i];
    f->nown = n;
    f->detached = 1;
  }
  pthread_mutex_unlock(&f->mu);
  if (!busy) {
    dg__flight_free(f);
    return 0;
  }
  pthread_detach(f->thr);
  return 1;
}

/* ---- recording ---- */

void dg__flight_post(dg_pg *pg, const dg_work *w) {
  dg__flight *f = pg->flight;
  if (!f || !f->ring) return;
  int64_t now = dg__now_ns();
  pthread_mutex_lock(&f->mu);
  fl_rec *r = &f->ring[w->seq % (uint64_t)f->n];
  *r = (fl_rec){.seq = w->seq, .count = w->count, .name = dg__work_name(w), .t_post = now,
                .tag = w->tag, .kind = (int32_t)w->kind, .dt = (int32_t)w->dt,
                .op = (int32_t)w->op, .root = w->root, .peer = w->peer, .state = FL_POSTED};
  if (w->kind == DG_W_SEND || w->kind == DG_W_RECV) r->t_start = now; /* on the wire at once */
  pthread_mutex_unlock(&f->mu);
}

/* The ring's record of w, if it is still there (lock held). */
static fl_rec *rec_of(dg__flight *f, const dg_work *w) {
  fl_rec *r = &f->ring[w->seq % (uint64_t)f->n];
  return r->state != FL_NONE && r->seq == w->seq ? r : NULL;
}

void dg__flight_start(dg_pg *pg, const dg_work *w) {
  dg__flight *f = pg->flight;
  if (!f || !f->ring) return;
  int64_t now = dg__now_ns();
  pthread_mutex_lock(&f->mu);
  fl_rec *r = rec_of(f, w);
  if (r) r->t_start = now, r->state = FL_RUNNING;
  pthread_mutex_unlock(&f->mu);
}

void dg__flight_end(dg_pg *pg, const dg_work *w, int rc) {
  dg__flight *f = pg->flight;
  if (!f || !f->ring) return;
  int64_t now = dg__now_ns();
  pthread_mutex_lock(&f->mu);
  fl_rec *r = rec_of(f, w);
  if (r) r->t_end = now, r->status = rc, r->state = rc == DG_OK ? FL_DONE : FL_FAILED;
  pthread_mutex_unlock(&f->mu);
}

/* ---- descriptions ---- */

static const char *redop_name(int op) {
  static const char *n[] = {"sum", "avg", "min", "max", "prod"};
  return op >= 0 && op <= DG_RED_PROD ? n[op] : "?";
}

static int is_coll(int kind) { return kind <= DG_W_BARRIER; }

/* "allreduce f32[1024]", "broadcast f32[10] root 0", "recv i32[1] from rank
 * 1 tag 5", "barrier", a task's name. */
static void rec_desc(const fl_rec *r, char *out, size_t cap) {
  const char *dt = dg_dtype_name((dg_dtype)r->dt);
  unsigned long long n = (unsigned long long)r->count;
  switch (r->kind) {
    case DG_W_BARRIER: snprintf(out, cap, "barrier"); break;
    case DG_W_TASK: snprintf(out, cap, "%s", r->name ? r->name : "task"); break;
    case DG_W_BROADCAST: snprintf(out, cap, "broadcast %s[%llu] root %d", dt, n, r->root); break;
    case DG_W_SEND:
    case DG_W_RECV:
      snprintf(out, cap, "%s %s[%llu] %s rank %d tag %u", r->name, dt, n,
               r->kind == DG_W_SEND ? "to" : "from", r->peer, r->tag);
      break;
    default: snprintf(out, cap, "%s %s[%llu]", r->name, dt, n); break;
  }
}

/* Where this rank stands, "<verb>|seq S (what)": the oldest collective or
 * task not finished ('w': waits in), else the newest operation ('a': is at,
 * 'f': failed in, 'w' for a pending send/recv). Lock held. */
static void position(dg__flight *f, char *out, size_t cap) {
  const fl_rec *old = NULL, *last = NULL;
  for (int i = 0; i < f->n; i++) {
    const fl_rec *r = &f->ring[i];
    if (r->state == FL_NONE) continue;
    if (!last || r->seq > last->seq) last = r;
    if ((r->state == FL_POSTED || r->state == FL_RUNNING) && r->kind != DG_W_SEND &&
        r->kind != DG_W_RECV && (!old || r->seq < old->seq))
      old = r;
  }
  const fl_rec *r = old ? old : last;
  if (!r) {
    snprintf(out, cap, "n|");
    return;
  }
  char d[120];
  rec_desc(r, d, sizeof d);
  char v = r->state == FL_DONE ? 'a' : r->state == FL_FAILED ? 'f' : 'w';
  snprintf(out, cap, "%c|seq %llu (%s)", v, (unsigned long long)r->seq, d);
}

/* The newest collective this rank completed, "seq S (what)" (lock held). */
static int last_coll(dg__flight *f, char *out, size_t cap) {
  const fl_rec *b = NULL;
  for (int i = 0; i < f->n; i++) {
    const fl_rec *r = &f->ring[i];
    if (r->state == FL_DONE && is_coll(r->kind) && (!b || r->seq > b->seq)) b = r;
  }
  if (!b) return 0;
  char d[120];
  rec_desc(b, d, sizeof d);
  snprintf(out, cap, "seq %llu (%s)", (unsigned long long)b->seq, d);
  return 1;
}

/* ---- fingerprints ---- */

static fl_fp fp_of(const dg_work *w) {
  int red = w->kind == DG_W_ALLREDUCE || w->kind == DG_W_REDUCE_SCATTER;
  return (fl_fp){.magic = FP_MAGIC, .kind = (uint32_t)w->kind,
                 .dt = w->kind == DG_W_BARRIER ? 0 : (uint32_t)w->dt,
                 .op = red ? (uint32_t)w->op : 0,
                 .count = w->kind == DG_W_BARRIER ? 0 : w->count,
                 .root = w->kind == DG_W_BROADCAST ? w->root : -1, .tag = w->tag};
}

static void fp_desc(const fl_fp *p, char *out, size_t cap) {
  static const char *names[] = {"allreduce", "broadcast", "allgather", "reduce_scatter",
                                "barrier"};
  if (p->magic != FP_MAGIC || p->kind > DG_W_BARRIER) {
    snprintf(out, cap, "an unknown call (malformed fingerprint)");
    return;
  }
  const char *nm = names[p->kind], *dt = dg_dtype_name((dg_dtype)p->dt);
  unsigned long long n = (unsigned long long)p->count;
  if (p->kind == DG_W_BARRIER) snprintf(out, cap, "barrier");
  else if (p->kind == DG_W_BROADCAST) snprintf(out, cap, "%s %s[%llu] root %d", nm, dt, n, p->root);
  else if (p->kind == DG_W_ALLGATHER) snprintf(out, cap, "%s %s[%llu]", nm, dt, n);
  else snprintf(out, cap, "%s %s[%llu] %s", nm, dt, n, redop_name((int)p->op));
}

/* Posts a receive from and a send to every other rank; waits for all that
 * were posted. The first failure's code (the group failed with it). */
static int fp_exchange(dg_coll *c, fl_fp *fp, dg_xop *ops) {
  int W = c->size, me = c->rank, rc = DG_OK, posted = 0;
  for (int p = 0; p < W && rc == DG_OK; p++)
    if (p != me && (rc = dg__coll_recv(c, &ops[p], p, &fp[p], sizeof *fp)) == DG_OK) posted++;
  for (int p = 0; p < W && rc == DG_OK; p++)
    if (p != me && (rc = dg__coll_send(c, &ops[W + p], p, &fp[me], sizeof *fp)) == DG_OK)
      posted++;
  for (int i = 0; i < 2 * W && posted > 0; i++) {
    if (i % W == me || ops[i].n == 0) continue;
    posted--;
    int e = dg__coll_wait(c, &ops[i]);
    if (rc == DG_OK) rc = e;
  }
  return rc;
}

/* One exchange on slot prefix `prefix`; leaves the collective's slot and
 * eagerness as the algorithms expect them (unset). */
static int fp_round(dg_coll *c, fl_fp *fp, uint64_t prefix) {
  dg_xop *ops = dg__coll_tmp(c, 2 * (size_t)c->size * sizeof *ops); /* zeroed: n 0 = not posted */
  if (!ops) return dg__coll_fail(c, DG_ENOMEM, "fingerprint check: out of memory");
  c->slot = (prefix << 56) | ((uint64_t)c->w->tag << 24);
  c->eager = 1;
  int rc = fp_exchange(c, fp, ops);
  c->slot = 0;
  c->eager = 0;
  return rc;
}

int dg__flight_check(dg_coll *c) {
  dg_pg *pg = c->pg;
  dg__flight *f = pg->flight;
  dg_work *w = c->w;
  if (!f || f->checks_left <= 0 || !is_coll(w->kind) || !pg->all_dgrad || c->size < 2)
    return DG_OK;
  f->checks_left--;
  int W = c->size;
  f->fp[c->rank] = fp_of(w);
  int rc = fp_round(c, f->fp, FP_PREFIX);
  if (rc != DG_OK) return rc;
  for (int r = 1; r < W; r++) {
    const fl_fp *a = &f->fp[0], *b = &f->fp[r];
    if (a->magic == b->magic && a->kind == b->kind && a->dt == b->dt && a->op == b->op &&
        a->count == b->count && a->root == b->root && a->tag == b->tag)
      continue;
    char da[96], db[96], m[384];
    fp_desc(a, da, sizeof da);
    fp_desc(b, db, sizeof db);
    snprintf(m, sizeof m, "collective #%u of the group: rank 0 called %s but rank %d called %s "
             "(every rank must call the same collectives in the same order, with the same "
             "dtype, count, root and reduction)", w->tag, da, r, db);
    /* Every rank found it. One more round before failing, so that no
     * rank's abort cuts another's exchange short: each keeps its detail
     * even when a peer's abort reaches it first. */
    fp_round(c, f->fp, FP_ACK_PREFIX);
    dg__coll_fail_peer(c, DG_EMISMATCH, -1, "%s", m);
    snprintf(w->err, sizeof w->err, "%s #%llu: %s", dg__work_name(w), (unsigned long long)w->seq,
             m);
    return DG_EMISMATCH;
  }
  return DG_OK;
}

/* ---- the failure path ---- */

/* "0-2, 5" from the ranks r with grp[r] == g (appended at *o). */
static void rank_list(const int *grp, int W, int g, char *out, size_t cap, size_t *o) {
  int first = 1;
  for (int r = 0; r < W && *o + 1 < cap; r++) {
    if (grp[r] != g) continue;
    int e = r;
    while (e + 1 < W && grp[e + 1] == g) e++;
    int k = e > r ? snprintf(out + *o, cap - *o, "%s%d-%d", first ? "" : ", ", r, e)
                  : snprintf(out + *o, cap - *o, "%s%d", first ? "" : ", ", r);
    *o = DG_MIN(*o + (size_t)(k > 0 ? k : 0), cap - 1);
    first = 0;
    r = e;
  }
}

/* Reads rank r's position into pos (POS_CAP) before the deadline: 1 read, 0 not. */
static int read_pos(dg_store *st, int r, int64_t deadline, char *pos) {
  char key[48];
  const char *k = key;
  snprintf(key, sizeof key, "dgrad_flight/%d", r);
  int64_t left = deadline - dg__now_ms();
  int present = 0;
  if (left <= 0 && (dg_store_check(st, &k, 1, &present) != DG_OK || !present)) return 0;
  if (left <= 0) left = 1000; /* there: the get returns at once */
  void *v = NULL;
  size_t n = 0;
  if (dg_store_get(st, key, &v, &n, (int)DG_MAX(left, 1)) != DG_OK) return 0;
  snprintf(pos, POS_CAP, "%.*s", (int)DG_MIN(n, POS_CAP - 1), (char *)v);
  dg_store_value_free(v);
  return pos[0] && pos[1] == '|';
}

/* Appends one group's phrase: "ranks 0-2 wait in seq 813 (...)". */
static void phrase(const char *pos, const int *grp, int W, int g, int cnt, char *out, size_t cap,
                   size_t *o) {
  static const char *one[] = {"is at", "waits in", "failed in", "has run no operation",
                              "failed:"};
  static const char *many[] = {"are at", "wait in", "failed in", "have run no operation",
                               "failed:"};
  int v = pos[0] == 'a' ? 0 : pos[0] == 'w' ? 1 : pos[0] == 'f' ? 2 : pos[0] == 'x' ? 4 : 3;
  int k = snprintf(out + *o, cap - *o, "%srank%s ", *o ? "; " : "", cnt > 1 ? "s" : "");
  *o = DG_MIN(*o + (size_t)(k > 0 ? k : 0), cap - 1);
  rank_list(grp, W, g, out, cap, o);
  k = snprintf(out + *o, cap - *o, " %s%s%s", cnt > 1 ? many[v] : one[v], v == 3 ? "" : " ",
               pos + 2);
  *o = DG_MIN(*o + (size_t)(k > 0 ? k : 0), cap - 1);
}

/* The summary of every rank's position; minorities (who is behind) first,
 * ranks that did not answer before all. pos[r][0] == 0: no answer. */
static void summarize(char (*pos)[POS_CAP], int W, int dead, const char *seen, char *out,
                      size_t cap) {
  int *grp = dg__calloc((size_t)W, sizeof *grp), *cnt = dg__calloc((size_t)W, sizeof *cnt);
  size_t o = 0;
  out[0] = 0;
  if (!grp || !cnt) goto done;
  int silent = 0, gone = 0;
  for (int r = 0; r < W; r++) {
    grp[r] = r;
    if (!pos[r][0]) {
      grp[r] = r == dead ? -2 : -1;
      if (r == dead) gone++;
      else silent++;
      continue;
    }
    for (int q = 0; q < r; q++)
      if (pos[q][0] && !strcmp(pos[q], pos[r])) {
        grp[r] = grp[q];
        break;
      }
    cnt[grp[r]]++;
  }
  for (int g = -2; g <= -1; g++) {
    int n = g == -2 ? gone : silent;
    if (!n) continue;
    int k = snprintf(out + o, cap - o, "%srank%s ", o ? "; " : "", n > 1 ? "s" : "");
    o = DG_MIN(o + (size_t)(k > 0 ? k : 0), cap - 1);
    rank_list(grp, W, g, out, cap, &o);
    k = snprintf(out + o, cap - o, " %s; last collective completed here: %s",
                 g == -2 ? (n > 1 ? "are gone" : "is gone")
                         : "did not answer (stopped, or busy outside dgrad)",
                 seen[0] ? seen : "none");
    o = DG_MIN(o + (size_t)(k > 0 ? k : 0), cap - 1);
  }
  for (int c = 1; c <= W; c++)
    for (int g = 0; g < W; g++)
      if (cnt[g] == c) phrase(pos[g], grp, W, g, c, out, cap, &o);
done:
  dg__free(grp);
  dg__free(cnt);
}

/* Publishes this rank's position, reads the others' for a bounded time
 * (an eighth of the group's timeout, 100 ms to 1 s; a rank known gone
 * for at most DEAD_GRACE_MS of it) and appends the summary to msg.
 * A stopped store host (it may be the rank that stalls) would hold a SET
 * for the store's own timeout: a WAIT, which takes our deadline, on the
 * key this rank published at rendezvous asks first whether it answers. */
static int bound_ms(const dg_pg *pg) { return DG_MAX(100, DG_MIN(pg->timeout_ms / 8, 1000)); }

/* A rank whose connection closed may be dead, or may be the first to fail:
 * it closes its sockets (tcp_abort) before its comparison thread publishes
 * where it stood, so the peer it blamed, which gets no abort message, sees
 * it "gone" a moment before its position lands. A short wait catches that
 * position without holding a killed rank's report back for long. */
#define DEAD_GRACE_MS 250

/* The comparison's thread: f->sum gets the summary (empty: none). */
static void *compare_main(void *arg) {
  dg__flight *f = arg;
  int W = f->size, bound = f->bound;
  char key[48], (*pos)[POS_CAP] = dg__calloc((size_t)W, POS_CAP);
  const int64_t t0 = dg__now_ms();
  const int64_t deadline = t0 + bound, dead_deadline = t0 + DG_MIN(bound, DEAD_GRACE_MS);
  const char *k = key;
  snprintf(key, sizeof key, "dgrad_info/%d", f->rank); /* published at rendezvous */
  if (!pos || dg_store_wait(f->st, &k, 1, bound) != DG_OK) goto out;
  snprintf(key, sizeof key, "dgrad_flight/%d", f->rank);
  if (dg_store_set(f->st, key, f->mine, strlen(f->mine)) != DG_OK || f->pub_only) goto out;
  for (int r = 0; r < W; r++) {
    if (r == f->rank) snprintf(pos[r], POS_CAP, "%s", f->mine);
    else if (!read_pos(f->st, r, r == f->dead ? dead_deadline : deadline, pos[r])) pos[r][0] = 0;
  }
  char sum[sizeof f->sum];
  summarize(pos, W, f->dead, f->seen, sum, sizeof sum);
  pthread_mutex_lock(&f->mu);
  snprintf(f->sum, sizeof f->sum, "%s", sum);
  pthread_mutex_unlock(&f->mu);
out:
  dg__free(pos);
  pthread_mutex_lock(&f->mu);
  f->cmp_done = 1;
  pthread_cond_broadcast(&f->cv);
  int detached = f->detached;
  pthread_mutex_unlock(&f->mu);
  if (detached) { /* the group is gone: its stores and f are ours to free */
    for (int i = 0; i < f->nown; i++) dg_store_free(f->own[i]);
    flight_destroy(f);
  }
  return NULL;
}

/* Publishes this rank's position and reads the others' (a rank known gone
 * for at most DEAD_GRACE_MS) in a thread, for at most an
 * eighth of the group's timeout, 100 ms to 1 s, and appends the summary
 * to msg. A stopped store host (maybe the rank that stalls) would hold a
 * store call for the store's own timeout: the thread's first call, a WAIT
 * on this rank's rendezvous key, gives up at the bound, and when even its
 * reconnection hangs, this rank does not wait for it. */
static int compare_start(dg_pg *pg, dg__flight *f) {
  f->rank = pg->rank;
  f->size = pg->size;
  f->bound = bound_ms(pg);
  f->st = pg->k_grp;
  if (pthread_create(&f->thr, NULL, compare_main, f) != 0) return 0;
  f->thr_started = 1;
  return 1;
}

static void compare(dg_pg *pg, dg__flight *f, char *msg, size_t cap) {
  int bound = bound_ms(pg);
  pthread_mutex_lock(&f->mu);
  const int64_t until = f->cmp_until; /* set with the claim (dg__flight_failed) */
  pthread_mutex_unlock(&f->mu);
  if (!compare_start(pg, f)) {
    pthread_mutex_lock(&f->mu);
    f->cmp_until = 0; /* nothing to wait for: later failures go on */
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
    return;
  }
  pthread_mutex_lock(&f->mu);
  for (int64_t left; !f->cmp_done && (left = until - dg__now_ms()) > 0;)
    dg__cond_wait_ms(&f->cv, &f->mu, left);
  size_t o = strlen(msg);
  if (f->sum[0] && o + 16 < cap) snprintf(msg + o, cap - o, " [where: %s]", f->sum);
  else if (o + 16 < cap)
    snprintf(msg + o, cap - o, " [where: unknown, the store did not answer within %d ms]",
             bound);
  const int done = f->cmp_done;
  pthread_mutex_unlock(&f->mu);
  if (done) { /* it only returns now: join it here, so a program that exits after
               * the failure without freeing the group leaves no thread behind */
    pthread_join(f->thr, NULL);
    f->thr_started = 0;
  }
}

static double ms_of(const dg__flight *f, int64_t t) { return t ? (double)(t - f->t0) / 1e6 : -1; }

/* <dir>/rank<R>.txt (sub-groups: rank<R>.group<name>.txt): the ring, oldest
 * first, under a header with the failure. */
static void write_file(dg_pg *pg, dg__flight *f, const char *msg) {
  if (!f->dir[0]) return;
  char path[400];
  if (mkdir(f->dir, 0777) != 0 && errno != EEXIST) {
    DG_LOGW("dist: rank %d: flight recorder: cannot create %s: %s", pg->rank, f->dir,
            strerror(errno));
    return;
  }
  if (pg->members) snprintf(path, sizeof path, "%s/rank%d.group%s.txt", f->dir, pg->rank, pg->name);
  else snprintf(path, sizeof path, "%s/rank%d.txt", f->dir, pg->rank);
  FILE *fp = fopen(path, "w");
  if (!fp) {
    DG_LOGW("dist: rank %d: flight recorder: cannot write %s: %s", pg->rank, path,
            strerror(errno));
    return;
  }
  fprintf(fp, "# dgrad flight recorder: rank %d of %d%s%s, pid %d, last %d operations\n",
          pg->rank, pg->size, pg->members ? ", sub-group " : "", pg->members ? pg->name : "",
          (int)getpid(), f->n);
  fprintf(fp, "# failure: %s\n# seq state op posted_ms started_ms ended_ms status "
          "(ms since the group was made; -1: not yet)\n", msg);
  uint64_t lo = UINT64_MAX;
  for (int i = 0; i < f->n; i++)
    if (f->ring[i].state != FL_NONE && f->ring[i].seq < lo) lo = f->ring[i].seq;
  static const char *st[] = {"-", "posted", "running", "done", "failed"};
  for (int i = 0; lo != UINT64_MAX && i < f->n; i++) {
    const fl_rec *r = &f->ring[(lo + (uint64_t)i) % (uint64_t)f->n];
    if (r->state == FL_NONE) continue;
    char d[120];
    rec_desc(r, d, sizeof d);
    fprintf(fp, "%llu %s %s %.3f %.3f %.3f %s\n", (unsigned long long)r->seq, st[r->state], d,
            ms_of(f, r->t_post), ms_of(f, r->t_start), ms_of(f, r->t_end),
            r->state >= FL_DONE ? dg_err_name(r->status) : "-");
  }
  if (fclose(fp) == 0) DG_LOGI("dist: rank %d: flight records in %s", pg->rank, path);
}

size_t dg__flight_cut(const char *msg) {
  const char *w = strstr(msg, " [where: ");
  return w ? (size_t)(w - msg) : strlen(msg);
}

/* "x|<why>": the error without the comparison a failed operation appended
 * (it describes other groups), and short enough to quote whole. */
static void own_position(const char *why, char *out, size_t cap) {
  int n = (int)dg__flight_cut(why);
  if (n > 150) snprintf(out, cap, "x|%.147s...", why);
  else snprintf(out, cap, "x|%.*s", n, why);
}

void dg__flight_aborted(dg_pg *pg, const char *why, int own) {
  dg__flight *f = pg->flight;
  if (!f || !f->ring || !pg->all_dgrad || pg->size < 2) return;
  pthread_mutex_lock(&f->mu);
  if (__atomic_exchange_n(&f->failed, 1, __ATOMIC_ACQ_REL)) {
    pthread_mutex_unlock(&f->mu);
    return;
  }
  if (own) own_position(why, f->mine, sizeof f->mine);
  else position(f, f->mine, sizeof f->mine); /* passing a failure on: where it stands */
  last_coll(f, f->seen, sizeof f->seen);
  f->dead = -1;
  f->pub_only = 1;
  write_file(pg, f, why);
  pthread_mutex_unlock(&f->mu);
  /* not waited for: the others' comparisons wait for it (bounded), and the
   * group's teardown joins the thread or hands it the stores */
  (void)compare_start(pg, f);
}

/* A later failure of the group on this rank (another pending op; lock
 * held): the first failure's comparison too, waited for as long as the
 * first one waits. */
static void later_failure(dg__flight *f, char *msg, size_t cap) {
  for (int64_t left; f->cmp_until && !f->cmp_done && (left = f->cmp_until - dg__now_ms()) > 0;)
    dg__cond_wait_ms(&f->cv, &f->mu, left);
  size_t o = strlen(msg);
  if (f->sum[0] && o + 16 < cap && dg__flight_cut(msg) == o)
    snprintf(msg + o, cap - o, " [where: %s]", f->sum);
}

void dg__flight_failed(dg_pg *pg, const dg_work *w, int code, int dead, char *msg, size_t cap) {
  dg__flight *f = pg->flight;
  if (!f || !f->ring) return;
  /* a fingerprint mismatch names both calls already; torch ranks publish
   * no position */
  const int cmp = code != DG_EMISMATCH && pg->all_dgrad && pg->size > 1;
  int64_t now = dg__now_ns();
  pthread_mutex_lock(&f->mu); /* the claim and the wait's deadline at once for later failures */
  if (__atomic_exchange_n(&f->failed, 1, __ATOMIC_ACQ_REL)) {
    later_failure(f, msg, cap);
    pthread_mutex_unlock(&f->mu);
    return;
  }
  if (cmp) f->cmp_until = dg__now_ms() + bound_ms(pg) + 250;
  position(f, f->mine, sizeof f->mine);
  last_coll(f, f->seen, sizeof f->seen);
  f->dead = dead;
  fl_rec *r = rec_of(f, w); /* failed now, as the file says */
  if (r) r->t_end = now, r->status = code, r->state = FL_FAILED;
  pthread_mutex_unlock(&f->mu);
  if (cmp) compare(pg, f, msg, cap);
  pthread_mutex_lock(&f->mu);
  write_file(pg, f, msg);
  pthread_mutex_unlock(&f->mu);
}
