/* Allreduce between dgrad ranks on one host through one shared-memory
 * segment, no transport messages at all:
 *
 *   per chunk g (a counter every rank advances alike):
 *     wait until every rank has finished reading slot g % NSLOT's last use
 *     copy my chunk into my slot; publish posted = g + 1
 *     wait for every peer's posted >= g + 1
 *     reduce the peers' slots into my buffer (rank order); consumed = g + 1
 *
 * One copy in and one reducing read per byte; the slots are small enough to
 * stay in cache, so main-memory traffic is that of a memcpy. Every rank
 * reduces the whole buffer in the same operand order, so the bits agree.
 * The barrier is a one-element allreduce; DDP's gradient segment (below)
 * averages buckets in place. Waits pause, then yield, then sleep on a futex
 * of the shared word, in slices that check the deadline, the transport's
 * error state and whether the peer process is still alive. */
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "dist/pg_impl.h"
#include "dist/net/net_impl.h"
#include "base/common_impl.h"

#define SHM_CHUNK ((size_t)256 << 10) /* bytes per slot */
#define SHM_NSLOT 4                   /* slots per rank (chunks in flight) */
#define PAUSE_NS 2000                 /* busy-wait (the peer is on another core)... */
#define SPIN_NS 20000                 /* ...then yielding, before sleeping... */
#define SPIN_WAITED_NS 2000000        /* ...or, yielding, this long while a caller waits */
#define SLICE_MS 5                    /* futex sleep between liveness checks */

typedef struct {
  uint64_t count; /* the call's element count, dtype and op: checked alike */
  uint32_t dt, op;
} shm_desc;

/* One rank's control words, each on its own cache line. */
typedef struct {
  uint32_t posted __attribute__((aligned(64)));
  uint32_t consumed __attribute__((aligned(64)));
  uint32_t sleepers __attribute__((aligned(64))); /* futex waiters on my words */
  shm_desc desc[SHM_NSLOT] __attribute__((aligned(64)));
} shm_ctl;

struct dg__shm {
  void *base;
  size_t len;
  int W;
  double link_ns_per_byte; /* DG_SIM_LINK_GBIT: a simulated slow link, 0: none */
  shm_ctl *ctl;        /* (W) */
  unsigned char *data; /* (W * SHM_NSLOT * SHM_CHUNK) */
  uint32_t next;       /* next chunk number */
};

static size_t seg_len(int W) {
  return (size_t)W * sizeof(shm_ctl) + (size_t)W * SHM_NSLOT * SHM_CHUNK;
}

static unsigned char *slot(dg__shm *s, int r, uint32_t g) {
  return s->data + ((size_t)r * SHM_NSLOT + g % SHM_NSLOT) * SHM_CHUNK;
}

static int futex(uint32_t *w, int op, uint32_t v, const struct timespec *ts) {
  return (int)syscall(SYS_futex, w, op, v, ts, NULL, 0);
}

/* A slow link simulated (DG_SIM_LINK_GBIT, for benchmarks of overlap): a
 * collective that moved `bytes` per rank returns no earlier than a link of
 * that rate would have carried them since t0 (2(W-1)/W of them, as a ring
 * would), sleeping, so that like a NIC's DMA it costs no CPU. */
static void sim_link(const dg_pg *pg, int64_t t0, size_t bytes) {
  double r = pg->shm->link_ns_per_byte;
  if (r <= 0) return;
  int64_t end = t0 + (int64_t)(r * (double)bytes * 2.0 * (pg->size - 1) / pg->size);
  for (int64_t now; (now = dg__now_ns()) < end;) {
    struct timespec ts = {(end - now) / 1000000000, (end - now) % 1000000000};
    nanosleep(&ts, NULL);
  }
}

/* Publishes *word = v and wakes sleepers of that rank's words. */
static void publish(uint32_t *sleepers, uint32_t *word, uint32_t v) {
  __atomic_store_n(word, v, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(sleepers, __ATOMIC_SEQ_CST))
    futex(word, FUTEX_WAKE, INT32_MAX, NULL);
}

static int reached(const uint32_t *word, uint32_t v) {
  return (int32_t)(__atomic_load_n(word, __ATOMIC_ACQUIRE) - v) >= 0;
}

/* Waits until ok(arg) holds. `word` is a futex that whoever changes what ok
 * reads bumps (after the change) and `sleepers` counts its futex waiters.
 * Returns DG_OK, the transport's error, DG_EPEER with *dead = a peer found
 * exited (blame(arg) names the one waited for: checked first), or
 * DG_ETIMEDOUT at `deadline` (ms). */
