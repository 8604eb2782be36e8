/* TCPStore client (PyTorch 1.13 protocol) and, with is_server, the server
 * thread in the same handle. One request in flight per connection; every key
 * gets torch's "/" prefix except the "init/" worker counter. A failed or
 * timed-out exchange drops the connection; the next call reconnects, so a
 * late WAIT reply can never be taken for another request's answer. */
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "dist/store/store_impl.h"
#include "dist/store/tcp_store_impl.h"
#include "dist/net/auth_impl.h"
#include "dist/net/net_impl.h"
#include "base/common_impl.h"

typedef struct {
  dg_store base;
  pthread_mutex_t mu;
  int fd;
  char host[256];
  int port;
  struct sockaddr_storage addr;
  socklen_t alen;
  dg_ts_server *server;
  int was_up; /* connected once: a refusal now means the server left */
  char *token; /* shared secret (NULL: none): every connection authenticates */
} tcp_store;

#define T(s) ((tcp_store *)(s))

typedef struct {
  unsigned char *p;
  size_t n, cap;
  int oom;
} req_t;

static void put(req_t *r, const void *p, size_t n) {
  if (r->oom) return;
  if (r->n + n > r->cap) {
    size_t nc = r->cap ? r->cap : 128;
    while (nc < r->n + n) nc *= 2;
    unsigned char *np = dg__realloc(r->p, nc);
    if (!np) {
      r->oom = 1;
      return;
    }
    r->p = np;
    r->cap = nc;
  }
  memcpy(r->p + r->n, p, n);
  r->n += n;
}

static void put_u64(req_t *r, uint64_t v) { put(r, &v, 8); }
static void put_bytes(req_t *r, const void *p, size_t n) {
  put_u64(r, n);
  put(r, p, n);
}
/* Keys travel with torch's "/" prefix. */
static void put_key(req_t *r, const char *key, int raw) {
  size_t n = strlen(key);
  put_u64(r, n + (raw ? 0 : 1));
  if (!raw) put(r, "/", 1);
  put(r, key, n);
}

static int io_fail(dg_store *s, int err, const char *what) {
  tcp_store *t = T(s);
  if (t->fd >= 0) close(t->fd);
  t->fd = -1;
  if (err == -ETIMEDOUT)
    return dg__store_fail(s, DG_ETIMEDOUT, "tcp store %s:%d: %s timed out", t->host, t->port,
                          what);
  int closed = err == -EPIPE || err == -ECONNRESET;
  return dg__store_fail(s, DG_EPEER, "tcp store %s:%d: %s failed: %s%s", t->host, t->port, what,
                        err == -EPIPE ? "connection closed by the server" : strerror(-err),
                        closed && !t->token ? " (a server with an auth token closes connections "
                                              "that present none: DG_AUTH_TOKEN)" : "");
}

/* Sends CHECK of one key, key = prefix || tail, and reads the 1-byte reply. */
static int auth_check(tcp_store *t, const char *prefix, size_t pl, const uint8_t *tail,
                      size_t tl, uint8_t *resp, int64_t dl) {
  unsigned char m[1 + 8 + 8 + 64];
  uint64_t one = 1, kl = pl + tl;
  m[0] = DG_TS_CHECK;
  memcpy(m + 1, &one, 8);
  memcpy(m + 9, &kl, 8);
  memcpy(m + 17, prefix, pl);
  memcpy(m + 17 + pl, tail, tl);
  int e = dg__send_all(t->fd, m, 17 + kl, dl);
  return e ? e : dg__recv_all(t->fd, resp, 1, dl);
}

