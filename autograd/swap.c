/* Activation swapping (include/dgrad/swap.h): the policy on top of the
 * saved-tensor hooks. pack turns a large arena tensor into a record; once
 * the op that saved it has returned (the next op starts) the record is
 * committed to the I/O thread (autograd/swap_io.c), which stores the whole
 * pages inside its data; a few ops later those pages are released with
 * madvise. Backward walks the tape in exact reverse order: before node i
 * runs, records only nodes above i used are released again and those of
 * nodes i-1 .. i-lookahead are queued for loading. Any other read of a
 * released tensor (a forward op, a raw accessor) loads it first, so a
 * released page is never read. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "autograd/swap_impl.h"
#include "base/trace_impl.h"

/* Ops a committed record stays resident, so that a residual read a few ops
 * later (a transformer block's skip connection) does not bring it back. */
#define DG_SWAP_LAG 8
#define PAGE ((uintptr_t)4096)

static int handle_index(const void *h) { return (int)((uintptr_t)h >> 1); }
static void *index_handle(int i) { return (void *)(((uintptr_t)i << 1) | 1); }

/* [*a, *b): the bytes t's elements span (any strides). */
static void span(const dg_tensor *t, uintptr_t *a, uintptr_t *b) {
  int64_t lo = 0, hi = 0;
  for (int d = 0; d < t->ndim; d++) {
    if (!t->shape[d]) {
      *a = *b = 0;
      return;
    }
    int64_t e = (t->shape[d] - 1) * t->stride[d];
    if (e < 0) lo += e;
    else hi += e;
  }
  size_t es = dg_dtype_size(t->dtype);
  *a = (uintptr_t)t->data + (uintptr_t)(lo * (int64_t)es);
  *b = (uintptr_t)t->data + (uintptr_t)((hi + 1) * (int64_t)es);
}

static int overlaps(const dg__swrec *r, uintptr_t a, uintptr_t b) {
  return a < (uintptr_t)r->lo + r->len && (uintptr_t)r->lo < b;
}

static int report(dg__swap *s) { /* lock held: the I/O thread's failure, once */
  s->err_told = 1;
  return dg__set_error(s->ctx, s->err, "%s", s->errmsg);
}

static int wait_cv(dg__swap *s, const struct timespec *dl) {
  return pthread_cond_timedwait(&s->cv_main, &s->mu, dl);
}

/* ---- releasing and loading (main thread, lock held) ---- */

static void release(dg__swap *s, int i) {
  dg__swrec *r = &s->r[i];
  if (r->ahead) s->ahead_bytes -= r->len, r->ahead = 0;
  if (madvise(r->lo, r->len, MADV_DONTNEED)) { /* not expected on arena memory */
    r->state = DG_SW_KEEP;
    dg__swap_fail(s, i, "releasing the pages of", errno);
    return;
  }
  r->state = DG_SW_OUT;
  s->out_now += r->len;
  if (s->out_now > s->st.peak_out_bytes) s->st.peak_out_bytes = s->out_now;
}

/* Brings record i back on this thread (state OUT or LOADQ). */
static int load_now(dg__swap *s, int i) {
  dg__swrec *r = &s->r[i];
  if (r->failed) return s->err_told ? dg__set_error(s->ctx, s->err, "%s", s->errmsg) : report(s);
  r->state = DG_SW_LOADING;
  dg__swio io = {r->lo, r->len, r->off, r->z, r->bf16, s->fd >= 0};
  pthread_mutex_unlock(&s->mu);
  uint64_t tr0 = dg__trace_t0();
  int e = dg__swap_load(s, &io, s->stage[1]);
  DG__TRACE_END(tr0, "swap in", NULL, "bytes", (int64_t)io.len, NULL, 0);
  pthread_mutex_lock(&s->mu);
  r = &s->r[i];
  if (e) {
    r->state = DG_SW_OUT;
    dg__swap_fail(s, i, "reading back", e);
    return report(s);
  }
  r->state = DG_SW_IN;
  s->out_now -= r->len;
  s->st.bytes_in += r->len, s->st.tensors_in++;
  return DG_OK;
}