static int shm_wait(dg_pg *pg, uint32_t *word, uint32_t *sleepers, int (*ok)(void *),
                    int (*blame)(void *), void *arg, int64_t deadline, int *dead) {
  if (ok(arg)) return DG_OK;
  /* Spinning steals the core from this rank's compute thread unless that
   * thread is blocked waiting for a collective; sleeping costs a wake-up
   * (tens of us on a VM whose idle cores halt). */
  int64_t t0 = dg__now_ns(), t;
  while ((t = dg__now_ns() - t0) < SPIN_NS ||
         (t < SPIN_WAITED_NS && __atomic_load_n(&pg->nwaiting, __ATOMIC_RELAXED) > 0)) {
    /* Past a few microseconds the peer may be waiting for this very core
     * (more ranks than free cores): let it run. */
    if (t < PAUSE_NS) for (int i = 0; i < 16; i++) dg__cpu_relax();
    else sched_yield();
    if (ok(arg)) return DG_OK;
  }
  for (;;) {
    __atomic_add_fetch(sleepers, 1, __ATOMIC_SEQ_CST);
    uint32_t cur = __atomic_load_n(word, __ATOMIC_SEQ_CST);
    if (!ok(arg)) {
      struct timespec ts = {0, SLICE_MS * 1000000L};
      futex(word, FUTEX_WAIT, cur, &ts);
    }
    __atomic_sub_fetch(sleepers, 1, __ATOMIC_SEQ_CST);
    if (ok(arg)) return DG_OK;
    int e = pg->x->vt->error(pg->x, NULL, 0);
    if (e != DG_OK) return e;
    if (pg->cma) {
      int first = blame(arg);
      for (int i = -1; i < pg->size; i++) {
        int p = i < 0 ? first : i;
        if (p < 0 || p == pg->rank || kill(pg->pids[p], 0) == 0 || errno != ESRCH) continue;
        *dead = p;
        return DG_EPEER;
      }
    }
    if (dg__now_ms() >= deadline) return DG_ETIMEDOUT;
  }
}

typedef struct {
  uint32_t *word, v;
  int p;
} word_wait;

static int word_ok(void *a) {
  word_wait *w = a;
  return reached(w->word, w->v);
}
static int word_blame(void *a) { return ((word_wait *)a)->p; }

/* A shm_wait failure of collective c, waiting for rank p to `what`. */
static int wait_fail(dg_coll *c, int rc, int p, int dead, const char *what, const char *where) {
  if (rc == DG_EPEER && dead >= 0)
    return dg__coll_fail_peer(c, DG_EPEER, dead, "rank %d (pid %d) exited while this rank "
                              "waited for rank %d to %s", dead, c->pg->pids[dead], p, what);
  if (rc == DG_ETIMEDOUT)
    return dg__coll_fail_peer(c, DG_ETIMEDOUT, p, "timed out after %d ms waiting for rank %d "
                              "to %s (%s)", c->pg->timeout_ms, p, what, where);
  return dg__coll_fail(c, rc, "waiting for rank %d to %s: transport failed", p, what);
}

/* Waits until rank p's *word reaches v (modular); `sleepers` is p's count
 * of futex waiters; failures name p. */
static int wait_word(dg_coll *c, int p, uint32_t *word, uint32_t *sleepers, uint32_t v,
                     const char *what) {
  word_wait w = {word, v, p};
  int dead = -1;
  int rc = shm_wait(c->pg, word, sleepers, word_ok, word_blame, &w, c->deadline, &dead);
  return rc == DG_OK ? DG_OK : wait_fail(c, rc, p, dead, what, "shared-memory allreduce");
}

/* Every rank's call must be the same allreduce: compare descriptors. */
static int check_desc(dg_coll *c, int p, uint32_t g) {
  const shm_desc *m = &c->pg->shm->ctl[c->rank].desc[g % SHM_NSLOT];
  const shm_desc *t = &c->pg->shm->ctl[p].desc[g % SHM_NSLOT];
  if (m->count == t->count && m->dt == t->dt && m->op == t->op) return DG_OK;
  return dg__coll_fail(c, DG_EMISMATCH, "rank %d reduces %llu elements of %s (op %u), rank %d "
                       "%llu of %s (op %u): every rank must call the same allreduce", c->rank,
                       (unsigned long long)m->count, dg_dtype_name((dg_dtype)m->dt), m->op, p,
                       (unsigned long long)t->count, dg_dtype_name((dg_dtype)t->dt), t->op);
}

