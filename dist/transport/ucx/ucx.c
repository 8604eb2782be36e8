/* UCX transport: ucp tagged send/recv behind the transport vtable (see
 * ucx_impl.h for the tag layout and locking). Posting threads call UCX
 * directly; waiting threads drive the worker themselves for a while (the
 * answer often comes within microseconds on shared memory), then sleep on a
 * condition variable while the group's progress thread, blocked on the
 * worker's event fd, finishes the work. A peer failure reported by UCX
 * (UCP_ERR_HANDLING_MODE_PEER: a closed connection or a failed keepalive)
 * fails the transport stickily naming the peer, and dgrad peers are told
 * whom to blame (ABORT), as the TCP transport does. */
#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include "dist/net/net_impl.h"
#include "dist/transport/ucx/ucx_impl.h"
#include "base/common_impl.h"

#define X(x) ((dg_ucx_xport *)(x))
/* Sleep of the idle progress thread between keepalive rounds (ms). */
#define IDLE_MS 100
/* ... and while ops are pending: some UCX work raises no event. */
#define BUSY_MS 1
/* How long a waiter polls (yielding) after the last activity, then sleeps. */
#define YIELD_MS 20

static unsigned char dummy[8];

uint64_t dg__ucx_tag(uint64_t slot, int src) {
  uint64_t kind = slot >> 56, t;
  if (kind == 0) {
    t = slot & 0xffffffffULL;
  } else {
    if (kind >= DG_UCX_KIND_CTL) kind = kind % 14 + 1;
    t = (kind << DG_UCX_KIND_SHIFT) | (((slot >> 24) & 0xffffffffULL) << 12) | (slot & 0xfff);
  }
  return ((uint64_t)(unsigned)src << DG_UCX_SRC_SHIFT) | t;
}

void dg__ucx_request_init(void *req) { memset(req, 0, sizeof(dg_ucx_req)); }

static void complete(dg_ucx_xport *x, dg_xop *op, int status) {
  __atomic_store_n(&op->status, status, __ATOMIC_RELEASE);
  pthread_cond_broadcast(&x->cv);
}

static void unlink_req(dg_ucx_xport *x, dg_ucx_req *r) {
  if (r->prev) r->prev->next = r->next;
  else if (x->pend == r) x->pend = r->next;
  if (r->next) r->next->prev = r->prev;
  r->prev = r->next = NULL;
}

/* Fails the pending ops of `peer` (-1: all) with code (lock held). Their
 * requests stay with UCX until it completes them: receives are cancelled. */
static void fail_pending(dg_ucx_xport *x, int peer, int code) {
  for (dg_ucx_req *r = x->pend, *n; r; r = n) {
    n = r->next;
    if (peer >= 0 && r->op->peer != peer) continue;
    dg_xop *op = r->op;
    unlink_req(x, r);
    r->op = NULL;
    if (!op->is_send) DG_UCX(ucp_request_cancel)(x->wk, r);
    complete(x, op, code);
  }
}

static void fail_orphans(dg_ucx_xport *x, int peer, int code) {
  for (dg_xop **pp = &x->orphans; *pp;) {
    dg_xop *op = *pp;
    if (peer >= 0 && op->peer != peer) {
      pp = &op->next;
      continue;
    }
    *pp = op->next;
    op->next = NULL;
    complete(x, op, code);
  }
}

static void send_ctl(dg_ucx_xport *x, int peer, int64_t *msg);

void dg__ucx_xfail(dg_ucx_xport *x, int code, int blame, const char *fmt, ...) {
  if (x->err) return;
  va_list ap;
  va_start(ap, fmt);
  dg__vfmt(x->errmsg, sizeof x->errmsg, fmt, ap);
  va_end(ap);
  x->err = code;
  /* Tell the other peers whom to blame, so every rank names the root cause. */
  x->ctl_out[0] = DG_UCX_CTL_ABORT;
  x->ctl_out[1] = blame;
  x->ctl_out[2] = code;
  for (int i = 0; i < x->base.size; i++)
    if (i != x->base.rank && i != blame && x->peers[i].state == DG_UCX_PEER_OK)
      send_ctl(x, i, x->ctl_out);
  DG_LOGD("ucx transport rank %d: %s", x->base.rank, x->errmsg);
  x->suspect = -1;
  fail_pending(x, -1, code);
  fail_orphans(x, -1, code);
  pthread_cond_broadcast(&x->cv);
}

static int peer_of(dg_ucx_xport *x, ucp_ep_h ep) {
  for (int i = 0; i < x->base.size; i++)
    if (x->peers[i].ep == ep) return i;
  return -1;
}

/* The endpoint to peer p failed (lock held). The blame waits a grace
 * period for an ABORT naming the root cause; ops on p wait with it. */