/* Makes record i resident: loads it here when nobody has started (a
 * queued prefetch is taken over), waits for the I/O thread otherwise. */
static int make_resident(dg__swap *s, int i, double *waited) {
  int st = s->r[i].state;
  if (st != DG_SW_OUT && st != DG_SW_LOADQ && st != DG_SW_LOADING) return DG_OK;
  double t0 = dg__swap_now();
  uint64_t tr0 = dg__trace_t0();
  int rc = DG_OK;
  if (st != DG_SW_LOADING) {
    rc = load_now(s, i);
  } else {
    struct timespec dl = dg__swap_deadline(s->o.io_timeout_ms);
    while (s->r[i].state == DG_SW_LOADING && !rc)
      if (wait_cv(s, &dl) == ETIMEDOUT) {
        char name[200];
        rc = dg__set_error(s->ctx, DG_ETIMEDOUT,
                           "swap: the I/O thread did not bring back %s from %s within %d ms",
                           dg__swap_rec_name(s, i, name, sizeof name),
                           s->fd >= 0 ? s->path : "memory", s->o.io_timeout_ms);
      }
    if (!rc && s->r[i].state == DG_SW_OUT) rc = report(s); /* its load failed */
  }
  DG__TRACE_END(tr0, "swap wait", NULL, "bytes", (int64_t)s->r[i].len, NULL, 0);
  *waited += dg__swap_now() - t0;
  return rc;
}

/* Brings back every record overlapping [a, b) (a read of those bytes) and
 * marks it read now; pin: never released again this step. */
static int fence(dg__swap *s, uintptr_t a, uintptr_t b, int pin, double *waited) {
  int hit = 0;
  for (int i = 0; i < s->nr; i++) {
    dg__swrec *r = &s->r[i];
    if (!overlaps(r, a, b)) continue;
    hit = 1;
    if (r->state == DG_SW_OUT || r->state == DG_SW_LOADQ || r->state == DG_SW_LOADING) {
      if (r->ahead) s->ahead_bytes -= r->len, r->ahead = 0;
      if (r->state != DG_SW_LOADING) r->state = DG_SW_OUT; /* a queued prefetch: ours now */
      int rc = make_resident(s, i, waited);
      if (rc) return rc;
      s->st.forward_reads++;
    }
    s->r[i].seen = s->opseq;
    s->r[i].pinned |= pin;
  }
  if (pin && !hit && s->npins < (int)(sizeof s->pins / sizeof s->pins[0])) {
    s->pins[s->npins].lo = a;
    s->pins[s->npins++].hi = b;
  }
  return DG_OK;
}

/* The op that saved the NEW records has returned: hand them to the I/O
 * thread. */
static void commit(dg__swap *s) {
  if (s->ncommit == s->nr) return;
  for (int i = s->ncommit; i < s->nr; i++) {
    dg__swrec *r = &s->r[i];
    r->seen = s->opseq;
    if (r->state != DG_SW_NEW) continue;
    r->state = DG_SW_QUEUED;
    s->backlog += r->len;
  }
  s->ncommit = s->nr;
  pthread_cond_signal(&s->cv_io);
}

static int is_input(const dg__swrec *r, int n, dg_tensor *const *in) {
  for (int k = 0; k < n; k++) {
    if (!in[k]) continue;
    uintptr_t a, b;
    span(in[k], &a, &b);
    if (overlaps(r, a, b)) return 1;
  }
  return 0;
}

/* Forward: releases stored records no op has read for DG_SWAP_LAG ops. */
static void release_stored(dg__swap *s, int n, dg_tensor *const *in) {
  for (int i = s->rec_base; i < s->ncommit; i++) {
    dg__swrec *r = &s->r[i];
    if ((r->state != DG_SW_STORED && r->state != DG_SW_IN) || r->pinned ||
        s->opseq - r->seen < DG_SWAP_LAG || is_input(r, n, in))
      continue;
    release(s, i);
  }
}