/* Posts chunk g (bytes [o, o + len) of buf) into my slot. */
static int post_chunk(dg_coll *c, const unsigned char *src, size_t len, uint32_t g) {
  dg__shm *s = c->pg->shm;
  shm_ctl *me = &s->ctl[c->rank];
  for (int p = 0; p < c->size; p++) { /* the slot's last readers must be done */
    if (p == c->rank) continue; /* I reduce in order: always done */
    int rc = wait_word(c, p, &s->ctl[p].consumed, &s->ctl[p].sleepers, g - SHM_NSLOT + 1,
                       "free a buffer");
    if (rc != DG_OK) return rc;
  }
  memcpy(slot(s, c->rank, g), src, len);
  me->desc[g % SHM_NSLOT] = (shm_desc){c->w->count, (uint32_t)c->w->dt, (uint32_t)c->w->op};
  publish(&me->sleepers, &me->posted, g + 1);
  return DG_OK;
}

/* Reduces chunk g of every rank into dst (len bytes), operands in rank
 * order; my own operand is already in dst. */
static int reduce_chunk(dg_coll *c, unsigned char *dst, size_t len, uint32_t g, dg_dtype dt,
                        dg_redop op) {
  dg__shm *s = c->pg->shm;
  size_t n = len / dg_dtype_size(dt);
  for (int p = 0; p < c->size; p++) {
    if (p == c->rank) continue;
    int rc = wait_word(c, p, &s->ctl[p].posted, &s->ctl[p].sleepers, g + 1, "post its data");
    if (rc == DG_OK) rc = check_desc(c, p, g);
    if (rc != DG_OK) return rc;
  }
  /* ranks 0 and 1 reduce in place (a op b == b op a exactly); from rank 2
   * on, start from rank 0's operand to keep the rank order. */
  int r = c->rank;
  if (r > 1) memcpy(dst, slot(s, 0, g), len);
  int last = r <= 1 && r == c->size - 1 ? c->size - 2 : c->size - 1;
  for (int p = r > 1 ? 1 : 0; p < c->size; p++) {
    if (r <= 1 && p == r) continue;
    if (op == DG_RED_AVG && p == last) dg__reduce_avg_last(dst, slot(s, p, g), n, dt, c->size);
    else dg__reduce(dst, slot(s, p, g), n, dt, op);
  }
  publish(&s->ctl[r].sleepers, &s->ctl[r].consumed, g + 1);
  return DG_OK;
}

int dg__allreduce_shm(dg_coll *c, void *buf, size_t count, dg_dtype dt, dg_redop op) {
  dg__shm *s = c->pg->shm;
  size_t es = dg_dtype_size(dt), step = SHM_CHUNK / es * es, bytes = count * es;
  unsigned char *b = buf;
  int64_t t0 = dg__now_ns();
  /* One chunk ahead: post k + 1 before reducing k, so a peer finds it. */
  uint32_t g0 = s->next;
  size_t nchunk = (bytes + step - 1) / step;
  int rc = post_chunk(c, b, DG_MIN(step, bytes), g0);
  for (size_t k = 0; k < nchunk && rc == DG_OK; k++) {
    size_t o = k * step, len = DG_MIN(step, bytes - o);
    if (k + 1 < nchunk)
      rc = post_chunk(c, b + o + step, DG_MIN(step, bytes - o - step), g0 + (uint32_t)k + 1);
    if (rc == DG_OK) rc = reduce_chunk(c, b + o, len, g0 + (uint32_t)k, dt, op);
  }
  s->next = g0 + (uint32_t)nchunk;
  if (rc == DG_OK) sim_link(c->pg, t0, bytes);
  return rc;
}

/* ---- set-up ---- */

static dg__shm *shm_wrap(void *p, int W) {
  dg__shm *s = dg__calloc(1, sizeof *s);
  if (!s) return NULL;
  s->base = p;
  s->len = seg_len(W);
  s->W = W;
  s->ctl = p;
  s->data = (unsigned char *)p + (size_t)W * sizeof(shm_ctl);
  return s;
}

void dg__shm_free(dg__shm *s) {
  if (!s) return;
  munmap(s->base, s->len);
  dg__free(s);
}

static void seg_name(char *out, size_t cap, int pid0, uint64_t nonce) {
  snprintf(out, cap, "/dgrad-%d-%016llx", pid0, (unsigned long long)nonce);
}

