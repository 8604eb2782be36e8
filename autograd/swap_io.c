/* Activation swapping's I/O: the swap file, the bf16 packing, the I/O
 * thread that stores what forward committed and loads what backward will
 * need. Policy and hooks: autograd/swap.c. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "autograd/swap_impl.h"
#include "base/trace_impl.h"

double dg__swap_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

struct timespec dg__swap_deadline(int ms) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ts.tv_sec += ms / 1000;
  ts.tv_nsec += (long)(ms % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
  return ts;
}

const char *dg__swap_rec_name(const dg__swap *s, int i, char *buf, size_t cap) {
  const dg__swrec *r = &s->r[i];
  char shape[96];
  snprintf(buf, cap, "saved tensor %d of node %d (%s), %s %s", r->slot, r->node_first, r->op,
           dg_dtype_name(r->t->dtype), dg__shape_str(r->t, shape, sizeof shape));
  return buf;
}

void dg__swap_fail(dg__swap *s, int i, const char *what, int e) {
  s->r[i].failed = 1;
  if (s->err) return; /* the first failure is the one reported */
  char name[200];
  s->err = e == ETIMEDOUT ? DG_ETIMEDOUT : e == ENOMEM ? DG_ENOMEM : DG_EIO;
  s->err_told = 0;
  dg__fail_msg(s->errmsg, sizeof s->errmsg, 0, "swap: %s %s (swap file %s): %s", what,
           dg__swap_rec_name(s, i, name, sizeof name),
           s->fd >= 0 ? s->path : "(bf16 in memory)", strerror(e));
}

int dg__swap_open_file(dg__swap *s, char *err, size_t cap) {
  snprintf(s->path, sizeof s->path, "%s/dgswap-%ld-XXXXXX", s->dir, (long)getpid());
  s->fd = mkostemp(s->path, O_CLOEXEC);
  if (s->fd < 0)
    return dg__fail_msg(err, cap, DG_EIO, "swap: cannot create a swap file in %s: %s", s->dir,
                        strerror(errno));
  unlink(s->path); /* nothing is left behind, whatever happens to the process */
  return DG_OK;
}

int dg__swap_file_reserve(dg__swap *s, uint64_t bytes) {
  if (s->fuse + bytes <= s->fcap) return 0;
  uint64_t want = s->fcap ? s->fcap : (uint64_t)16 << 20;
  while (want < s->fuse + bytes) want *= 2;
  /* real blocks now: a full disk fails here, naming the tensor, not later */
  int e = posix_fallocate(s->fd, (off_t)s->fcap, (off_t)(want - s->fcap));
  if (e == ENOSPC || e == EFBIG) /* a tight disk: exactly what is needed */
    e = posix_fallocate(s->fd, (off_t)s->fcap, (off_t)(s->fuse + bytes - s->fcap)),
    want = e ? want : s->fuse + bytes;
  if (e) return e;
  s->fcap = want;
  return 0;
}

char *dg__swap_slab_take(dg__swap *s, size_t bytes) {
  bytes = (bytes + 63) & ~(size_t)63;
  while (s->slab_cur < s->nslab && s->slab_used + bytes > s->slab[s->slab_cur].cap)
    s->slab_cur++, s->slab_used = 0; /* the next chunk, kept from an earlier step */
  if (s->slab_cur == s->nslab) {
    if (s->nslab == (int)(sizeof s->slab / sizeof s->slab[0])) return NULL;
    size_t c = s->nslab ? s->slab[s->nslab - 1].cap * 2 : (size_t)16 << 20;
    if (c < bytes) c = bytes;
    char *p = dg__malloc(c);
    if (!p) return NULL;
    s->slab[s->nslab].p = p;
    s->slab[s->nslab++].cap = c;
    s->slab_used = 0;
  }
  char *p = s->slab[s->slab_cur].p + s->slab_used;
  s->slab_used += bytes;
  return p;
}

/* f32 -> bf16, round to nearest even; NaN stays NaN. */
static void pack_bf16(uint16_t *dst, const uint32_t *src, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint32_t u = src[i];
    dst[i] = (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((u >> 16) | 0x40)
                                              : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
  }
}

static void unpack_bf16(uint32_t *dst, const uint16_t *src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = (uint32_t)src[i] << 16;
}