static int swap_op_begin(dg__swap *s, const char *op, int n, dg_tensor *const *in) {
  (void)op;
  if (!s->nr) return DG_OK; /* nothing saved this step */
  pthread_mutex_lock(&s->mu);
  s->opseq++;
  int rc = s->err && !s->err_told ? report(s) : DG_OK;
  double waited = 0;
  if (!s->in_bwd) commit(s);
  for (int k = 0; k < n && !rc; k++) {
    if (!in[k] || in[k]->device != DG_CPU) continue;
    uintptr_t a, b;
    span(in[k], &a, &b);
    rc = fence(s, a, b, 0, &waited);
  }
  if (!rc && !s->in_bwd) {
    release_stored(s, n, in);
    struct timespec dl = dg__swap_deadline(s->o.io_timeout_ms);
    double t0 = dg__swap_now();
    while (!rc && s->o.staging_bytes && s->backlog > s->o.staging_bytes) /* write-behind bound */
      if (wait_cv(s, &dl) == ETIMEDOUT)
        rc = dg__set_error(s->ctx, DG_ETIMEDOUT,
                           "swap: %s: the I/O thread stored nothing of %zu bytes queued for %s "
                           "within %d ms", op, s->backlog, s->fd >= 0 ? s->path : "memory",
                           s->o.io_timeout_ms);
    waited += dg__swap_now() - t0;
  }
  s->st.forward_wait_s += waited;
  pthread_mutex_unlock(&s->mu);
  return rc;
}

/* ---- the saved-tensor hooks ---- */

static int grow(dg__swap *s) {
  if (s->nr == s->rcap) {
    int cap = s->rcap ? 2 * s->rcap : 256;
    dg__swrec *r = dg__realloc(s->r, (size_t)cap * sizeof *r);
    if (!r) return DG_ENOMEM;
    s->r = r;
    int *q = dg__malloc((size_t)cap * sizeof *q);
    if (!q) return DG_ENOMEM;
    for (int k = 0; k < s->lq_n; k++) q[k] = s->lq[(s->lq_head + k) % s->rcap];
    dg__free(s->lq);
    s->lq = q, s->lq_head = 0, s->rcap = cap;
  }
  if (s->nsv == s->svcap) {
    int cap = s->svcap ? 2 * s->svcap : 256;
    void *v = dg__realloc(s->sv, (size_t)cap * sizeof *s->sv);
    if (!v) return DG_ENOMEM;
    s->sv = v, s->svcap = cap;
  }
  return DG_OK;
}

/* An earlier record of the same bytes (a tensor saved by several nodes),
 * -2 when [lo, lo + len) overlaps another record or a pinned range (it
 * stays resident), -1 when new. */
static int find_region(const dg__swap *s, const char *lo, size_t len) {
  uintptr_t a = (uintptr_t)lo, b = a + len;
  for (int i = s->nr - 1; i >= s->rec_base; i--) {
    if (s->r[i].lo == lo && s->r[i].len == len) return i;
    if (overlaps(&s->r[i], a, b)) return -2;
  }
  for (int i = 0; i < s->rec_base; i++)
    if (overlaps(&s->r[i], a, b)) return -2;
  for (int k = 0; k < s->npins; k++)
    if (a < s->pins[k].hi && s->pins[k].lo < b) return -2;
  return -1;
}

/* Room for record i's copy: file blocks or bf16 slab. Nonzero: keep it
 * resident (slab) or fail the op (file: the disk is full). */
static int place(dg__swap *s, dg__swrec *r) {
  if (s->fd < 0) {
    r->z = dg__swap_slab_take(s, r->slen);
    return r->z ? 0 : 1;
  }
  uint64_t sz = (r->slen + PAGE - 1) & ~(uint64_t)(PAGE - 1);
  int e = dg__swap_file_reserve(s, sz);
  if (e) {
    char name[200];
    s->r[s->nr] = *r; /* for the name */
    return dg__set_error(s->ctx, DG_EIO, "swap: no room for %s in %s: %s",
                         dg__swap_rec_name(s, s->nr, name, sizeof name), s->path, strerror(e));
  }
  r->off = s->fuse;
  s->fuse += sz;
  return 0;
}

