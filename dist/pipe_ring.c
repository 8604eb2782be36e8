/* Boundaries written straight into a neighbour's memory (pipe_ring.h). */
#include "dist/pipe_ring.h"

#include "dist/coll_ext.h"
#include "base/common_impl.h"

#define SLOT_ALIGN 64 /* slots a whole number of cache lines */

int dg__pipe_link_begin(dg__pipe_link *l, dg_pg *pg, int M, size_t want, int64_t step,
                        uint32_t tag) {
  if (l->peer < 0 || l->pid <= 0) return DG_OK; /* through the transport: nothing to say */
  if (want) {
    want = (want + SLOT_ALIGN - 1) / SLOT_ALIGN * SLOT_ALIGN;
    if (want > l->slot) {
      size_t n = want * (size_t)M;
      if (n > l->cap) { /* between steps: the neighbour writes it only once told */
        unsigned char *b = dg__malloc(n);
        if (!b) return DG_ENOMEM;
        dg__free(l->mine);
        l->mine = b, l->cap = n;
      }
      l->slot = want;
    }
  }
  l->dout[0] = (int64_t)(uintptr_t)l->mine, l->dout[1] = (int64_t)l->slot, l->dout[2] = step;
  l->din[2] = -1;
  int rc = dg_pg_recv(pg, l->din, 3, DG_I64, l->peer, tag, &l->wr);
  if (!rc) rc = dg_pg_send(pg, l->dout, 3, DG_I64, l->peer, tag, &l->ws);
  return rc;
}

int dg__pipe_link_theirs(dg__pipe_link *l, int64_t step, size_t *slot, char *err, size_t cap) {
  *slot = 0;
  if (l->wr) {
    int rc = dg_work_wait(l->wr, 0);
    if (rc) return rc; /* the caller names the work's message */
    dg_work_free(l->wr);
    l->wr = NULL;
    if (l->din[2] != step)
      return dg__fail_msg(err, cap, DG_EPEER, "the ring descriptor of step %lld arrived in "
                          "step %lld", (long long)l->din[2], (long long)step);
    l->theirs = (uint64_t)l->din[0], l->their_slot = (size_t)l->din[1];
  }
  *slot = l->pid > 0 ? l->their_slot : 0;
  return DG_OK;
}

int dg__pipe_link_write(const dg__pipe_link *l, int m, size_t off, const void *src, size_t n) {
  return dg__cma_write(l->pid, l->theirs + (uint64_t)m * l->their_slot + off, src, n);
}

int dg__pipe_link_end(dg__pipe_link *l) {
  int rc = l->ws ? dg_work_wait(l->ws, 0) : DG_OK;
  dg_work_free(l->ws), dg_work_free(l->wr);
  l->ws = l->wr = NULL;
  return rc;
}

void dg__pipe_link_free(dg__pipe_link *l) {
  dg_work_free(l->ws), dg_work_free(l->wr);
  l->ws = l->wr = NULL;
  dg__free(l->mine);
  l->mine = NULL, l->cap = l->slot = 0;
}