static int pwrite_all(int fd, const char *p, size_t n, uint64_t off) {
  while (n) {
    ssize_t w = pwrite(fd, p, n > ((size_t)1 << 30) ? (size_t)1 << 30 : n, (off_t)off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return w < 0 ? errno : ENOSPC;
    p += w, n -= (size_t)w, off += (uint64_t)w;
  }
  return 0;
}

static int pread_all(int fd, char *p, size_t n, uint64_t off) {
  while (n) {
    ssize_t r = pread(fd, p, n > ((size_t)1 << 30) ? (size_t)1 << 30 : n, (off_t)off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return r < 0 ? errno : EIO; /* a short file: the data is not there */
    p += r, n -= (size_t)r, off += (uint64_t)r;
  }
  return 0;
}

int dg__swap_store(dg__swap *s, const dg__swio *io, char *stage) {
  if (!io->bf16) return pwrite_all(s->fd, io->lo, io->len, io->off);
  size_t n = io->len / 4;
  if (!io->file) {
    pack_bf16((uint16_t *)io->z, (const uint32_t *)io->lo, n);
    return 0;
  }
  const size_t chunk = DG_SWAP_STAGE / 2; /* floats per staged write */
  for (size_t i = 0; i < n; i += chunk) {
    size_t k = n - i < chunk ? n - i : chunk;
    pack_bf16((uint16_t *)stage, (const uint32_t *)io->lo + i, k);
    int e = pwrite_all(s->fd, stage, k * 2, io->off + i * 2);
    if (e) return e;
  }
  return 0;
}

int dg__swap_load(dg__swap *s, const dg__swio *io, char *stage) {
  if (!io->bf16) return pread_all(s->fd, io->lo, io->len, io->off);
  size_t n = io->len / 4;
  if (!io->file) {
    unpack_bf16((uint32_t *)io->lo, (const uint16_t *)io->z, n);
    return 0;
  }
  const size_t chunk = DG_SWAP_STAGE / 2;
  for (size_t i = 0; i < n; i += chunk) {
    size_t k = n - i < chunk ? n - i : chunk;
    int e = pread_all(s->fd, stage, k * 2, io->off + i * 2);
    if (e) return e;
    unpack_bf16((uint32_t *)io->lo + i, (const uint16_t *)stage, k);
  }
  return 0;
}

static dg__swio io_of(const dg__swap *s, const dg__swrec *r) {
  dg__swio io = {r->lo, r->len, r->off, r->z, r->bf16, s->fd >= 0};
  return io;
}

/* Takes the next job (lock held): a prefetch first (backward waits on
 * those), else the next committed store. -1: none. */
static int next_job(dg__swap *s, int *load) {
  while (s->lq_n) {
    int i = s->lq[s->lq_head];
    s->lq_head = (s->lq_head + 1) % s->rcap;
    s->lq_n--;
    if (s->r[i].state == DG_SW_LOADQ) return *load = 1, i; /* else cancelled */
  }
  while (s->store_next < s->ncommit) {
    int i = s->store_next++;
    if (s->r[i].state == DG_SW_QUEUED) return *load = 0, i;
  }
  return -1;
}

void *dg__swap_thread(void *arg) {
  dg__swap *s = arg;
  pthread_mutex_lock(&s->mu);
  while (!s->stop) {
    int load, i = next_job(s, &load);
    if (i < 0) { /* idle: sleep until work or stop (re-checked each second) */
      struct timespec dl = dg__swap_deadline(1000);
      pthread_cond_timedwait(&s->cv_io, &s->mu, &dl);
      continue;
    }
    dg__swrec *r = &s->r[i];
    r->state = load ? DG_SW_LOADING : DG_SW_STORING;
    dg__swio io = io_of(s, r);
    s->io_busy = 1;
    pthread_mutex_unlock(&s->mu);
    uint64_t tr0 = dg__trace_t0();
    int e = load ? dg__swap_load(s, &io, s->stage[0]) : dg__swap_store(s, &io, s->stage[0]);
    DG__TRACE_END(tr0, load ? "swap in" : "swap out", NULL, "bytes", (int64_t)io.len, NULL, 0);
    pthread_mutex_lock(&s->mu);
    s->io_busy = 0;
    r = &s->r[i]; /* the array may have grown meanwhile */
    if (load) {
      r->state = e ? DG_SW_OUT : DG_SW_IN; /* a failed load is reported by unpack */
      if (e) dg__swap_fail(s, i, "reading back", e);
      else s->st.bytes_in += r->len, s->st.tensors_in++, s->out_now -= r->len;
    } else {
      s->backlog -= r->len;
      r->state = e ? DG_SW_KEEP : DG_SW_STORED; /* failed: the data never left */
      if (e) dg__swap_fail(s, i, "writing", e);
      else s->st.stored_bytes += r->slen, s->st.bytes_out += r->len, s->st.tensors_out++;
    }
    pthread_cond_broadcast(&s->cv_main);
  }
  s->io_exited = 1;
  pthread_cond_broadcast(&s->cv_main);
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

/* Parses "Key:   123 kB" lines of /proc/self/status without stdio (no heap). */
void dg__swap_rss(size_t *rss, size_t *hwm) {
  *rss = *hwm = 0;
  char buf[4096];
  int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return;
  buf[n] = 0;
  const char *keys[2] = {"VmRSS:", "VmHWM:"};
  size_t *out[2] = {rss, hwm};
  for (int k = 0; k < 2; k++) {
    const char *p = strstr(buf, keys[k]);
    if (!p) continue;
    p += strlen(keys[k]);
    size_t v = 0;
    while (*p == ' ' || *p == '\t') p++;
    while (*p >= '0' && *p <= '9') v = v * 10 + (size_t)(*p++ - '0');
    *out[k] = v * 1024;
  }
}
