/* Gloo 2022 connectFullMesh over a store: hostnames under "rank_<r>", one
 * listener per pair, the 136-byte address blobs of all peers under "<r>",
 * and Gloo's connect rule (compare IP bytes, then the byte-swapped ports;
 * the greater side dials). No handshake bytes: a pair is known by its port;
 * with an auth token (dgrad-only groups) each pair first runs the
 * handshake of tcp_impl.h, and a listener keeps serving until a connection
 * passes it. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "dist/net/auth_impl.h"
#include "dist/net/net_impl.h"
#include "dist/transport/tcp/tcp_impl.h"
#include "base/common_impl.h"

typedef struct {
  int lfd;     /* our listener for this pair (-1 once closed) */
  int fd;      /* connected socket, or the one being connected */
  int dialing; /* this side connects */
  int dgrad;   /* the peer runs dgrad */
  struct sockaddr_storage self, peer;
  /* handshake (with a token): 0 none, 1 our hello sent, 2 our proof sent,
   * 3 done; our nonce, the peer's, bytes of the peer's message so far */
  int ast;
  int64_t adl; /* an accepted connection must finish by then */
  uint8_t mine[DG_AUTH_NONCE], theirs[DG_AUTH_NONCE], in[DG_TCP_AUTH_MSG];
  size_t got;
  char from[64];
} conn_t;

static void addr_to_blob(const struct sockaddr_storage *ss, unsigned char *blob) {
  memset(blob, 0, DG_TCP_BLOB);
  size_t n = ss->ss_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
  memcpy(blob, ss, n);
  int64_t seq = -1; /* the 2022 protocol */
  memcpy(blob + 128, &seq, 8);
}

static int blob_to_addr(const unsigned char *blob, struct sockaddr_storage *ss) {
  uint16_t fam;
  memcpy(&fam, blob, 2);
  memset(ss, 0, sizeof *ss);
  if (fam == AF_INET) memcpy(ss, blob, sizeof(struct sockaddr_in));
  else if (fam == AF_INET6) memcpy(ss, blob, sizeof(struct sockaddr_in6));
  else return -1;
  return 0;
}

/* Gloo's rule: >0 this side dials, <0 it accepts, 0 is an error. */
static int compare_addr(const struct sockaddr_storage *a, const struct sockaddr_storage *b) {
  int rv;
  uint16_t pa, pb; /* network-order fields read as host integers */
  if (a->ss_family != b->ss_family) return a->ss_family - b->ss_family;
  if (a->ss_family == AF_INET) {
    const struct sockaddr_in *x = (const void *)a, *y = (const void *)b;
    rv = memcmp(&x->sin_addr, &y->sin_addr, sizeof x->sin_addr);
    pa = x->sin_port;
    pb = y->sin_port;
  } else {
    const struct sockaddr_in6 *x = (const void *)a, *y = (const void *)b;
    rv = memcmp(&x->sin6_addr, &y->sin6_addr, sizeof x->sin6_addr);
    pa = x->sin6_port;
    pb = y->sin6_port;
  }
  return rv ? rv : (int)pa - (int)pb;
}

static socklen_t ss_len(const struct sockaddr_storage *ss) {
  return ss->ss_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
}

/* ---- the pair handshake (tcp_impl.h) ---- */

static void put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

int dg__tcp_auth_hello_parse(const uint8_t msg[DG_TCP_AUTH_MSG], int from, int to,
                             uint8_t nonce[16]) {
  uint8_t want[16] = DG_TCP_AUTH_MAGIC;
  put_u32(want + 8, (uint32_t)from);
  put_u32(want + 12, (uint32_t)to);
  if (memcmp(msg, want, 16)) return -1;
  memcpy(nonce, msg + 16, 16);
  return 0;
}

/* The proof rank `from` sends rank `to` (whose nonce is nto). */
static void pair_proof(const char *token, int from, int to, const uint8_t *nto,
                       const uint8_t *nfrom, uint8_t out[DG_AUTH_MAC]) {
  uint8_t a[8 + DG_AUTH_NONCE];
  put_u32(a, (uint32_t)from);
  put_u32(a + 4, (uint32_t)to);
  memcpy(a + 8, nto, DG_AUTH_NONCE);
  dg__auth_proof(token, DG_TCP_AUTH_LABEL, a, sizeof a, nfrom, DG_AUTH_NONCE, out);
}

static int send_msg(int fd, const uint8_t *m) {
  ssize_t w = send(fd, m, DG_TCP_AUTH_MSG, MSG_NOSIGNAL | MSG_DONTWAIT);
  return w == DG_TCP_AUTH_MSG ? 0 : -1; /* a fresh socket takes 32 bytes at once */
}

