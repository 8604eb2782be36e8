/* DDP's shared gradient segment: the reducer for ranks on one host with the
 * built-in f32 reduction. Every rank's flat gradient buffer lives in one
 * shared mapping (the store borrows it: dg__params_lend_grad), so a
 * bucket's average needs no copy-in: each rank reduces its 1/W block of the
 * bucket from every rank's buffer and writes the result into every rank's
 * buffer (read S, write S per rank in all).
 *
 * Buckets are independent (words per bucket, values = the round number g):
 *   rank r's bucket k is final:    ready[r][k] = g
 *   a rank making progress: pick, among the buckets ready on every rank,
 *     the one the next forward needs first (the highest index: buckets run
 *     from the output layer back) with a block j not claimed yet (its own
 *     block first), claim[j][k] = g by compare-and-swap, average block j,
 *     done[j][k] = g; none: sleep on the bell
 *   bucket k is complete when done[j][k] = g for every block j.
 * Block j is rank j's by default, but a rank waiting for a late peer
 * averages the peer's blocks itself (on a noisy host the stalled rank's
 * share of the averaging moves to the one that waits); every block's
 * average is computed in rank order by one code path, so who computes it
 * does not change a bit.
 * Ranks may pick in different orders (each picks from what it sees) and no
 * one waits for buckets in a fixed sequence, so no order can deadlock.
 * Progress is cooperative: the backward thread takes what it can at every
 * grad-ready hook and the thread that needs a bucket while it waits; with a
 * spare core a task in the group's worker also runs an engine during
 * backward (a claim per bucket keeps a block from being done twice). Every
 * publish bumps the bell (one futex for all waiters). The segment is mapped
 * and waited on with the process group's primitives (dist/pg_ext.h).
 *
 * A link model (dg_pg_opts.link, benchmarks only) sees when every rank
 * posted each bucket (the latest ready_at) and holds a complete bucket back
 * until its modelled transfer ends; that hold runs after the wait loop,
 * only where a model is installed. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backends/backend.h"
#include "backends/kern_blas.h"
#include "base/lend_impl.h"
#include "dist/ddp_impl.h"
#include "dist/coll_ext.h"
#include "dist/net/net_impl.h"
#include "core/core_impl.h"
#include "optim/optim_impl.h"

#define RED_TILE 4096 /* floats reduced in L1 before being written out */

typedef struct {
  uint32_t bell __attribute__((aligned(64)));
  uint32_t sleepers __attribute__((aligned(64)));
  uint32_t waiters __attribute__((aligned(64))); /* threads in a wait loop (any rank) */
} grad_hdr;

/* A rank's update of this round (sharded update), by round parity: the
 * averaging applies the first one of a round in which every rank with data
 * publishes one (on). */
typedef struct {
  uint32_t gen;  /* the round it belongs to */
  int32_t on;    /* this rank has data and applies the update sharded */
  int32_t accum; /* the round's accumulation divisor */
  float lr;
  int64_t step;  /* the optimizer's step count for this update */
} __attribute__((aligned(64))) upd_desc;

typedef struct {
  dg_pg *pg;
  void *base;
  size_t len, stride; /* mapping; bytes between ranks' buffers */
  int W, rank, nbmax, nb;
  grad_hdr *hdr;
  unsigned char *ctl; /* (W) per-rank words (see done_of) */
  size_t ctl_stride;
  unsigned char *data;
  size_t *off, *cnt;  /* (nbmax) bucket k: [off, off + cnt) */
  size_t *bytes;      /* (nbmax) cnt * 4, for the link model */
  int64_t *posted;    /* (nbmax) the link model's view of the postings */
  uint32_t gen;       /* this rank's round number */
  const dg_link_model *link; /* the group's model with bucket_end, or NULL */
  float *mine;        /* this rank's buffer (the store's gradients) */
  int engine_thread;  /* 1: an engine task in the group's worker per round */
  dg_work *engine;    /* this round's engine */
  int64_t peer_blocks; /* peers' blocks this rank averaged (dg_ddp_stats) */
  /* the sharded update: per-rank update words before the gradients; the
   * values, then the optimizer's state, one copy for all ranks, in a
   * mapping of their own made when the ranks start sharing (shm_share) */
  upd_desc *desc;      /* (W * 2) */
  unsigned char *shared;
  size_t shared_len;
  struct dg_optim *opt; /* this rank's optimizer while it updates the shared copy */
  int no_join;
} seg;