/* The handshake of tcp_store_impl.h on a fresh connection. */
static int authenticate(dg_store *s, int64_t dl) {
  tcp_store *t = T(s);
  uint8_t cn[DG_AUTH_NONCE], sr[DG_AUTH_NONCE + DG_AUTH_MAC], want[DG_AUTH_MAC], r = 0xff;
  if (dg__auth_nonce(cn) != DG_OK)
    return dg__store_fail(s, DG_ESYS, "tcp store %s:%d: no random bytes for a nonce", t->host,
                          t->port);
  int e = auth_check(t, DG_TS_AUTH_HELLO, sizeof DG_TS_AUTH_HELLO - 1, cn, sizeof cn, &r, dl);
  if (!e && r == 1) {
    io_fail(s, -EPROTO, "authentication");
    return dg__store_fail(s, DG_EUNSUPPORTED, "tcp store %s:%d: this rank has an auth token but "
                          "the server does not authenticate (torch's TCPStore, or a dgrad rank 0 "
                          "without DG_AUTH_TOKEN): tokens need every rank to run dgrad with the "
                          "same token", t->host, t->port);
  }
  if (!e && r != 0) e = -EPROTO;
  if (!e) e = dg__recv_all(t->fd, sr, sizeof sr, dl);
  if (e) return io_fail(s, e, "authentication");
  dg__auth_proof(t->token, DG_TS_AUTH_SERVER, cn, sizeof cn, sr, DG_AUTH_NONCE, want);
  if (!dg__auth_equal(want, sr + DG_AUTH_NONCE, DG_AUTH_MAC)) {
    io_fail(s, -EPROTO, "authentication");
    return dg__store_fail(s, DG_EMISMATCH, "tcp store %s:%d: authentication refused: the "
                          "server holds a different auth token (DG_AUTH_TOKEN)", t->host,
                          t->port);
  }
  dg__auth_proof(t->token, DG_TS_AUTH_CLIENT, cn, sizeof cn, sr, DG_AUTH_NONCE, want);
  e = auth_check(t, DG_TS_AUTH_PROOF, sizeof DG_TS_AUTH_PROOF - 1, want, sizeof want, &r, dl);
  if (!e && r != 0) e = -EPROTO;
  return e ? io_fail(s, e, "authentication") : DG_OK;
}

static int ensure_conn(dg_store *s, int64_t deadline) {
  tcp_store *t = T(s);
  if (t->fd >= 0) return DG_OK;
  /* Until the server is first reached it may not be up yet: retry. */
  int fd = dg__connect_tcp(&t->addr, t->alen, deadline, !t->was_up);
  if (fd == -ETIMEDOUT) /* every caller's deadline is the store's timeout */
    return dg__store_fail(s, DG_ETIMEDOUT, "tcp store %s:%d: connect timed out after %d ms "
                          "(no server there%s)", t->host, t->port, s->timeout_ms,
                          t->was_up ? " any more" : " yet");
  if (fd < 0) return io_fail(s, fd, "connect");
  t->fd = fd;
  t->was_up = 1;
  return t->token ? authenticate(s, deadline) : DG_OK;
}

/* Sends a request and reads `rlen` reply bytes (0: none) under the lock. */
static int exchange(dg_store *s, req_t *r, void *reply, size_t rlen, int64_t deadline,
                    const char *what) {
  tcp_store *t = T(s);
  if (r->oom) return DG_ENOMEM;
  int rc = ensure_conn(s, dg__deadline(0, s->timeout_ms));
  if (rc != DG_OK) return rc;
  int e = dg__send_all(t->fd, r->p, r->n, dg__deadline(0, s->timeout_ms));
  if (!e && rlen) e = dg__recv_all(t->fd, reply, rlen, deadline);
  return e ? io_fail(s, e, what) : DG_OK;
}

/* Reads a u64-length-prefixed byte array reply. */
static int recv_vec(dg_store *s, void **val, size_t *len, const char *what) {
  tcp_store *t = T(s);
  uint64_t n;
  int64_t dl = dg__deadline(0, s->timeout_ms);
  int e = dg__recv_all(t->fd, &n, 8, dl);
  if (e) return io_fail(s, e, what);
  if (n > DG_TS_MAX_VALUE) return io_fail(s, -EPROTO, what);
  unsigned char *b = dg__malloc(n ? n : 1);
  if (!b) return DG_ENOMEM;
  if (n && (e = dg__recv_all(t->fd, b, n, dl))) {
    dg__free(b);
    return io_fail(s, e, what);
  }
  *val = b;
  *len = n;
  return DG_OK;
}

