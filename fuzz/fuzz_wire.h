/* The TCP transport's wire parser (dist/transport/tcp/tcp.c) as a group
 * runs it: a transport of rank 0 of 2 over a socketpair, a few operations
 * posted (flags in the first input byte), the rest of the input written as
 * everything rank 1 sends, then rank 1 hangs up. Every operation must then
 * complete (with data or an error) within the deadline: never a hang, a
 * crash, or a write past a posted buffer. */
#ifndef DG_FUZZ_WIRE_H
#define DG_FUZZ_WIRE_H

#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>

#include "fuzz_util.h"
#include "dist/net/net_impl.h"
#include "dist/transport/tcp/tcp_impl.h"

#define FZ_NOPS 5

static void fz_wire(const uint8_t *data, size_t size, int all_dgrad) {
  fz_quiet();
  if (size < 1 || size > (1u << 16)) return;
  uint8_t flags = data[0];
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) abort();
  int fds[2] = {-1, sv[0]};
  dg_xport *x = NULL;
  if (dg__tcp_xport_adopt(&x, 0, 2, fds, all_dgrad, -1) != DG_OK) abort();
  /* (64) (16) (8) (32) (0): receives of slots 1-3 (slot 2 eager when the
   * group is dgrad-only), a send of 32 bytes on slot 1, an empty receive */
  static uint8_t rbuf[3][64], sbuf[32];
  dg_xop ops[FZ_NOPS] = {
      {.peer = 1, .slot = 1, .buf = rbuf[0], .n = 64},
      {.peer = 1, .slot = 2, .buf = rbuf[1], .n = 16, .eager = all_dgrad && (flags & 2)},
      {.peer = 1, .slot = 3, .buf = rbuf[2], .n = 8, .eager = all_dgrad && (flags & 4)},
      {.peer = 1, .slot = 1, .buf = sbuf, .n = 32, .eager = all_dgrad && (flags & 8)},
      {.peer = 1, .slot = 0x100000001ULL, .buf = rbuf[2], .n = 0}};
  int posted[FZ_NOPS] = {0};
  for (int i = 0; i < FZ_NOPS; i++) {
    if (!(flags & 1) && i == 2) continue; /* sometimes data nobody asked for */
    int rc = i == 3 ? x->vt->send(x, &ops[i]) : x->vt->recv(x, &ops[i]);
    posted[i] = rc == DG_OK || ops[i].status == DG_XOP_PENDING;
  }
  /* The peer's stream (non-blocking: what does not fit is dropped), then
   * its hang-up. */
  fcntl(sv[1], F_SETFL, O_NONBLOCK);
  ssize_t w = write(sv[1], data + 1, size - 1);
  (void)w;
  if (flags & 16) shutdown(sv[1], SHUT_WR);
  else close(sv[1]), sv[1] = -1;
  int64_t dl = dg__now_ms() + 10000;
  for (int i = 0; i < FZ_NOPS; i++) {
    if (!posted[i]) continue;
    int rc = x->vt->wait(x, &ops[i], dl);
    /* still pending: a hang (the stream ended); DG_ETIMEDOUT may also be a
     * peer's ABORT code, a completed op */
    if (rc == DG_ETIMEDOUT && __atomic_load_n(&ops[i].status, __ATOMIC_ACQUIRE) == DG_XOP_PENDING) {
      char m[512];
      x->vt->error(x, m, sizeof m);
      fprintf(stderr, "fuzz_wire: op %d (slot %llu) still pending after the peer hung up; "
              "transport: %s\n", i, (unsigned long long)ops[i].slot, m);
      abort();
    }
    if (rc == DG_OK && !ops[i].is_send && ops[i].nrecv > ops[i].n) abort();
  }
  char msg[512];
  x->vt->error(x, msg, sizeof msg);
  x->vt->destroy(x);
  if (sv[1] >= 0) close(sv[1]);
}

#endif
