/* A dgrad rank for the interop tests: the sequence of torch_rank.py over
 * dg_pg_new_from_env (torch's env:// rendezvous), or over a Gloo FileStore
 * (argv[2]) against a C++ libgloo program. Writes the raw results to
 * argv[1]. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dgrad/dist.h"

typedef double (*val_fn)(int r, size_t i);
static double f0(int r, size_t i) { (void)i; return r + 1; }
static double f1(int r, size_t i) { return r * (double)i + 0.5; }
static double f2(int r, size_t i) { return (r + 1) * (double)(i % 1000) / 8.0; }

static FILE *out;

static int allreduce(dg_pg *pg, size_t n, val_fn f) {
  int r = dg_pg_rank(pg), W = dg_pg_size(pg);
  float *b = malloc(n * 4 + 4);
  for (size_t i = 0; i < n; i++) b[i] = (float)f(r, i);
  int rc = dg_pg_allreduce_sync(pg, b, n, DG_F32, DG_RED_SUM);
  if (rc != DG_OK) {
    fprintf(stderr, "dgrad rank %d: allreduce %zu: %s\n", r, n, dg_pg_errmsg(pg));
    free(b);
    return 1;
  }
  for (size_t i = 0; i < n; i++) {
    double want = 0;
    for (int q = 0; q < W; q++) want += f(q, i);
    if (b[i] != (float)want) {
      fprintf(stderr, "dgrad rank %d: allreduce %zu: [%zu] = %g, want %g\n", r, n, i, b[i], want);
      free(b);
      return 1;
    }
  }
  fwrite(b, 4, n, out);
  free(b);
  return 0;
}

static int sequence(dg_pg *pg) {
  int r = dg_pg_rank(pg), W = dg_pg_size(pg);
  if (allreduce(pg, 0, f0) || allreduce(pg, 1, f0) || allreduce(pg, 5, f1) ||
      allreduce(pg, 1000001, f2))
    return 1;
  float bc[1000];
  for (int i = 0; i < 1000; i++) bc[i] = r == W - 1 ? i * 2 + 0.25f : 0;
  dg_work *w;
  int rc = dg_pg_broadcast(pg, bc, 1000, DG_F32, W - 1, &w);
  if (rc == DG_OK) rc = dg_work_wait(w, 0);
  dg_work_free(w);
  for (int i = 0; i < 1000 && rc == DG_OK; i++)
    if (bc[i] != i * 2 + 0.25f) rc = DG_EMISMATCH;
  if (rc != DG_OK) {
    fprintf(stderr, "dgrad rank %d: broadcast: %s %s\n", r, dg_err_name(rc), dg_pg_errmsg(pg));
    return 1;
  }
  fwrite(bc, 4, 1000, out);
  if ((rc = dg_pg_barrier_sync(pg)) != DG_OK) {
    fprintf(stderr, "dgrad rank %d: barrier: %s\n", r, dg_pg_errmsg(pg));
    return 1;
  }
  if (allreduce(pg, 5, f1)) return 1;
  fclose(out);
  out = NULL;
  return dg_pg_barrier_sync(pg) == DG_OK ? 0 : 1;
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  out = fopen(argv[1], "wb");
  if (!out) return 2;
  dg_pg *pg = NULL;
  char err[512] = "";
  int rc;
  dg_store *fs = NULL;
  if (argc > 2) { /* Gloo FileStore rendezvous with a libgloo program */
    if (dg_store_new_file(&fs, argv[2], 60000, NULL, 0) != DG_OK) return 2;
    dg_pg_opts o = {.rank = atoi(getenv("RANK")), .world_size = atoi(getenv("WORLD_SIZE")),
                    .store = fs, .timeout_ms = 60000, .rendezvous = DG_RDZV_GLOO};
    rc = dg_pg_new(&pg, &o, err, sizeof err);
  } else {
    rc = dg_pg_new_from_env(&pg, 60000, err, sizeof err);
  }
  if (rc != DG_OK) {
    fprintf(stderr, "dgrad init: %s: %s\n", dg_err_name(rc), err);
    return 1;
  }
  rc = sequence(pg);
  dg_pg_free(pg);
  dg_store_free(fs);
  return rc;
}