static int ts_set(dg_store *s, const char *key, const void *val, size_t len) {
  req_t r = {0};
  uint8_t q = DG_TS_SET;
  put(&r, &q, 1);
  put_key(&r, key, 0);
  put_bytes(&r, val, len);
  pthread_mutex_lock(&T(s)->mu);
  int rc = exchange(s, &r, NULL, 0, 0, "SET");
  pthread_mutex_unlock(&T(s)->mu);
  dg__free(r.p);
  return rc;
}

static void put_keys(req_t *r, uint8_t q, const char *const *keys, int nkeys, int raw) {
  put(r, &q, 1);
  put_u64(r, (uint64_t)nkeys);
  for (int i = 0; i < nkeys; i++) put_key(r, keys[i], raw);
}

/* WAIT with the lock held. */
static int wait_locked(dg_store *s, const char *const *keys, int nkeys, int raw,
                       int64_t deadline) {
  req_t r = {0};
  put_keys(&r, DG_TS_WAIT, keys, nkeys, raw);
  uint8_t resp = 0xff;
  int rc = exchange(s, &r, &resp, 1, deadline, "WAIT");
  dg__free(r.p);
  if (rc == DG_OK && resp != 0) rc = io_fail(s, -EPROTO, "WAIT");
  return rc;
}

static int ts_wait(dg_store *s, const char *const *keys, int nkeys, int64_t deadline) {
  int64_t start = dg__now_ms();
  pthread_mutex_lock(&T(s)->mu);
  int rc = wait_locked(s, keys, nkeys, 0, deadline);
  pthread_mutex_unlock(&T(s)->mu);
  if (rc == DG_ETIMEDOUT) return dg__store_timeout(s, keys, nkeys, (int)(deadline - start));
  return rc;
}

static int get_raw(dg_store *s, const char *key, int raw, void **val, size_t *len,
                   int64_t deadline) {
  pthread_mutex_lock(&T(s)->mu);
  /* As torch does: WAIT first, since GET of a missing key drops the link. */
  int rc = wait_locked(s, &key, 1, raw, deadline);
  if (rc == DG_OK) {
    req_t r = {0};
    uint8_t q = DG_TS_GET;
    put(&r, &q, 1);
    put_key(&r, key, raw);
    rc = exchange(s, &r, NULL, 0, 0, "GET");
    if (rc == DG_OK) rc = recv_vec(s, val, len, "GET");
    dg__free(r.p);
  }
  pthread_mutex_unlock(&T(s)->mu);
  return rc;
}

static int ts_get(dg_store *s, const char *key, void **val, size_t *len, int64_t deadline) {
  int64_t start = dg__now_ms();
  int rc = get_raw(s, key, 0, val, len, deadline);
  if (rc == DG_ETIMEDOUT) return dg__store_timeout(s, &key, 1, (int)(deadline - start));
  return rc;
}

static int add_raw(dg_store *s, const char *key, int raw, int64_t delta, int64_t *result) {
  req_t r = {0};
  uint8_t q = DG_TS_ADD;
  put(&r, &q, 1);
  put_key(&r, key, raw);
  put_u64(&r, (uint64_t)delta);
  pthread_mutex_lock(&T(s)->mu);
  int rc = exchange(s, &r, result, 8, dg__deadline(0, s->timeout_ms), "ADD");
  pthread_mutex_unlock(&T(s)->mu);
  dg__free(r.p);
  return rc;
}

static int ts_add(dg_store *s, const char *key, int64_t delta, int64_t *result) {
  return add_raw(s, key, 0, delta, result);
}

