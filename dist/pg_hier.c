/* The hierarchy of a dgrad-only root group over several hosts, one of them
 * with more than one rank (coll_hier.c runs the allreduce on it). From
 * every rank's host identity ("dgrad_host/<r>": the host name or
 * DG_HOST_ID), the hosts are numbered in the order of their lowest rank,
 * each host's ranks in rank order (local rank). Internal groups then, over
 * the root's connections (pg_group.c, dg__pg_new_internal):
 *   "hier.<n>.h<h>": the ranks of host h (more than one), with the shared
 *                    segment or cross-memory attach among them;
 *   "hier.<n>.x<j>": local rank j of every host, for j < S (the fewest
 *                    ranks any host has): shard j's traffic between hosts.
 * <n> is a number rank 0 draws for the group, so the names of a group made
 * again over the same store are new. They take no number of torch's
 * sub-group count: a user's first dg_pg_new_group is still "1". Every rank
 * agrees on the layout (a hash of it) and on whether AUTO may pick the
 * hierarchy (every host's ranks reach each other without the transport)
 * before it is used. */
#include <stdio.h>
#include <string.h>

#include "dist/coll_impl.h"
#include "dist/pg_group.h"
#include "dist/net/net_impl.h"
#include "base/common_impl.h"

typedef struct {
  int nh;         /* hosts */
  int *host;      /* (W) host number of each rank */
  int *lrank;     /* (W) rank among its host's ranks */
  int *cnt;       /* (W, nh used) ranks of each host */
  int known, S;   /* every host identity known; shards */
  int64_t hash;   /* of host[], 62 bits */
} layout;

static void layout_free(layout *l) {
  dg__free(l->host);
  dg__free(l->lrank);
  dg__free(l->cnt);
}

static int layout_make(layout *l, int W, const char *const *hosts) {
  memset(l, 0, sizeof *l);
  l->host = dg__calloc((size_t)W, sizeof(int));
  l->lrank = dg__calloc((size_t)W, sizeof(int));
  l->cnt = dg__calloc((size_t)W, sizeof(int));
  if (!l->host || !l->lrank || !l->cnt) return DG_ENOMEM;
  l->known = 1;
  uint64_t h = 1469598103934665603ULL; /* FNV-1a */
  for (int r = 0; r < W; r++) {
    if (!hosts[r]) l->known = 0;
    int q = 0;
    while (q < r && !(hosts[q] && hosts[r] && !strcmp(hosts[q], hosts[r]))) q++;
    l->host[r] = q < r ? l->host[q] : l->nh++;
    l->lrank[r] = l->cnt[l->host[r]]++;
    h = (h ^ (uint64_t)l->host[r]) * 1099511628211ULL;
  }
  l->hash = (int64_t)(h >> 2);
  l->S = W;
  for (int i = 0; i < l->nh; i++) l->S = DG_MIN(l->S, l->cnt[i]);
  return DG_OK;
}

/* MIN-allreduce of v (n int64) over the root group at creation (the slot
 * of coll_cma.c's agreement: cross-memory attach and the segment). */
static int agree_min(dg_pg *pg, int64_t *v, size_t n, char *err, size_t cap) {
  dg_work w;
  dg_coll c;
  dg__setup_coll(pg, &w, &c);
  int rc = dg__allreduce_rd(&c, v, n, DG_I64, DG_RED_MIN);
  if (rc != DG_OK) dg__fail_msg(err, cap, rc, "hierarchical allreduce set-up: %s", w.err);
  return rc;
}

/* My host's ranks (local group) and local rank j of every host (cross
 * group j), each sorted, made as internal groups. */
static int make_groups(dg_pg *pg, const layout *l, int64_t n, char *err, size_t cap) {
  int W = pg->size, me = pg->rank, h = l->host[me], j = l->lrank[me], k = 0;
  int *r = dg__calloc((size_t)W, sizeof(int));
  char name[48];
  if (!r) return DG_ENOMEM;
  for (int q = 0; q < W; q++)
    if (l->host[q] == h) r[k++] = q;
  int rc = DG_OK;
  snprintf(name, sizeof name, "hier.%lld.h%d", (long long)n, h);
  if (k > 1) rc = dg__pg_new_internal(&pg->hier_local, pg, r, k, name, err, cap);
  k = 0;
  for (int q = 0; q < W; q++) /* rank order: one of each host */
    if (l->lrank[q] == j) r[k++] = q;
  snprintf(name, sizeof name, "hier.%lld.x%d", (long long)n, j);
  if (rc == DG_OK && j < l->S) rc = dg__pg_new_internal(&pg->hier_cross, pg, r, k, name, err, cap);
  dg__free(r);
  return rc;
}

static const char *local_path(const dg_pg *g) {
  return !g ? "none (alone on this host)" : g->shm ? "shared memory" : g->cma
             ? "cross-memory attach" : "the transport (no segment, no cross-memory attach)";
}

int dg__hier_setup(dg_pg *pg, const char *const *hosts, char *err, size_t cap) {
  if (pg->size < 3 || pg->parent) return DG_OK; /* two hosts of one rank at most */
  layout l;
  int rc = layout_make(&l, pg->size, hosts);
  /* several hosts, one with more than one rank */
  int want = rc == DG_OK && l.known && l.nh > 1 && l.nh < pg->size;
  /* [0] all want it, [1] [2] the same layout everywhere, [3] rank 0's
   * number for the names (negated: MIN) */
  int64_t v[4] = {want, want ? l.hash : 0, want ? -l.hash : 0, 0};
  if (pg->rank == 0) v[3] = -(int64_t)(1 + (dg__now_ns() & 0x3fffffff));
  if (rc == DG_OK) rc = agree_min(pg, v, 4, err, cap);
  if (rc == DG_OK && v[0] == 1 && v[1] == -v[2])
    rc = make_groups(pg, &l, -v[3], err, cap);
  if (rc == DG_OK && v[0] == 1 && v[1] == -v[2]) {
    pg->hier_shards = l.S;
    pg->hier_lrank = l.lrank[pg->rank];
    const dg_pg *g = pg->hier_local;
    int64_t fast[1] = {!g || g->shm || g->cma};
    if ((rc = agree_min(pg, fast, 1, err, cap)) == DG_OK) pg->hier = fast[0] ? 2 : 1;
    if (rc == DG_OK)
      DG_LOGI("dist: rank %d: hierarchical allreduce: host %d of %d (\"%s\"), local rank %d of "
              "%d, %d shard(s) between hosts; inside the host: %s; %s", pg->rank,
              l.host[pg->rank], l.nh, hosts[pg->rank], l.lrank[pg->rank],
              l.cnt[l.host[pg->rank]], l.S, local_path(g),
              pg->hier == 2 ? "the default (DG_ALGO_AUTO)" : "when forced (DG_ALGO_HIER) only");
  }
  layout_free(&l);
  if (rc == DG_ENOMEM && !err[0]) snprintf(err, cap, "hierarchical allreduce: out of memory");
  return rc;
}

void dg__hier_free(dg_pg *pg) {
  dg__pg_free_internal(pg->hier_cross);
  dg__pg_free_internal(pg->hier_local);
  pg->hier_cross = pg->hier_local = NULL;
  pg->hier = 0;
}
