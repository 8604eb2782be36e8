/* TCP transport: Gloo's unbound-buffer protocol (48-byte headers, NOTIFY
 * then SEND, FIFO per (pair, slot)) on non-blocking sockets, driven by one
 * epoll progress thread. Posting threads write directly when a pair's queue
 * is empty; the progress thread finishes partial writes and does all reads,
 * straight into the posted buffers. One mutex guards the whole transport;
 * a malformed frame, a reset, or an abort fails it (sticky) and closes every
 * socket so that peers notice at once. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <linux/sockios.h>
#include <sys/uio.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include "dist/net/net_impl.h"
#include "dist/transport/tcp/tcp_impl.h"
#include "base/common_impl.h"

#define X(x) ((dg_tcp_xport *)(x))
/* Bytes read from one socket before the lock is let go once. */
#define READ_BUDGET (4u << 20)

static void complete(dg_tcp_xport *x, dg_xop *op, int status) {
  __atomic_store_n(&op->status, status, __ATOMIC_RELEASE);
  (void)x;
}

/* ---- pools (lock held) ---- */

static dg_tcp_msg *msg_get(dg_tcp_xport *x) {
  dg_tcp_msg *m = x->msg_free;
  if (m) x->msg_free = m->next;
  else m = dg__malloc(sizeof *m);
  return m;
}

static void msg_put(dg_tcp_xport *x, dg_tcp_msg *m) {
  m->next = x->msg_free;
  x->msg_free = m;
}

/* A holder with room for n bytes: every holder takes the largest eager
 * message, so the pool never needs to grow a buffer again. */
static dg_xop *unx_get(dg_tcp_xport *x, size_t n) {
  dg_tcp_unx *u = (dg_tcp_unx *)x->unx_free;
  if (u) x->unx_free = u->op.next;
  else if (!(u = dg__calloc(1, sizeof *u))) return NULL;
  if (n < DG_TCP_EAGER_MAX) n = DG_TCP_EAGER_MAX;
  if (u->cap < n || !u->op.buf) {
    void *b = dg__realloc(u->op.buf, n);
    if (!b) {
      dg__free(u->op.buf);
      dg__free(u);
      return NULL;
    }
    u->op.buf = b;
    u->cap = n;
  }
  void *b = u->op.buf;
  u->op = (dg_xop){.buf = b};
  return &u->op;
}

static void unx_put(dg_tcp_xport *x, dg_xop *op) {
  op->next = x->unx_free;
  x->unx_free = op;
}

static void pools_free(dg_tcp_xport *x) {
  while (x->msg_free) {
    dg_tcp_msg *m = x->msg_free;
    x->msg_free = m->next;
    dg__free(m);
  }
  while (x->unx_free) {
    dg_xop *u = x->unx_free;
    x->unx_free = u->next;
    dg__free(u->buf);
    dg__free(u);
  }
}

/* Fills the pools and the RECV_READY banks to what a few collectives in
 * flight need, so steady-state traffic does not hit a new high-water mark
 * (an allocation) at some random later step. */
static int pools_warm(dg_tcp_xport *x) {
  int peers = x->base.size - 1;
  for (int i = 0; i < 8 * peers; i++) {
    dg_tcp_msg *m = dg__malloc(sizeof *m);
    if (!m) return DG_ENOMEM;
    msg_put(x, m);
  }
  dg_xop *held = NULL; /* take them all, then give them back */
  for (int i = 0; i < DG_MIN(4 * peers, 32); i++) {
    dg_xop *u = unx_get(x, 0);
    if (!u) break;
    u->next = held;
    held = u;
  }
  while (held) {
    dg_xop *n = held->next;
    unx_put(x, held);
    held = n;
  }
  if (!x->unx_free && peers) return DG_ENOMEM;
  for (int i = 0; i < x->base.size; i++) {
    dg_tcp_pair *p = &x->pairs[i];
    if (i == x->base.rank || p->caprr) continue;
    if (!(p->rr = dg__malloc(8 * sizeof *p->rr))) return DG_ENOMEM;
    p->caprr = 8;
  }
  return DG_OK;
}

static void fail_list(dg_tcp_xport *x, dg_xop *op, int code) {
  while (op) {
    dg_xop *n = op->next;
    complete(x, op, code);
    op = n;
  }
}

