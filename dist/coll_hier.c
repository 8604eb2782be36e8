/* Hierarchical allreduce for a dgrad-only group over several hosts (issue
 * #17 item 6), on the internal groups pg_hier.c makes at creation:
 *
 *   1. local:  the ranks of each host allreduce the whole buffer among
 *              themselves (the host's group: its shared-memory segment,
 *              else cross-memory attach, else the transport);
 *   2. cross:  the buffer is cut into S shards (S: the fewest ranks any
 *              host has); local rank j < S of every host allreduces shard j
 *              over the transport (cross group j), so S ranks per host
 *              share the traffic between hosts;
 *   3. back:   every rank zeroes the bytes it did not carry in step 2 and
 *              the host's group sums the buffer as integers of the same
 *              width: the carriers' bytes are disjoint, so the sum is their
 *              OR and every rank gets every shard bit for bit.
 *
 * Operands are ordered by the layout only (which ranks on which host): the
 * local step's algorithm (rank order), then the cross group's algorithm
 * chosen by size, so a layout gives the same bits run to run. AVG sums
 * here; the caller divides by the group's size. Each step runs as a work of
 * its internal group (messages name its ranks in both numberings, the
 * slots are its own) with the root work's tag and deadline; a failure is
 * then the root work's, so the root's flight recorder reports it. */
#include <stdint.h>
#include <string.h>

#include "dist/coll_impl.h"
#include "base/common_impl.h"

/* Shard j of S: elements [off, off + n). */
static void shard(size_t count, int S, int j, size_t *off, size_t *n) {
  size_t q = count / (size_t)S, rm = count % (size_t)S;
  *off = (size_t)j * q + ((size_t)j < rm ? (size_t)j : rm);
  *n = q + ((size_t)j < rm ? 1 : 0);
}

/* A step of the root's running collective c on internal group g. */
static void step_init(dg_coll *sc, dg_work *sw, const dg_coll *c, dg_pg *g) {
  const dg_work *w = c->w;
  memset(sw, 0, sizeof *sw);
  sw->pg = g;
  sw->kind = DG_W_ALLREDUCE;
  sw->seq = w->seq;
  sw->tag = w->tag;
  sw->count = w->count;
  sw->dt = w->dt;
  sw->op = w->op;
  sw->deadline = c->deadline;
  *sc = (dg_coll){.pg = g, .w = sw, .x = g->x, .rank = g->rank, .size = g->size,
                  .slot = c->slot, .deadline = c->deadline, .eager = 1};
}

/* Each step runs the algorithm DG_ALGO_AUTO picks on its internal group
 * (pg_coll.c): inside a host the segment, else recursive doubling (small)
 * or CMA, else Gloo's ring; between hosts recursive doubling or the ring. */

/* Step 3 on b (bytes, 4-aligned): sums as int64 or int32 words, the last
 * 1-3 bytes (f16/bf16, odd count) as one more int32. */
static int sum_bits(dg_coll *sc, unsigned char *b, size_t bytes) {
  int wide = bytes % 8 == 0 && (uintptr_t)b % 8 == 0;
  size_t isz = wide ? 8 : 4, words = bytes / isz, tail = bytes - words * isz;
  int rc = words ? dg__allreduce_auto(sc, b, words, wide ? DG_I64 : DG_I32, DG_RED_SUM) : DG_OK;
  if (rc == DG_OK && tail) {
    int32_t t = 0;
    memcpy(&t, b + words * isz, tail);
    rc = dg__allreduce_auto(sc, &t, 1, DG_I32, DG_RED_SUM);
    memcpy(b + words * isz, &t, tail);
  }
  return rc;
}

/* Step 3: the shard I carried (none when my local rank is S or more) goes
 * to every rank of my host, and theirs to me. c: the root's collective
 * (its scratch: the steps' algorithms use their groups'). */
static int share_shards(dg_coll *c, dg_coll *sc, unsigned char *b, size_t count, size_t es) {
  dg_pg *pg = c->pg;
  size_t bytes = count * es, off = 0, n = 0;
  if (pg->hier_lrank < pg->hier_shards) shard(count, pg->hier_shards, pg->hier_lrank, &off, &n);
  /* a buffer not 4-aligned (f16 at an odd offset) goes through scratch */
  unsigned char *t = (uintptr_t)b % 4 == 0 ? b : dg__coll_scratch(c, bytes);
  if (!t) return dg__coll_fail(sc, DG_ENOMEM, "out of memory (%zu bytes)", bytes);
  memset(t, 0, off * es);
  if (t != b) memcpy(t + off * es, b + off * es, n * es);
  memset(t + (off + n) * es, 0, bytes - (off + n) * es);
  int rc = sum_bits(sc, t, bytes);
  if (rc == DG_OK && t != b) memcpy(b, t, bytes);
  return rc;
}

/* A step failed (its internal group's message in sw): the root work fails
 * with it (the transport is aborted already: every rank hears of it). */
static int step_failed(dg_coll *c, const dg_work *sw, int rc) {
  return dg__coll_fail(c, rc, "%s", sw->err);
}

int dg__allreduce_hier(dg_coll *c, void *buf, size_t count, dg_dtype dt, dg_redop op) {
  dg_pg *pg = c->pg;
  unsigned char *b = buf;
  size_t es = dg_dtype_size(dt), off, n;
  dg_coll sc;
  dg_work sw;
  int rc = DG_OK;
  if (op == DG_RED_AVG) op = DG_RED_SUM; /* divided by the group's size after */
  if (pg->hier_local) {
    step_init(&sc, &sw, c, pg->hier_local);
    if ((rc = dg__allreduce_auto(&sc, b, count, dt, op)) != DG_OK) return step_failed(c, &sw, rc);
  }
  if (pg->hier_cross) {
    dg_coll xc;
    dg_work xw;
    step_init(&xc, &xw, c, pg->hier_cross);
    shard(count, pg->hier_shards, pg->hier_lrank, &off, &n);
    if (n && (rc = dg__allreduce_auto(&xc, b + off * es, n, dt, op)) != DG_OK)
      return step_failed(c, &xw, rc);
  }
  if (pg->hier_local) {
    step_init(&sc, &sw, c, pg->hier_local);
    if ((rc = share_shards(c, &sc, b, count, es)) != DG_OK) return step_failed(c, &sw, rc);
  }
  return DG_OK;
}
