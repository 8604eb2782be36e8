/* dgrad/store.h — rendezvous key-value stores.
 *
 * Four kinds behind one handle:
 *   - TCP: PyTorch 1.13 TCPStore wire protocol, server and client, so torch
 *     processes and dgrad processes rendezvous through the same store;
 *   - file: Gloo FileStore layout (one file per key, named by libstdc++'s
 *     std::hash of the key), so a C++ libgloo program can share it;
 *   - in-process: for tests with ranks as threads;
 *   - prefix: wraps another store, key k becomes "<prefix>/<k>".
 * Keys are C strings, "" included (as torch); a NULL key is DG_EINVAL. The
 * TCP server also keeps keys that hold NUL bytes, as torch clients may send.
 * Every blocking call takes a deadline (timeout in milliseconds; <= 0 means
 * the store's default timeout). On timeout: DG_ETIMEDOUT, with the missing
 * keys named in dg_store_errmsg().
 *
 * Thread-safety: one store handle may be used from several threads; calls
 * are serialised internally (one request in flight per TCP connection, as
 * the protocol requires). */
#ifndef DGRAD_STORE_H
#define DGRAD_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "dgrad/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dg_store dg_store;

typedef struct {
  const char *host;   /* address to connect to; the server listens there when
                         it is an IP address of this host, else on every
                         address (a name, or an address behind NAT) */
  int port;           /* 0 with is_server: pick a free port (see dg_store_port) */
  int is_server;      /* host the store in this process (rank 0, as torch does) */
  int world_size;     /* clients expected; the server waits for the "init/"
                         counter to reach it when wait_workers is set */
  int wait_workers;
  int timeout_ms;     /* default deadline for every wait; 0: 300000 */
  /* Shared secret (NULL or "": none). The server then serves only clients
   * that prove they know it (challenge-response with HMAC-SHA-256; the
   * token is never sent) and closes other connections, logging them; a
   * client proves it on every connection. Only for groups whose ranks all
   * run dgrad: torch's TCPStore has no authentication (a client with a
   * token fails against it with DG_EUNSUPPORTED). A wrong token is
   * DG_EMISMATCH on the client. It protects who may use the store, not
   * what travels: nothing is encrypted. */
  const char *auth_token;
} dg_tcp_store_opts;

/* Constructors: on failure *out is NULL and err (cap bytes, may be NULL)
 * says why (a TCP server whose port is taken: DG_ESTATE, "failed to bind
 * HOST:PORT (errno 98: Address already in use)" and what to do; a host that
 * does not resolve: DG_EINVAL with the resolver's reason); the in-memory and prefix stores fail only on a NULL argument
 * (DG_EINVAL) or memory (DG_ENOMEM), so they take no err. A TCP store with
 * err NULL logs its failure at WARN. */
DG_API int dg_store_new_tcp(dg_store **out, const dg_tcp_store_opts *opts, char *err,
                            size_t cap);
/* The port a TCP store server listens on, or that a client connected to. */
DG_API int dg_store_port(const dg_store *s);

DG_API int dg_store_new_file(dg_store **out, const char *dir, int timeout_ms, char *err,
                             size_t cap);
DG_API int dg_store_new_mem(dg_store **out, int timeout_ms);
/* Shares an in-process store between handles (ranks as threads); each handle
 * must be freed. DG_EINVAL when s is not an in-memory store. */
DG_API int dg_store_clone(dg_store **out, dg_store *s);
/* Wraps `base` (not owned; must outlive the prefix store). */
DG_API int dg_store_new_prefix(dg_store **out, dg_store *base, const char *prefix);

/* NULL: no-op. A TCP server stops serving at once: free it after its
 * clients are done (dg_pg_new_from_env's group waits for them). A TCP
 * client that has reached its server once does not retry a refused
 * connection later: the server has left. */
DG_API void dg_store_free(dg_store *s);

DG_API int dg_store_set(dg_store *s, const char *key, const void *val, size_t len);
/* Waits for the key up to the deadline, then returns a copy in *val (free
 * with dg_store_value_free) and its length. */
DG_API int dg_store_get(dg_store *s, const char *key, void **val, size_t *len, int timeout_ms);
DG_API void dg_store_value_free(void *val);
/* Atomic add to a decimal integer value (missing key counts as 0). */
DG_API int dg_store_add(dg_store *s, const char *key, int64_t delta, int64_t *result);
/* Sets `desired` when the current value equals `expected` (a missing key
 * matches an empty `expected`); returns the value now stored. */
DG_API int dg_store_compare_set(dg_store *s, const char *key, const void *expected,
                                size_t elen, const void *desired, size_t dlen,
                                void **cur, size_t *curlen);
/* 1 in *present when all keys exist, else 0. Never blocks. */
DG_API int dg_store_check(dg_store *s, const char *const *keys, int nkeys, int *present);
DG_API int dg_store_wait(dg_store *s, const char *const *keys, int nkeys, int timeout_ms);
DG_API int dg_store_delete(dg_store *s, const char *key, int *deleted);
DG_API int dg_store_num_keys(dg_store *s, int64_t *n);

/* Detail of the last failure on this handle (thread-local to the handle). */
DG_API const char *dg_store_errmsg(const dg_store *s);

#ifdef __cplusplus
}
#endif
#endif /* DGRAD_STORE_H */