/* How a segment's creation is agreed: an int64 allreduce (MAX, MIN). */
typedef int (*agree_fn)(void *arg, int64_t *v, dg_redop op);

/* Rank 0 creates a segment of `len` bytes; its name travels as a
 * MAX-allreduce of a nonce (0 = none); the others map it; a MIN-allreduce
 * agrees; rank 0 unlinks the name, so nothing is left in /dev/shm once
 * every rank has mapped it. *base is NULL unless every rank mapped it. */
static int seg_open(dg_pg *pg, size_t len, agree_fn agree, void *arg, void **base) {
  int fd = -1;
  char name[64];
  int64_t nonce = 0, ok = 0;
  void *p = MAP_FAILED;
  *base = NULL;
  if (pg->rank == 0) {
    static uint32_t counter;
    uint64_t k = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
    nonce = (int64_t)(((uint64_t)dg__now_ns() ^ (k << 40)) & INT64_MAX) | 1;
    seg_name(name, sizeof name, getpid(), (uint64_t)nonce);
    fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    /* reserve the pages now: a full /dev/shm must fail here, not raise
     * SIGBUS at first touch */
    int e = fd < 0 ? errno : ftruncate(fd, (off_t)len) < 0 ? errno
                                                           : posix_fallocate(fd, 0, (off_t)len);
    if (e) {
      DG_LOGI("dist: rank 0: no shared-memory segment of %zu bytes (%s): %s", len, name,
              strerror(e));
      if (fd >= 0) close(fd), shm_unlink(name);
      fd = -1;
      nonce = 0;
    }
  }
  int rc = agree(arg, &nonce, DG_RED_MAX);
  if (rc == DG_OK && nonce && pg->rank != 0) {
    seg_name(name, sizeof name, pg->pids[0], (uint64_t)nonce);
    fd = shm_open(name, O_RDWR, 0600);
  }
  if (rc == DG_OK && fd >= 0) p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ok = p != MAP_FAILED;
  if (rc == DG_OK) rc = agree(arg, &ok, DG_RED_MIN);
  if (fd >= 0) close(fd);
  if (pg->rank == 0 && nonce) shm_unlink(name);
  if (rc == DG_OK && ok) *base = p;
  else if (p != MAP_FAILED) munmap(p, len);
  return rc;
}

static int agree_rd(void *arg, int64_t *v, dg_redop op) {
  return dg__allreduce_rd(arg, v, 1, DG_I64, op);
}

int dg__shm_setup(dg_pg *pg, dg_coll *c) {
  void *p = NULL;
  int rc = seg_open(pg, seg_len(pg->size), agree_rd, c, &p);
  if (p && !(pg->shm = shm_wrap(p, pg->size))) munmap(p, seg_len(pg->size));
  /* a rank that failed to allocate the wrapper: agree again */
  int64_t ok = pg->shm != NULL;
  if (rc == DG_OK && p) rc = agree_rd(c, &ok, DG_RED_MIN);
  if (rc != DG_OK || !ok) {
    dg__shm_free(pg->shm);
    pg->shm = NULL;
  }
  const char *e = getenv("DG_SIM_LINK_GBIT");
  if (pg->shm && e && atof(e) > 0) pg->shm->link_ns_per_byte = 8.0 / atof(e);
  DG_LOGI("dist: rank %d: shared-memory allreduce %s", pg->rank, pg->shm ? "on" : "off");
  return rc;
}

/* ---- DDP's gradient segment: every rank's flat gradient buffer in one
 * shared mapping. A bucket's average needs no copy-in: each rank reduces
 * its 1/W block of the bucket from every rank's buffer and writes the
 * result into every rank's buffer (read S, write S per rank in all).
 *
 * Buckets are independent (words per bucket, values = the step number g):
 *   rank r's bucket k is final:    ready[r][k] = g
 *   r's engine, until r has done every bucket: pick, among the buckets
 *     ready on every rank and not done by r, the one the next forward needs
 *     first (the highest index: buckets run from the output layer back),
 *     average r's block of it, done[r][k] = g; none: sleep on the bell
 *   bucket k is complete when done[p][k] = g on every rank p.
 * Ranks may pick in different orders (each picks from what it sees) and no
 * one waits for buckets in a fixed sequence, so no order can deadlock.
 * Progress is cooperative: the backward thread takes what it can at every
 * grad-ready hook and the thread that needs a bucket while it waits; with a
 * spare core the group's worker also runs an engine during backward (a
 * claim per bucket keeps a block from being done twice). Every publish
 * bumps the bell (one futex for all waiters).
 *
 * A simulated slow link (DG_SIM_LINK_GBIT) models a NIC with a priority
 * queue and DMA, not a sleeping thread: a bucket is posted when every rank
 * has published it (avail = the latest ready_at); whenever the link is
 * free the most urgent posted bucket is sent, taking bytes / rate; a
 * bucket is complete once the data is averaged and its transfer has ended.
 * Every rank computes this schedule from the same shared ready_at times,
 * lazily up to "now" (a decision at time t only involves buckets posted
 * by t, all known by now), so no thread has to wake up to start a
 * transfer; the averaging itself is CPU work done at the looks. ---- */

