/* A dgrad rank for the sub-group interop test: the sequence of
 * torch_group.py (see there) with dg_pg_new_group, in a world of dgrad and
 * torch ranks made by dg_pg_new_from_env. Exits 0 when every value is
 * right. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dgrad/dist.h"

#define NG 5
static const int GROUPS[NG][3] = {{0, 1}, {2, 3}, {1, 3}, {0, 2}, {0, 1, 3}};
static const int GN[NG] = {2, 2, 2, 2, 3};

static double val(int q, size_t i) { return (q + 1) * (double)(i % 1000) / 8.0; }

static int fail(int r, const int *ranks, const char *what, dg_pg *g) {
  fprintf(stderr, "dgrad rank %d: group [%d, %d%s]: %s: %s\n", r, ranks[0], ranks[1],
          ranks[2] ? ", ..." : "", what, dg_pg_errmsg(g));
  return 1;
}

static int check_group(int r, const int *ranks, int n, dg_pg *g) {
  static const size_t sizes[] = {1, 1000, 100001};
  static float b[100001];
  for (int s = 0; s < 3; s++) {
    for (size_t i = 0; i < sizes[s]; i++) b[i] = (float)val(r, i);
    if (dg_pg_allreduce_sync(g, b, sizes[s], DG_F32, DG_RED_SUM))
      return fail(r, ranks, "allreduce", g);
    for (size_t i = 0; i < sizes[s]; i++) {
      double want = 0;
      for (int k = 0; k < n; k++) want += val(ranks[k], i);
      if (b[i] != (float)want) return fail(r, ranks, "allreduce value", g);
    }
  }
  int root = ranks[n - 1];
  float bc[777];
  for (int i = 0; i < 777; i++) bc[i] = r == root ? 10.0f * root + 0.5f : 0;
  dg_work *w;
  int rc = dg_pg_broadcast(g, bc, 777, DG_F32, n - 1, &w); /* the group's numbering */
  if (rc == DG_OK) rc = dg_work_wait(w, 0);
  dg_work_free(w);
  if (rc != DG_OK || bc[776] != 10.0f * root + 0.5f) return fail(r, ranks, "broadcast", g);
  float in[3] = {(float)r, 2.0f * r, 3.0f * r}, out[9];
  if ((rc = dg_pg_allgather(g, in, out, 3, DG_F32, &w)) == DG_OK) rc = dg_work_wait(w, 0);
  dg_work_free(w);
  for (int k = 0; k < n && rc == DG_OK; k++)
    if (out[3 * k + 2] != 3.0f * ranks[k]) rc = DG_EMISMATCH;
  if (rc != DG_OK) return fail(r, ranks, "allgather", g);
  if (dg_pg_barrier_sync(g)) return fail(r, ranks, "barrier", g);
  return 0;
}

int main(void) {
  dg_pg *pg = NULL, *g[NG] = {0};
  char err[512] = "";
  if (dg_pg_new_from_env(&pg, 60000, err, sizeof err) != DG_OK) {
    fprintf(stderr, "dgrad init: %s\n", err);
    return 1;
  }
  int r = dg_pg_rank(pg), rc = 0;
  for (int k = 0; k < NG && !rc; k++)
    if (dg_pg_new_group(&g[k], pg, GROUPS[k], GN[k], err, sizeof err) != DG_OK) {
      fprintf(stderr, "dgrad rank %d: new_group %d: %s\n", r, k, err);
      rc = 1;
    }
  for (int k = 0; k < NG && !rc; k++)
    if (g[k]) rc = check_group(r, GROUPS[k], GN[k], g[k]);
  float t[5];
  for (int i = 0; i < 5 && !rc; i++) t[i] = (float)r;
  if (!rc && (dg_pg_allreduce_sync(pg, t, 5, DG_F32, DG_RED_SUM) || t[4] != 6.0f)) {
    fprintf(stderr, "dgrad rank %d: world allreduce: %s\n", r, dg_pg_errmsg(pg));
    rc = 1;
  }
  if (!rc && dg_pg_barrier_sync(pg)) rc = 1;
  for (int k = 0; k < NG; k++) dg_pg_free(g[k]);
  dg_pg_free(pg);
  return rc;
}
