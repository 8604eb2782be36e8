/* The timeline recorder (include/dgrad/trace.h): a ring of fixed-size events
 * per thread, all allocated by dg_trace_start, written as Chrome trace JSON.
 *
 * Safety of start/stop against recording threads: a recording increments
 * `inflight` before it reads the on flag (both seq_cst), and stop clears the
 * flag before it waits for `inflight` to reach 0; so once stop returns, no
 * thread is inside a ring, and none enters one until the next start, which
 * is the only place rings are freed or handed out. The count is touched only
 * while tracing is on: off costs the flag's load. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "base/common_impl.h"
#include "base/trace_impl.h"

#define DEF_EVENTS 16384
#define DEF_THREADS 32
#define MAX_EVENTS ((size_t)1 << 24)
#define MAX_THREADS 4096
#define LABEL 32

typedef struct {
  uint64_t t0, t1; /* ns; t1 == t0 for an instant */
  const char *name, *k0, *k1;
  int64_t v0, v1, id;
  char ph; /* 'X' complete, 'i' instant, 'A' async span */
  char label[LABEL];
} ev_t;

typedef struct {
  ev_t *ev;     /* cap events; ev[head & mask] is the next slot */
  uint64_t head; /* events ever pushed; written by the owner only */
  long tid;
  char tname[16];
} ring_t;

atomic_int dg__trace_on;
static atomic_int inflight;
static atomic_int nclaimed;     /* rings handed out this session */
static atomic_ullong dropped;   /* events of threads without a ring */
static unsigned gen;            /* sessions started; a thread's ring is this gen's */
static ring_t *rings;
static int nrings;
static size_t mask;
static int started;

static _Thread_local ring_t *t_ring;
static _Thread_local unsigned t_gen;

uint64_t dg__trace_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  uint64_t ns = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
  return ns ? ns : 1; /* 0 means "off" to the scope macros */
}

static void free_rings(void) {
  for (int i = 0; i < nrings; i++) dg__free(rings[i].ev);
  dg__free(rings);
  rings = NULL;
  nrings = 0;
}

int dg_trace_start(const dg_trace_opts *opts) {
  if (atomic_load(&dg__trace_on)) return DG_ESTATE;
  size_t cap = opts && opts->events_per_thread ? opts->events_per_thread : DEF_EVENTS;
  int nt = opts && opts->max_threads ? opts->max_threads : DEF_THREADS;
  if (cap > MAX_EVENTS || nt < 0 || nt > MAX_THREADS) return DG_EINVAL;
  size_t p2 = 1;
  while (p2 < cap) p2 <<= 1;
  free_rings();
  rings = dg__calloc((size_t)nt, sizeof *rings);
  if (!rings) return DG_ENOMEM;
  nrings = nt;
  for (int i = 0; i < nt; i++)
    if (!(rings[i].ev = dg__malloc(p2 * sizeof(ev_t)))) {
      free_rings();
      return DG_ENOMEM;
    }
  mask = p2 - 1;
  atomic_store(&nclaimed, 0);
  atomic_store(&dropped, 0);
  gen++;
  started = 1;
  atomic_store(&dg__trace_on, 1); /* seq_cst: publishes rings, gen, mask */
  return DG_OK;
}

int dg_trace_stop(void) {
  if (!atomic_load(&dg__trace_on)) return DG_ESTATE;
  atomic_store(&dg__trace_on, 0);
  uint64_t deadline = dg__trace_now() + 2000000000u;
  while (atomic_load(&inflight) > 0) {
    if (dg__trace_now() > deadline) return DG_ETIMEDOUT;
    sched_yield();
  }
  return DG_OK;
}

int dg_trace_enabled(void) { return atomic_load(&dg__trace_on); }

int dg_trace_clear(void) {
  if (atomic_load(&dg__trace_on)) return DG_ESTATE;
  free_rings();
  started = 0;
  return DG_OK;
}

/* This thread's ring of the current session, claimed on its first event
 * (inside the in-flight window: rings cannot change under it). */
static ring_t *self_ring(void) {
  if (t_gen == gen) return t_ring;
  t_gen = gen;
  t_ring = NULL;
  int i = atomic_fetch_add(&nclaimed, 1);
  if (i >= nrings) return NULL;
  ring_t *r = &rings[i];
  r->head = 0;
  r->tid = (long)syscall(SYS_gettid);
  if (pthread_getname_np(pthread_self(), r->tname, sizeof r->tname)) r->tname[0] = 0;
  return t_ring = r;
}

static void push(const ev_t *e, const char *label) {
  atomic_fetch_add(&inflight, 1);
  if (atomic_load(&dg__trace_on)) {
    ring_t *r = self_ring();
    if (!r) {
      atomic_fetch_add_explicit(&dropped, 1, memory_order_relaxed);
    } else {
      ev_t *slot = &r->ev[r->head & mask];
      *slot = *e;
      slot->label[0] = 0;
      if (label) {
        size_t n = strlen(label);
        if (n > LABEL - 1) n = LABEL - 1;
        memcpy(slot->label, label, n);
        slot->label[n] = 0;
      }
      r->head++;
    }
  }
  atomic_fetch_sub_explicit(&inflight, 1, memory_order_release);
}

void dg__trace_complete(uint64_t t0, const char *name, const char *label, const char *k0,
                        int64_t v0, const char *k1, int64_t v1) {
  ev_t e = {.t0 = t0, .t1 = dg__trace_now(), .name = name, .k0 = k0, .k1 = k1, .v0 = v0,
            .v1 = v1, .ph = 'X'};
  push(&e, label);
}