static void *swap_pack(void *user, dg_ctx *ctx, dg_tensor *t) {
  dg__swap *s = user;
  size_t bytes = (size_t)dg__numel(t) * dg_dtype_size(t->dtype);
  if (!s->active || s->broken || bytes < s->o.min_bytes || t->device != DG_CPU ||
      dg__arena_live(&ctx->arena, t->data) != 1) /* parameters, user memory: not ours */
    return t;
  uintptr_t a = ((uintptr_t)t->data + PAGE - 1) & ~(PAGE - 1);
  uintptr_t b = ((uintptr_t)t->data + bytes) & ~(PAGE - 1);
  int bf16 = (s->o.target & DG_SWAP_BF16) && t->dtype == DG_F32;
  if (b < a + PAGE || !dg__is_contig(t) || (s->fd < 0 && !bf16)) {
    s->st.kept++;
    return t;
  }
  dg_node *node = ctx->tape[ctx->ntape - 1]; /* dg__record pushed it */
  pthread_mutex_lock(&s->mu);
  int i = find_region(s, (char *)a, b - a);
  void *h = t;
  if (i == -2) {
    s->st.kept++;
  } else if (grow(s)) {
    dg__set_error(ctx, DG_ENOMEM, "swap: out of memory for the record of a saved tensor");
    h = NULL;
  } else if (i >= 0) { /* the same tensor again: one copy */
    s->r[i].node_last = node->index;
    h = index_handle(i);
  } else {
    dg__swrec r = {.t = t, .lo = (char *)a, .len = b - a, .op = node->op,
                   .node_first = node->index, .node_last = node->index,
                   .slot = node->nsaved, .state = DG_SW_NEW, .bf16 = bf16};
    r.slen = bf16 ? r.len / 2 : r.len;
    int rc = place(s, &r);
    if (rc < 0) {
      h = NULL; /* the disk is full: the op fails, naming the tensor and file */
    } else if (rc) {
      s->st.kept++;
    } else {
      i = s->nr++;
      s->r[i] = r;
      h = index_handle(i);
    }
  }
  if (h && h != t) s->sv[s->nsv].node = node->index, s->sv[s->nsv++].rec = handle_index(h);
  pthread_mutex_unlock(&s->mu);
  return h;
}

static dg_tensor *swap_unpack(void *user, dg_ctx *ctx, void *h) {
  (void)ctx;
  if (!((uintptr_t)h & 1)) return h; /* kept resident */
  dg__swap *s = user;
  int i = handle_index(h);
  pthread_mutex_lock(&s->mu);
  double waited = 0;
  int rc = s->err && !s->err_told ? report(s) : make_resident(s, i, &waited);
  dg__swrec *r = &s->r[i];
  if (r->ahead) s->ahead_bytes -= r->len, r->ahead = 0;
  s->st.backward_wait_s += waited;
  dg_tensor *t = rc ? NULL : r->t;
  pthread_mutex_unlock(&s->mu);
  return t;
}

/* ---- backward ---- */

static void backward_begin(dg__swap *s) {
  s->in_bwd = 1;
  commit(s);
  s->pf = s->nsv - 1;
  s->drop = s->nr - 1;
  size_t rss, hwm;
  dg__swap_rss(&rss, &hwm); /* forward's end: the step's peak */
  if (rss > s->st.peak_rss) s->st.peak_rss = rss;
}

/* Queues record i for loading; 0 when the staging bound or the ring says
 * not yet. */
static int prefetch(dg__swap *s, int i) {
  dg__swrec *r = &s->r[i];
  if (r->state != DG_SW_OUT || r->failed) return 1;
  if (s->o.staging_bytes && s->ahead_bytes && s->ahead_bytes + r->len > s->o.staging_bytes)
    return 0;
  if (s->lq_n == s->rcap) return 0;
  s->lq[(s->lq_head + s->lq_n++) % s->rcap] = i;
  r->state = DG_SW_LOADQ;
  r->ahead = 1;
  s->ahead_bytes += r->len;
  return 1;
}