/* Starts the handshake on a connected socket: our hello. */
static int auth_start(conn_t *p, const dg_xport_opts *o, int peer) {
  uint8_t m[DG_TCP_AUTH_MSG] = DG_TCP_AUTH_MAGIC;
  put_u32(m + 8, (uint32_t)o->rank);
  put_u32(m + 12, (uint32_t)peer);
  if (dg__auth_nonce(p->mine) != DG_OK) return -1;
  memcpy(m + 16, p->mine, DG_AUTH_NONCE);
  p->ast = 1;
  p->got = 0;
  p->adl = dg__deadline(DG_MIN(o->timeout_ms, 10000), 10000);
  return send_msg(p->fd, m);
}

/* Reads what the peer sent: 1 done, 0 more to come, -1 failed (why). */
static int auth_progress(conn_t *p, const dg_xport_opts *o, int peer, const char **why) {
  for (;;) {
    ssize_t r = recv(p->fd, p->in + p->got, DG_TCP_AUTH_MSG - p->got, MSG_DONTWAIT);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (r <= 0) {
      *why = "it closed the connection (a different token, or none?)";
      return -1;
    }
    if ((p->got += (size_t)r) < DG_TCP_AUTH_MSG) continue;
    p->got = 0;
    uint8_t m[DG_AUTH_MAC];
    if (p->ast == 1) { /* their hello in: our proof out */
      if (dg__tcp_auth_hello_parse(p->in, peer, o->rank, p->theirs) < 0) {
        *why = "not a dgrad pair hello for this pair of ranks";
        return -1;
      }
      pair_proof(o->auth_token, o->rank, peer, p->theirs, p->mine, m);
      p->ast = 2;
      if (send_msg(p->fd, m) < 0) {
        *why = "cannot send the proof";
        return -1;
      }
      continue;
    }
    pair_proof(o->auth_token, peer, o->rank, p->mine, p->theirs, m);
    if (!dg__auth_equal(m, p->in, DG_AUTH_MAC)) {
      *why = "wrong proof: it holds a different auth token";
      return -1;
    }
    p->ast = 3;
    return 1;
  }
}

/* Step 1: hostnames (Gloo computes local ranks from them; torch ranks wait
 * for ours). */
static int exchange_hostnames(dg_store *st, int rank, char *err, size_t cap) {
  char host[256] = "localhost", key[32];
  gethostname(host, sizeof host - 1);
  snprintf(key, sizeof key, "rank_%d", rank);
  int rc = dg_store_set(st, key, host, strlen(host));
  for (int i = 0; rc == DG_OK && i < rank; i++) {
    void *v = NULL;
    size_t n;
    snprintf(key, sizeof key, "rank_%d", i);
    rc = dg_store_get(st, key, &v, &n, 0);
    dg_store_value_free(v);
  }
  if (rc != DG_OK) snprintf(err, cap, "rendezvous: %s", dg_store_errmsg(st));
  return rc;
}

/* Step 2: a listener per peer, all addresses published under "<rank>". */
static int publish(dg_tcp_xport *x, const dg_xport_opts *o, conn_t *c, char *err, size_t cap) {
  int W = o->size, r = o->rank;
  unsigned char *blobs = dg__calloc((size_t)(W > 1 ? W - 1 : 1), DG_TCP_BLOB);
  if (!blobs) return DG_ENOMEM;
  int rc = DG_OK, k = 0;
  for (int i = 0; i < W && rc == DG_OK; i++) {
    if (i == r) continue;
    struct sockaddr_storage ss = *o->bind_addr;
    if (ss.ss_family == AF_INET) ((struct sockaddr_in *)&ss)->sin_port = 0;
    else ((struct sockaddr_in6 *)&ss)->sin6_port = 0;
    c[i].lfd = dg__listen_tcp(&ss, ss_len(&ss), 1);
    if (c[i].lfd < 0) {
      snprintf(err, cap, "rendezvous: cannot listen for rank %d: %s", i, strerror(-c[i].lfd));
      rc = DG_ESYS;
      break;
    }
    socklen_t l = sizeof c[i].self;
    getsockname(c[i].lfd, (struct sockaddr *)&c[i].self, &l);
    addr_to_blob(&c[i].self, blobs + (size_t)k++ * DG_TCP_BLOB);
  }
  char key[16];
  snprintf(key, sizeof key, "%d", r);
  if (rc == DG_OK && (rc = dg_store_set(o->store, key, blobs, (size_t)k * DG_TCP_BLOB)))
    snprintf(err, cap, "rendezvous: %s", dg_store_errmsg(o->store));
  dg__free(blobs);
  (void)x;
  return rc;
}

