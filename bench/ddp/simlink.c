/* A link of R Gbit/s modelled as a NIC with a priority queue and DMA
 * (simlink.h):
 *   - an all-reduce of B bytes per rank returns no earlier than the link
 *     would have carried 2(W-1)/W * B since it began (as a ring would);
 *   - DDP's shared gradient buckets: a bucket is posted when every rank has
 *     published it (the latest of their ready times); whenever the link is
 *     free the most urgent posted bucket (the highest index: the next
 *     forward needs it first) is sent, taking 2(W-1)/W * bytes / R; a
 *     bucket is complete once its data is averaged and its transfer ended.
 * Every rank computes this schedule from the same shared posting times,
 * lazily up to "now" (a decision at time t only involves buckets posted by
 * t, all known by now), so no thread has to wake up to start a transfer;
 * the averaging itself is the library's CPU work. */
#include "simlink.h"

#include <stdlib.h>

typedef struct {
  double ns_per_byte;
  int64_t link_free; /* the schedule is fixed up to here */
  int64_t *end;      /* (cap) bucket k's transfer ends (in round step[k]) */
  uint64_t *step;    /* (cap) the round whose transfer end[k] is */
  int cap;
} simlink;

static int64_t wire_ns(const simlink *s, size_t bytes, int world) {
  return (int64_t)(s->ns_per_byte * (double)bytes * 2.0 * (world - 1) / world);
}

static int64_t allreduce_end(void *state, int64_t t0, size_t bytes, int world) {
  return t0 + wire_ns(state, bytes, world);
}

static int grow(simlink *s, int nb) {
  if (nb <= s->cap) return 0;
  int64_t *e = realloc(s->end, (size_t)nb * sizeof *e);
  if (e) s->end = e;
  uint64_t *st = e ? realloc(s->step, (size_t)nb * sizeof *st) : NULL;
  if (!st) return -1;
  s->step = st;
  for (int k = s->cap; k < nb; k++) s->end[k] = 0, s->step[k] = 0; /* rounds start at 1 */
  s->cap = nb;
  return 0;
}

/* The schedule up to now: from the time the link is free, send the most
 * urgent bucket posted by then. */
static void advance(simlink *s, uint64_t step, int nb, const size_t *bytes,
                    const int64_t *posted, int world, int64_t now) {
  for (;;) {
    int64_t t = s->link_free, first = INT64_MAX;
    int best = -1;
    for (int k = nb - 1; k >= 0; k--) {
      if (s->step[k] == step || posted[k] < 0) continue;
      if (posted[k] < first) first = posted[k];
      if (best < 0 && posted[k] <= t) best = k;
    }
    if (first == INT64_MAX) break; /* nothing posted */
    if (best < 0) { /* the link idles until the first posting */
      t = first;
      for (int k = nb - 1; k >= 0 && best < 0; k--)
        if (s->step[k] != step && posted[k] >= 0 && posted[k] <= t) best = k;
    }
    if (t > now) break; /* decided later, when all postings up to t are known */
    s->end[best] = t + wire_ns(s, bytes[best], world);
    s->step[best] = step;
    s->link_free = s->end[best];
  }
}

static int64_t bucket_end(void *state, uint64_t step, int k, int nb, const size_t *bytes,
                          const int64_t *posted, int world, int64_t now) {
  simlink *s = state;
  if (grow(s, nb)) return now; /* out of memory: no hold */
  advance(s, step, nb, bytes, posted, world, now);
  if (s->step[k] == step) return s->end[k];
  return s->link_free > now ? s->link_free : INT64_MAX;
}

const dg_link_model *simlink_from_env(void) {
  static simlink s;
  static dg_link_model m;
  const char *e = getenv("DG_SIM_LINK_GBIT");
  double gbit = e ? atof(e) : 0;
  if (gbit <= 0) return NULL;
  s.ns_per_byte = 8.0 / gbit;
  m = (dg_link_model){.state = &s, .allreduce_end = allreduce_end, .bucket_end = bucket_end};
  return &m;
}