/* Fails every op of a pair and closes its socket. */
static void close_pair(dg_tcp_xport *x, dg_tcp_pair *p, int code) {
  fail_list(x, p->recvs, code);
  fail_list(x, p->sends, code);
  p->recvs = p->recvs_tail = p->sends = p->sends_tail = NULL;
  if (p->rop && p->rop != p->rop_unx) complete(x, p->rop, code); /* cut short */
  p->rop = NULL;
  p->rh_got = 0;
  while (p->out) {
    dg_tcp_msg *m = p->out;
    p->out = m->next;
    if (m->op) complete(x, m->op, code);
    msg_put(x, m);
  }
  p->out_tail = NULL;
  p->nrr = 0;
  if (p->rop_unx) p->rop_unx->next = p->unx;
  else if (p->unx_tail) p->unx_tail->next = NULL;
  for (dg_xop *u = p->rop_unx ? p->rop_unx : p->unx; u;) {
    dg_xop *n = u->next;
    unx_put(x, u);
    u = n;
  }
  p->unx = p->unx_tail = p->rop_unx = NULL;
  if (p->fd >= 0) {
    epoll_ctl(x->ep, EPOLL_CTL_DEL, p->fd, NULL);
    shutdown(p->fd, SHUT_RDWR);
    close(p->fd);
    p->fd = -1;
  }
  if (p->state == DG_PAIR_OK) p->state = DG_PAIR_CLOSED;
}

/* A dgrad peer that said goodbye closed its end (lock held): what it sent
 * before leaving is delivered; data that came before the receive that wants
 * it (eager, kept in `unx`) stays for receives posted later. Only ops that
 * can no longer complete fail: receives waiting for more, sends to it. */
static void pair_left(dg_tcp_xport *x, dg_tcp_pair *p) {
  dg_xop *keep = p->unx, *keep_tail = p->unx_tail;
  if (p->rop_unx) { /* a message cut short: drop it */
    unx_put(x, p->rop_unx);
    p->rop_unx = NULL;
  }
  p->unx = p->unx_tail = NULL;
  close_pair(x, p, DG_EPEER);
  p->unx = keep;
  p->unx_tail = keep_tail;
  p->state = DG_PAIR_BYE;
}

/* Whether an eager receive of `slot` can still be served by a peer that
 * left: its data is already here. */
static int left_has(const dg_tcp_pair *p, uint64_t slot) {
  for (const dg_xop *u = p->unx; u; u = u->next)
    if (u->slot == slot) return 1;
  return 0;
}

