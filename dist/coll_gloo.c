/* Gloo's collectives, message for message (gloo 2022-05 as ProcessGroupGloo
 * runs them; GLOO_WIRE.md section 4), so dgrad ranks and torch/libgloo
 * ranks can share a group. */
#include <string.h>

#include "dist/coll_impl.h"
#include "base/common_impl.h"

#define RING_MAX_SEGMENT ((size_t)1 << 20)

static size_t round_up(size_t v, size_t m) { return (v + m - 1) / m * m; }

typedef struct {
  size_t K, P, G, S;
} ring_geom;

/* Byte range of segment j (len 0 when it lies past the end). */
static size_t seg_len(const ring_geom *g, size_t j, size_t *off) {
  *off = j * g->G;
  if (*off >= g->S) return 0;
  return DG_MIN(g->G, g->S - *off);
}

/* One phase of the ring: reduce-scatter (scratch != NULL: receive into the
 * scratch half, then reduce into buf) or allgather (receive in place). */
static int ring_phase(dg_coll *c, unsigned char *buf, unsigned char *scratch, const ring_geom *g,
                      size_t send_base, size_t recv_base, dg_dtype dt, dg_redop op) {
  size_t E = dg_dtype_size(dt), K = g->K, steps = K - g->P;
  int to = (c->rank + c->size - 1) % c->size, from = (c->rank + 1) % c->size;
  dg_xop rops[2], sops[2];
  int rc = DG_OK;
  for (size_t i = 0; i < steps + 2 && rc == DG_OK; i++) {
    if (i >= 2) {
      size_t p = i - 2, roff, soff;
      size_t rl = seg_len(g, (recv_base + p) % K, &roff);
      size_t sl = seg_len(g, (send_base + p) % K, &soff);
      if (rl && (rc = dg__coll_wait(c, &rops[p & 1])) != DG_OK) break;
      if (rl && scratch) dg__reduce(buf + roff, scratch + (p & 1) * g->G, rl / E, dt, op);
      if (sl && (rc = dg__coll_wait(c, &sops[p & 1])) != DG_OK) break;
    }
    if (i < steps) {
      size_t roff, soff;
      size_t rl = seg_len(g, (recv_base + i) % K, &roff);
      size_t sl = seg_len(g, (send_base + i) % K, &soff);
      void *dst = scratch ? scratch + (i & 1) * g->G : buf + roff;
      if (rl) rc = dg__coll_recv(c, &rops[i & 1], from, dst, rl);
      if (rc == DG_OK && sl) rc = dg__coll_send(c, &sops[i & 1], to, buf + soff, sl);
    }
  }
  return rc;
}

int dg__gloo_allreduce_ring(dg_coll *c, void *buf, size_t count, dg_dtype dt, dg_redop op) {
  size_t E = dg_dtype_size(dt), S = count * E, W = (size_t)c->size, r = (size_t)c->rank;
  if (W == 1 || S == 0) return DG_OK;
  ring_geom g;
  g.S = S;
  g.K = round_up(DG_MAX((S + RING_MAX_SEGMENT - 1) / RING_MAX_SEGMENT, 2 * W), W);
  g.P = g.K / W;
  g.G = round_up((S + g.K - 1) / g.K, E);
  unsigned char *scratch = dg__coll_scratch(c, 2 * g.G);
  if (!scratch) return dg__coll_fail(c, DG_ENOMEM, "out of memory (ring scratch)");
  int rc = ring_phase(c, buf, scratch, &g, (r + 1) * g.P, (r + 2) * g.P, dt, op);
  if (rc == DG_OK) rc = ring_phase(c, buf, NULL, &g, r * g.P, (r + 1) * g.P, dt, op);
  return rc;
}

/* Dissemination barrier: 0-byte messages to r+d from r-d, d = 1, 2, 4... */
int dg__gloo_barrier(dg_coll *c) {
  int W = c->size, rc = DG_OK;
  for (int d = 1; d < W && rc == DG_OK; d <<= 1) {
    dg_xop ro, so;
    rc = dg__coll_recv(c, &ro, (c->rank + W - d) % W, NULL, 0);
    if (rc == DG_OK) rc = dg__coll_send(c, &so, (c->rank + d) % W, NULL, 0);
    if (rc == DG_OK) rc = dg__coll_wait(c, &ro);
    if (rc == DG_OK) rc = dg__coll_wait(c, &so);
  }
  return rc;
}

/* Binomial tree from the root; bit i of the virtual rank from the LSB up. */
int dg__gloo_broadcast(dg_coll *c, void *buf, size_t bytes, int root) {
  size_t W = (size_t)c->size, vr = ((size_t)c->rank + W - (size_t)root) % W, dim = 0;
  while (((size_t)1 << dim) < W) dim++;
  size_t mask = ((size_t)1 << dim) - 1, nsend = 0;
  dg_xop *sops = dg__coll_tmp(c, (dim ? dim : 1) * sizeof *sops);
  if (!sops) return dg__coll_fail(c, DG_ENOMEM, "out of memory");
  int rc = DG_OK;
  for (size_t i = 0; i < dim && rc == DG_OK; i++) {
    mask ^= (size_t)1 << i;
    if ((vr & mask) != 0) continue;
    size_t vp = vr ^ ((size_t)1 << i);
    if (vp >= W) continue;
    int peer = (int)((vp + (size_t)root) % W);
    if ((vr & ((size_t)1 << i)) == 0) {
      rc = dg__coll_send(c, &sops[nsend++], peer, buf, bytes);
    } else {
      dg_xop ro;
      rc = dg__coll_recv(c, &ro, peer, buf, bytes);
      if (rc == DG_OK) rc = dg__coll_wait(c, &ro);
    }
  }
  for (size_t i = 0; i < nsend && rc == DG_OK; i++) rc = dg__coll_wait(c, &sops[i]);
  return rc;
}

/* Ring allgather in two half-chunks: send to r+1, receive from r-1. */
int dg__gloo_allgather(dg_coll *c, const void *in, void *out, size_t bytes) {
  size_t W = (size_t)c->size, r = (size_t)c->rank, total = bytes * W;
  unsigned char *o = out;
  if (in && bytes) memmove(o + r * bytes, in, bytes);
  size_t csz[2] = {bytes / 2, bytes - bytes / 2}, coff[2] = {0, bytes / 2};
  int to = (int)((r + 1) % W), from = (int)((r + W - 1) % W), rc = DG_OK;
  dg_xop sops[2], rops[2];
  size_t nsteps = (W - 1) * 2;
  for (size_t i = 0; i < nsteps && rc == DG_OK; i++) {
    size_t sseg = W + r - i / 2, rseg = sseg - 1;
    size_t soff = total ? (sseg * bytes + coff[i & 1]) % total : 0;
    size_t roff = total ? (rseg * bytes + coff[i & 1]) % total : 0;
    if (i >= 2) {
      rc = dg__coll_wait(c, &sops[i & 1]);
      if (rc == DG_OK) rc = dg__coll_wait(c, &rops[i & 1]);
    }
    if (rc == DG_OK) rc = dg__coll_send(c, &sops[i & 1], to, o + soff, csz[i & 1]);
    if (rc == DG_OK) rc = dg__coll_recv(c, &rops[i & 1], from, o + roff, csz[i & 1]);
  }
  for (size_t k = nsteps >= 2 ? nsteps - 2 : 0; k < nsteps && rc == DG_OK; k++) {
    rc = dg__coll_wait(c, &sops[k & 1]);
    if (rc == DG_OK) rc = dg__coll_wait(c, &rops[k & 1]);
  }
  return rc;
}