void dg__trace_instant(const char *name, const char *k0, int64_t v0, const char *k1,
                       int64_t v1) {
  uint64_t t = dg__trace_now();
  ev_t e = {.t0 = t, .t1 = t, .name = name, .k0 = k0, .k1 = k1, .v0 = v0, .v1 = v1, .ph = 'i'};
  push(&e, NULL);
}

void dg__trace_async(uint64_t t0, const char *name, int64_t id, const char *k0, int64_t v0,
                     const char *k1, int64_t v1) {
  ev_t e = {.t0 = t0, .t1 = dg__trace_now(), .name = name, .k0 = k0, .k1 = k1, .v0 = v0,
            .v1 = v1, .id = id, .ph = 'A'};
  push(&e, NULL);
}

int dg_trace_get_stats(dg_trace_stats *out) {
  if (!out) return DG_EINVAL;
  memset(out, 0, sizeof *out);
  if (!started) return DG_OK;
  int n = atomic_load(&nclaimed);
  out->threads = n < nrings ? n : nrings;
  for (int i = 0; i < out->threads; i++) {
    uint64_t h = rings[i].head;
    out->recorded += h;
    if (h > mask + 1) out->overwritten += h - (mask + 1);
  }
  out->dropped = atomic_load(&dropped);
  return DG_OK;
}

/* ---- JSON ---- */

static void put_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c < 0x20) fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
  fputc('"', f);
}

/* ts in microseconds with ns precision, as Chrome's format wants. */
static void put_us(FILE *f, const char *key, uint64_t ns) {
  fprintf(f, ",\"%s\":%llu.%03u", key, (unsigned long long)(ns / 1000), (unsigned)(ns % 1000));
}

static void put_args(FILE *f, const ev_t *e) {
  int n = 0;
  fputs(",\"args\":{", f);
  if (e->label[0]) {
    fputs("\"module\":", f);
    put_str(f, e->label);
    n++;
  }
  if (e->k0) fprintf(f, "%s\"%s\":%lld", n++ ? "," : "", e->k0, (long long)e->v0);
  if (e->k1) fprintf(f, "%s\"%s\":%lld", n++ ? "," : "", e->k1, (long long)e->v1);
  fputc('}', f);
}

static void put_event(FILE *f, const ev_t *e, int pid, long tid) {
  if (e->ph == 'A') { /* a "b"/"e" pair: async events get their own track */
    for (int end = 0; end < 2; end++) {
      fputs(",\n{\"name\":", f);
      put_str(f, e->name);
      fprintf(f, ",\"cat\":\"dgrad\",\"ph\":\"%c\",\"id\":%lld,\"pid\":%d,\"tid\":%ld",
              end ? 'e' : 'b', (long long)e->id, pid, tid);
      put_us(f, "ts", end ? e->t1 : e->t0);
      if (!end) put_args(f, e);
      fputc('}', f);
    }
    return;
  }
  fputs(",\n{\"name\":", f);
  put_str(f, e->name);
  fprintf(f, ",\"cat\":\"dgrad\",\"ph\":\"%c\",\"pid\":%d,\"tid\":%ld", e->ph, pid, tid);
  put_us(f, "ts", e->t0);
  if (e->ph == 'X') put_us(f, "dur", e->t1 - e->t0);
  else fputs(",\"s\":\"t\"", f);
  put_args(f, e);
  fputc('}', f);
}

int dg_trace_write(const char *path, int pid, char *err, size_t cap) {
  if (!path || pid < 0) return dg__fail_msg(err, cap, DG_EINVAL, "trace write: %s",
                                            !path ? "path is NULL" : "pid (the rank) is < 0");
  if (atomic_load(&dg__trace_on))
    return dg__fail_msg(err, cap, DG_ESTATE, "trace write %s: tracing is on; dg_trace_stop first",
                        path);
  if (!started)
    return dg__fail_msg(err, cap, DG_ESTATE, "trace write %s: no trace was started", path);
  FILE *f = fopen(path, "w");
  if (!f)
    return dg__fail_msg(err, cap, DG_EIO, "trace write: cannot open %s: %s", path,
                        strerror(errno));
  dg_trace_stats st;
  dg_trace_get_stats(&st);
  fprintf(f, "{\"traceEvents\":[\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
          "\"args\":{\"name\":\"rank %d\"}}", pid, pid);
  for (int i = 0; i < st.threads; i++) {
    const ring_t *r = &rings[i];
    fprintf(f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%ld,\"args\":{"
            "\"name\":", pid, r->tid);
    put_str(f, r->tname[0] ? r->tname : "thread");
    fputs("}}", f);
    uint64_t lo = r->head > mask + 1 ? r->head - (mask + 1) : 0;
    for (uint64_t j = lo; j < r->head; j++) put_event(f, &r->ev[j & mask], pid, r->tid);
  }
  fprintf(f, "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"recorded\":%llu,"
          "\"overwritten\":%llu,\"dropped\":%llu}}\n", (unsigned long long)st.recorded,
          (unsigned long long)st.overwritten, (unsigned long long)st.dropped);
  int bad = ferror(f);
  if (fclose(f) || bad)
    return dg__fail_msg(err, cap, DG_EIO, "trace write: writing %s failed: %s", path,
                        strerror(errno ? errno : EIO));
  return DG_OK;
}