typedef struct {
  uint32_t bell __attribute__((aligned(64)));
  uint32_t sleepers __attribute__((aligned(64)));
} grad_hdr;

struct dg__shmgrad {
  void *base;
  size_t len, stride; /* mapping; bytes between ranks' buffers */
  int W, rank, nbmax, nb;
  grad_hdr *hdr;
  unsigned char *ctl;  /* (W) per-rank words (see done_of) */
  size_t ctl_stride;
  unsigned char *data;
  size_t *off, *cnt;   /* (nbmax) bucket k: [off, off + cnt) */
  uint32_t *claimed;   /* (nbmax) step that took my block of bucket k */
  double link_ns_per_byte; /* simulated link, 0: none */
  int64_t link_free;   /* simulated link: the schedule is fixed up to here */
  int64_t *sched_end;  /* (nbmax) bucket k's transfer ends (this step's) */
  uint32_t *sched_gen; /* (nbmax) step whose transfer sched_end is */
  uint32_t gen;        /* this rank's step number */
};

#define RED_TILE 4096 /* floats reduced in L1 before being written out */

static size_t page_up(size_t n) { return (n + 4095) / 4096 * 4096; }
static size_t line_up(size_t n) { return (n + 63) / 64 * 64; }

static int32_t *count_of(dg__shmgrad *s, int r) { return (int32_t *)(s->ctl + (size_t)r * s->ctl_stride); }
/* Per rank after count[2]: done[nbmax] | ready[2][nbmax] | ready_at[2][nbmax]
 * (ns, CLOCK_MONOTONIC);
 * ready words and times by step parity, as the counts: a peer one step
 * ahead must not erase what the simulated link's schedule still reads. */
static uint32_t *done_of(dg__shmgrad *s, int r) {
  return (uint32_t *)(s->ctl + (size_t)r * s->ctl_stride + 64);
}
static uint32_t *ready_of(dg__shmgrad *s, int r) {
  size_t w = line_up((size_t)s->nbmax * sizeof(uint32_t));
  return (uint32_t *)(s->ctl + (size_t)r * s->ctl_stride + 64 + w + (s->gen & 1) * w);
}
static int64_t *ready_at_of(dg__shmgrad *s, int r) {
  size_t w = line_up((size_t)s->nbmax * sizeof(uint32_t));
  size_t t = line_up((size_t)s->nbmax * sizeof(int64_t));
  return (int64_t *)(s->ctl + (size_t)r * s->ctl_stride + 64 + 3 * w + (s->gen & 1) * t);
}

static int agree_pub(void *arg, int64_t *v, dg_redop op) {
  return dg_pg_allreduce_sync(arg, v, 1, DG_I64, op);
}

int dg__shmgrad_new(dg_pg *pg, size_t nfloat, int nbmax, dg__shmgrad **out, float **mine) {
  *out = NULL;
  *mine = NULL;
  if (!pg->shm || nbmax < 1) return DG_OK;
  size_t stride = page_up((nfloat ? nfloat : 1) * sizeof(float));
  size_t cs = 64 + 3 * line_up((size_t)nbmax * sizeof(uint32_t)) +
              2 * line_up((size_t)nbmax * sizeof(int64_t));
  size_t ctl = page_up(sizeof(grad_hdr) + (size_t)pg->size * cs);
  size_t len = ctl + (size_t)pg->size * stride;
  void *p = NULL;
  int rc = seg_open(pg, len, agree_pub, pg, &p);
  if (rc != DG_OK || !p) return rc;
  dg__shmgrad *s = dg__calloc(1, sizeof *s);
  size_t *oc = dg__calloc((size_t)nbmax * 2, sizeof *oc);
  uint32_t *cl = dg__calloc((size_t)nbmax * 2, sizeof *cl);
  int64_t *se = dg__calloc((size_t)nbmax, sizeof *se);
  int64_t ok = s && oc && cl && se;
  rc = agree_pub(pg, &ok, DG_RED_MIN);
  if (rc != DG_OK || !ok) {
    dg__free(s);
    dg__free(oc);
    dg__free(cl);
    dg__free(se);
    munmap(p, len);
    return rc;
  }
  *s = (dg__shmgrad){.base = p, .len = len, .stride = stride, .W = pg->size, .rank = pg->rank,
                     .nbmax = nbmax, .hdr = p, .ctl = (unsigned char *)p + sizeof(grad_hdr),
                     .ctl_stride = cs, .data = (unsigned char *)p + ctl, .off = oc,
                     .cnt = oc + nbmax, .claimed = cl, .sched_gen = cl + nbmax,
                     .sched_end = se,
                     .link_ns_per_byte = pg->shm->link_ns_per_byte};
  *out = s;
  *mine = (float *)(s->data + (size_t)pg->rank * stride);
  return DG_OK;
}

