/* The pipe's boundaries between ranks on one host: each stage keeps a ring
 * of M slots per neighbour that the neighbour writes into directly, by
 * cross-memory attach (process_vm_writev, as the allreduce between ranks on
 * one host reads its peers), and reads the micro-batch's tensor in place:
 * one copy, no socket, no staging; only a small notice crosses the
 * transport. A link is one neighbour: the ring this rank receives into,
 * the neighbour's ring it writes to. At every step's start each side sends
 * the other its ring (address, slot bytes, step); a slot is written once
 * per step, and a ring is written only after that step's descriptor came,
 * which its owner sends once its previous step ended: no slot is reused
 * while read. A ring grows between steps to the last step's boundary (the
 * first step, or a bigger boundary, goes through the transport). Internal. */
#ifndef DG_PIPE_RING_H
#define DG_PIPE_RING_H

#include <stddef.h>
#include <stdint.h>

#include "dgrad/dist.h"

typedef struct {
  int peer;              /* the neighbour's rank, -1: no neighbour this side */
  int pid;               /* its process id when it can be written directly, else 0 */
  unsigned char *mine;   /* the ring this rank receives into: M slots */
  size_t slot, cap;      /* bytes per slot this step (0: off), bytes held */
  uint64_t theirs;       /* the neighbour's ring, from its descriptor */
  size_t their_slot;     /* its bytes per slot (0: off) */
  int64_t dout[3], din[3]; /* descriptors sent and received: address, slot, step */
  dg_work *ws, *wr;
} dg__pipe_link;

/* A step begins: on a direct link, grows the ring to M slots of `want`
 * bytes (0: keep), sends its descriptor and posts the neighbour's receive
 * (tag); nothing otherwise. Returns DG_OK or a dg_pg code (detail:
 * dg_pg_errmsg), DG_ENOMEM. */
int dg__pipe_link_begin(dg__pipe_link *l, dg_pg *pg, int M, size_t want, int64_t step,
                        uint32_t tag);
/* Waits for the neighbour's descriptor of this step (once); *slot: bytes per
 * slot it may be written with (0: through the transport). A code from the
 * wait, or DG_EPEER with `err` set when the descriptor is of another step. */
int dg__pipe_link_theirs(dg__pipe_link *l, int64_t step, size_t *slot, char *err, size_t cap);
/* Writes n bytes of src at byte off of the neighbour's slot m: 0 or
 * -errno. */
int dg__pipe_link_write(const dg__pipe_link *l, int m, size_t off, const void *src, size_t n);
/* This rank's slot m (to read in place). */
static inline void *dg__pipe_link_slot(const dg__pipe_link *l, int m) {
  return l->mine + (size_t)m * l->slot;
}
/* The step ended (or failed, after the group was aborted): waits for and
 * frees the descriptor works. Returns the send's status. */
int dg__pipe_link_end(dg__pipe_link *l);
void dg__pipe_link_free(dg__pipe_link *l);

#endif
