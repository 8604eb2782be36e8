/* Store internals: every kind implements this vtable; store.c checks
 * arguments and dispatches. Internal. */
#ifndef DG_STORE_IMPL_H
#define DG_STORE_IMPL_H

#include <pthread.h>

#include "dgrad/store.h"

typedef struct {
  const char *kind;
  int (*set)(dg_store *s, const char *key, const void *val, size_t len);
  /* Waits for the key until the absolute deadline (ms, monotonic). */
  int (*get)(dg_store *s, const char *key, void **val, size_t *len, int64_t deadline);
  int (*add)(dg_store *s, const char *key, int64_t delta, int64_t *result);
  int (*compare_set)(dg_store *s, const char *key, const void *e, size_t elen,
                     const void *d, size_t dlen, void **cur, size_t *curlen);
  int (*check)(dg_store *s, const char *const *keys, int nkeys, int *present);
  int (*wait)(dg_store *s, const char *const *keys, int nkeys, int64_t deadline);
  int (*del)(dg_store *s, const char *key, int *deleted);
  int (*num_keys)(dg_store *s, int64_t *n);
  int (*port)(const dg_store *s);
  /* Optional (TCP): close this handle's connection; drain as below. */
  void (*release)(dg_store *s);
  int (*drain)(dg_store *s, int64_t deadline, int quiet_ms);
  void (*destroy)(dg_store *s);
} dg_store_vt;

struct dg_store {
  const dg_store_vt *vt;
  int timeout_ms;
  pthread_mutex_t err_mu;
  char err[512];
};

/* Initialises the common part (timeout 0: 300 s). */
void dg__store_init(dg_store *s, const dg_store_vt *vt, int timeout_ms);
/* Records the detail of a failure and returns `code`. */
int dg__store_fail(dg_store *s, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Names the keys that are missing (for timeout messages). */
int dg__store_timeout(dg_store *s, const char *const *keys, int nkeys, int timeout_ms);

/* Closes this handle's connection to its server, if any; the next call
 * reconnects. A rank done with rendezvous calls it so that the hosting
 * rank's drain need not wait for that rank to leave. */
void dg__store_release(dg_store *s);
/* For a handle hosting a TCP store: closes its own connection, then keeps
 * serving until no client has been connected for quiet_ms (a client whose
 * wait timed out reconnects at once: quiet_ms spans that gap) or the
 * absolute deadline (ms) has passed. Returns the connections still open
 * (0: all left; always 0 for other stores). */
int dg__store_drain(dg_store *s, int64_t deadline, int quiet_ms);

/* libstdc++ std::hash<std::string> (_Hash_bytes, seed 0xc70f6907). */
uint64_t dg__std_hash_bytes(const void *p, size_t len, uint64_t seed);

#endif