void dg__shmgrad_free(dg__shmgrad *s) {
  if (!s) return;
  munmap(s->base, s->len);
  dg__free(s->off);
  dg__free(s->claimed);
  dg__free(s->sched_end);
  dg__free(s);
}

void dg__shmgrad_bucket(dg__shmgrad *s, int k, int nb, size_t off, size_t n) {
  if (k < 0 || k >= s->nbmax) return;
  s->nb = DG_MIN(nb, s->nbmax);
  s->off[k] = off;
  s->cnt[k] = n;
}

static void ring(dg__shmgrad *s) {
  __atomic_add_fetch(&s->hdr->bell, 1, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&s->hdr->sleepers, __ATOMIC_SEQ_CST))
    futex(&s->hdr->bell, FUTEX_WAKE, INT32_MAX, NULL);
}

void dg__shmgrad_begin(dg__shmgrad *s, int32_t count) {
  s->gen++;
  /* two slots: a peer is at most one step ahead, and it cannot begin the
   * step after that before this rank has read this step's counts */
  __atomic_store_n(&count_of(s, s->rank)[s->gen & 1], count, __ATOMIC_RELEASE);
}

void dg__shmgrad_ready(dg__shmgrad *s, int k) {
  __atomic_store_n(&ready_at_of(s, s->rank)[k], dg__now_ns(), __ATOMIC_RELAXED);
  __atomic_store_n(&ready_of(s, s->rank)[k], s->gen, __ATOMIC_SEQ_CST);
  ring(s);
}

static int is_gen(const uint32_t *w, uint32_t g) { return __atomic_load_n(w, __ATOMIC_ACQUIRE) == g; }

static int data_done(dg__shmgrad *s, int k) {
  for (int p = 0; p < s->W; p++)
    if (!is_gen(&done_of(s, p)[k], s->gen)) return 0;
  return 1;
}

/* When bucket k was posted everywhere (the latest ready_at), or -1. */
static int64_t avail(dg__shmgrad *s, int k) {
  int64_t t = 0;
  for (int p = 0; p < s->W; p++) {
    if (!is_gen(&ready_of(s, p)[k], s->gen)) return -1;
    t = DG_MAX(t, __atomic_load_n(&ready_at_of(s, p)[k], __ATOMIC_RELAXED));
  }
  return t;
}

static int scheduled(dg__shmgrad *s, int k) {
  return __atomic_load_n(&s->sched_gen[k], __ATOMIC_ACQUIRE) == s->gen;
}

/* The simulated link's schedule up to now: from the time the link is free,
 * send the most urgent (highest index) bucket posted by then. Only threads
 * waiting for a bucket run it: this rank's compute thread (the worker's
 * engine waits for postings, never for a transfer). */
static void advance(dg__shmgrad *s, int64_t now) {
  if (s->link_ns_per_byte <= 0) return;
  for (;;) {
    int64_t t = __atomic_load_n(&s->link_free, __ATOMIC_RELAXED), first = INT64_MAX;
    int best = -1;
    for (int k = s->nb - 1; k >= 0; k--) {
      int64_t a;
      if (scheduled(s, k) || (a = avail(s, k)) < 0) continue;
      first = DG_MIN(first, a);
      if (best < 0 && a <= t) best = k;
    }
    if (first == INT64_MAX) break; /* nothing posted */
    if (best < 0) { /* the link idles until the first posting */
      t = first;
      for (int k = s->nb - 1; k >= 0 && best < 0; k--)
        if (!scheduled(s, k) && avail(s, k) >= 0 && avail(s, k) <= t) best = k;
    }
    if (t > now) break; /* decided later, when all postings up to t are known */
    int64_t end = t + (int64_t)(s->link_ns_per_byte * (double)s->cnt[best] * sizeof(float) *
                                2.0 * (s->W - 1) / s->W); /* as a ring would */
    s->sched_end[best] = end;
    __atomic_store_n(&s->sched_gen[best], s->gen, __ATOMIC_RELEASE);
    __atomic_store_n(&s->link_free, end, __ATOMIC_RELAXED);
  }
}

