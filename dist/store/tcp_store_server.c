/* TCPStore server (PyTorch 1.13 protocol): one thread polls the listener and
 * every client; requests are parsed from per-client buffers so partial reads
 * and pipelined requests work; WAIT parks the client until its keys exist.
 * A malformed request closes only that client's connection. With a token
 * (dgrad-only groups) a client must first pass the handshake of
 * tcp_store_impl.h; anything else it sends closes its connection. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dist/store/kv_impl.h"
#include "dist/store/tcp_store_impl.h"
#include "dist/net/auth_impl.h"
#include "dist/net/net_impl.h"
#include "base/common_impl.h"

typedef struct {
  unsigned char *p;
  size_t n, cap, off; /* off: bytes already sent (output) */
} buf_t;

/* A key as it came on the wire: bytes, NUL included (torch keys may hold
 * any byte). */
typedef struct {
  char *p;
  size_t n;
} key_t_;

typedef struct {
  int fd;
  buf_t in, out;
  key_t_ *wait_keys; /* (nwait) keys of a parked WAIT, NULL when not waiting */
  int nwait;
  /* handshake (servers with a token): 0 nothing yet, 1 hello answered,
   * 2 authenticated; the nonces of the hello */
  int auth;
  uint8_t cnonce[DG_AUTH_NONCE], snonce[DG_AUTH_NONCE];
  char addr[64];
} client_t;

struct dg_ts_server {
  int lfd, wake[2];
  pthread_t thr;
  dg_kv kv;
  client_t *cl; /* (ncl) */
  int ncl, capcl;
  /* ncl as last published by the server thread, for dg__ts_server_drain */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int live;
  char *token;     /* NULL: no authentication (torch's protocol as is) */
  int fixed_nonce; /* dg__ts_server_replay: server nonces are all zero */
};

static int buf_put(buf_t *b, const void *p, size_t n) {
  if (!n) return 0; /* b->p may be NULL: no pointer arithmetic on it (fuzz_store) */
  if (b->n + n > b->cap) {
    size_t nc = b->cap ? b->cap : 256;
    while (nc < b->n + n) nc *= 2;
    unsigned char *np = dg__realloc(b->p, nc);
    if (!np) return -1;
    b->p = np;
    b->cap = nc;
  }
  memcpy(b->p + b->n, p, n);
  b->n += n;
  return 0;
}

static void buf_free(buf_t *b) {
  dg__free(b->p);
  memset(b, 0, sizeof *b);
}

static void clear_wait(client_t *c) {
  for (int i = 0; i < c->nwait; i++) dg__free(c->wait_keys[i].p);
  dg__free(c->wait_keys);
  c->wait_keys = NULL;
  c->nwait = 0;
}

static void drop_client(dg_ts_server *s, int i) {
  client_t *c = &s->cl[i];
  if (c->fd >= 0) close(c->fd);
  buf_free(&c->in);
  buf_free(&c->out);
  clear_wait(c);
  s->cl[i] = s->cl[--s->ncl];
}

/* Cursor over a client's input: each get returns 0 when the request is not
 * complete yet, -1 when it is malformed. */
typedef struct {
  const unsigned char *p;
  size_t n, o;
} cur_t;

static int get_u64(cur_t *c, uint64_t *v) {
  if (c->n - c->o < 8) return 0;
  memcpy(v, c->p + c->o, 8);
  c->o += 8;
  return 1;
}

static int get_bytes(cur_t *c, const unsigned char **p, size_t *len, uint64_t max) {
  uint64_t l;
  int r = get_u64(c, &l);
  if (r <= 0) return r;
  if (l > max) return -1;
  if (c->n - c->o < l) return 0;
  *p = c->p + c->o;
  *len = (size_t)l;
  c->o += (size_t)l;
  return 1;
}

static int reply(client_t *c, const void *p, size_t n) { return buf_put(&c->out, p, n); }

static int reply_bytes(client_t *c, const void *p, size_t n) {
  uint64_t l = n;
  return reply(c, &l, 8) || reply(c, p, n) ? -1 : 0;
}