/* Sticky failure of the whole transport (lock held). */
static void xfail(dg_tcp_xport *x, int code, int blame, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void xfail(dg_tcp_xport *x, int code, int blame, const char *fmt, ...) {
  if (x->err) return;
  va_list ap;
  va_start(ap, fmt);
  dg__vfmt(x->errmsg, sizeof x->errmsg, fmt, ap);
  va_end(ap);
  x->err = code;
  /* Tell dgrad peers whom to blame before the sockets close. Skipped on a
   * pair with a message half written: the stream is not at a boundary. */
  for (int i = 0; i < x->base.size; i++) {
    dg_tcp_pair *p = &x->pairs[i];
    if (i == x->base.rank || p->fd < 0 || i == blame || (p->out && p->out->off)) continue;
    if (!x->base.all_dgrad && !p->dgrad) continue; /* Gloo aborts on opcodes it does not know */
    dg_tcp_hdr h = {DG_TCP_HDR, DG_TCP_ABORT, (uint64_t)(int64_t)blame, (uint64_t)(-code), 0, 0};
    ssize_t w = send(p->fd, &h, sizeof h, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)w;
  }
  DG_LOGD("tcp transport rank %d: %s", x->base.rank, x->errmsg);
  for (int i = 0; i < x->base.size; i++)
    if (i != x->base.rank) close_pair(x, &x->pairs[i], code);
  pthread_cond_broadcast(&x->cv);
}

static void set_epout(dg_tcp_xport *x, dg_tcp_pair *p, int on) {
  if (p->epout == on || p->fd < 0) return;
  struct epoll_event ev = {.events = EPOLLIN | (on ? EPOLLOUT : 0),
                           .data.u32 = (uint32_t)p->peer};
  epoll_ctl(x->ep, EPOLL_CTL_MOD, p->fd, &ev);
  p->epout = on;
}

static void do_read(dg_tcp_xport *x, dg_tcp_pair *p);

/* A send to p failed (lock held). A peer that failed first said why
 * (DG_TCP_ABORT, naming the rank to blame) before it closed; its close reset
 * the connection, but the kernel keeps what was received before the reset.
 * Read that first, so that the rank named is the one that failed and not
 * the messenger (a pipe stage sending to a neighbour that had just been
 * told of a third rank's failure blamed the neighbour). */
static void send_failed(dg_tcp_xport *x, dg_tcp_pair *p, int err) {
  p->wfail = 1; /* flush() from do_read() must not come back here */
  for (int i = 0; i < 64 && p->fd >= 0 && !x->err; i++) do_read(x, p);
  p->wfail = 0;
  xfail(x, DG_EPEER, p->peer, "rank %d (%s): send failed: %s", p->peer, p->addr, strerror(err));
}

/* Writes as much of the queue as the socket takes (lock held). */
static void flush(dg_tcp_xport *x, dg_tcp_pair *p) {
  if (p->wfail) return;
  while (p->out && p->fd >= 0) {
    struct iovec iov[32];
    int n = 0;
    for (dg_tcp_msg *m = p->out; m && n < 31; m = m->next) {
      size_t off = m->off;
      if (off < DG_TCP_HDR)
        iov[n++] = (struct iovec){(char *)&m->h + off, DG_TCP_HDR - off};
      size_t poff = off > DG_TCP_HDR ? off - DG_TCP_HDR : 0;
      if (m->plen > poff) iov[n++] = (struct iovec){(void *)(m->payload + poff), m->plen - poff};
    }
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    ssize_t w = sendmsg(p->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (w < 0) {
      send_failed(x, p, errno);
      return;
    }
    size_t left = (size_t)w;
    while (p->out && left > 0) {
      dg_tcp_msg *m = p->out;
      size_t need = DG_TCP_HDR + m->plen - m->off;
      if (left < need) {
        m->off += left;
        break;
      }
      left -= need;
      p->out = m->next;
      if (!p->out) p->out_tail = NULL;
      if (m->op) {
        complete(x, m->op, DG_OK);
        pthread_cond_broadcast(&x->cv);
      }
      msg_put(x, m);
    }
  }
  set_epout(x, p, p->out != NULL);
}

static int queue_msg(dg_tcp_xport *x, dg_tcp_pair *p, uint64_t opcode, uint64_t slot,
                     uint64_t length, const void *payload, size_t plen, dg_xop *op) {
  dg_tcp_msg *m = msg_get(x);
  if (!m) {
    xfail(x, DG_ENOMEM, -1, "out of memory queueing a message to rank %d", p->peer);
    return DG_ENOMEM;
  }
  m->h = (dg_tcp_hdr){DG_TCP_HDR + plen, opcode, slot, 0, length, 0};
  m->payload = payload;
  m->plen = plen;
  m->off = 0;
  m->op = op;
  m->next = NULL;
  if (p->out_tail) p->out_tail->next = m;
  else p->out = m;
  p->out_tail = m;
  return DG_OK;
}

static dg_xop *take(dg_xop **head, dg_xop **tail, uint64_t slot);

/* Completes an eager receive from data that arrived before it; frees u. */
static int fill_from(dg_tcp_xport *x, dg_tcp_pair *p, dg_xop *op, dg_xop *u) {
  int rc = DG_OK;
  if (u->nrecv > op->n) {
    xfail(x, DG_EFORMAT, p->peer, "rank %d (%s) sent %zu bytes on slot 0x%llx for a receive of %zu; "
          "pair closed", p->peer, p->addr, u->nrecv, (unsigned long long)op->slot, op->n);
    rc = DG_EFORMAT;
  } else {
    if (u->nrecv) memcpy(op->buf, u->buf, u->nrecv);
    op->nrecv = u->nrecv;
    complete(x, op, DG_OK);
    pthread_cond_broadcast(&x->cv);
  }
  unx_put(x, u);
  return rc;
}

/* An unexpected eager message is complete: hand it to a receive posted in
 * the meantime, or keep it. */
static void unx_done(dg_tcp_xport *x, dg_tcp_pair *p, dg_xop *u) {
  dg_xop *r = take(&p->recvs, &p->recvs_tail, u->slot);
  if (r) {
    fill_from(x, p, r, u);
    return;
  }
  u->next = NULL;
  if (p->unx_tail) p->unx_tail->next = u;
  else p->unx = u;
  p->unx_tail = u;
}

/* Queues the data of a send the peer is ready for. The op is on no list
 * here (taken from `sends`, or not queued yet): when it cannot go, it fails
 * itself, else nothing would ever complete it and its waiter would hang
 * until its deadline (found by fuzz_ctrl). */
static int start_data(dg_tcp_xport *x, dg_tcp_pair *p, dg_xop *op, uint64_t announced) {
  int rc;
  if (op->n > announced) {
    xfail(x, DG_EMISMATCH, p->peer,
          "rank %d posted a receive of %llu bytes on slot 0x%llx but this rank sends %zu",
          p->peer, (unsigned long long)announced, (unsigned long long)op->slot, op->n);
    rc = DG_EMISMATCH;
  } else {
    rc = queue_msg(x, p, DG_TCP_SEND_UNBOUND, op->slot, op->n, op->buf, op->n, op);
  }
  if (rc != DG_OK) {
    complete(x, op, x->err ? x->err : rc);
    pthread_cond_broadcast(&x->cv);
  }
  return rc;
}

static int post_check(dg_tcp_xport *x, dg_xop *op, dg_tcp_pair **pp) {
  if (op->peer < 0 || op->peer >= x->base.size || op->peer == x->base.rank) return DG_EINVAL;
  if (x->err) {
    op->status = x->err;
    return x->err;
  }
  *pp = &x->pairs[op->peer];
  if ((*pp)->fd < 0 && !(!op->is_send && op->eager && left_has(*pp, op->slot))) {
    op->status = DG_EPEER;
    return DG_EPEER;
  }
  op->status = DG_XOP_PENDING;
  op->next = NULL;
  op->nrecv = 0;
  return DG_OK;
}

static int tcp_send(dg_xport *xp, dg_xop *op) {
  dg_tcp_xport *x = X(xp);
  dg_tcp_pair *p;
  pthread_mutex_lock(&x->mu);
  op->is_send = 1;
  int rc = post_check(x, op, &p);
  if (rc == DG_OK && op->eager && x->base.all_dgrad) {
    rc = queue_msg(x, p, DG_TCP_EAGER, op->slot, op->n, op->buf, op->n, op);
    if (rc == DG_OK) flush(x, p);
    if (rc == DG_OK && x->err) rc = x->err;
    pthread_mutex_unlock(&x->mu);
    return rc;
  }
  if (rc == DG_OK) rc = queue_msg(x, p, DG_TCP_NOTIFY_SEND_READY, op->slot, op->n, NULL, 0, NULL);
  if (rc == DG_OK) {
    size_t i = 0;
    while (i < p->nrr && p->rr[i].slot != op->slot) i++;
    if (i < p->nrr) {
      uint64_t len = p->rr[i].len;
      memmove(&p->rr[i], &p->rr[i + 1], (p->nrr - i - 1) * sizeof *p->rr);
      p->nrr--;
      rc = start_data(x, p, op, len);
    } else {
      if (p->sends_tail) p->sends_tail->next = op;
      else p->sends = op;
      p->sends_tail = op;
    }
  }
  if (rc == DG_OK) flush(x, p);
  if (rc == DG_OK && x->err) rc = x->err;
  pthread_mutex_unlock(&x->mu);
  return rc;
}

static int tcp_recv(dg_xport *xp, dg_xop *op) {
  dg_tcp_xport *x = X(xp);
  dg_tcp_pair *p;
  pthread_mutex_lock(&x->mu);
  op->is_send = 0;
  int rc = post_check(x, op, &p);
  dg_xop *u = rc == DG_OK && op->eager ? take(&p->unx, &p->unx_tail, op->slot) : NULL;
  if (u) {
    rc = fill_from(x, p, op, u);
  } else if (rc == DG_OK) {
    if (p->recvs_tail) p->recvs_tail->next = op;
    else p->recvs = op;
    p->recvs_tail = op;
    if (!op->eager) rc = queue_msg(x, p, DG_TCP_NOTIFY_RECV_READY, op->slot, op->n, NULL, 0, NULL);
  }
  if (rc == DG_OK) flush(x, p);
  if (rc == DG_OK && x->err) rc = x->err;
  pthread_mutex_unlock(&x->mu);
  return rc;
}

/* Removes the oldest op of `slot` from a FIFO list. */
static dg_xop *take(dg_xop **head, dg_xop **tail, uint64_t slot) {
  dg_xop *prev = NULL;
  for (dg_xop *o = *head; o; prev = o, o = o->next) {
    if (o->slot != slot) continue;
    if (prev) prev->next = o->next;
    else *head = o->next;
    if (*tail == o) *tail = prev;
    o->next = NULL;
    return o;
  }
  return NULL;
}

/* The payload being read is complete. */
static void rop_done(dg_tcp_xport *x, dg_tcp_pair *p) {
  dg_xop *r = p->rop;
  p->rop = NULL;
  if (r == p->rop_unx) {
    p->rop_unx = NULL;
    unx_done(x, p, r);
    return;
  }
  complete(x, r, DG_OK);
  pthread_cond_broadcast(&x->cv);
}

static int bad_frame(dg_tcp_xport *x, dg_tcp_pair *p, const char *why) {
  const dg_tcp_hdr *h = &p->rh;
  xfail(x, DG_EFORMAT, p->peer,
        "rank %d (%s) sent a malformed frame (%s: nbytes %llu opcode %llu slot 0x%llx "
        "length %llu); pair closed", p->peer, p->addr, why, (unsigned long long)h->nbytes,
        (unsigned long long)h->opcode, (unsigned long long)h->slot,
        (unsigned long long)h->length);
  return -1;
}

/* A complete header arrived: match it. Returns -1 when the pair failed. */
static int on_header(dg_tcp_xport *x, dg_tcp_pair *p) {
  dg_tcp_hdr *h = &p->rh;
  p->rh_got = 0;
  if (h->opcode == DG_TCP_NOTIFY_SEND_READY || h->opcode == DG_TCP_NOTIFY_RECV_READY) {
    if (h->nbytes != DG_TCP_HDR || h->offset || h->roffset)
      return bad_frame(x, p, "bad notification");
    if (h->opcode == DG_TCP_NOTIFY_SEND_READY) return 0; /* only recv-from-any uses it */
    dg_xop *s = take(&p->sends, &p->sends_tail, h->slot);
    if (s) return start_data(x, p, s, h->length) == DG_OK ? 0 : -1;
    if (p->nrr == p->caprr) {
      size_t nc = p->caprr ? p->caprr * 2 : 8;
      dg_tcp_rr *n = dg__realloc(p->rr, nc * sizeof *n);
      if (!n) return bad_frame(x, p, "out of memory");
      p->rr = n;
      p->caprr = nc;
    }
    p->rr[p->nrr++] = (dg_tcp_rr){h->slot, h->length};
    return 0;
  }
  if (h->opcode == DG_TCP_SEND_UNBOUND) {
    if (h->nbytes != DG_TCP_HDR + h->length || h->offset || h->roffset)
      return bad_frame(x, p, "bad data header");
    dg_xop *r = take(&p->recvs, &p->recvs_tail, h->slot);
    if (!r) return bad_frame(x, p, "data nobody asked for");
    if (h->length > r->n) {
      complete(x, r, DG_EFORMAT);
      return bad_frame(x, p, "longer than the posted receive");
    }
    r->nrecv = h->length;
    p->rop = r;
    p->rgot = 0;
    if (h->length == 0) rop_done(x, p);
    return 0;
  }
  if (h->opcode == DG_TCP_EAGER && x->base.all_dgrad) {
    if (h->nbytes != DG_TCP_HDR + h->length || h->length > DG_TCP_EAGER_MAX)
      return bad_frame(x, p, "bad eager header");
    dg_xop *r = take(&p->recvs, &p->recvs_tail, h->slot);
    if (r && h->length > r->n) {
      complete(x, r, DG_EFORMAT);
      return bad_frame(x, p, "longer than the posted receive");
    }
    if (!r) { /* keep it until its receive is posted */
      r = unx_get(x, h->length);
      if (!r) return bad_frame(x, p, "out of memory");
      r->slot = h->slot;
      r->n = h->length;
      p->rop_unx = r;
    }
    r->nrecv = h->length;
    p->rop = r;
    p->rgot = 0;
    if (h->length == 0) rop_done(x, p);
    return 0;
  }
  if (h->opcode == DG_TCP_ABORT && (x->base.all_dgrad || p->dgrad) && h->nbytes == DG_TCP_HDR) {
    /* range-checked as unsigned: negating any u64 as int64 may overflow (fuzz_ctrl) */
    int64_t blame = h->slot < (uint64_t)x->base.size ? (int64_t)h->slot : p->peer;
    int64_t code = h->offset >= 1 && h->offset < (uint64_t)-DG__ERR_MIN ? -(int64_t)h->offset
                                                                          : DG_EPEER;
    const char *what = code == DG_EPEER ? "connection lost (process exited or was killed?)"
                       : code == DG_ETIMEDOUT ? "silent past the deadline"
                                              : dg_strerror((int)code);
    xfail(x, (int)code, (int)blame, "rank %d: %s (reported by rank %d)", (int)blame, what,
          p->peer);
    return -1;
  }
  if (h->opcode == DG_TCP_BYE && x->base.all_dgrad && h->nbytes == DG_TCP_HDR) {
    p->state = DG_PAIR_BYE;
    return 0;
  }
  return bad_frame(x, p, "unknown opcode");
}

static int pair_busy(const dg_tcp_pair *p) {
  return p->recvs || p->sends || p->out || p->rop || p->rh_got;
}

static int any_busy(const dg_tcp_xport *x) {
  for (int i = 0; i < x->base.size; i++)
    if (i != x->base.rank && pair_busy(&x->pairs[i])) return 1;
  return 0;
}

/* Whether the first peer that closed, not `peer`, is the one to blame for
 * peer's failure: it closed while this rank was in an operation, or shortly
 * before (a rank killed between two operations: its neighbours fail the
 * next one and close theirs a few ms later). A torch rank that finished
 * and left long ago is not blamed. */
static int blame_gone(const dg_tcp_xport *x, int peer) {
  return x->gone >= 0 && x->gone != peer &&
         (x->gone_busy || dg__now_ms() - x->gone_ms < 1000);
}

static void on_eof(dg_tcp_xport *x, dg_tcp_pair *p, int err) {
  const char *why = err ? strerror(err) : "connection closed";
  if (p->state == DG_PAIR_BYE || (!pair_busy(p) && !x->base.all_dgrad)) {
    /* A peer that left cleanly: only ops that need it fail from now on. */
    DG_LOGD("tcp transport rank %d: rank %d left (%s)", x->base.rank, p->peer, why);
    if (p->state != DG_PAIR_BYE && x->gone < 0) {
      x->gone = p->peer; /* remembered in case a failure follows */
      x->gone_ms = dg__now_ms();
      x->gone_busy = any_busy(x);
    }
    if (p->state == DG_PAIR_BYE) pair_left(x, p);
    else close_pair(x, p, DG_EPEER);
    pthread_cond_broadcast(&x->cv);
    return;
  }
  if (blame_gone(x, p->peer)) {
    xfail(x, DG_EPEER, x->gone, "rank %d closed its connection first, %lld ms before rank %d "
          "(%s) closed its own (%s) while this rank was in an operation: rank %d "
          "probably failed, and rank %d exited because of it (torch ranks do not say which "
          "peer failed)", x->gone, (long long)(dg__now_ms() - x->gone_ms), p->peer, p->addr,
          why, x->gone, p->peer);
    return;
  }
  int net = err == ETIMEDOUT || err == EHOSTUNREACH || err == ENETUNREACH;
  xfail(x, DG_EPEER, p->peer, "rank %d (%s): %s (%s?)", p->peer, p->addr, why,
        net ? "network down or host unreachable" : "process exited or was killed");
}

/* Reads what the socket has, up to a budget (lock held). */
static void do_read(dg_tcp_xport *x, dg_tcp_pair *p) {
  size_t budget = READ_BUDGET;
  while (p->fd >= 0 && !x->err && budget > 0) {
    void *dst;
    size_t want;
    if (p->rop) {
      dst = (char *)p->rop->buf + p->rgot;
      want = p->rop->nrecv - p->rgot;
    } else {
      dst = (char *)&p->rh + p->rh_got;
      want = DG_TCP_HDR - p->rh_got;
    }
    if (want > budget) want = budget;
    ssize_t r = recv(p->fd, dst, want, MSG_DONTWAIT);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (r <= 0) {
      on_eof(x, p, r < 0 ? errno : 0);
      return;
    }
    budget -= (size_t)r;
    if (p->rop) {
      p->rgot += (size_t)r;
      if (p->rgot == p->rop->nrecv) rop_done(x, p);
    } else if ((p->rh_got += (size_t)r) == DG_TCP_HDR) {
      if (on_header(x, p) < 0) return;
      flush(x, p); /* a RECV_READY may have released data */
    }
  }
}

static void *progress_main(void *arg) {
  dg_tcp_xport *x = arg;
  struct epoll_event ev[64];
  for (;;) {
    int n = epoll_wait(x->ep, ev, 64, -1);
    if (n < 0 && errno != EINTR) break;
    __atomic_store_n(&x->loop_wants_lock, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&x->mu);
    __atomic_store_n(&x->loop_wants_lock, 0, __ATOMIC_RELAXED);
    int stop = x->stop;
    for (int i = 0; i < n && !stop; i++) {
      uint32_t id = ev[i].data.u32;
      if (id == UINT32_MAX) {
        uint64_t v;
        ssize_t rr = read(x->evfd, &v, 8);
        (void)rr;
        continue;
      }
      dg_tcp_pair *p = &x->pairs[id];
      if (p->fd < 0) continue;
      if (ev[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) do_read(x, p);
      if ((ev[i].events & EPOLLOUT) && p->fd >= 0) flush(x, p);
    }
    stop = x->stop;
    pthread_mutex_unlock(&x->mu);
    if (stop) break;
  }
  return NULL;
}

static int tcp_wait(dg_xport *xp, dg_xop *op, int64_t deadline_ms) {
  dg_tcp_xport *x = X(xp);
  /* Busy-poll the op's own socket for a while: on loopback the answer often
   * lands within microseconds, and handing it over from the progress thread
   * costs a wake-up (slow on VMs). */
  /* Not for big transfers: they outlast any spin, and the cycles are better
   * left to the threads doing the copying. */
  int64_t spin_ns = op->n <= DG_TCP_EAGER_MAX ? (int64_t)x->spin_us * 1000 : 0;
  int64_t spin_end = dg__now_ns() + spin_ns;
  dg_tcp_pair *p = &x->pairs[op->peer];
  unsigned turns = 0;
  while (__atomic_load_n(&op->status, __ATOMIC_ACQUIRE) == DG_XOP_PENDING &&
         dg__now_ns() < spin_end) {
    if (__atomic_load_n(&x->loop_wants_lock, __ATOMIC_RELAXED) ||
        pthread_mutex_trylock(&x->mu) != 0) {
      for (int i = 0; i < 64; i++) dg__cpu_relax();
      continue;
    }
    if (p->fd >= 0 && !x->err && op->status == DG_XOP_PENDING) {
      do_read(x, p);
      if (p->out) flush(x, p);
    }
    pthread_mutex_unlock(&x->mu);
    /* On an oversubscribed machine the peer may need this very core; but a
     * yield can cost a whole time slice, so not on every turn. */
    if ((++turns & 15) == 0) sched_yield();
  }
  pthread_mutex_lock(&x->mu);
  while (op->status == DG_XOP_PENDING) {
    int64_t left = deadline_ms - dg__now_ms();
    if (left <= 0) break;
    dg__cond_wait_ms(&x->cv, &x->mu, left > 200 ? 200 : left);
  }
  int st = op->status;
  pthread_mutex_unlock(&x->mu);
  return st == DG_XOP_PENDING ? DG_ETIMEDOUT : st;
}

static void tcp_abort(dg_xport *xp, int code, int peer, const char *msg) {
  dg_tcp_xport *x = X(xp);
  pthread_mutex_lock(&x->mu);
  if (code == DG_ETIMEDOUT && blame_gone(x, peer)) /* waiting for a live rank */
    xfail(x, code, x->gone, "%s; rank %d had closed its connection %lld ms earlier: rank %d "
          "probably failed first", msg, x->gone,
          (long long)(dg__now_ms() - x->gone_ms), x->gone);
  else
    xfail(x, code, peer, "%s", msg);
  pthread_mutex_unlock(&x->mu);
}

static int tcp_error(dg_xport *xp, char *msg, size_t cap) {
  dg_tcp_xport *x = X(xp);
  pthread_mutex_lock(&x->mu);
  int e = x->err;
  if (msg && cap) snprintf(msg, cap, "%s", e ? x->errmsg : "no error");
  pthread_mutex_unlock(&x->mu);
  return e;
}

/* Whether pair p still holds bytes the peer has not acknowledged: in our
 * queue, or in the kernel's send buffer. Closing a socket with unread
 * input resets the connection and drops that buffer, so a rank leaving
 * right after its last send over a slow link (a final broadcast relayed
 * through it) would cut the peer off mid-message. */
static int unsent(const dg_tcp_pair *p) {
  int unacked = 0;
  return p->fd >= 0 && (p->out || (ioctl(p->fd, SIOCOUTQ, &unacked) == 0 && unacked > 0));
}

/* Says goodbye (dgrad-only groups), drains queues, ours and the kernel's,
 * for up to two seconds. */
static void say_bye(dg_tcp_xport *x) {
  pthread_mutex_lock(&x->mu);
  for (int i = 0; i < x->base.size && x->base.all_dgrad && !x->err; i++) {
    dg_tcp_pair *p = &x->pairs[i];
    if (i == x->base.rank || p->fd < 0) continue;
    if (queue_msg(x, p, DG_TCP_BYE, 0, 0, NULL, 0, NULL) == DG_OK) flush(x, p);
  }
  int64_t dl = dg__now_ms() + 2000;
  for (;;) {
    int busy = 0;
    for (int i = 0; i < x->base.size && !busy; i++)
      busy = i != x->base.rank && unsent(&x->pairs[i]);
    if (!busy || x->err || dg__now_ms() >= dl || !x->thr_started) break;
    pthread_mutex_unlock(&x->mu);
    usleep(1000);
    pthread_mutex_lock(&x->mu);
  }
  pthread_mutex_unlock(&x->mu);
}

static void tcp_destroy(dg_xport *xp) {
  dg_tcp_xport *x = X(xp);
  if (!x) return;
  if (x->pairs) say_bye(x);
  if (x->thr_started) {
    pthread_mutex_lock(&x->mu);
    x->stop = 1;
    pthread_mutex_unlock(&x->mu);
    uint64_t one = 1;
    ssize_t w = write(x->evfd, &one, 8);
    (void)w;
    pthread_join(x->thr, NULL);
  }
  for (int i = 0; x->pairs && i < x->base.size; i++) {
    if (i == x->base.rank) continue;
    close_pair(x, &x->pairs[i], DG_ECLOSED);
    dg__free(x->pairs[i].rr);
  }
  dg__free(x->pairs);
  pools_free(x);
  if (x->ep >= 0) close(x->ep);
  if (x->evfd >= 0) close(x->evfd);
  pthread_cond_destroy(&x->cv);
  pthread_mutex_destroy(&x->mu);
  dg__free(x);
}

static const dg_xport_vt tcp_vt = {.name = "tcp", .send = tcp_send, .recv = tcp_recv,
                                   .wait = tcp_wait, .abort = tcp_abort, .error = tcp_error,
                                   .destroy = tcp_destroy};

static int start_loop(dg_tcp_xport *x) {
  x->ep = epoll_create1(EPOLL_CLOEXEC);
  x->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (x->ep < 0 || x->evfd < 0) return DG_ESYS;
  struct epoll_event ev = {.events = EPOLLIN, .data.u32 = UINT32_MAX};
  if (epoll_ctl(x->ep, EPOLL_CTL_ADD, x->evfd, &ev) < 0) return DG_ESYS;
  for (int i = 0; i < x->base.size; i++) {
    dg_tcp_pair *p = &x->pairs[i];
    if (i == x->base.rank) continue;
    dg__set_nonblock(p->fd, 1);
    ev = (struct epoll_event){.events = EPOLLIN, .data.u32 = (uint32_t)i};
    if (epoll_ctl(x->ep, EPOLL_CTL_ADD, p->fd, &ev) < 0) return DG_ESYS;
  }
  if (pthread_create(&x->thr, NULL, progress_main, x) != 0) return DG_ESYS;
  x->thr_started = 1;
  return DG_OK;
}

/* The transport object with its pairs, no sockets yet (NULL: memory). */
static dg_tcp_xport *xport_alloc(int rank, int size, int timeout_ms, int spin_us) {
  dg_tcp_xport *x = dg__calloc(1, sizeof *x);
  if (!x) return NULL;
  x->base.vt = &tcp_vt;
  x->base.rank = rank;
  x->base.size = size;
  x->timeout_ms = timeout_ms > 0 ? timeout_ms : 300000;
  x->base.eager_max = DG_TCP_EAGER_MAX;
  x->spin_us = spin_us > 0 ? spin_us : spin_us < 0 ? 0 : 100;
  x->ep = x->evfd = -1;
  x->gone = -1;
  pthread_mutex_init(&x->mu, NULL);
  pthread_cond_init(&x->cv, NULL);
  x->pairs = dg__calloc((size_t)size, sizeof *x->pairs);
  if (!x->pairs) {
    tcp_destroy(&x->base);
    return NULL;
  }
  for (int i = 0; i < size; i++) {
    x->pairs[i].peer = i;
    x->pairs[i].fd = -1;
  }
  return x;
}

int dg__tcp_xport_adopt(dg_xport **out, int rank, int size, const int *fds, int all_dgrad,
                        int spin_us) {
  if (!out || !fds || size < 1 || rank < 0 || rank >= size) return DG_EINVAL;
  *out = NULL;
  dg_tcp_xport *x = xport_alloc(rank, size, 0, spin_us);
  if (!x) return DG_ENOMEM;
  x->base.all_dgrad = all_dgrad;
  for (int i = 0; i < size; i++) {
    if (i == rank) continue;
    x->pairs[i].fd = fds[i];
    x->pairs[i].dgrad = all_dgrad;
    snprintf(x->pairs[i].addr, sizeof x->pairs[i].addr, "fd %d", fds[i]);
  }
  int rc = pools_warm(x);
  if (rc == DG_OK) rc = start_loop(x);
  if (rc != DG_OK) {
    x->base.all_dgrad = 0;
    tcp_destroy(&x->base);
    return rc;
  }
  *out = &x->base;
  return DG_OK;
}

int dg__tcp_xport_new(dg_xport **out, const dg_xport_opts *o, char *err, size_t cap) {
  if (!out || !o || !o->store || !o->bind_addr || o->size < 1 || o->rank < 0 ||
      o->rank >= o->size)
    return DG_EINVAL;
  *out = NULL;
  dg_tcp_xport *x = xport_alloc(o->rank, o->size, o->timeout_ms, o->spin_us);
  if (!x) return DG_ENOMEM;
  dg_xport_opts oo = *o;
  oo.timeout_ms = x->timeout_ms;
  int rc = dg__tcp_rendezvous(x, &oo, err, cap);
  if (rc == DG_OK && (rc = pools_warm(x)) != DG_OK) snprintf(err, cap, "out of memory");
  if (rc == DG_OK && (rc = start_loop(x)) != DG_OK) snprintf(err, cap, "epoll setup failed");
  if (rc != DG_OK) {
    x->base.all_dgrad = 0; /* no goodbyes on a failed init */
    tcp_destroy(&x->base);
    return rc;
  }
  *out = &x->base;
  return DG_OK;
}
