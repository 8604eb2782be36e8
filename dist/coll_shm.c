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
 * The barrier is a one-element allreduce. Waits pause, then yield, then
 * sleep on a futex of the shared word, in slices that check the deadline,
 * the transport's error state and whether the peer process is still alive;
 * DDP's gradient segment (dist/ddp_shm.c) waits and maps its own segment
 * with the same primitives (dist/pg_ext.h). */
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

#include "dist/coll_impl.h"
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

void dg__sleep_until_ns(int64_t t_ns, int64_t deadline) {
  int64_t end = DG_MIN(t_ns, deadline > INT64_MAX / 1000000 ? INT64_MAX : deadline * 1000000);
  for (int64_t now; (now = dg__now_ns()) < end;) {
    struct timespec ts = {(end - now) / 1000000000, (end - now) % 1000000000};
    nanosleep(&ts, NULL);
  }
}

void dg__shm_wake(uint32_t *word, uint32_t *sleepers) {
  if (__atomic_load_n(sleepers, __ATOMIC_SEQ_CST)) futex(word, FUTEX_WAKE, INT32_MAX, NULL);
}

/* Publishes *word = v and wakes sleepers of that rank's words. */
static void publish(uint32_t *sleepers, uint32_t *word, uint32_t v) {
  __atomic_store_n(word, v, __ATOMIC_SEQ_CST);
  dg__shm_wake(word, sleepers);
}

static int reached(const uint32_t *word, uint32_t v) {
  return (int32_t)(__atomic_load_n(word, __ATOMIC_ACQUIRE) - v) >= 0;
}

/* The last peer process seen stopped while a wait slept (0: none): a rank
 * whose own wait fails a moment after another's may find it resumed by
 * then (dgrun continues a stopped rank to end it). */
static int g_stopped_pid;

static int stopped_now(dg_pg *pg) {
  for (int p = 0; pg->pids && p < pg->size; p++) {
    if (p == pg->rank || pg->pids[p] <= 0) continue;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pg->pids[p]);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *e = strrchr(buf, ')'); /* "pid (comm) S ...": comm may hold spaces */
    if (e && (e[2] == 'T' || e[2] == 't')) return p;
  }
  return -1;
}

int dg__shm_wait(dg_pg *pg, uint32_t *word, uint32_t *sleepers, int (*ok)(void *),
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
    /* a second into a wait, note a stopped peer (a few /proc reads a slice) */
    if (dg__now_ns() - t0 > 1000000000LL) {
      int s = stopped_now(pg);
      if (s >= 0) __atomic_store_n(&g_stopped_pid, pg->pids[s], __ATOMIC_RELAXED);
    }
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

int dg__shm_stopped_peer(dg_pg *pg) {
  int p = stopped_now(pg), seen = __atomic_load_n(&g_stopped_pid, __ATOMIC_RELAXED);
  for (int q = 0; p < 0 && seen > 0 && pg->pids && q < pg->size; q++)
    if (q != pg->rank && pg->pids[q] == seen) p = q;
  return p;
}

int dg__shm_wait_fail(dg_coll *c, int rc, int p, int dead, const char *what, const char *where) {
  int stopped = rc == DG_ETIMEDOUT ? dg__shm_stopped_peer(c->pg) : -1;
  if (stopped >= 0)
    return dg__coll_fail_peer(c, DG_ETIMEDOUT, stopped, "timed out after %d ms waiting for "
                              "rank %d to %s (%s): rank %d (pid %d) is stopped (SIGSTOP or a "
                              "debugger)", c->pg->timeout_ms, p, what, where, stopped,
                              c->pg->pids[stopped]);
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
  int rc = dg__shm_wait(c->pg, word, sleepers, word_ok, word_blame, &w, c->deadline, &dead);
  return rc == DG_OK ? DG_OK : dg__shm_wait_fail(c, rc, p, dead, what, "shared-memory allreduce");
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
  const dg_link_model *link = dg__pg_link(c->pg);
  int64_t t0 = link && link->allreduce_end ? dg__now_ns() : 0;
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
  if (rc == DG_OK && t0) /* a benchmark's link model: hold the result back */
    dg__sleep_until_ns(link->allreduce_end(link->state, t0, bytes, c->size), c->deadline);
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
  DG_LOGI("dist: rank %d: shared-memory allreduce %s", pg->rank, pg->shm ? "on" : "off");
  return rc;
}

static int agree_pub(void *arg, int64_t *v, dg_redop op) {
  return dg_pg_allreduce_sync(arg, v, 1, DG_I64, op);
}

int dg__shm_map(dg_pg *pg, size_t len, void **base) {
  *base = NULL;
  if (!pg->shm) return DG_OK; /* no segment agreed at creation: none now */
  return seg_open(pg, len, agree_pub, pg, base);
}