/* Record i is dead (every node that saved it has run): its pages go. */
static void release_dead(dg__swap *s, int i) {
  dg__swrec *r = &s->r[i];
  if (r->pinned) return;
  if (r->state == DG_SW_LOADQ) { /* a prefetch no node used */
    r->state = DG_SW_OUT;
    if (r->ahead) s->ahead_bytes -= r->len, r->ahead = 0;
  } else if (r->state == DG_SW_STORED || r->state == DG_SW_IN) {
    release(s, i);
  }
}

int dg__swap_backward_node(dg__swap *s, int index) {
  if (!s->nr) return DG_OK;
  pthread_mutex_lock(&s->mu);
  int rc = s->err && !s->err_told ? report(s) : DG_OK;
  if (!s->in_bwd) backward_begin(s);
  for (; s->drop >= s->rec_base && s->r[s->drop].node_first > index; s->drop--)
    release_dead(s, s->drop);
  int L = s->o.lookahead, queued = 0;
  for (; L > 0 && s->pf >= s->sv_base && s->sv[s->pf].node >= index - L; s->pf--) {
    if (s->sv[s->pf].node > index) continue; /* a node backward skipped */
    int before = s->lq_n;
    if (!prefetch(s, s->sv[s->pf].rec)) break;
    queued |= s->lq_n != before;
  }
  if (queued) pthread_cond_signal(&s->cv_io);
  pthread_mutex_unlock(&s->mu);
  return rc;
}

void dg__swap_backward_end(dg__swap *s) {
  if (!s->nr) return;
  pthread_mutex_lock(&s->mu);
  for (int i = s->rec_base; i < s->nr; i++) release_dead(s, i);
  s->rec_base = s->nr, s->sv_base = s->nsv;
  s->in_bwd = 0;
  s->st.backwards++;
  size_t rss, hwm;
  dg__swap_rss(&rss, &hwm);
  if (rss > s->st.peak_rss) s->st.peak_rss = rss;
  pthread_mutex_unlock(&s->mu);
}

/* ---- reset, free ---- */

static void swap_reset(dg__swap *s) {
  pthread_mutex_lock(&s->mu);
  for (int i = 0; i < s->nr; i++) { /* queued work is cancelled */
    if (s->r[i].state == DG_SW_LOADQ) s->r[i].state = DG_SW_OUT;
    if (s->r[i].state == DG_SW_QUEUED) s->r[i].state = DG_SW_KEEP;
  }
  s->lq_n = 0;
  struct timespec dl = dg__swap_deadline(s->o.io_timeout_ms);
  while (s->io_busy && !s->broken) /* the job in flight reads or writes the arena */
    if (wait_cv(s, &dl) == ETIMEDOUT) {
      DG_LOGE("swap: the I/O thread on %s did not finish within %d ms at dg_ctx_reset; "
              "swapping is off for this context", s->fd >= 0 ? s->path : "memory",
              s->o.io_timeout_ms);
      s->broken = 1;
    }
  if (s->err && !s->err_told) DG_LOGE("%s (reported at dg_ctx_reset)", s->errmsg);
  s->nr = s->nsv = s->ncommit = s->store_next = s->rec_base = s->sv_base = 0;
  s->fuse = 0;
  s->slab_cur = 0, s->slab_used = 0;
  s->npins = 0;
  s->backlog = s->ahead_bytes = s->out_now = 0;
  s->in_bwd = 0;
  s->err = s->err_told = 0;
  pthread_mutex_unlock(&s->mu);
}

/* Every swapping context, linked through reg_next: a pipe stage holds one
 * per micro-batch it keeps alive, so there is no fixed bound. */
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static dg__swap *reg_head;

/* A raw accessor reads t: if it lies in a swapping context's arena, it
 * comes back and stays. */
static void swap_touch(const dg_tensor *t) {
  pthread_mutex_lock(&reg_mu);
  for (dg__swap *s = reg_head; s; s = s->reg_next) {
    if (dg__arena_live(&s->ctx->arena, t->data) != 1) continue;
    uintptr_t a, b;
    span(t, &a, &b);
    pthread_mutex_lock(&s->mu);
    double waited = 0;
    if (fence(s, a, b, 1, &waited))
      DG_LOGE("swap: a raw read of a swapped tensor failed: %s", dg_ctx_errmsg(s->ctx));
    s->st.forward_wait_s += waited;
    pthread_mutex_unlock(&s->mu);
  }
  pthread_mutex_unlock(&reg_mu);
}

