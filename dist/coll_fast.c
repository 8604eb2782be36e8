/* dgrad-only collectives (chosen when every rank runs dgrad):
 *  - recursive doubling for small allreduces: log2(W) exchanges of the whole
 *    buffer, non-powers of two folded in first and out last;
 *  - "direct" allreduce for large ones: every rank owns 1/W of the buffer,
 *    receives that part from all peers at once, reduces it segment by
 *    segment as it arrives and sends each reduced segment straight back, so
 *    transfer and reduction overlap and no data takes more than one hop;
 *  - reduce-scatter the same way.
 * Every rank reduces operands in the same order, so results are identical
 * on all ranks. */
#include <string.h>

#include "dist/coll_impl.h"
#include "base/common_impl.h"

#define SEG_BYTES ((size_t)1 << 20)

int dg__allreduce_rd(dg_coll *c, void *buf, size_t count, dg_dtype dt, dg_redop op) {
  size_t bytes = count * dg_dtype_size(dt);
  int W = c->size, r = c->rank, p2 = 1, rc = DG_OK;
  while (p2 * 2 <= W) p2 *= 2;
  int extra = W - p2;
  unsigned char *tmp = dg__coll_scratch(c, bytes ? bytes : 1);
  if (!tmp) return dg__coll_fail(c, DG_ENOMEM, "out of memory");
  dg_xop so, ro;
  int nr; /* rank among the p2 that do the doubling, -1 if folded out */
  if (r < 2 * extra) {
    if (r % 2 == 0) {
      rc = dg__coll_send(c, &so, r + 1, buf, bytes);
      if (rc == DG_OK) rc = dg__coll_wait(c, &so);
      nr = -1;
    } else {
      rc = dg__coll_recv(c, &ro, r - 1, tmp, bytes);
      if (rc == DG_OK) rc = dg__coll_wait(c, &ro);
      /* lower rank's data first, as the even rank would order it */
      if (rc == DG_OK) {
        dg__reduce(tmp, buf, count, dt, op);
        memcpy(buf, tmp, bytes);
      }
      nr = r / 2;
    }
  } else {
    nr = r - extra;
  }
  for (int mask = 1; nr >= 0 && mask < p2 && rc == DG_OK; mask <<= 1) {
    int np = nr ^ mask;
    int peer = np < extra ? np * 2 + 1 : np + extra;
    rc = dg__coll_recv(c, &ro, peer, tmp, bytes);
    if (rc == DG_OK) rc = dg__coll_send(c, &so, peer, buf, bytes);
    if (rc == DG_OK) rc = dg__coll_wait(c, &ro);
    if (rc == DG_OK) rc = dg__coll_wait(c, &so);
    if (rc != DG_OK) break;
    /* Lower rank's operand first: both sides compute the same bits. */
    if (nr < np) {
      dg__reduce(buf, tmp, count, dt, op);
    } else {
      dg__reduce(tmp, buf, count, dt, op);
      memcpy(buf, tmp, bytes);
    }
  }
  if (rc == DG_OK && r < 2 * extra) {
    if (r % 2 == 0) {
      rc = dg__coll_recv(c, &ro, r + 1, buf, bytes);
      if (rc == DG_OK) rc = dg__coll_wait(c, &ro);
    } else {
      rc = dg__coll_send(c, &so, r - 1, buf, bytes);
      if (rc == DG_OK) rc = dg__coll_wait(c, &so);
    }
  }
  return rc;
}

/* Split of `count` elements into W blocks (the first count % W get one more). */
static void block(size_t count, int W, int j, size_t *off, size_t *n) {
  size_t q = count / (size_t)W, rm = count % (size_t)W;
  *off = (size_t)j * q + ((size_t)j < rm ? (size_t)j : rm);
  *n = q + ((size_t)j < rm ? 1 : 0);
}

typedef struct {
  dg_coll *c;
  size_t es, segel; /* element size, elements per segment */
  int nseg;         /* segments of the largest block */
  dg_xop *rs_r, *rs_s, *ag_r, *ag_s; /* [peer * nseg + s] */
} direct_t;

static size_t seg(const direct_t *d, size_t n, int s, size_t *off) {
  *off = (size_t)s * d->segel;
  return *off >= n ? 0 : DG_MIN(d->segel, n - *off);
}

/* Reduce-scatter part: my block from every peer into scratch, reduced into
 * `dst` segment by segment (peers in rank order: identical on all ranks).
 * When ag is set, each reduced segment goes back to every peer. */