static size_t page_up(size_t n) { return (n + 4095) / 4096 * 4096; }
static size_t line_up(size_t n) { return (n + 63) / 64 * 64; }

static int32_t *count_of(seg *s, int r) { return (int32_t *)(s->ctl + (size_t)r * s->ctl_stride); }
/* Since when rank r's main thread waits in wait_bucket, ns; 0: it does not
 * (after count[2], in the same line). */
static int64_t *waiting_of(seg *s, int r) { return (int64_t *)count_of(s, r) + 2; }
/* Per rank after count[2]: done[nbmax] | ready[2][nbmax] | ready_at[2][nbmax]
 * (ns, CLOCK_MONOTONIC) | claim[nbmax] | who[nbmax]; ready words and times by
 * round parity, as the counts: a peer one round ahead must not erase what a
 * link model still reads. done, claim and who are of rank r's block (the
 * r-th 1/W of each bucket), whichever rank averages it. */
static uint32_t *done_of(seg *s, int r) {
  return (uint32_t *)(s->ctl + (size_t)r * s->ctl_stride + 64);
}
static uint32_t *claim_of(seg *s, int r) {
  size_t w = line_up((size_t)s->nbmax * sizeof(uint32_t));
  size_t t = line_up((size_t)s->nbmax * sizeof(int64_t));
  return (uint32_t *)(s->ctl + (size_t)r * s->ctl_stride + 64 + 3 * w + 2 * t);
}
static int32_t *who_of(seg *s, int r) { /* the rank that claimed the block */
  return (int32_t *)(claim_of(s, r) + line_up((size_t)s->nbmax * sizeof(uint32_t)) / 4);
}
static uint32_t *ready_of(seg *s, int r) {
  size_t w = line_up((size_t)s->nbmax * sizeof(uint32_t));
  return (uint32_t *)(s->ctl + (size_t)r * s->ctl_stride + 64 + w + (s->gen & 1) * w);
}
static int64_t *ready_at_of(seg *s, int r) {
  size_t w = line_up((size_t)s->nbmax * sizeof(uint32_t));
  size_t t = line_up((size_t)s->nbmax * sizeof(int64_t));
  return (int64_t *)(s->ctl + (size_t)r * s->ctl_stride + 64 + 3 * w + (s->gen & 1) * t);
}
static float *grad_of(seg *s, int r) { return (float *)(s->data + (size_t)r * s->stride); }
/* Shared buffer i: 0 the values, 1 + k the optimizer's state k. */
static float *shared_of(seg *s, int i) { return (float *)(s->shared + (size_t)i * s->stride); }
static upd_desc *desc_of(seg *s, int r) { return &s->desc[r * 2 + (s->gen & 1)]; }

static void seg_free(seg *s) {
  if (!s) return;
  if (s->base) munmap(s->base, s->len);
  if (s->shared) munmap(s->shared, s->shared_len);
  dg__free(s->off);
  dg__free(s->posted);
  dg__free(s);
}

/* Maps the segment for nfloat gradients and at most nbmax buckets
 * (collective); *out stays NULL where the group has no segment or a rank
 * cannot map it. Returns a group failure only. */
static int seg_new(dg_pg *pg, size_t nfloat, int nbmax, seg **out) {
  *out = NULL;
  int W = dg_pg_size(pg);
  size_t stride = page_up((nfloat ? nfloat : 1) * sizeof(float));
  size_t cs = 64 + 5 * line_up((size_t)nbmax * sizeof(uint32_t)) +
              2 * line_up((size_t)nbmax * sizeof(int64_t));
  size_t ctl = page_up(sizeof(grad_hdr) + (size_t)W * cs);
  size_t dsc = page_up((size_t)W * 2 * sizeof(upd_desc));
  size_t len = ctl + dsc + (size_t)W * stride;
  void *p = NULL;
  int rc = dg__shm_map(pg, len, &p);
  if (rc != DG_OK || !p) return rc;
  seg *s = dg__calloc(1, sizeof *s);
  if (s) {
    *s = (seg){.pg = pg, .base = p, .len = len, .stride = stride, .W = W,
               .rank = dg_pg_rank(pg), .nbmax = nbmax, .hdr = p,
               .ctl = (unsigned char *)p + sizeof(grad_hdr), .ctl_stride = cs,
               .desc = (upd_desc *)((unsigned char *)p + ctl),
               .data = (unsigned char *)p + ctl + dsc};
    s->off = dg__calloc((size_t)nbmax * 3, sizeof *s->off);
    s->posted = dg__calloc((size_t)nbmax, sizeof *s->posted);
  }
  int64_t ok = s && s->off && s->posted;
  rc = dg_pg_allreduce_sync(pg, &ok, 1, DG_I64, DG_RED_MIN); /* every rank or none */
  if (rc != DG_OK || !ok) {
    if (s) seg_free(s);
    else munmap(p, len);
    return rc;
  }
  s->cnt = s->off + nbmax;
  s->bytes = s->cnt + nbmax;
  const dg_link_model *m = dg__pg_link(pg);
  s->link = m && m->bucket_end ? m : NULL;
  s->mine = grad_of(s, s->rank);
  *out = s;
  return DG_OK;
}