/* 0 when bucket k is complete, else the time to look again (INT64_MAX:
 * when something is published). */
static int64_t pending_until(dg__shmgrad *s, int k, int64_t now) {
  if (!data_done(s, k)) return INT64_MAX;
  if (s->link_ns_per_byte <= 0) return 0;
  advance(s, now);
  if (scheduled(s, k)) return now >= s->sched_end[k] ? 0 : s->sched_end[k];
  int64_t f = __atomic_load_n(&s->link_free, __ATOMIC_RELAXED);
  return f > now ? f : INT64_MAX;
}

static int complete(dg__shmgrad *s, int k) { return pending_until(s, k, dg__now_ns()) == 0; }

int32_t dg__shmgrad_count(dg__shmgrad *s) {
  int32_t t = 0;
  for (int p = 0; p < s->W; p++) t += __atomic_load_n(&count_of(s, p)[s->gen & 1], __ATOMIC_ACQUIRE);
  return t;
}

static float *grad_of(dg__shmgrad *s, int r) { return (float *)(s->data + (size_t)r * s->stride); }

/* out = average over ranks (in rank order) of [o, o + n) of every buffer,
 * written to every buffer, a tile at a time through L1. */
static void grad_block(dg__shmgrad *s, size_t o, size_t n) {
  if (s->W == 2) { /* one pass: read both, write both */
    float *restrict a = grad_of(s, 0) + o, *restrict b = grad_of(s, 1) + o;
    for (size_t i = 0; i < n; i++) a[i] = b[i] = (a[i] + b[i]) * 0.5f;
    return;
  }
  float tile[RED_TILE];
  for (size_t t = 0; t < n; t += RED_TILE) {
    size_t k = DG_MIN((size_t)RED_TILE, n - t);
    memcpy(tile, grad_of(s, 0) + o + t, k * sizeof(float));
    for (int p = 1; p < s->W; p++) {
      if (p == s->W - 1) dg__reduce_avg_last(tile, grad_of(s, p) + o + t, k, DG_F32, s->W);
      else dg__reduce(tile, grad_of(s, p) + o + t, k, DG_F32, DG_RED_SUM);
    }
    for (int p = 0; p < s->W; p++) memcpy(grad_of(s, p) + o + t, tile, k * sizeof(float));
  }
}

/* The next bucket for this rank (-1: none ready everywhere). */
static int candidate(dg__shmgrad *s) {
  for (int k = s->nb - 1; k >= 0; k--) {
    if (__atomic_load_n(&s->claimed[k], __ATOMIC_ACQUIRE) == s->gen) continue;
    int p = 0;
    while (p < s->W && is_gen(&ready_of(s, p)[k], s->gen)) p++;
    if (p == s->W) return k;
  }
  return -1;
}