static int direct_rs(direct_t *d, const unsigned char *src, unsigned char *dst,
                     unsigned char *scratch, size_t count, dg_dtype dt, dg_redop op, int ag) {
  dg_coll *c = d->c;
  int W = c->size, r = c->rank, rc = DG_OK;
  size_t moff, mn;
  block(count, W, r, &moff, &mn);
  for (int p = 0; p < W && rc == DG_OK; p++) {
    if (p == r) continue;
    size_t off, n, so;
    block(count, W, p, &off, &n);
    for (int s = 0; s < d->nseg && rc == DG_OK; s++) {
      size_t ln = seg(d, mn, s, &so);
      if (ln) rc = dg__coll_recv(c, &d->rs_r[p * d->nseg + s], p,
                                 scratch + ((size_t)p * mn + so) * d->es, ln * d->es);
    }
    for (int s = 0; s < d->nseg && rc == DG_OK; s++) {
      size_t ln = seg(d, n, s, &so);
      if (ln) rc = dg__coll_send(c, &d->rs_s[p * d->nseg + s], p, src + (off + so) * d->es,
                                 ln * d->es);
    }
  }
  for (int s = 0; s < d->nseg && rc == DG_OK; s++) {
    size_t so, ln = seg(d, mn, s, &so);
    if (!ln) continue;
    unsigned char *out = dst + so * d->es;
    if (src + (moff + so) * d->es != out) memcpy(out, src + (moff + so) * d->es, ln * d->es);
    for (int p = 0; p < W && rc == DG_OK; p++) {
      if (p == r) continue;
      rc = dg__coll_wait(c, &d->rs_r[p * d->nseg + s]);
      if (rc == DG_OK) dg__reduce(out, scratch + ((size_t)p * mn + so) * d->es, ln, dt, op);
    }
    for (int p = 0; p < W && rc == DG_OK && ag; p++)
      if (p != r) rc = dg__coll_send(c, &d->ag_s[p * d->nseg + s], p, out, ln * d->es);
  }
  return rc;
}

static int wait_all(direct_t *d, dg_xop *ops, size_t count, int mine_only) {
  int rc = DG_OK;
  for (int p = 0; p < d->c->size && rc == DG_OK; p++) {
    if (p == d->c->rank) continue;
    size_t off, n, so;
    block(count, d->c->size, mine_only ? d->c->rank : p, &off, &n);
    for (int s = 0; s < d->nseg && rc == DG_OK; s++)
      if (seg(d, n, s, &so)) rc = dg__coll_wait(d->c, &ops[p * d->nseg + s]);
  }
  return rc;
}

static int direct_setup(direct_t *d, dg_coll *c, size_t count, dg_dtype dt, int nsets) {
  memset(d, 0, sizeof *d);
  d->c = c;
  d->es = dg_dtype_size(dt);
  d->segel = DG_MAX(SEG_BYTES / d->es, 1);
  size_t big = count / (size_t)c->size + 1;
  d->nseg = (int)((big + d->segel - 1) / d->segel);
  size_t n = (size_t)c->size * (size_t)d->nseg;
  dg_xop *ops = dg__coll_tmp(c, n * (size_t)nsets * sizeof *ops);
  if (!ops) return DG_ENOMEM;
  d->rs_r = ops;
  d->rs_s = ops + n;
  if (nsets > 2) {
    d->ag_r = ops + 2 * n;
    d->ag_s = ops + 3 * n;
  }
  return DG_OK;
}

int dg__allreduce_direct(dg_coll *c, void *buf, size_t count, dg_dtype dt, dg_redop op) {
  direct_t d;
  int W = c->size, r = c->rank;
  if (direct_setup(&d, c, count, dt, 4) != DG_OK)
    return dg__coll_fail(c, DG_ENOMEM, "out of memory");
  size_t moff, mn;
  block(count, W, r, &moff, &mn);
  unsigned char *b = buf, *scratch = dg__coll_scratch(c, (size_t)W * mn * d.es + 1);
  int rc = scratch ? DG_OK : dg__coll_fail(c, DG_ENOMEM, "out of memory");
  if (rc == DG_OK) rc = direct_rs(&d, b, b + moff * d.es, scratch, count, dt, op, 1);
  /* Peers' reduced blocks land in place once our sends of them are out. */
  for (int p = 0; p < W && rc == DG_OK; p++) {
    if (p == r) continue;
    size_t off, n, so;
    block(count, W, p, &off, &n);
    for (int s = 0; s < d.nseg && rc == DG_OK; s++) {
      size_t ln = seg(&d, n, s, &so);
      if (!ln) continue;
      rc = dg__coll_wait(c, &d.rs_s[p * d.nseg + s]);
      if (rc == DG_OK) rc = dg__coll_recv(c, &d.ag_r[p * d.nseg + s], p, b + (off + so) * d.es,
                                          ln * d.es);
    }
  }
  if (rc == DG_OK) rc = wait_all(&d, d.ag_r, count, 0);
  if (rc == DG_OK) rc = wait_all(&d, d.ag_s, count, 1);
  return rc;
}

int dg__reduce_scatter(dg_coll *c, const void *in, void *out, size_t count, dg_dtype dt,
                       dg_redop op) {
  if (c->size == 1 || count == 0) {
    if (count) memmove(out, in, count * dg_dtype_size(dt));
    if (count && op == DG_RED_AVG) dg__scale_div(out, count, dt, c->size);
    return DG_OK;
  }
  /* Blocks of exactly `count` elements: view `in` as W*count, W blocks. */
  direct_t d;
  size_t total = count * (size_t)c->size;
  if (direct_setup(&d, c, total, dt, 2) != DG_OK)
    return dg__coll_fail(c, DG_ENOMEM, "out of memory");
  unsigned char *scratch = dg__coll_scratch(c, (size_t)c->size * count * d.es + 1);
  int rc = scratch ? DG_OK : dg__coll_fail(c, DG_ENOMEM, "out of memory");
  if (rc == DG_OK) rc = direct_rs(&d, in, out, scratch, total, dt, op, 0);
  if (rc == DG_OK) rc = wait_all(&d, d.rs_s, total, 0);
  if (rc == DG_OK && op == DG_RED_AVG) dg__scale_div(out, count, dt, c->size);
  return rc;
}
