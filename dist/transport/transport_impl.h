/* Transport vtable: what collectives see of a transport (TCP today, UCX
 * later). Point-to-point, asynchronous, matched FIFO per (peer, slot).
 *
 * Contract:
 *  - send/recv post an op owned by the caller, who keeps it (and its buffer)
 *    alive until the op is no longer pending (status != DG_XOP_PENDING);
 *  - a recv of n bytes matches the oldest unmatched send of the same slot
 *    from that peer, which must not be longer than n;
 *  - any failure (a peer dies, sends garbage, an abort) is sticky: every
 *    pending op completes with the error and later posts fail at once; the
 *    message names the peer;
 *  - wait() returning DG_ETIMEDOUT leaves the op pending: the caller aborts
 *    the transport (so no late write lands in its buffer) or waits again.
 * Thread-safety: every function may be called from any thread. Internal. */
#ifndef DG_TRANSPORT_IMPL_H
#define DG_TRANSPORT_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "dgrad/store.h"

#define DG_XOP_PENDING 1

typedef struct dg_xop {
  /* set by the caller before posting */
  int peer;
  uint64_t slot;
  void *buf;
  size_t n;
  /* set by the transport: DG_XOP_PENDING, DG_OK or a negative code */
  int status;
  size_t nrecv; /* bytes received (recv ops) */
  /* Eager (dgrad-only groups, collectives): the data goes out without
   * waiting for the receiver's RECV_READY and a receive announces nothing.
   * Both sides of a match must agree on it, and on the exact length. */
  int eager;
  /* transport-private */
  struct dg_xop *next;
  int is_send;
} dg_xop;

typedef struct dg_xport dg_xport;

typedef struct {
  const char *name;
  int (*send)(dg_xport *x, dg_xop *op);
  int (*recv)(dg_xport *x, dg_xop *op);
  /* Waits until op completes or the absolute deadline (ms, monotonic). */
  int (*wait)(dg_xport *x, dg_xop *op, int64_t deadline_ms);
  /* Fails the transport (sticky) with code and message; `peer` is the rank
   * to blame (-1: none), which dgrad peers are told about. */
  void (*abort)(dg_xport *x, int code, int peer, const char *msg);
  /* Sticky error code (DG_OK if none) and its message. */
  int (*error)(dg_xport *x, char *msg, size_t cap);
  /* Leaves the group politely (peers see a clean close), then frees. */
  void (*destroy)(dg_xport *x);
} dg_xport_vt;

struct dg_xport {
  const dg_xport_vt *vt;
  int rank, size;
  int all_dgrad;    /* every rank runs dgrad: own message types allowed */
  size_t eager_max; /* largest eager op (0: none) */
};

/* Called by a transport's rendezvous once peer i's address is published and
 * before it is used: lets the process group compare versions. Returns 1 for
 * a dgrad peer, 0 for another (torch, libgloo), or a negative code. The
 * transport knows whether all ranks run dgrad before it reads a byte. */
typedef int (*dg_peer_check_fn)(void *arg, int peer);

typedef struct {
  int rank, size;
  dg_store *store; /* keys "<r>", "rank_<r>" as Gloo's connectFullMesh */
  int timeout_ms;
  const struct sockaddr_storage *bind_addr; /* interface to listen on */
  dg_peer_check_fn check;
  void *check_arg;
  int spin_us; /* busy-poll before sleeping (us): 0 the transport's default, < 0 none */
  /* Shared secret (NULL or "": none): every pair proves it before its first
   * frame (tcp; dgrad-only groups: a non-dgrad peer is DG_EUNSUPPORTED). */
  const char *auth_token;
} dg_xport_opts;

/* TCP transport with the Gloo 2022 wire protocol. On failure *err says why. */
int dg__tcp_xport_new(dg_xport **out, const dg_xport_opts *o, char *err, size_t cap);
/* UCX transport (dist/transport/ucx/, built only with UCX's headers; the
 * first call loads the library, ucx_dl.h): every rank must run dgrad;
 * worker addresses go under "ucx/<r>" in o->store. */
int dg__ucx_xport_new(dg_xport **out, const dg_xport_opts *o, char *err, size_t cap);

#endif