static int keys_present(dg_ts_server *s, const key_t_ *keys, int n) {
  for (int i = 0; i < n; i++)
    if (!dg__kv_find(&s->kv, keys[i].p, keys[i].n)) return 0;
  return 1;
}

static void wake_waiters(dg_ts_server *s) {
  for (int i = 0; i < s->ncl; i++) {
    client_t *c = &s->cl[i];
    if (c->wait_keys && keys_present(s, c->wait_keys, c->nwait)) {
      uint8_t stop = 0;
      clear_wait(c);
      reply(c, &stop, 1);
    }
  }
}

/* The handshake (tcp_store_impl.h), on a server with a token: 1 when
 * `keys` was a step of it (answered), 0 when not, -1 to drop the client. */
static int auth_step(dg_ts_server *s, client_t *c, const key_t_ *keys, uint64_t n, int is_wait) {
  size_t hl = sizeof DG_TS_AUTH_HELLO - 1, pl = sizeof DG_TS_AUTH_PROOF - 1;
  int hello = !is_wait && n == 1 && keys[0].n == hl + DG_AUTH_NONCE &&
              !memcmp(keys[0].p, DG_TS_AUTH_HELLO, hl);
  int proof = !is_wait && n == 1 && keys[0].n == pl + DG_AUTH_MAC &&
              !memcmp(keys[0].p, DG_TS_AUTH_PROOF, pl);
  if (hello && c->auth == 0) {
    uint8_t r[1 + DG_AUTH_NONCE + DG_AUTH_MAC] = {0}; /* READY, nonce, proof */
    memcpy(c->cnonce, keys[0].p + hl, DG_AUTH_NONCE);
    if (!s->fixed_nonce && dg__auth_nonce(c->snonce) != DG_OK) return -1;
    memcpy(r + 1, c->snonce, DG_AUTH_NONCE);
    dg__auth_proof(s->token, DG_TS_AUTH_SERVER, c->cnonce, DG_AUTH_NONCE, c->snonce,
                   DG_AUTH_NONCE, r + 1 + DG_AUTH_NONCE);
    c->auth = 1;
    return reply(c, r, sizeof r) ? -1 : 1;
  }
  if (proof && c->auth == 1) {
    uint8_t want[DG_AUTH_MAC], ok = 0;
    dg__auth_proof(s->token, DG_TS_AUTH_CLIENT, c->cnonce, DG_AUTH_NONCE, c->snonce,
                   DG_AUTH_NONCE, want);
    if (!dg__auth_equal(want, keys[0].p + pl, DG_AUTH_MAC)) {
      DG_LOGW("tcp store server: client %s failed authentication (wrong token); "
              "connection closed", c->addr);
      return -1;
    }
    c->auth = 2;
    return reply(c, &ok, 1) ? -1 : 1;
  }
  if (c->auth == 2) return 0;
  DG_LOGW("tcp store server: client %s sent a request before authenticating (no token, "
          "or torch's TCPStore client); connection closed", c->addr);
  return -1;
}

/* CHECK / WAIT: u64 n then n keys. */
static int handle_keys(dg_ts_server *s, client_t *c, cur_t *cu, int is_wait) {
  uint64_t n;
  int r = get_u64(cu, &n);
  if (r <= 0) return r;
  if (n > DG_TS_MAX_KEYS) return -1;
  key_t_ *keys = dg__calloc(n ? n : 1, sizeof *keys);
  if (!keys) return -1;
  int rc = 1;
  for (uint64_t i = 0; i < n && rc == 1; i++) {
    const unsigned char *k;
    size_t kl;
    rc = get_bytes(cu, &k, &kl, DG_TS_MAX_KEY);
    if (rc == 1 && !(keys[i].p = dg__malloc(kl ? kl : 1))) rc = -1;
    if (rc == 1) {
      if (kl) memcpy(keys[i].p, k, kl);
      keys[i].n = kl;
    }
  }
  int step = rc == 1 && s->token ? auth_step(s, c, keys, n, is_wait) : 0;
  if (step) rc = step; /* a step of the handshake, answered; or drop */
  if (rc == 1 && !step) {
    uint8_t present = (uint8_t)keys_present(s, keys, (int)n);
    if (!is_wait) {
      uint8_t v = present ? 0 : 1; /* READY 0, NOT_READY 1 */
      rc = reply(c, &v, 1) ? -1 : 1;
    } else if (present) {
      uint8_t stop = 0;
      rc = reply(c, &stop, 1) ? -1 : 1;
    } else {
      c->wait_keys = keys;
      c->nwait = (int)n;
      return 1;
    }
  }
  for (uint64_t i = 0; i < n; i++) dg__free(keys[i].p);
  dg__free(keys);
  return rc;
}

