/* Allreduce benchmark rank (launched by run_allreduce.py with the torchrun
 * environment). For each size and algorithm: warm-up, then `iters` timed
 * allreduces of f32; rank 0 prints one JSON line per measurement with every
 * sample, so the runner can pool rounds and take medians.
 * Usage: bench_allreduce ITERS ALGO[,ALGO...] SIZE_BYTES[,SIZE...]
 * ALGO: ring (Gloo's, as torch runs it), rd, direct, auto. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dgrad/dist.h"

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static dg_algo parse_algo(const char *s) {
  if (!strcmp(s, "ring")) return DG_ALGO_RING;
  if (!strcmp(s, "rd")) return DG_ALGO_HALVING_DOUBLING;
  if (!strcmp(s, "direct")) return DG_ALGO_DIRECT;
  if (!strcmp(s, "cma")) return DG_ALGO_CMA;
  if (!strcmp(s, "shm")) return DG_ALGO_SHM;
  if (!strcmp(s, "hier")) return DG_ALGO_HIER;
  return DG_ALGO_AUTO;
}

#define WARMUP 40 /* barrier + allreduce each */

static void run(dg_pg *pg, const char *algo, size_t bytes, int iters, float *buf) {
  size_t n = bytes / 4;
  dg_pg_set_algo(pg, parse_algo(algo));
  double *t = malloc(sizeof *t * (size_t)iters);
  /* warm-up: past the group's first 64 collectives, whose fingerprints
   * are checked across ranks (dg_pg_opts.check_colls), to time the steady
   * state */
  for (int i = -WARMUP; i < iters; i++) {
    for (size_t k = 0; k < n; k += 1024) buf[k] = 1.0f;
    dg_pg_barrier_sync(pg);
    double t0 = now_us();
    if (dg_pg_allreduce_sync(pg, buf, n, DG_F32, DG_RED_SUM) != DG_OK) {
      fprintf(stderr, "allreduce failed: %s\n", dg_pg_errmsg(pg));
      exit(1);
    }
    if (i >= 0) t[i] = now_us() - t0;
  }
  if (dg_pg_rank(pg) == 0) {
    printf("{\"impl\": \"dgrad\", \"algo\": \"%s\", \"world\": %d, \"bytes\": %zu, \"us\": [",
           algo, dg_pg_size(pg), bytes);
    for (int i = 0; i < iters; i++) printf("%s%.1f", i ? ", " : "", t[i]);
    printf("]}\n");
    fflush(stdout);
  }
  free(t);
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s ITERS ALGOS SIZES\n", argv[0]);
    return 2;
  }
  int iters = atoi(argv[1]);
  dg_pg *pg = NULL;
  char err[256];
  if (dg_pg_new_from_env(&pg, 120000, err, sizeof err) != DG_OK) {
    fprintf(stderr, "init: %s\n", err);
    return 1;
  }
  float *buf = calloc(64u << 20, 1);
  char sizes[512];
  snprintf(sizes, sizeof sizes, "%s", argv[3]);
  for (char *sv, *s = strtok_r(sizes, ",", &sv); s; s = strtok_r(NULL, ",", &sv)) {
    char algos[128];
    snprintf(algos, sizeof algos, "%s", argv[2]);
    for (char *av, *a = strtok_r(algos, ",", &av); a; a = strtok_r(NULL, ",", &av))
      run(pg, a, (size_t)strtoull(s, NULL, 10), iters, buf);
  }
  free(buf);
  dg_pg_free(pg);
  return 0;
}