int dg__shmgrad_progress(dg__shmgrad *s) {
  int n = 0;
  for (int k; (k = candidate(s)) >= 0;) {
    uint32_t old = __atomic_load_n(&s->claimed[k], __ATOMIC_ACQUIRE);
    if (old == s->gen || !__atomic_compare_exchange_n(&s->claimed[k], &old, s->gen, 0,
                                                      __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
      continue; /* the other thread took it */
    size_t q = s->cnt[k] / (size_t)s->W, rm = s->cnt[k] % (size_t)s->W;
    size_t bo = (size_t)s->rank * q + DG_MIN((size_t)s->rank, rm);
    grad_block(s, s->off[k] + bo, q + ((size_t)s->rank < rm));
    __atomic_store_n(&done_of(s, s->rank)[k], s->gen, __ATOMIC_SEQ_CST);
    ring(s);
    n++;
  }
  return n;
}

static int mine_all_done(dg__shmgrad *s) {
  for (int k = 0; k < s->nb; k++)
    if (!is_gen(&done_of(s, s->rank)[k], s->gen)) return 0;
  return 1;
}

/* What an engine or a waiter is waiting for. */
typedef struct {
  dg__shmgrad *s;
  int want;           /* bucket, or -1: this rank's blocks of every bucket */
  uint32_t bell;      /* the bell when the waiter last looked */
  const dg_work *eng; /* a waiter's engine (its failure ends the wait) */
} grad_wait;

static int bell_moved(void *a) {
  grad_wait *w = a;
  return __atomic_load_n(&w->s->hdr->bell, __ATOMIC_SEQ_CST) != w->bell;
}

static int engine_failed(const dg_work *eng) {
  int st = eng ? __atomic_load_n(&eng->status, __ATOMIC_ACQUIRE) : DG_OK;
  return st != DG_XOP_PENDING && st != DG_OK;
}

/* The first rank holding up `want` (or this rank's engine). */
static int laggard(void *a) {
  grad_wait *w = a;
  dg__shmgrad *s = w->s;
  for (int k = 0; k < s->nb; k++) {
    if (w->want >= 0 ? k != w->want : is_gen(&done_of(s, s->rank)[k], s->gen)) continue;
    for (int p = 0; p < s->W; p++)
      if (p != s->rank && !is_gen(w->want >= 0 ? &done_of(s, p)[k] : &ready_of(s, p)[k], s->gen))
        return p;
  }
  return -1;
}

static void sleep_until(int64_t t) {
  for (int64_t now; (now = dg__now_ns()) < t;) {
    struct timespec ts = {(t - now) / 1000000000, (t - now) % 1000000000};
    nanosleep(&ts, NULL);
  }
}

/* One wait of a loop that makes progress: until a simulated transfer ends,
 * or for the bell. */
static int wait_step(dg_pg *pg, grad_wait *w, int64_t deadline, int *dead) {
  int64_t now = dg__now_ns();
  int64_t t = w->want >= 0 ? pending_until(w->s, w->want, now) : INT64_MAX;
  if (t != INT64_MAX) { /* no message can make it complete sooner */
    sleep_until(t);
    return DG_OK;
  }
  return shm_wait(pg, &w->s->hdr->bell, &w->s->hdr->sleepers, bell_moved, laggard, w,
                  deadline, dead);
}

int dg__shmgrad_run(dg_coll *c, dg__shmgrad *s) {
  grad_wait w = {s, -1, 0, NULL};
  for (;;) {
    w.bell = __atomic_load_n(&s->hdr->bell, __ATOMIC_SEQ_CST);
    dg__shmgrad_progress(s);
    if (mine_all_done(s)) return DG_OK;
    int dead = -1, rc = wait_step(c->pg, &w, c->deadline, &dead);
    if (rc != DG_OK)
      return wait_fail(c, rc, DG_MAX(laggard(&w), 0), dead, "finish its gradients",
                       "DDP shared-memory gradients");
  }
}

int dg__shmgrad_wait(dg_pg *pg, dg__shmgrad *s, int k, const dg_work *eng, char *err,
                     size_t cap) {
  grad_wait w = {s, k, 0, eng};
  int64_t deadline = dg__deadline(0, pg->timeout_ms);
  int dead = -1, rc = DG_OK;
  for (;;) {
    w.bell = __atomic_load_n(&s->hdr->bell, __ATOMIC_SEQ_CST);
    dg__shmgrad_progress(s);
    if (complete(s, k)) return DG_OK;
    if (engine_failed(eng)) {
      snprintf(err, cap, "%s", eng->err);
      return __atomic_load_n(&eng->status, __ATOMIC_ACQUIRE);
    }
    if ((rc = wait_step(pg, &w, deadline, &dead)) != DG_OK) break;
    if (dg__now_ms() >= deadline) {
      rc = DG_ETIMEDOUT;
      break;
    }
  }
  int p = laggard(&w);
  if (p < 0) p = pg->rank; /* every peer is done: this rank's own block is missing */
  if (rc == DG_EPEER && dead >= 0)
    snprintf(err, cap, "rank %d exited while rank %d waited for rank %d to average its block "
             "of gradient bucket %d", dead, pg->rank, p, k);
  else if (rc == DG_ETIMEDOUT)
    snprintf(err, cap, "timed out after %d ms waiting for rank %d to average its block of "
             "gradient bucket %d", pg->timeout_ms, p, k);
  else if (pg->x->vt->error(pg->x, err, cap) == DG_OK)
    snprintf(err, cap, "transport failed while waiting for rank %d", p);
  return rc;
}