static int handle_cas(dg_ts_server *s, client_t *c, cur_t *cu) {
  const unsigned char *k, *e, *d;
  size_t kl, el, dl;
  int r;
  if ((r = get_bytes(cu, &k, &kl, DG_TS_MAX_KEY)) <= 0) return r;
  if ((r = get_bytes(cu, &e, &el, DG_TS_MAX_VALUE)) <= 0) return r;
  if ((r = get_bytes(cu, &d, &dl, DG_TS_MAX_VALUE)) <= 0) return r;
  dg_kv_entry *ent = dg__kv_find(&s->kv, (const char *)k, kl);
  if (!ent) {
    if (el != 0) return reply_bytes(c, e, el) ? -1 : 1;
    if (dg__kv_set(&s->kv, (const char *)k, kl, d, dl) < 0) return -1;
  } else if (ent->vlen == el && (el == 0 || !memcmp(ent->val, e, el))) {
    if (dg__kv_set(&s->kv, (const char *)k, kl, d, dl) < 0) return -1;
  }
  ent = dg__kv_find(&s->kv, (const char *)k, kl);
  wake_waiters(s);
  return reply_bytes(c, ent->val, ent->vlen) ? -1 : 1;
}

/* Parses and executes one request; 1 done, 0 incomplete, -1 drop client. */
static int handle_one(dg_ts_server *s, client_t *c, cur_t *cu) {
  const unsigned char *k, *v;
  size_t kl, vl;
  uint64_t u;
  int r;
  if (cu->o >= cu->n) return 0;
  uint8_t q = cu->p[cu->o++];
  if (s->token && c->auth != 2 && q != DG_TS_CHECK) { /* only the handshake's CHECKs */
    DG_LOGW("tcp store server: client %s sent query %u before authenticating (no token, "
            "or torch's TCPStore client); connection closed", c->addr, q);
    return -1;
  }
  switch (q) {
    case DG_TS_SET:
      if ((r = get_bytes(cu, &k, &kl, DG_TS_MAX_KEY)) <= 0) return r;
      if ((r = get_bytes(cu, &v, &vl, DG_TS_MAX_VALUE)) <= 0) return r;
      if (dg__kv_set(&s->kv, (const char *)k, kl, v, vl) < 0) return -1;
      wake_waiters(s);
      return 1;
    case DG_TS_COMPARE_SET:
      return handle_cas(s, c, cu);
    case DG_TS_GET: {
      if ((r = get_bytes(cu, &k, &kl, DG_TS_MAX_KEY)) <= 0) return r;
      dg_kv_entry *e = dg__kv_find(&s->kv, (const char *)k, kl);
      if (!e) return -1; /* torch 1.13 drops the connection too */
      return reply_bytes(c, e->val, e->vlen) ? -1 : 1;
    }
    case DG_TS_ADD: {
      int64_t res;
      if ((r = get_bytes(cu, &k, &kl, DG_TS_MAX_KEY)) <= 0) return r;
      if ((r = get_u64(cu, &u)) <= 0) return r;
      if (dg__kv_add(&s->kv, (const char *)k, kl, (int64_t)u, &res) < 0) return -1;
      wake_waiters(s);
      return reply(c, &res, 8) ? -1 : 1;
    }
    case DG_TS_CHECK:
    case DG_TS_WAIT:
      return handle_keys(s, c, cu, q == DG_TS_WAIT);
    case DG_TS_GETNUMKEYS: {
      int64_t n = (int64_t)s->kv.n;
      return reply(c, &n, 8) ? -1 : 1;
    }
    case DG_TS_DELETE_KEY: {
      if ((r = get_bytes(cu, &k, &kl, DG_TS_MAX_KEY)) <= 0) return r;
      int64_t n = dg__kv_del(&s->kv, (const char *)k, kl);
      return reply(c, &n, 8) ? -1 : 1;
    }
    default: /* WATCH_KEY (unused by torch's init) and garbage */
      DG_LOGW("tcp store server: unsupported query %u; closing that connection", q);
      return -1;
  }
}