static void suspect(dg_ucx_xport *x, int p, ucs_status_t st) {
  x->peers[p].state = DG_UCX_PEER_FAILED;
  if (x->err || x->suspect >= 0) return;
  x->suspect = p;
  x->suspect_st = st;
  x->suspect_until = dg__now_ms() + DG_UCX_GRACE_MS;
}

void dg__ucx_settle(dg_ucx_xport *x) {
  if (x->suspect < 0 || x->err || dg__now_ms() < x->suspect_until) return;
  int p = x->suspect;
  dg__ucx_xfail(x, DG_EPEER, p, "rank %d: connection lost (process exited or was killed?): "
                "ucx: %s", p, DG_UCX(ucs_status_string)(x->suspect_st));
}

/* UCX says the endpoint to a peer failed (progress context, lock held). */
void dg__ucx_ep_error(void *arg, ucp_ep_h ep, ucs_status_t st) {
  dg_ucx_xport *x = arg;
  int p = peer_of(x, ep);
  if (p < 0) return;
  dg_ucx_peer *pp = &x->peers[p];
  if (pp->state == DG_UCX_PEER_BYE || pp->state == DG_UCX_PEER_CLOSED || pp->closing) {
    /* It left cleanly: only ops that need it fail from now on. */
    DG_LOGD("ucx transport rank %d: rank %d left (%s)", x->base.rank, p,
            DG_UCX(ucs_status_string)(st));
    pp->state = DG_UCX_PEER_CLOSED;
    fail_pending(x, p, DG_EPEER);
    fail_orphans(x, p, DG_EPEER);
    return;
  }
  suspect(x, p, st);
}

static void on_ctl(dg_ucx_xport *x, const ucp_tag_recv_info_t *info) {
  int from = (int)(info->sender_tag >> DG_UCX_SRC_SHIFT);
  if (from < 0 || from >= x->base.size || from == x->base.rank) return;
  if (info->length != sizeof x->ctl_in) return;
  int64_t type = x->ctl_in[0], blame = x->ctl_in[1], code = x->ctl_in[2];
  if (type == DG_UCX_CTL_BYE) {
    if (x->peers[from].state == DG_UCX_PEER_OK) x->peers[from].state = DG_UCX_PEER_BYE;
    return;
  }
  if (type != DG_UCX_CTL_ABORT) return;
  if (blame < 0 || blame >= x->base.size) blame = from;
  if (code >= 0 || code <= DG__ERR_MIN) code = DG_EPEER;
  const char *what = code == DG_EPEER      ? "connection lost (process exited or was killed?)"
                     : code == DG_ETIMEDOUT ? "silent past the deadline"
                                            : dg_strerror((int)code);
  dg__ucx_xfail(x, (int)code, (int)blame, "rank %d: %s (reported by rank %d)", (int)blame, what,
                from);
}

static void ctl_cb(void *req, ucs_status_t st, const ucp_tag_recv_info_t *info, void *ud) {
  dg_ucx_xport *x = ud;
  DG_UCX(ucp_request_free)(req);
  if (x->ctl_req != req) return;
  x->ctl_req = NULL;
  if (st != UCS_OK) return; /* cancelled (destroy) */
  on_ctl(x, info);
  dg__ucx_ctl_post(x);
}

/* Posts the standing control receive, handling messages already there. */
int dg__ucx_ctl_post(dg_ucx_xport *x) {
  for (;;) {
    ucp_tag_recv_info_t info;
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FIELD_RECV_INFO,
        .cb.recv = ctl_cb, .user_data = x, .recv_info.tag_info = &info};
    ucs_status_ptr_t s = DG_UCX(ucp_tag_recv_nbx)(x->wk, x->ctl_in, sizeof x->ctl_in,
                                                  DG_UCX_KIND_CTL << DG_UCX_KIND_SHIFT,
                                                  DG_UCX_KIND_CTL << DG_UCX_KIND_SHIFT, &p);
    if (UCS_PTR_IS_ERR(s)) return DG_ESYS;
    if (s != NULL) {
      x->ctl_req = s;
      ((dg_ucx_req *)s)->ctl = 1;
      return DG_OK;
    }
    on_ctl(x, &info);
  }
}

static void free_cb(void *req, ucs_status_t st, void *ud) {
  (void)st;
  (void)ud;
  DG_UCX(ucp_request_free)(req);
}

/* Fire and forget: the request frees itself; msg must outlive it. */
static void send_ctl(dg_ucx_xport *x, int peer, int64_t *msg) {
  ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK, .cb.send = free_cb};
  uint64_t tag = ((uint64_t)(unsigned)x->base.rank << DG_UCX_SRC_SHIFT) |
                 (DG_UCX_KIND_CTL << DG_UCX_KIND_SHIFT);
  ucs_status_ptr_t s =
      DG_UCX(ucp_tag_send_nbx)(x->peers[peer].ep, msg, 3 * sizeof *msg, tag, &p);
  (void)s;
}