static void ring(seg *s) {
  __atomic_add_fetch(&s->hdr->bell, 1, __ATOMIC_SEQ_CST);
  dg__shm_wake(&s->hdr->bell, &s->hdr->sleepers);
}

static int is_gen(const uint32_t *w, uint32_t g) { return __atomic_load_n(w, __ATOMIC_ACQUIRE) == g; }

static int data_done(seg *s, int k) {
  for (int p = 0; p < s->W; p++)
    if (!is_gen(&done_of(s, p)[k], s->gen)) return 0;
  return 1;
}

/* When bucket k was posted everywhere (the latest ready_at), or -1. */
static int64_t posted_at(seg *s, int k) {
  int64_t t = 0;
  for (int p = 0; p < s->W; p++) {
    if (!is_gen(&ready_of(s, p)[k], s->gen)) return -1;
    t = DG_MAX(t, __atomic_load_n(&ready_at_of(s, p)[k], __ATOMIC_RELAXED));
  }
  return t;
}

/* The round's count summed over ranks (valid once any bucket is complete). */
static int32_t seg_count(seg *s) {
  int32_t t = 0;
  for (int p = 0; p < s->W; p++) t += __atomic_load_n(&count_of(s, p)[s->gen & 1], __ATOMIC_ACQUIRE);
  return t;
}

/* out = average over ranks (in rank order) of [o, o + n) of every buffer,
 * written to every buffer, a tile at a time through L1. */
/* tile = average over ranks (in rank order) of [o, o + k) of every buffer
 * (k <= RED_TILE): the one definition of a block's average, whoever
 * computes it and wherever it goes. */
static void avg_tile(seg *s, size_t o, size_t k, float *tile) {
  if (s->W == 2) {
    const float *a = grad_of(s, 0) + o, *b = grad_of(s, 1) + o;
    for (size_t i = 0; i < k; i++) tile[i] = (a[i] + b[i]) * 0.5f;
    return;
  }
  memcpy(tile, grad_of(s, 0) + o, k * sizeof(float));
  for (int p = 1; p < s->W; p++) {
    if (p == s->W - 1) dg__reduce_avg_last(tile, grad_of(s, p) + o, k, DG_F32, s->W);
    else dg__reduce(tile, grad_of(s, p) + o, k, DG_F32, DG_RED_SUM);
  }
}

static void grad_block(seg *s, size_t o, size_t n) {
  if (s->W == 2) { /* one pass: read both, write both (avg_tile's sum, in place) */
    float *restrict a = grad_of(s, 0) + o, *restrict b = grad_of(s, 1) + o;
    for (size_t i = 0; i < n; i++) a[i] = b[i] = (a[i] + b[i]) * 0.5f;
    return;
  }
  float tile[RED_TILE];
  for (size_t t = 0; t < n; t += RED_TILE) {
    size_t k = DG_MIN((size_t)RED_TILE, n - t);
    avg_tile(s, o + t, k, tile);
    for (int p = 0; p < s->W; p++) memcpy(grad_of(s, p) + o + t, tile, k * sizeof(float));
  }
}

/* This round's update when every rank with data applies it sharded (the
 * first such rank's words; all agree), else NULL: the average goes into the
 * gradients. *split: ranks with data disagree (a rank's optimizer was let
 * go). Valid once every rank posted a bucket of the round. */
static const upd_desc *round_update(seg *s, int *split) {
  const upd_desc *first = NULL;
  int on = 0;
  for (int p = 0; p < s->W; p++) {
    const upd_desc *u = desc_of(s, p);
    if (!is_gen(&u->gen, s->gen) || !u->on) continue;
    on++;
    if (!first) first = u;
  }
  int data = seg_count(s);
  if (split) *split = on && on != data;
  return on && on == data ? first : NULL;
}