/* Runs every complete request in the client's buffer. -1: drop it. */
static int process_input(dg_ts_server *s, client_t *c) {
  size_t used = 0;
  if (!c->in.n) return 0; /* in.p may be NULL */
  while (!c->wait_keys) {
    cur_t cu = {c->in.p + used, c->in.n - used, 0};
    int r = handle_one(s, c, &cu);
    if (r < 0) return -1;
    if (r == 0) break;
    used += cu.o;
  }
  if (used) {
    memmove(c->in.p, c->in.p + used, c->in.n - used);
    c->in.n -= used;
  }
  return 0;
}

static int flush_out(client_t *c) {
  while (c->out.off < c->out.n) {
    ssize_t w = send(c->fd, c->out.p + c->out.off, c->out.n - c->out.off,
                     MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (w <= 0) return -1;
    c->out.off += (size_t)w;
  }
  c->out.n = c->out.off = 0;
  return 0;
}

static int read_client(dg_ts_server *s, client_t *c) {
  unsigned char tmp[65536];
  for (;;) {
    ssize_t r = recv(c->fd, tmp, sizeof tmp, MSG_DONTWAIT);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (r <= 0) return -1;
    if (buf_put(&c->in, tmp, (size_t)r) < 0) return -1;
    if (process_input(s, c) < 0) return -1;
    if ((size_t)r < sizeof tmp) break;
  }
  return 0;
}

static void accept_clients(dg_ts_server *s) {
  for (;;) {
    struct sockaddr_storage pa;
    socklen_t pl = sizeof pa;
    int fd = accept4(s->lfd, (struct sockaddr *)&pa, &pl, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    if (s->ncl == s->capcl) {
      int nc = s->capcl ? s->capcl * 2 : 16;
      client_t *ncl = dg__realloc(s->cl, (size_t)nc * sizeof *ncl);
      if (!ncl) {
        close(fd);
        return;
      }
      s->cl = ncl;
      s->capcl = nc;
    }
    dg__set_nodelay(fd);
    memset(&s->cl[s->ncl], 0, sizeof s->cl[0]);
    dg__addr_str(&pa, s->cl[s->ncl].addr, sizeof s->cl[0].addr);
    s->cl[s->ncl++].fd = fd;
  }
}

/* Publishes the client count after each round of the poll loop. */
static void publish_live(dg_ts_server *s) {
  pthread_mutex_lock(&s->mu);
  s->live = s->ncl;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

static void *server_main(void *arg) {
  dg_ts_server *s = arg;
  struct pollfd *pf = NULL;
  int cap = 0;
  for (;;) {
    int n = s->ncl + 2;
    if (n > cap) {
      cap = n * 2;
      struct pollfd *np = dg__realloc(pf, (size_t)cap * sizeof *pf);
      if (!np) { usleep(10000); continue; }
      pf = np;
    }
    pf[0] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
    pf[1] = (struct pollfd){.fd = s->lfd, .events = POLLIN};
    for (int i = 0; i < s->ncl; i++)
      pf[i + 2] = (struct pollfd){.fd = s->cl[i].fd,
                                  .events = POLLIN | (s->cl[i].out.n ? POLLOUT : 0)};
    int ncl = s->ncl;
    if (poll(pf, (nfds_t)n, -1) < 0 && errno != EINTR) break;
    if (pf[0].revents) break;
    /* Walk backwards: drop_client moves the last client into the hole. */
    for (int i = ncl - 1; i >= 0; i--) {
      if (!pf[i + 2].revents) continue;
      client_t *c = &s->cl[i];
      int bad = (pf[i + 2].revents & (POLLIN | POLLHUP | POLLERR)) && read_client(s, c) < 0;
      if (bad) drop_client(s, i);
    }
    /* A client whose WAIT was released may have pipelined requests. */
    for (int i = s->ncl - 1; i >= 0; i--)
      if (s->cl[i].in.n && !s->cl[i].wait_keys && process_input(s, &s->cl[i]) < 0)
        drop_client(s, i);
    for (int i = s->ncl - 1; i >= 0; i--)
      if (s->cl[i].out.n && flush_out(&s->cl[i]) < 0) drop_client(s, i);
    if (pf[1].revents) accept_clients(s);
    publish_live(s);
  }
  dg__free(pf);
  return NULL;
}

/* Listens on `at` (NULL: every address, dual stack where IPv6 exists).
 * Returns the fd or -errno; *tried gets the address of the last attempt. */
static int listen_on(const struct sockaddr_storage *at, int port, struct sockaddr_storage *tried) {
  if (at) {
    *tried = *at;
    return dg__listen_tcp(at, at->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                        : sizeof(struct sockaddr_in), 1024);
  }
  struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port),
                            .sin6_addr = in6addr_any};
  memset(tried, 0, sizeof *tried);
  memcpy(tried, &a6, sizeof a6);
  int fd = dg__listen_tcp(tried, sizeof a6, 1024);
  if (fd >= 0 || fd == -EADDRINUSE || fd == -EACCES) return fd; /* else: no IPv6 here */
  struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                           .sin_addr.s_addr = htonl(INADDR_ANY)};
  memset(tried, 0, sizeof *tried);
  memcpy(tried, &a4, sizeof a4);
  return dg__listen_tcp(tried, sizeof a4, 1024);
}