static void orphan(dg_ucx_xport *x, dg_xop *op) {
  op->next = x->orphans;
  x->orphans = op;
}

/* A data op finished (from a callback, or at once). */
static void op_done(dg_ucx_xport *x, dg_xop *op, ucs_status_t st, size_t len) {
  if (st == UCS_OK) {
    if (!op->is_send) op->nrecv = len;
    complete(x, op, DG_OK);
    return;
  }
  if (st == UCS_ERR_MESSAGE_TRUNCATED) {
    complete(x, op, DG_EFORMAT);
    dg__ucx_xfail(x, DG_EFORMAT, op->peer, "rank %d sent more than the posted receive of %zu "
                  "bytes on slot 0x%llx", op->peer, op->n, (unsigned long long)op->slot);
    return;
  }
  if (x->err || x->peers[op->peer].state == DG_UCX_PEER_CLOSED) {
    complete(x, op, x->err ? x->err : DG_EPEER);
    return;
  }
  orphan(x, op);
  suspect(x, op->peer, st);
}

static void data_cb(dg_ucx_xport *x, dg_ucx_req *r, ucs_status_t st, size_t len) {
  dg_xop *op = r->op;
  if (op) {
    unlink_req(x, r);
    r->op = NULL;
    op_done(x, op, st, len);
  }
  DG_UCX(ucp_request_free)(r);
}

static void send_cb(void *req, ucs_status_t st, void *ud) {
  data_cb(ud, req, st, 0);
}

static void recv_cb(void *req, ucs_status_t st, const ucp_tag_recv_info_t *info, void *ud) {
  data_cb(ud, req, st, info ? info->length : 0);
}

static int post_check(dg_ucx_xport *x, dg_xop *op) {
  if (op->peer < 0 || op->peer >= x->base.size || op->peer == x->base.rank) return DG_EINVAL;
  if (x->err) {
    op->status = x->err;
    return x->err;
  }
  if (x->peers[op->peer].state == DG_UCX_PEER_CLOSED) {
    op->status = DG_EPEER;
    return DG_EPEER;
  }
  op->status = DG_XOP_PENDING;
  op->next = NULL;
  op->nrecv = 0;
  if (x->peers[op->peer].state == DG_UCX_PEER_FAILED) {
    orphan(x, op); /* fails with the transport, naming the root cause */
    return DG_EAGAIN;
  }
  return DG_OK;
}

/* A posted op: done at once, failed, or tracked until its callback. */
static int track(dg_ucx_xport *x, dg_xop *op, ucs_status_ptr_t s, size_t len) {
  if (s == NULL) {
    op_done(x, op, UCS_OK, len);
  } else if (UCS_PTR_IS_ERR(s)) {
    op_done(x, op, UCS_PTR_STATUS(s), 0);
  } else {
    dg_ucx_req *r = s;
    r->x = x;
    r->op = op;
    r->ctl = 0;
    r->prev = NULL;
    r->next = x->pend;
    if (x->pend) x->pend->prev = r;
    x->pend = r;
  }
  int st = op->status;
  return st == DG_XOP_PENDING || st == DG_OK ? DG_OK : st;
}

static int ucx_send(dg_xport *xp, dg_xop *op) {
  dg_ucx_xport *x = X(xp);
  pthread_mutex_lock(&x->mu);
  op->is_send = 1;
  int rc = post_check(x, op);
  if (rc == DG_OK) {
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                             UCP_OP_ATTR_FIELD_USER_DATA,
                             .cb.send = send_cb, .user_data = x};
    ucs_status_ptr_t s =
        DG_UCX(ucp_tag_send_nbx)(x->peers[op->peer].ep, op->buf ? op->buf : dummy, op->n,
                                 dg__ucx_tag(op->slot, x->base.rank), &p);
    rc = track(x, op, s, 0);
  }
  if (rc == DG_EAGAIN) rc = DG_OK;
  pthread_mutex_unlock(&x->mu);
  return rc;
}

static int ucx_recv(dg_xport *xp, dg_xop *op) {
  dg_ucx_xport *x = X(xp);
  pthread_mutex_lock(&x->mu);
  op->is_send = 0;
  int rc = post_check(x, op);
  if (rc == DG_OK) {
    ucp_tag_recv_info_t info = {0};
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FIELD_RECV_INFO,
        .cb.recv = recv_cb, .user_data = x, .recv_info.tag_info = &info};
    ucs_status_ptr_t s =
        DG_UCX(ucp_tag_recv_nbx)(x->wk, op->buf ? op->buf : dummy, op->n,
                                 dg__ucx_tag(op->slot, op->peer), UINT64_MAX, &p);
    rc = track(x, op, s, info.length);
  }
  if (rc == DG_EAGAIN) rc = DG_OK;
  pthread_mutex_unlock(&x->mu);
  return rc;
}

