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

enum { DG_PAIR_OK = 0, DG_PAIR_BYE = 1, DG_PAIR_CLOSED = 2 };

typedef struct {
  int peer, fd, state, epout;
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
  int timeout_ms;
} dg_tcp_xport;

/* tcp_conn.c: Gloo's connectFullMesh; fills pairs[i].fd (blocking sockets). */
int dg__tcp_rendezvous(dg_tcp_xport *x, const dg_xport_opts *o, char *err, size_t cap);

#endif