/* The average of [o, o + n), scaled as shm_finish would, fed straight into
 * the update of the shared values: a tile at a time through L1, nothing
 * written back to the gradients. Bit for bit what averaging, scaling and
 * dg__optim_step_span give (same operations in the same order). */
static void fused_block(seg *s, const upd_desc *u, size_t o, size_t n) {
  int32_t active = s->no_join ? s->W : seg_count(s);
  const float f = (active > 0 ? 1.0f / ((float)active * (float)u->accum) : 0.0f) * (float)s->W;
  float tile[RED_TILE];
  for (size_t t = 0; t < n; t += RED_TILE) {
    size_t k = DG_MIN((size_t)RED_TILE, n - t);
    avg_tile(s, o + t, k, tile);
    if (f != 1.0f)
      for (size_t i = 0; i < k; i++) tile[i] *= f;
    dg__optim_update_at(s->opt, u->lr, u->step, o + t, tile, k);
  }
}

/* Whether block j of bucket k is taken this round (a claim of a later
 * round cannot exist before this rank posted it: see progress). */
static int claimed(seg *s, int j, int k) {
  return (int32_t)(__atomic_load_n(&claim_of(s, j)[k], __ATOMIC_ACQUIRE) - s->gen) >= 0;
}

/* The next block for this rank, as bucket k and block *j (-1: none): of
 * the buckets ready everywhere, the one the next forward needs first; its
 * own block first, then (steal) the others'. */
static int candidate(seg *s, int steal, int *j) {
  for (int k = s->nb - 1; k >= 0; k--) {
    int p = 0;
    while (p < s->W && is_gen(&ready_of(s, p)[k], s->gen)) p++;
    if (p < s->W) continue;
    for (int i = 0; i < (steal ? s->W : 1); i++)
      if (!claimed(s, *j = (s->rank + i) % s->W, k)) return k;
  }
  return -1;
}

/* Averages unclaimed blocks of the buckets ready everywhere, without
 * waiting; returns how many. A thread that waits (steal) takes any block (a
 * claim in the segment makes one rank do it), its own first; backward's
 * hooks take only this rank's blocks, and none while some thread waits: a
 * rank that is behind leaves the averaging to the ranks idle waiting for it
 * and goes on with its backward. A block's average is the same whichever
 * rank computes it (rank order, one code path): results stay bit-exact. */