void dg__ucx_progress(dg_ucx_xport *x) {
  x->armed = 0;
  while (DG_UCX(ucp_worker_progress)(x->wk)) {
  }
  dg__ucx_settle(x);
}

/* Progresses and arms the worker's event fd (lock held): after this, any
 * event wakes the progress thread. Any later progress call disarms. */
static void arm(dg_ucx_xport *x) {
  do dg__ucx_progress(x);
  while (DG_UCX(ucp_worker_arm)(x->wk) == UCS_ERR_BUSY);
  x->armed = 1;
}

static void kick(dg_ucx_xport *x) {
  /* wakes the progress thread */
  uint64_t one = 1;
  ssize_t w = write(x->wakefd, &one, sizeof one);
  (void)w;
}

void *dg__ucx_progress_main(void *arg) {
  dg_ucx_xport *x = arg;
  struct epoll_event ev[4];
  pthread_mutex_lock(&x->mu);
  while (!x->stop) {
    arm(x);
    int busy = x->pend || x->orphans || x->suspect >= 0;
    x->sleeping = 1;
    pthread_mutex_unlock(&x->mu);
    /* Wakes on worker events, a kick, or after a tick (keepalive; work
     * that raises no event while ops are pending). */
    int n = epoll_wait(x->ep, ev, 4, busy ? BUSY_MS : IDLE_MS);
    for (int i = 0; i < n; i++)
      if (ev[i].data.fd == x->wakefd) {
        uint64_t v;
        ssize_t r = read(x->wakefd, &v, sizeof v);
        (void)r;
      }
    pthread_mutex_lock(&x->mu);
    x->sleeping = 0;
  }
  pthread_mutex_unlock(&x->mu);
  return NULL;
}

static int ucx_wait(dg_xport *xp, dg_xop *op, int64_t deadline_ms) {
  dg_ucx_xport *x = X(xp);
  /* Drive the worker from this thread while it makes progress: no thread
   * hand-off, and no stall on work that raises no event. Busy for spin_us
   * after the last activity, then yielding the CPU between polls (peers may
   * share the cores) for up to YIELD_MS, then sleep on the condition
   * variable while the progress thread waits on the worker's event fd. */
  int64_t last = dg__now_ns(), spin = (int64_t)x->spin_us * 1000;
  while (__atomic_load_n(&op->status, __ATOMIC_ACQUIRE) == DG_XOP_PENDING) {
    int64_t now = dg__now_ns();
    if (now - last > (int64_t)YIELD_MS * 1000000 || now / 1000000 >= deadline_ms) break;
    if (now - last > spin) sched_yield();
    if (pthread_mutex_trylock(&x->mu) != 0) {
      for (int i = 0; i < 64; i++) dg__cpu_relax();
      continue;
    }
    if (op->status == DG_XOP_PENDING) {
      x->armed = 0;
      if (DG_UCX(ucp_worker_progress)(x->wk)) last = dg__now_ns();
      dg__ucx_settle(x);
    }
    pthread_mutex_unlock(&x->mu);
  }
  pthread_mutex_lock(&x->mu);
  while (op->status == DG_XOP_PENDING) {
    int64_t left = deadline_ms - dg__now_ms();
    if (left <= 0) break;
    /* This thread progressed last: arm, so an event wakes the progress
     * thread (it re-arms itself after each of its own rounds). */
    if (!x->armed && x->sleeping) arm(x);
    if (op->status != DG_XOP_PENDING) break;
    dg__cond_wait_ms(&x->cv, &x->mu, x->suspect >= 0 ? 1 : left > 200 ? 200 : left);
    dg__ucx_settle(x);
  }
  int st = op->status;
  pthread_mutex_unlock(&x->mu);
  return st == DG_XOP_PENDING ? DG_ETIMEDOUT : st;
}

static void ucx_abort(dg_xport *xp, int code, int peer, const char *msg) {
  dg_ucx_xport *x = X(xp);
  pthread_mutex_lock(&x->mu);
  dg__ucx_xfail(x, code, peer, "%s", msg);
  pthread_mutex_unlock(&x->mu);
  kick(x); /* get the ABORT messages out */
}

static int ucx_error(dg_xport *xp, char *msg, size_t cap) {
  dg_ucx_xport *x = X(xp);
  pthread_mutex_lock(&x->mu);
  int e = x->err;
  if (msg && cap) snprintf(msg, cap, "%s", e ? x->errmsg : "no error");
  pthread_mutex_unlock(&x->mu);
  return e;
}

const dg_xport_vt dg__ucx_vt = {.name = "ucx", .send = ucx_send, .recv = ucx_recv,
                                .wait = ucx_wait, .abort = ucx_abort, .error = ucx_error,
                                .destroy = dg__ucx_destroy};
