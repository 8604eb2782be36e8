/* TCP transport internals (Gloo 2022 wire protocol, GLOO_WIRE.md). Internal. */
#ifndef DG_TCP_IMPL_H
#define DG_TCP_IMPL_H

#include <pthread.h>
#include <sys/socket.h>

#include "dist/transport/transport_impl.h"

#define DG_TCP_HDR 48
#define DG_TCP_BLOB 136

enum {
  DG_TCP_SEND_BUFFER = 0, /* legacy, never used by unbound buffers */
  DG_TCP_SEND_UNBOUND = 1,
  DG_TCP_NOTIFY_SEND_READY = 2,
  DG_TCP_NOTIFY_RECV_READY = 3
};
/* dgrad-only: "I am leaving cleanly" (sent only when every rank is dgrad,
 * since Gloo aborts on opcodes it does not know). */
#define DG_TCP_BYE 0x4447425945ULL
/* dgrad-only: "I failed because of rank <slot>, code -<offset>", sent just
 * before closing, so every rank names the rank at the root of a failure. */
#define DG_TCP_ABORT 0x444741424f5254ULL
/* dgrad-only: data sent without a RECV_READY (small collective messages). */
#define DG_TCP_EAGER 0x444745414752ULL
/* Largest message sent eagerly. */
#define DG_TCP_EAGER_MAX ((size_t)64 << 10)

typedef struct {
  uint64_t nbytes, opcode, slot, offset, length, roffset;
} dg_tcp_hdr;

typedef struct dg_tcp_msg {
  dg_tcp_hdr h;
  const unsigned char *payload;
  size_t plen;
  size_t off;    /* bytes of header + payload written so far */
  dg_xop *op;    /* send op that completes once the message is written */
  struct dg_tcp_msg *next;
} dg_tcp_msg;

typedef struct {
  uint64_t slot, len;
} dg_tcp_rr;

/* Holder of eager data that arrived before its receive: `op.buf` has room
 * for `cap` bytes. Kept in a pool with the buffer, so steady state
 * allocates nothing. */
typedef struct {
  dg_xop op;
  size_t cap;
} dg_tcp_unx;

enum { DG_PAIR_OK = 0, DG_PAIR_BYE = 1, DG_PAIR_CLOSED = 2 };

typedef struct {
  int peer, fd, state, epout;
  int wfail; /* a send failed: reading what the peer said before it closed */
  int dgrad; /* the peer runs dgrad: ABORT may go both ways, even in a mixed group */
  char addr[64];
  /* receive state: a header being read, or a payload into rop */
  dg_tcp_hdr rh;
  size_t rh_got;
  dg_xop *rop;
  size_t rgot;
  dg_xop *recvs, *recvs_tail; /* posted receives, FIFO over all slots */
  dg_xop *sends, *sends_tail; /* sends waiting for the peer's RECV_READY */
  dg_tcp_rr *rr;              /* (nrr) banked RECV_READY, FIFO */
  size_t nrr, caprr;
  dg_tcp_msg *out, *out_tail; /* transmit queue */
  dg_xop *unx, *unx_tail;     /* eager data that arrived before its receive */
  dg_xop *rop_unx;            /* rop is an unexpected-data holder */
} dg_tcp_pair;

typedef struct {
  dg_xport base;
  pthread_mutex_t mu;
  pthread_cond_t cv; /* broadcast whenever an op completes */
  int ep, evfd, stop;
  pthread_t thr;
  int thr_started;
  dg_tcp_pair *pairs; /* (size); pairs[rank] unused */
  int err;
  char errmsg[512];
  /* Mixed groups: the first peer whose connection closed without a goodbye
   * and without failing an operation that needed it (-1: none), and when
   * (ms). A torch rank says nothing before it exits, and its neighbours
   * exit when it dies: the first to go is the likely root of a failure. */
  int gone;
  int64_t gone_ms;
  int gone_busy;    /* this rank was in an operation then */
  int timeout_ms;
  int spin_us; /* busy-poll before sleeping in wait (DG_SPIN_US) */
  int loop_wants_lock; /* the progress thread is queueing for mu: spinners back off */
  /* pools (under mu): sent messages and unexpected-data holders for reuse */
  dg_tcp_msg *msg_free;
  dg_xop *unx_free; /* dg_tcp_unx, linked through op.next */
} dg_tcp_xport;

/* A transport over sockets already connected to each peer (fds[i]: to rank
 * i; fds[rank] unused; owned from then on), without rendezvous: the wire
 * parser as the group runs it, for the fuzz harness (fuzz/fuzz_gloo.c) and
 * tests. spin_us as in dg_xport_opts. */
int dg__tcp_xport_adopt(dg_xport **out, int rank, int size, const int *fds, int all_dgrad,
                        int spin_us);

/* The pair handshake of dgrad-only groups with a token, before any Gloo
 * frame, both sides at once (neither waits for the other to speak first):
 *   hello: "DGPAIR1" NUL, u32 sender rank, u32 receiver rank, nonce (16)
 *   proof: HMAC(token, DG_TCP_AUTH_LABEL, [u32 sender, u32 receiver,
 *          receiver's nonce], sender's nonce) (32)
 * each sent once the peer's hello is in; a proof over the receiver's fresh
 * nonce and labelled by direction cannot be replayed or reflected. */
#define DG_TCP_AUTH_MSG 32
#define DG_TCP_AUTH_MAGIC "DGPAIR1"
#define DG_TCP_AUTH_LABEL "dgrad tcp pair"
/* Parses a hello from rank `from` to rank `to`: 0 and its nonce, or -1. */
int dg__tcp_auth_hello_parse(const uint8_t msg[DG_TCP_AUTH_MSG], int from, int to,
                             uint8_t nonce[16]);

/* tcp_conn.c: Gloo's connectFullMesh; fills pairs[i].fd (blocking sockets). */
int dg__tcp_rendezvous(dg_tcp_xport *x, const dg_xport_opts *o, char *err, size_t cap);

#endif
