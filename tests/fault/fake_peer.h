/* A hand-written "rank 1" that does Gloo's rendezvous by hand on an
 * in-process store (torch key layout) and then speaks raw bytes to rank 0:
 * the way to put malformed frames on a pair. */
#ifndef DG_TEST_FAKE_PEER_H
#define DG_TEST_FAKE_PEER_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dgrad/store.h"

/* Returns the connected socket to rank 0, or -1. */
static inline int fake_rank1(dg_store *st) {
  dg_store_set(st, "default_pg/0/0/rank_1", "fake", 4);
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in me = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t l = sizeof me;
  if (bind(lfd, (struct sockaddr *)&me, sizeof me) < 0 || listen(lfd, 1) < 0) return -1;
  getsockname(lfd, (struct sockaddr *)&me, &l);
  unsigned char blob[136];
  memset(blob, 0, sizeof blob);
  memcpy(blob, &me, sizeof me);
  memset(blob + 128, 0xff, 8);
  dg_store_set(st, "default_pg/0/0/1", blob, sizeof blob);
  void *v = NULL;
  size_t n = 0;
  if (dg_store_get(st, "default_pg/0/0/0", &v, &n, 10000) != DG_OK || n != 136) return -1;
  struct sockaddr_in peer;
  memcpy(&peer, v, sizeof peer);
  dg_store_value_free(v);
  /* Gloo's rule: same IP, so compare the byte-swapped ports. */
  int cmp = (int)me.sin_port - (int)peer.sin_port, fd;
  if (cmp > 0) {
    close(lfd);
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, (struct sockaddr *)&peer, sizeof peer) < 0) return -1;
  } else {
    fd = accept(lfd, NULL, NULL);
    close(lfd);
  }
  int64_t x;
  dg_store_add(st, "default_pg/store_based_barrier_key:1", 1, &x);
  return fd;
}

/* Reads 48-byte headers until one has `opcode`; fills hdr. */
static inline int fake_read_until(int fd, uint64_t opcode, uint64_t hdr[6]) {
  for (;;) {
    size_t got = 0;
    while (got < 48) {
      struct pollfd p = {.fd = fd, .events = POLLIN};
      if (poll(&p, 1, 10000) <= 0) return -1;
      ssize_t r = recv(fd, (char *)hdr + got, 48 - got, 0);
      if (r <= 0) return -1;
      got += (size_t)r;
    }
    if (hdr[1] == opcode) return 0;
  }
}

#endif