static int ts_cas(dg_store *s, const char *key, const void *e, size_t elen, const void *d,
                  size_t dlen, void **cur, size_t *curlen) {
  req_t r = {0};
  uint8_t q = DG_TS_COMPARE_SET;
  put(&r, &q, 1);
  put_key(&r, key, 0);
  put_bytes(&r, e, elen);
  put_bytes(&r, d, dlen);
  pthread_mutex_lock(&T(s)->mu);
  int rc = exchange(s, &r, NULL, 0, 0, "COMPARE_SET");
  if (rc == DG_OK) rc = recv_vec(s, cur, curlen, "COMPARE_SET");
  pthread_mutex_unlock(&T(s)->mu);
  dg__free(r.p);
  return rc;
}

static int ts_check(dg_store *s, const char *const *keys, int nkeys, int *present) {
  req_t r = {0};
  put_keys(&r, DG_TS_CHECK, keys, nkeys, 0);
  uint8_t resp = 0xff;
  pthread_mutex_lock(&T(s)->mu);
  int rc = exchange(s, &r, &resp, 1, dg__deadline(0, s->timeout_ms), "CHECK");
  pthread_mutex_unlock(&T(s)->mu);
  dg__free(r.p);
  if (rc == DG_OK && resp > 1) return dg__store_fail(s, DG_EFORMAT, "tcp store: bad CHECK reply");
  *present = resp == 0;
  return rc;
}

static int ts_del(dg_store *s, const char *key, int *deleted) {
  req_t r = {0};
  uint8_t q = DG_TS_DELETE_KEY;
  put(&r, &q, 1);
  put_key(&r, key, 0);
  int64_t n = 0;
  pthread_mutex_lock(&T(s)->mu);
  int rc = exchange(s, &r, &n, 8, dg__deadline(0, s->timeout_ms), "DELETE_KEY");
  pthread_mutex_unlock(&T(s)->mu);
  dg__free(r.p);
  *deleted = n == 1;
  return rc;
}

static int ts_num_keys(dg_store *s, int64_t *n) {
  req_t r = {0};
  uint8_t q = DG_TS_GETNUMKEYS;
  put(&r, &q, 1);
  pthread_mutex_lock(&T(s)->mu);
  int rc = exchange(s, &r, n, 8, dg__deadline(0, s->timeout_ms), "GETNUMKEYS");
  pthread_mutex_unlock(&T(s)->mu);
  dg__free(r.p);
  return rc;
}

static int ts_port(const dg_store *s) { return T(s)->port; }

static void ts_release(dg_store *s) {
  tcp_store *t = T(s);
  pthread_mutex_lock(&t->mu);
  if (t->fd >= 0) close(t->fd);
  t->fd = -1;
  pthread_mutex_unlock(&t->mu);
}

static int ts_drain(dg_store *s, int64_t deadline, int quiet_ms) {
  ts_release(s);
  return T(s)->server ? dg__ts_server_drain(T(s)->server, deadline, quiet_ms) : 0;
}

static void ts_destroy(dg_store *s) {
  tcp_store *t = T(s);
  if (t->fd >= 0) close(t->fd);
  dg__ts_server_stop(t->server);
  pthread_mutex_destroy(&t->mu);
  dg__free(t->token);
  dg__free(t);
}

static const dg_store_vt tcp_vt = {
    .kind = "tcp", .set = ts_set, .get = ts_get, .add = ts_add, .compare_set = ts_cas,
    .check = ts_check, .wait = ts_wait, .del = ts_del, .num_keys = ts_num_keys,
    .port = ts_port, .release = ts_release, .drain = ts_drain, .destroy = ts_destroy};

/* torch's waitForWorkers: ADD "init/" 1 (no "/" prefix); the server's own
 * client then polls it every 10 ms until the world has joined. */
static int wait_workers(dg_store *s, int world, int is_server) {
  int64_t v = 0, deadline = dg__deadline(0, s->timeout_ms);
  int rc = add_raw(s, "init/", 1, 1, &v);
  while (rc == DG_OK && is_server && v < world) {
    if (dg__now_ms() >= deadline)
      return dg__store_fail(s, DG_ETIMEDOUT,
                            "tcp store %s:%d: timed out after %d ms waiting for clients: "
                            "%lld/%d joined", T(s)->host, T(s)->port, s->timeout_ms,
                            (long long)v, world);
    usleep(10000);
    rc = add_raw(s, "init/", 1, 0, &v);
  }
  return rc;
}