/* "failed to bind ADDR (errno N: text)" and what to do about it. */
static void bind_msg(const struct sockaddr_storage *ss, int e, char *why, size_t cap) {
  char a[80];
  const char *hint = e == EADDRINUSE ? ": another process holds this port (another job, or an "
                                       "earlier run not yet exited); choose another port "
                                       "(MASTER_PORT)"
                     : e == EACCES ? ": ports below 1024 need privileges; choose another port "
                                     "(MASTER_PORT)"
                     : e == EADDRNOTAVAIL ? ": that address is not one of this host's"
                                          : "";
  snprintf(why, cap, "failed to bind %s (errno %d: %s)%s", dg__addr_str(ss, a, sizeof a), e,
           strerror(e), hint);
}

int dg__ts_server_start(dg_ts_server **out, const struct sockaddr_storage *at, int *port,
                        const char *token, int *eno, char *why, size_t cap) {
  dg_ts_server *s = dg__calloc(1, sizeof *s);
  if (!s) return DG_ENOMEM;
  if (token && *token && !(s->token = dg__strdup(token))) {
    dg__free(s);
    return DG_ENOMEM;
  }
  s->wake[0] = s->wake[1] = -1;
  struct sockaddr_storage ss;
  s->lfd = listen_on(at, *port, &ss);
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  int err = s->lfd < 0 ? -s->lfd : 0;
  *eno = err;
  if (err) bind_msg(&ss, err, why, cap);
  if (!err && pipe2(s->wake, O_CLOEXEC) < 0) {
    err = errno;
    snprintf(why, cap, "pipe: %s", strerror(err));
  }
  if (!err) {
    dg__set_nonblock(s->lfd, 1);
    socklen_t l = sizeof ss;
    getsockname(s->lfd, (struct sockaddr *)&ss, &l);
    *port = dg__sockaddr_port(&ss);
    if (pthread_create(&s->thr, NULL, server_main, s) != 0) {
      err = EAGAIN;
      snprintf(why, cap, "cannot start the server thread");
    }
  }
  if (err) {
    if (s->lfd >= 0) close(s->lfd);
    if (s->wake[0] >= 0) close(s->wake[0]);
    if (s->wake[1] >= 0) close(s->wake[1]);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    dg__free(s->token);
    dg__free(s);
    return err == EADDRINUSE ? DG_ESTATE : DG_ESYS;
  }
  *out = s;
  return DG_OK;
}