static int progress(seg *s, int steal) {
  if (!steal && __atomic_load_n(&s->hdr->waiters, __ATOMIC_ACQUIRE)) return 0;
  int n = 0;
  const upd_desc *u = NULL;
  for (int k, j; (k = candidate(s, steal, &j)) >= 0;) {
    /* a bucket ready everywhere: every rank's words of the round are out */
    if (!u) u = round_update(s, NULL);
    if (u && !s->opt) return n; /* this rank let its optimizer go: the others update */
    uint32_t *c = &claim_of(s, j)[k], old = __atomic_load_n(c, __ATOMIC_ACQUIRE);
    if ((int32_t)(old - s->gen) >= 0 ||
        !__atomic_compare_exchange_n(c, &old, s->gen, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
      continue; /* another thread or rank took it */
    __atomic_store_n(&who_of(s, j)[k], s->rank, __ATOMIC_RELAXED);
    size_t q = s->cnt[k] / (size_t)s->W, rm = s->cnt[k] % (size_t)s->W;
    size_t bo = (size_t)j * q + DG_MIN((size_t)j, rm);
    if (u) fused_block(s, u, s->off[k] + bo, q + ((size_t)j < rm));
    else grad_block(s, s->off[k] + bo, q + ((size_t)j < rm));
    __atomic_store_n(&done_of(s, j)[k], s->gen, __ATOMIC_SEQ_CST);
    ring(s);
    if (j != s->rank) __atomic_add_fetch(&s->peer_blocks, 1, __ATOMIC_RELAXED);
    n++;
  }
  return n;
}

static int mine_all_done(seg *s) {
  for (int k = 0; k < s->nb; k++)
    if (!is_gen(&done_of(s, s->rank)[k], s->gen)) return 0;
  return 1;
}

/* What an engine or a waiter is waiting for. */
typedef struct {
  seg *s;
  int want;      /* bucket, or -1: this rank's blocks of every bucket */
  uint32_t bell; /* the bell when the waiter last looked */
} grad_wait;

static int bell_moved(void *a) {
  grad_wait *w = a;
  return __atomic_load_n(&w->s->hdr->bell, __ATOMIC_SEQ_CST) != w->bell;
}

/* The first rank holding up `want` (or this rank's engine: its own blocks).
 * A rank that has not posted its gradients comes first (the others wait
 * for it), then the rank that claimed a block not averaged yet. */
static int laggard(void *a) {
  grad_wait *w = a;
  seg *s = w->s;
  for (int k = 0; k < s->nb; k++) {
    if (w->want >= 0 ? k != w->want : is_gen(&done_of(s, s->rank)[k], s->gen)) continue;
    for (int p = 0; p < s->W; p++)
      if (p != s->rank && !is_gen(&ready_of(s, p)[k], s->gen)) return p;
    for (int j = 0; j < s->W; j++) {
      if (is_gen(&done_of(s, j)[k], s->gen) || (w->want < 0 && j != s->rank)) continue;
      int c = claimed(s, j, k) ? __atomic_load_n(&who_of(s, j)[k], __ATOMIC_RELAXED) : j;
      if (c != s->rank) return c;
    }
  }
  return -1;
}

static int bell_wait(seg *s, grad_wait *w, int64_t deadline, int *dead) {
  return dg__shm_wait(s->pg, &s->hdr->bell, &s->hdr->sleepers, bell_moved, laggard, w, deadline,
                      dead);
}

/* The engine: a task in the group's worker that does this rank's blocks of
 * every bucket of the round as they become ready everywhere. */
static int engine_run(dg_coll *c, void *arg) {
  seg *s = arg;
  grad_wait w = {s, -1, 0};
  int rc = DG_OK, dead = -1;
  __atomic_add_fetch(&s->hdr->waiters, 1, __ATOMIC_SEQ_CST);
  for (;;) {
    w.bell = __atomic_load_n(&s->hdr->bell, __ATOMIC_SEQ_CST);
    progress(s, 1);
    if (mine_all_done(s) || (rc = bell_wait(s, &w, dg__coll_deadline(c), &dead)) != DG_OK)
      break;
  }
  __atomic_sub_fetch(&s->hdr->waiters, 1, __ATOMIC_SEQ_CST);
  if (rc != DG_OK)
    return dg__shm_wait_fail(c, rc, DG_MAX(laggard(&w), 0), dead, "finish its gradients",
                             "DDP shared-memory gradients");
  return DG_OK;
}

/* A link model (benchmarks): bucket k's data is averaged; hold it back
 * until the model's transfer of it ends (bounded by the deadline). */
static void link_hold(seg *s, int k, int64_t deadline) {
  for (;;) {
    for (int j = 0; j < s->nb; j++) s->posted[j] = posted_at(s, j);
    int64_t now = dg__now_ns();
    int64_t t = s->link->bucket_end(s->link->state, s->gen, k, s->nb, s->bytes, s->posted,
                                    s->W, now);
    if (t <= now || dg__now_ms() >= deadline) return;
    dg__sleep_until_ns(t == INT64_MAX ? now + 1000000 : t, deadline); /* no message ends it sooner */
  }
}

/* Why waiting for bucket k failed with rc (into err). */
static void wait_error(seg *s, grad_wait *w, int rc, int dead, char *err, size_t cap) {
  int k = w->want, p = laggard(w), stopped;
  if (p < 0) p = s->rank; /* every peer is done: this rank's own block is missing */
  const char *what = p != s->rank && !is_gen(&ready_of(s, p)[k], s->gen)
                         ? "to post its gradients of bucket"
                         : "to average its block of gradient bucket";
  if (rc == DG_EPEER && dead >= 0)
    snprintf(err, cap, "rank %d exited while rank %d waited for rank %d %s %d", dead, s->rank, p,
             what, k);
  else if (rc == DG_ETIMEDOUT && (stopped = dg__shm_stopped_peer(s->pg)) >= 0)
    snprintf(err, cap, "timed out after %d ms waiting for rank %d %s %d: rank %d is stopped "
             "(SIGSTOP or a debugger)", dg__pg_timeout_ms(s->pg), p, what, k, stopped);
  else if (rc == DG_ETIMEDOUT)
    snprintf(err, cap, "timed out after %d ms waiting for rank %d %s %d",
             dg__pg_timeout_ms(s->pg), p, what, k);
  else if (dg__pg_error(s->pg, err, cap) == DG_OK)
    snprintf(err, cap, "transport failed while waiting for rank %d", p);
}

/* Makes progress until bucket k is complete, or until this round's engine
 * fails; a failure's message goes to err. */
static int wait_bucket(seg *s, int k, char *err, size_t cap) {
  grad_wait w = {s, k, 0};
  err[0] = '\0';
  int64_t deadline = dg__deadline(0, dg__pg_timeout_ms(s->pg));
  int dead = -1, rc = DG_OK, done = 0;
  __atomic_add_fetch(&s->hdr->waiters, 1, __ATOMIC_SEQ_CST);
  __atomic_store_n(waiting_of(s, s->rank), dg__now_ns(), __ATOMIC_RELAXED);
  for (;;) {
    w.bell = __atomic_load_n(&s->hdr->bell, __ATOMIC_SEQ_CST);
    progress(s, 1);
    if (data_done(s, k)) break;
    if (s->engine && (rc = dg_work_test(s->engine, &done)) != DG_OK) {
      snprintf(err, cap, "%s", dg_work_errmsg(s->engine));
      break;
    }
    if ((rc = bell_wait(s, &w, deadline, &dead)) != DG_OK) break;
    if (dg__now_ms() >= deadline) {
      rc = DG_ETIMEDOUT;
      break;
    }
  }
  __atomic_store_n(waiting_of(s, s->rank), 0, __ATOMIC_RELAXED);
  __atomic_sub_fetch(&s->hdr->waiters, 1, __ATOMIC_SEQ_CST);
  if (rc == DG_OK && s->link) link_hold(s, k, deadline);
  else if (rc != DG_OK && !err[0]) wait_error(s, &w, rc, dead, err, cap);
  return rc;
}

/* ---- the reducer ---- */

static void shm_layout(dg_ddp *d) {
  seg *s = d->red_state;
  s->nb = DG_MIN(d->nb, s->nbmax);
  for (int k = 0; k < s->nb; k++) {
    s->off[k] = d->b[k].lo;
    s->cnt[k] = d->b[k].hi - d->b[k].lo;
    s->bytes[k] = s->cnt[k] * sizeof(float);
  }
}

static void shm_begin_round(dg_ddp *d, int32_t have) {
  seg *s = d->red_state;
  s->gen++;
  /* the count rides in the segment. Two slots: a peer is at most one round
   * ahead, and it cannot begin the round after that before this rank has
   * read this round's counts */
  __atomic_store_n(&count_of(s, s->rank)[s->gen & 1], have, __ATOMIC_RELEASE);
  /* this rank's update of the round, before any of its buckets is posted */
  upd_desc *u = desc_of(s, s->rank);
  u->on = d->shard && s->opt && have && dg__optim_shardable(s->opt);
  if (u->on) {
    int K = d->opts.accum_steps > 1 ? d->opts.accum_steps : 1;
    u->accum = d->micro > 1 ? K : 1; /* what on_end sets d->accum_div to */
    u->lr = dg_optim_lr(s->opt); /* the rate in force as backward begins */
    u->step = dg_optim_step_count(s->opt) + 1; /* counted at backward end */
  }
  __atomic_store_n(&u->gen, s->gen, __ATOMIC_RELEASE);
  d->round_fused = 0;
  /* the first round re-lays the buckets out before any starts: no engine
   * may read the layout meanwhile (the waits do the blocks) */
  if (!s->engine_thread || dg__ddp_layout_due(d)) return;
  int rc = dg__pg_post_task(d->pg, "DDP gradient averaging", engine_run, s, &s->engine);
  if (rc) dg__ddp_fail(d, rc, "ddp: rank %d: posting the gradient averaging failed: %s",
                       d->rank, dg_pg_errmsg(d->pg));
}

/* Publishes bucket k and averages what is ready everywhere. */
static void shm_start(dg_ddp *d, int k) {
  seg *s = d->red_state;
  if (s->link) __atomic_store_n(&ready_at_of(s, s->rank)[k], dg__now_ns(), __ATOMIC_RELAXED);
  __atomic_store_n(&ready_of(s, s->rank)[k], s->gen, __ATOMIC_SEQ_CST);
  ring(s);
  progress(s, 0);
}

static void shm_progress(dg_ddp *d) { progress(d->red_state, 0); }

/* Waits until every rank averaged its block of bucket k (doing this rank's
 * blocks meanwhile), then scales. */
static int shm_finish(dg_ddp *d, int k) {
  seg *s = d->red_state;
  char err[400];
  err[0] = '\0';
  int rc = wait_bucket(s, k, err, sizeof err);
  if (rc)
    return dg__ddp_fail(d, rc, "ddp: rank %d: step %lld: averaging bucket %d (%d params, %zu "
                        "floats) failed: %s", d->rank, (long long)d->st.sync_steps, k,
                        d->b[k].nparams, d->b[k].hi - d->b[k].lo, err[0] ? err : dg_pg_errmsg(d->pg));
  if (d->active < 0) d->active = d->opts.no_join ? d->world : seg_count(s);
  int split = 0;
  d->round_fused = round_update(s, &split) != NULL;
  if (d->shard && d->has_data && !d->round_fused)
    return dg__ddp_fail(d, DG_ESTATE, "ddp: rank %d: step %lld: the update is sharded over the "
                        "ranks, but %s: free the DDP before the optimizer, and set no "
                        "parameter group on it once it is sharded", d->rank,
                        (long long)d->st.sync_steps,
                        !s->opt ? "this rank's optimizer was freed"
                        : !dg__optim_shardable(s->opt) ? "this rank's optimizer was given "
                                                         "parameter groups"
                        : split ? "another rank no longer applies it (its optimizer was freed "
                                  "or given parameter groups)"
                                : "no rank applies it");
  const float f = dg__ddp_round_scale(d) * (float)d->world; /* the segment divided by world */
  if (!d->round_fused && f != 1.0f) {
    float *g = dg__params_grad_raw(d->ps);
    for (size_t i = d->b[k].lo; i < d->b[k].hi; i++) g[i] *= f;
  }
  d->b[k].finished = 1;
  return d->err;
}

/* The count is known once any bucket is complete. */
static int32_t shm_count(dg_ddp *d) {
  dg__ddp_start_rest(d);
  return dg__ddp_finish_bucket(d, 0) ? 0 : d->active;
}

static void shm_end_round(dg_ddp *d) {
  seg *s = d->red_state;
  d->st.peer_blocks = __atomic_load_n(&s->peer_blocks, __ATOMIC_RELAXED);
  if (!s->engine) return;
  /* done with every block once every bucket completed; a failed round has
   * it fail by its deadline */
  (void)dg_work_wait(s->engine, 0);
  dg_work_free(s->engine);
  s->engine = NULL;
}

/* One copy of the values and the optimizer's state for all ranks: rank 0
 * copies its own in (every rank's are equal after the first step), and
 * after a barrier each rank points its store and optimizer at the copy. */
static int shm_share(dg_ddp *d) {
  seg *s = d->red_state;
  dg_optim *o = d->opt;
  size_t bytes = d->ps->used_total * sizeof(float);
  void *p = NULL;
  size_t len = (size_t)(1 + o->nstate) * s->stride; /* nstate is agreed (fingerprint) */
  int rc = dg__shm_map(d->pg, len, &p);
  if (!rc && p && s->rank == 0) {
    memcpy(p, d->ps->data, bytes);
    for (int k = 0; k < o->nstate; k++)
      memcpy((unsigned char *)p + (size_t)(1 + k) * s->stride, o->state[k], bytes);
  }
  int64_t ok = p != NULL; /* every rank mapped it (and rank 0 filled it) or none shares */
  if (!rc) rc = dg_pg_allreduce_sync(d->pg, &ok, 1, DG_I64, DG_RED_MIN);
  if (rc) {
    if (p) munmap(p, len);
    return dg__ddp_fail(d, rc, "ddp: rank %d: sharing the update over the ranks failed: %s",
                        d->rank, dg_pg_errmsg(d->pg));
  }
  if (!ok) { /* (no shared memory for it: every rank updates its own copy, as before) */
    if (p) munmap(p, len);
    DG_LOGI("ddp: rank %d: no shared memory for a copy of the values and the optimizer "
            "state (%zu bytes): the update is not sharded", d->rank, len);
    return DG_OK;
  }
  s->shared = p;
  s->shared_len = len;
  d->priv_data = dg__params_swap_data(d->ps, shared_of(s, 0), 1);
  for (int k = 0; k < o->nstate; k++) d->priv_state[k] = dg__optim_swap_state(o, k, shared_of(s, 1 + k));
  s->opt = o;
  d->shard = 1;
  return DG_OK;
}

/* The optimizer is let go: it gets a copy of the shared state back. */
static void shm_unshare_state(dg_ddp *d) {
  seg *s = d->red_state;
  dg_optim *o = s->opt;
  if (!o) return;
  size_t bytes = d->ps->used_total * sizeof(float);
  for (int k = 0; k < o->nstate; k++) {
    memcpy(d->priv_state[k], o->state[k], bytes);
    (void)dg__optim_swap_state(o, k, d->priv_state[k]);
  }
  s->opt = NULL;
}

static void shm_free(dg_ddp *d) {
  /* the values (a copy of the shared ones) and the gradients back into
   * private memory (the store outlives us) */
  shm_unshare_state(d);
  if (d->shard) {
    memcpy(d->priv_data, d->ps->data, d->ps->used_total * sizeof(float));
    (void)dg__params_swap_data(d->ps, d->priv_data, 0);
    d->shard = 0;
  }
  if (dg__params_lend_grad(d->ps, NULL) != DG_OK)
    DG_LOGE("ddp_free: rank %d: out of memory taking the gradients back; they are lost",
            d->rank);
  dg__lend_clear_probe(d->red_state);
  seg_free(d->red_state);
  d->red_state = NULL;
}

/* How long a peer must have waited before this rank lends it work: a
 * hand-off costs a wake-up and packing again (tens of us), and a peer a
 * little ahead catches up anyway; a preempted rank is off its core for a
 * slice, milliseconds. With no threshold, lending gained nothing under 10%
 * load (BENCHMARKS.md, session 21). */
#define LEND_WAIT_NS 150000

/* The lend probe (base/lend.c): a rank of this host has waited a while for
 * this one. */
static int peer_waits(void *arg) {
  seg *s = arg;
  int64_t now = dg__now_ns();
  for (int p = 0; p < s->W; p++) {
    int64_t t = __atomic_load_n(waiting_of(s, p), __ATOMIC_RELAXED);
    if (p != s->rank && t && now - t >= LEND_WAIT_NS) return 1;
  }
  return 0;
}

static const dg__ddp_reducer shm_reducer = {
    .name = "shared segment", .count_rides = 1, .layout = shm_layout,
    .begin_round = shm_begin_round, .start = shm_start, .progress = shm_progress,
    .finish = shm_finish, .count = shm_count, .end_round = shm_end_round, .share = shm_share,
    .unshare_state = shm_unshare_state, .free = shm_free};

/* The averaging is CPU work: an engine in the group's worker overlaps it
 * with backward only if a core is free for it; otherwise it only adds
 * thread hand-offs (measured: bench/ddp, 2 ranks on 2 cores). */
static int engine_wanted(const dg_ddp *d) {
  if (d->opts.engine_thread) return d->opts.engine_thread > 0;
  cpu_set_t cs;
  int ncpu = sched_getaffinity(0, sizeof cs, &cs) == 0 ? CPU_COUNT(&cs) : 1;
  return ncpu >= dg_pg_local_size(d->pg) * (dg_get_num_threads() + 1);
}

int dg__ddp_shm_init(dg_ddp *d) {
  if (d->world == 1 || d->opts.hook || d->opts.comm != DG_DDP_COMM_F32 ||
      !dg__pg_local_shm(d->pg))
    return DG_OK;
  size_t n = 0;
  dg_params_data(d->ps, &n);
  seg *s = NULL;
  int rc = seg_new(d->pg, n, d->nparams, &s);
  if (rc) return dg__ddp_fail(d, rc, "ddp_new: rank %d: setting up the shared gradient "
                              "buffers failed: %s", d->rank, dg_pg_errmsg(d->pg));
  if (!s) return DG_OK; /* no segment: private gradients, the collectives */
  s->engine_thread = engine_wanted(d);
  s->no_join = d->opts.no_join;
  if ((rc = dg__params_lend_grad(d->ps, s->mine)) != DG_OK) {
    /* only ENOMEM-free paths reach here: lending an external buffer cannot fail */
    seg_free(s);
    return dg__ddp_fail(d, rc, "ddp_new: lending the gradient buffer failed");
  }
  d->red = &shm_reducer;
  d->red_state = s;
  /* the lend worker only where a product can be lent */
  const struct dg__kern_blas *blas = dg__cpu_backend.blas;
  const char *e = getenv("DG_LEND");
  if ((!e || strcmp(e, "0")) && blas->can_lend && blas->can_lend())
    dg__lend_set_probe(peer_waits, s);
  return DG_OK;
}