/* Step 3a: read peer i's blobs, pick ours, dial when the rule says so. */
static int start_pair(const dg_xport_opts *o, int i, conn_t *c, char *err, size_t cap) {
  char key[16];
  void *v = NULL;
  size_t n = 0;
  snprintf(key, sizeof key, "%d", i);
  int rc = dg_store_get(o->store, key, &v, &n, 0);
  if (rc != DG_OK) {
    snprintf(err, cap, "rendezvous: waiting for the address of rank %d: %s", i,
             dg_store_errmsg(o->store));
    return rc;
  }
  int dg = o->check ? o->check(o->check_arg, i) : 0;
  if (dg < 0) {
    dg_store_value_free(v);
    return dg;
  }
  if (!dg && o->auth_token && *o->auth_token) {
    dg_store_value_free(v);
    snprintf(err, cap, "rendezvous: rank %d does not run dgrad (torch or libgloo), but this "
             "rank has an auth token: tokens need groups whose ranks all run dgrad (torch's "
             "TCPStore and Gloo have no authentication)", i);
    return DG_EUNSUPPORTED;
  }
  c->dgrad = dg;
  size_t idx = (size_t)(o->rank > i ? o->rank - 1 : o->rank);
  if (n != (size_t)(o->size - 1) * DG_TCP_BLOB || blob_to_addr((unsigned char *)v + idx * DG_TCP_BLOB, &c->peer) < 0) {
    snprintf(err, cap, "rendezvous: rank %d published %zu bytes of addresses, expected %d "
             "(world size %d): do all ranks agree on the world size?", i, n,
             (o->size - 1) * DG_TCP_BLOB, o->size);
    dg_store_value_free(v);
    return DG_EMISMATCH;
  }
  dg_store_value_free(v);
  int cmp = compare_addr(&c->self, &c->peer);
  if (cmp == 0) {
    snprintf(err, cap, "rendezvous: rank %d has the same address as this rank", i);
    return DG_EINVAL;
  }
  if (cmp < 0) return DG_OK; /* we accept */
  close(c->lfd);
  c->lfd = -1;
  c->dialing = 1;
  c->fd = socket(c->peer.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (c->fd < 0 || (connect(c->fd, (struct sockaddr *)&c->peer, ss_len(&c->peer)) < 0 &&
                    errno != EINPROGRESS)) {
    char a[64];
    snprintf(err, cap, "rendezvous: connect to rank %d at %s: %s", i,
             dg__addr_str(&c->peer, a, sizeof a), strerror(errno));
    return DG_EPEER;
  }
  return DG_OK;
}

/* A connection to pair i's listener failed the handshake: it is closed and
 * the listener keeps waiting for rank i (a stranger never takes its place
 * nor stops the rank). */
static void reject(const dg_xport_opts *o, int i, conn_t *p, const char *why) {
  DG_LOGW("rendezvous: rank %d: a connection from %s to the listener for rank %d failed "
          "authentication (%s); closed, still waiting for rank %d", o->rank, p->from, i, why, i);
  close(p->fd);
  p->fd = -1;
  p->ast = 0;
}

/* One poll event of pair i (a dial finished, a connection came, handshake
 * bytes arrived). */
static int pair_event(const dg_xport_opts *o, int i, conn_t *p, int tok, char *err, size_t cap) {
  const char *why = "";
  if (p->dialing == 1) {
    int e = 0;
    socklen_t el = sizeof e;
    getsockopt(p->fd, SOL_SOCKET, SO_ERROR, &e, &el);
    if (e) {
      snprintf(err, cap, "rendezvous: connect to rank %d: %s", i, strerror(e));
      return DG_EPEER;
    }
    p->dialing = 2; /* connected */
    if (tok && auth_start(p, o, i) < 0) {
      snprintf(err, cap, "rendezvous: rank %d: cannot start authentication", i);
      return DG_EPEER;
    }
    return DG_OK;
  }
  if (p->fd < 0) { /* the listener */
    struct sockaddr_storage pa;
    socklen_t pl = sizeof pa;
    p->fd = accept4(p->lfd, (struct sockaddr *)&pa, &pl, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (p->fd < 0) return DG_OK;
    dg__addr_str(&pa, p->from, sizeof p->from);
    if (tok && auth_start(p, o, i) < 0) reject(o, i, p, "cannot send the hello");
    else if (!tok) close(p->lfd), p->lfd = -1;
    return DG_OK;
  }
  int r = auth_progress(p, o, i, &why);
  if (r == 1 && !p->dialing) close(p->lfd), p->lfd = -1;
  if (r >= 0) return DG_OK;
  if (!p->dialing) {
    reject(o, i, p, why);
    return DG_OK;
  }
  snprintf(err, cap, "rendezvous: authentication with rank %d failed: %s (DG_AUTH_TOKEN must "
           "be the same on every rank)", i, why);
  return strstr(why, "wrong proof") ? DG_EMISMATCH : DG_EPEER;
}

/* Step 3b: finish every dial and accept (and handshake), all at once,
 * until the deadline. */
/* Data unacknowledged for half the timeout fails the connection: over a
 * cut link the ranks behind it are named, not a rank waiting too. A rank
 * that only receives sends nothing to go unacknowledged, so idle pairs send
 * keepalive probes after a quarter of the timeout (whole seconds, at least
 * 1); with the user timeout set, the kernel fails the connection once a
 * probe has gone unanswered past it. A stopped or busy peer's kernel still
 * answers probes: only a dead link or host fails them. */
static void set_liveness(int fd, int timeout_ms) {
  int uto = timeout_ms / 2, on = 1, idle = DG_MAX(1, timeout_ms / 4000), intvl = 1;
  (void)setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &uto, sizeof uto);
  (void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
  (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
}

static int finish_pairs(const dg_xport_opts *o, conn_t *c, int64_t deadline, char *err,
                        size_t cap) {
  int W = o->size, tok = o->auth_token && *o->auth_token;
  struct pollfd *pf = dg__calloc((size_t)W, sizeof *pf);
  int *who = dg__calloc((size_t)W, sizeof *who);
  int rc = pf && who ? DG_OK : DG_ENOMEM;
  for (;;) {
    int n = 0;
    for (int i = 0; i < W && rc == DG_OK; i++) {
      conn_t *p = &c[i];
      if (i == o->rank) continue;
      if (p->fd >= 0 && !p->dialing && (p->ast == 1 || p->ast == 2) && dg__now_ms() > p->adl)
        reject(o, i, p, "silent past the handshake's deadline");
      if (p->dialing == 1)
        pf[n] = (struct pollfd){.fd = p->fd, .events = POLLOUT}, who[n++] = i;
      else if (p->fd >= 0 && (p->ast == 1 || p->ast == 2))
        pf[n] = (struct pollfd){.fd = p->fd, .events = POLLIN}, who[n++] = i;
      else if (!p->dialing && p->lfd >= 0 && p->fd < 0)
        pf[n] = (struct pollfd){.fd = p->lfd, .events = POLLIN}, who[n++] = i;
    }
    if (rc != DG_OK || n == 0) break;
    int64_t left = deadline - dg__now_ms();
    if (left <= 0) {
      snprintf(err, cap, "rendezvous: timed out connecting to rank %d%s", who[0],
               tok && c[who[0]].ast ? " (in authentication)" : "");
      rc = DG_ETIMEDOUT;
      break;
    }
    if (poll(pf, (nfds_t)n, left > 200 ? 200 : (int)left) < 0 && errno != EINTR) {
      rc = DG_ESYS;
      break;
    }
    for (int k = 0; k < n && rc == DG_OK; k++)
      if (pf[k].revents) rc = pair_event(o, who[k], &c[who[k]], tok, err, cap);
  }
  dg__free(pf);
  dg__free(who);
  return rc;
}

int dg__tcp_rendezvous(dg_tcp_xport *x, const dg_xport_opts *o, char *err, size_t cap) {
  int W = o->size;
  conn_t *c = dg__calloc((size_t)W, sizeof *c);
  if (!c) return DG_ENOMEM;
  for (int i = 0; i < W; i++) c[i].lfd = c[i].fd = -1;
  int rc = exchange_hostnames(o->store, o->rank, err, cap);
  if (rc == DG_OK) rc = publish(x, o, c, err, cap);
  for (int i = 0; i < W && rc == DG_OK; i++)
    if (i != o->rank) rc = start_pair(o, i, &c[i], err, cap);
  if (rc == DG_OK) rc = finish_pairs(o, c, dg__deadline(0, 5 * o->timeout_ms), err, cap);
  x->base.all_dgrad = 1;
  for (int i = 0; i < W; i++) {
    if (i != o->rank && !c[i].dgrad) x->base.all_dgrad = 0;
    if (c[i].lfd >= 0) close(c[i].lfd);
    if (i == o->rank) continue;
    if (rc == DG_OK) {
      x->pairs[i].fd = c[i].fd;
      x->pairs[i].dgrad = c[i].dgrad;
      dg__set_nodelay(c[i].fd);
      set_liveness(c[i].fd, o->timeout_ms);
      dg__addr_str(&c[i].peer, x->pairs[i].addr, sizeof x->pairs[i].addr);
    } else if (c[i].fd >= 0) {
      close(c[i].fd);
    }
  }
  dg__free(c);
  return rc;
}