int dg__ts_server_drain(dg_ts_server *s, int64_t deadline, int quiet_ms) {
  pthread_mutex_lock(&s->mu);
  int64_t idle_since = -1; /* when the last client left */
  for (int64_t now = dg__now_ms(); now < deadline; now = dg__now_ms()) {
    if (s->live > 0) idle_since = -1;
    else if (idle_since < 0) idle_since = now;
    if (idle_since >= 0 && now - idle_since >= quiet_ms) break;
    int64_t ms = idle_since < 0 ? 100 : idle_since + quiet_ms - now;
    dg__cond_wait_ms(&s->cv, &s->mu, DG_MIN(deadline - now, ms));
  }
  int left = s->live;
  pthread_mutex_unlock(&s->mu);
  return left;
}

void dg__ts_server_stop(dg_ts_server *s) {
  if (!s) return;
  char b = 1;
  ssize_t w = write(s->wake[1], &b, 1);
  (void)w;
  pthread_join(s->thr, NULL);
  while (s->ncl) drop_client(s, s->ncl - 1);
  dg__free(s->cl);
  dg__kv_free(&s->kv);
  close(s->lfd);
  close(s->wake[0]);
  close(s->wake[1]);
  pthread_cond_destroy(&s->cv);
  pthread_mutex_destroy(&s->mu);
  dg__free(s->token);
  dg__free(s);
}

/* One record of a replay: the client it is for gets the bytes; after a
 * failed request or a hang-up it is dropped, and a later record for it
 * opens a fresh connection. Then, as in server_main, clients whose WAIT
 * was released run what they had pipelined. Replies are discarded. */
static int replay_record(dg_ts_server *s, int who, const uint8_t *p, size_t len, int hangup) {
  int dropped = 0;
  while (s->ncl <= who) {
    memset(&s->cl[s->ncl], 0, sizeof s->cl[0]);
    s->cl[s->ncl].fd = -1;
    snprintf(s->cl[s->ncl].addr, sizeof s->cl[0].addr, "replay client %d", s->ncl);
    s->ncl++;
  }
  client_t *c = &s->cl[who];
  if (buf_put(&c->in, p, len) < 0 || process_input(s, c) < 0 || hangup) {
    dropped = !hangup;
    drop_client(s, who); /* the last one moves into its place */
  }
  for (int i = s->ncl - 1; i >= 0; i--)
    if (s->cl[i].in.n && !s->cl[i].wait_keys && process_input(s, &s->cl[i]) < 0) {
      drop_client(s, i);
      dropped++;
    }
  for (int i = 0; i < s->ncl; i++) s->cl[i].out.n = s->cl[i].out.off = 0;
  return dropped;
}

int dg__ts_server_replay(const uint8_t *data, size_t n, const char *token) {
  dg_ts_server s;
  memset(&s, 0, sizeof s);
  s.fixed_nonce = 1;
  s.token = (char *)(token && *token ? token : NULL);
  s.cl = dg__calloc(DG_TS_REPLAY_CLIENTS, sizeof *s.cl);
  if (!s.cl) return DG_ENOMEM;
  s.capcl = DG_TS_REPLAY_CLIENTS;
  int dropped = 0;
  for (size_t o = 0; o + 2 <= n;) {
    int who = data[o] % DG_TS_REPLAY_CLIENTS, hangup = (data[o] >> 2) & 1;
    size_t len = DG_MIN((size_t)data[o + 1], n - o - 2);
    if (who > s.ncl) who = s.ncl; /* clients are numbered densely */
    dropped += replay_record(&s, who, data + o + 2, len, hangup);
    o += 2 + len;
  }
  while (s.ncl) drop_client(&s, s.ncl - 1);
  dg__free(s.cl);
  dg__kv_free(&s.kv);
  return dropped;
}