static void set_port(struct sockaddr_storage *ss, int port) {
  if (ss->ss_family == AF_INET) ((struct sockaddr_in *)ss)->sin_port = htons((uint16_t)port);
  else ((struct sockaddr_in6 *)ss)->sin6_port = htons((uint16_t)port);
}

/* Resolves the host (naming the resolver's reason on failure) and, for a
 * server, listens: on the host's address when it is an IP literal of this
 * host (not exposed on other interfaces), else on every address (a name
 * may resolve differently here than on the other hosts, e.g. to 127.0.1.1;
 * an address not of this host is one behind NAT), as torch does. */
static int resolve_and_listen(tcp_store *t, int is_server) {
  char why[320];
  if (dg__resolve_msg(t->host, t->port, &t->addr, &t->alen, why, sizeof why) < 0)
    return dg__store_fail(&t->base, DG_EINVAL, "tcp store %s:%d: cannot resolve host \"%s\": "
                          "%s", t->host, t->port, t->host, why);
  if (!is_server) return DG_OK;
  int local = dg__is_numeric_host(t->host), port = t->port, eno = 0;
  int rc = dg__ts_server_start(&t->server, local ? &t->addr : NULL, &port, t->token, &eno, why,
                               sizeof why);
  if (rc != DG_OK && local && eno == EADDRNOTAVAIL) {
    DG_LOGI("tcp store: %s is not an address of this host; listening on every address",
            t->host);
    port = t->port;
    rc = dg__ts_server_start(&t->server, NULL, &port, t->token, &eno, why, sizeof why);
  }
  if (rc != DG_OK)
    return dg__store_fail(&t->base, rc, "tcp store %s:%d (server): %s", t->host, t->port, why);
  t->port = port;
  set_port(&t->addr, port);
  return DG_OK;
}

int dg_store_new_tcp(dg_store **out, const dg_tcp_store_opts *o, char *err, size_t cap) {
  if (!out || !o || o->port < 0 || o->port > 65535 || (o->wait_workers && o->world_size < 1))
    return dg__fail_msg(err, cap, DG_EINVAL,
                        "store_new_tcp: need out, options, 0 <= port <= 65535 and world_size "
                        ">= 1 with wait_workers");
  *out = NULL;
  tcp_store *t = dg__calloc(1, sizeof *t);
  if (!t) return dg__fail_msg(err, cap, DG_ENOMEM, "store_new_tcp: out of memory");
  dg__store_init(&t->base, &tcp_vt, o->timeout_ms);
  pthread_mutex_init(&t->mu, NULL);
  t->fd = -1;
  t->port = o->port;
  snprintf(t->host, sizeof t->host, "%s", o->host && *o->host ? o->host : "127.0.0.1");
  int rc = DG_OK;
  if (o->auth_token && *o->auth_token && !(t->token = dg__strdup(o->auth_token)))
    rc = dg__store_fail(&t->base, DG_ENOMEM, "store_new_tcp: out of memory");
  if (rc == DG_OK) rc = resolve_and_listen(t, o->is_server);
  if (rc == DG_OK) rc = ensure_conn(&t->base, dg__deadline(0, t->base.timeout_ms));
  if (rc == DG_OK && o->wait_workers) rc = wait_workers(&t->base, o->world_size, o->is_server);
  if (rc != DG_OK) { /* every message above names the store */
    dg__fail_msg(err, cap, rc, "%s", dg_store_errmsg(&t->base));
    if (!err || !cap) DG_LOGW("%s", dg_store_errmsg(&t->base));
    ts_destroy(&t->base);
    return rc;
  }
  *out = &t->base;
  return DG_OK;
}
