/* A dgrad rank for the fault and misuse interop tests (fault_driver.c):
 *
 *   dg_fault loop DIR OUT  joins from the environment, all-reduces in a loop
 *                          until the group fails, then writes to OUT the
 *                          CLOCK_MONOTONIC ms of the failure and the message;
 *                          exits 3 (DIR/ready_<rank> once joined);
 *                          DG_FAULT_PAUSE_MS: a pause before each one
 *   dg_fault once DIR      reduce_scatter must fail at once with
 *                          DG_EUNSUPPORTED (torch gloo has none) and leave
 *                          the group usable: one all-reduce and a barrier
 *   dg_fault ucx           DG_BACKEND=ucx with torch ranks: the join must
 *                          fail with DG_EUNSUPPORTED, not at the timeout
 *   dg_fault store OUT     hosts a TCPStore (port written to OUT) for a torch
 *                          client that sets keys with NUL bytes and the
 *                          empty key; waits for its "done"
 * Exit codes: 0 as expected, 3 failed as the loop must, others: wrong. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dgrad/dist.h"

#define TIMEOUT_MS 60000

static long long now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void touch(const char *dir, int rank) {
  char p[512];
  snprintf(p, sizeof p, "%s/ready_%d", dir, rank);
  FILE *f = fopen(p, "w");
  if (f) fclose(f);
}

static dg_pg *join(void) {
  dg_pg *pg = NULL;
  char err[1024] = "";
  int rc = dg_pg_new_from_env(&pg, TIMEOUT_MS, err, sizeof err);
  if (rc != DG_OK) fprintf(stderr, "dg_fault: init: %s: %s\n", dg_err_name(rc), err);
  return pg;
}

static int loop(const char *dir, const char *out) {
  dg_pg *pg = join();
  if (!pg) return 1;
  static float b[4096];
  int rc = dg_pg_allreduce_sync(pg, b, 4096, DG_F32, DG_RED_SUM);
  touch(dir, dg_pg_rank(pg));
  const char *pause = getenv("DG_FAULT_PAUSE_MS"); /* idle between all-reduces */
  while (rc == DG_OK) {
    if (pause) usleep(1000 * (useconds_t)atoi(pause));
    rc = dg_pg_allreduce_sync(pg, b, 4096, DG_F32, DG_RED_SUM);
  }
  long long t = now_ms();
  FILE *f = fopen(out, "w");
  if (f) {
    fprintf(f, "%lld %s %s\n", t, dg_err_name(rc), dg_pg_errmsg(pg));
    fclose(f);
  }
  fprintf(stderr, "dg_fault rank %d: %s: %s\n", dg_pg_rank(pg), dg_err_name(rc),
          dg_pg_errmsg(pg));
  dg_pg_free(pg);
  return 3;
}

static int once(const char *dir) {
  dg_pg *pg = join();
  if (!pg) return 1;
  int W = dg_pg_size(pg), bad = 0;
  float b[4096];
  for (int i = 0; i < 4096; i++) b[i] = 1;
  if (dg_pg_allreduce_sync(pg, b, 4096, DG_F32, DG_RED_SUM) != DG_OK) return 1;
  touch(dir, dg_pg_rank(pg));
  float in[64], o[8];
  memset(in, 0, sizeof in);
  dg_work *w = NULL;
  long long t0 = now_ms();
  int rc = dg_pg_reduce_scatter(pg, in, o, W <= 8 ? 8 : 1, DG_F32, DG_RED_SUM, &w);
  if (rc == DG_OK) rc = dg_work_wait(w, 0);
  long long dt = now_ms() - t0;
  if (rc != DG_EUNSUPPORTED || !strstr(dg_work_errmsg(w), "torch")) {
    fprintf(stderr, "dg_fault: reduce_scatter gave %s: %s\n", dg_err_name(rc),
            w ? dg_work_errmsg(w) : "(no work)");
    bad = 1;
  }
  if (dt > TIMEOUT_MS / 2) {
    fprintf(stderr, "dg_fault: reduce_scatter took %lld ms to fail\n", dt);
    bad = 1;
  }
  fprintf(stderr, "dg_fault: reduce_scatter: %s in %lld ms: %s\n", dg_err_name(rc), dt,
          w ? dg_work_errmsg(w) : "");
  dg_work_free(w);
  for (int i = 0; i < 5; i++) b[i] = 1;
  if ((rc = dg_pg_allreduce_sync(pg, b, 5, DG_F32, DG_RED_SUM)) != DG_OK) {
    fprintf(stderr, "dg_fault: allreduce after reduce_scatter: %s\n", dg_pg_errmsg(pg));
    bad = 1;
  }
  for (int i = 0; i < 5 && !bad; i++) bad = b[i] != (float)W;
  if (dg_pg_barrier_sync(pg) != DG_OK) bad = 1;
  dg_pg_free(pg);
  return bad ? 1 : 0;
}

static int ucx(void) {
  dg_pg *pg = NULL;
  char err[1024] = "";
  long long t0 = now_ms();
  int rc = dg_pg_new_from_env(&pg, TIMEOUT_MS, err, sizeof err);
  long long dt = now_ms() - t0;
  fprintf(stderr, "dg_fault: ucx join: %s in %lld ms: %s\n", dg_err_name(rc), dt, err);
  if (rc == DG_OK) dg_pg_free(pg);
  return rc == DG_EUNSUPPORTED && strstr(err, "torch or libgloo") && dt < TIMEOUT_MS / 2 ? 0 : 1;
}

static int store(const char *out) {
  dg_store *s = NULL;
  char err[512] = "";
  dg_tcp_store_opts o = {.host = "127.0.0.1", .port = 0, .is_server = 1, .timeout_ms = 30000};
  if (dg_store_new_tcp(&s, &o, err, sizeof err) != DG_OK) {
    fprintf(stderr, "dg_fault: store: %s\n", err);
    return 1;
  }
  FILE *f = fopen(out, "w");
  if (!f) return 1;
  fprintf(f, "%d\n", dg_store_port(s));
  fclose(f);
  void *v = NULL;
  size_t n = 0;
  int rc = dg_store_get(s, "done", &v, &n, 30000);
  dg_store_value_free(v);
  if (rc == DG_OK) rc = dg_store_get(s, "", &v, &n, 1000); /* torch's empty key */
  int bad = rc != DG_OK || n != 5 || memcmp(v, "empty", 5) != 0;
  if (bad) fprintf(stderr, "dg_fault: store: %s: %s\n", dg_err_name(rc), dg_store_errmsg(s));
  dg_store_value_free(v);
  dg_store_free(s);
  return bad;
}

int main(int argc, char **argv) {
  if (argc > 3 && !strcmp(argv[1], "loop")) return loop(argv[2], argv[3]);
  if (argc > 2 && !strcmp(argv[1], "once")) return once(argv[2]);
  if (argc > 1 && !strcmp(argv[1], "ucx")) return ucx();
  if (argc > 2 && !strcmp(argv[1], "store")) return store(argv[2]);
  fprintf(stderr, "usage: dg_fault loop DIR OUT | once DIR | ucx | store OUT\n");
  return 2;
}