static void registry(dg__swap *s, int add) {
  pthread_mutex_lock(&reg_mu);
  if (add) {
    s->reg_next = reg_head, reg_head = s;
  } else {
    for (dg__swap **q = &reg_head; *q; q = &(*q)->reg_next)
      if (*q == s) {
        *q = s->reg_next;
        break;
      }
  }
  dg__swap_touch = reg_head ? swap_touch : NULL;
  pthread_mutex_unlock(&reg_mu);
}

static void stop_thread(dg__swap *s) {
  if (!s->th_started) return;
  pthread_mutex_lock(&s->mu);
  s->stop = 1;
  pthread_cond_signal(&s->cv_io);
  struct timespec dl = dg__swap_deadline(s->o.io_timeout_ms);
  while (!s->io_exited)
    if (wait_cv(s, &dl) == ETIMEDOUT) break;
  int exited = s->io_exited;
  pthread_mutex_unlock(&s->mu);
  if (exited) {
    pthread_join(s->th, NULL);
  } else { /* stuck in a system call: it owns nothing we free but s */
    DG_LOGE("swap: the I/O thread on %s did not stop within %d ms; leaving it",
            s->fd >= 0 ? s->path : "memory", s->o.io_timeout_ms);
    pthread_detach(s->th);
  }
  s->th_started = exited ? 0 : -1;
}

/* Frees what swap_start made (a thread that would not stop keeps s). */
static void discard(dg__swap *s) {
  stop_thread(s);
  if (s->th_started < 0) return; /* the thread may still touch s: leaked, not freed */
  if (s->fd >= 0) close(s->fd);
  for (int k = 0; k < s->nslab; k++) dg__free(s->slab[k].p);
  dg__free(s->stage[0]);
  dg__free(s->stage[1]);
  dg__free(s->r);
  dg__free(s->lq);
  dg__free(s->sv);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv_io);
  pthread_cond_destroy(&s->cv_main);
  dg__free(s);
}

static void swap_free(dg__swap *s) {
  dg_ctx *ctx = s->ctx;
  registry(s, 0);
  ctx->swap = NULL;
  ctx->swap_vt = NULL;
  dg_ctx_set_saved_tensor_hooks(ctx, NULL, NULL, NULL);
  discard(s);
}

static const dg__swap_vt swap_vt = {swap_op_begin, swap_reset, swap_free};

/* ---- API ---- */

void dg_swap_opts_init(dg_swap_opts *o) {
  if (!o) return;
  memset(o, 0, sizeof *o);
  o->min_bytes = (size_t)256 << 10;
  o->lookahead = 2;
  o->io_timeout_ms = 60000;
}

static int check_opts(dg_ctx *ctx, const dg_swap_opts *o) {
  if (o->target & DG_SWAP_HOST)
    return dg__set_error(ctx, DG_EUNSUPPORTED, "set_swap: DG_SWAP_HOST needs the CUDA backend, "
                                               "which this build does not have");
  if (!o->target || (o->target & ~(unsigned)(DG_SWAP_FILE | DG_SWAP_BF16)))
    return dg__set_error(ctx, DG_EINVAL, "set_swap: target %#x is not DG_SWAP_FILE and/or "
                                         "DG_SWAP_BF16 (pass NULL to turn swapping off)",
                         o->target);
  if (o->lookahead < 0 || o->io_timeout_ms <= 0)
    return dg__set_error(ctx, DG_EINVAL, "set_swap: lookahead %d must be >= 0 and io_timeout_ms "
                                         "%d > 0 (dg_swap_opts_init sets defaults)",
                         o->lookahead, o->io_timeout_ms);
  const char *dir = o->dir ? o->dir : "/var/tmp";
  if ((o->target & DG_SWAP_FILE) && strlen(dir) >= 200)
    return dg__set_error(ctx, DG_EINVAL, "set_swap: directory name longer than 200 bytes");
  return DG_OK;
}

static int swap_start(dg__swap *s) {
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* deadlines ignore wall-clock jumps */
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv_io, &ca);
  pthread_cond_init(&s->cv_main, &ca);
  pthread_condattr_destroy(&ca);
  char err[400];
  if ((s->o.target & DG_SWAP_FILE) && dg__swap_open_file(s, err, sizeof err))
    return dg__set_error(s->ctx, DG_EIO, "set_%s", err);
  if ((s->o.target & DG_SWAP_FILE) && (s->o.target & DG_SWAP_BF16)) {
    s->stage[0] = dg__malloc(DG_SWAP_STAGE);
    s->stage[1] = dg__malloc(DG_SWAP_STAGE);
    if (!s->stage[0] || !s->stage[1])
      return dg__set_error(s->ctx, DG_ENOMEM, "set_swap: out of memory for staging buffers");
  }
  int e = pthread_create(&s->th, NULL, dg__swap_thread, s);
  if (e)
    return dg__set_error(s->ctx, DG_ESYS, "set_swap: cannot start the I/O thread: %s",
                         strerror(e));
  s->th_started = 1;
  return DG_OK;
}

int dg_ctx_set_swap(dg_ctx *ctx, const dg_swap_opts *opts) {
  if (!ctx) return DG_EINVAL;
  dg_ctx_clear_error(ctx); /* it reports its own failures only */
  if (ctx->in_backward || ctx->ntape)
    return dg__set_error(ctx, DG_ESTATE, "set_swap: the tape holds %d nodes (call it between "
                                         "steps)", ctx->ntape);
  if (ctx->swap && ctx->swap->nr)
    return dg__set_error(ctx, DG_ESTATE, "set_swap: tensors of this step are swapped "
                                         "(dg_ctx_reset first)");
  if (opts && check_opts(ctx, opts)) return ctx->err;
  if (!ctx->swap && ctx->pack)
    return dg__set_error(ctx, DG_ESTATE, "set_swap: saved-tensor hooks of the caller are set");
  if (ctx->swap) swap_free(ctx->swap);
  if (!opts) return DG_OK;
  dg__swap *s = dg__calloc(1, sizeof *s);
  if (!s) return dg__set_error(ctx, DG_ENOMEM, "set_swap: out of memory");
  s->ctx = ctx;
  s->o = *opts;
  snprintf(s->dir, sizeof s->dir, "%s", opts->dir ? opts->dir : "/var/tmp");
  s->o.dir = s->dir;
  s->fd = -1;
  s->active = 1;
  int rc = swap_start(s);
  if (!rc && (rc = dg_ctx_set_saved_tensor_hooks(ctx, swap_pack, swap_unpack, s)) > 0) rc = 0;
  if (rc) {
    discard(s);
    return rc;
  }
  ctx->swap = s;
  ctx->swap_vt = &swap_vt;
  registry(s, 1);
  return DG_OK;
}

int dg_ctx_swap_scope(dg_ctx *ctx, int on) {
  if (!ctx || !ctx->swap) return 0;
  int prev = ctx->swap->active;
  ctx->swap->active = !!on;
  return prev;
}

int dg_ctx_swap_stats(const dg_ctx *ctx, dg_swap_stats *out) {
  if (!ctx || !out) return DG_EINVAL;
  if (!ctx->swap) return DG_ESTATE;
  dg__swap *s = ctx->swap;
  pthread_mutex_lock(&s->mu);
  *out = s->st;
  pthread_mutex_unlock(&s->mu);
  size_t rss;
  dg__swap_rss(&rss, &out->hwm_rss);
  return DG_OK;
}

void dg_ctx_swap_stats_reset(dg_ctx *ctx) {
  if (!ctx || !ctx->swap) return;
  pthread_mutex_lock(&ctx->swap->mu);
  memset(&ctx->swap->st, 0, sizeof ctx->swap->st);
  pthread_mutex_unlock(&ctx->swap->mu);
  int fd = open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC); /* VmHWM restarts */
  if (fd >= 0) {
    if (write(fd, "5", 1) != 1) DG_LOGD("swap: cannot reset VmHWM: %s", strerror(errno));
    close(fd);
  }
}
