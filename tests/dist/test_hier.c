/* The hierarchical allreduce (DG_ALGO_HIER, issue #17 item 6) with
 * DG_HOST_ID faking several hosts on this machine:
 *   test_hier 2x2   ranks 0,1 on host A, 2,3 on B
 *   test_hier 2x2i  ranks 0,2 on A, 1,3 on B (hosts interleaved)
 *   test_hier 2p1   ranks 0,1 on A, 2 on B (uneven: one shard)
 *   test_hier kill  2x2; rank 3 is killed mid-run: every other rank fails
 *                   before the group's timeout, naming it
 * Each layout: the hierarchy is chosen by DG_ALGO_AUTO for every size;
 * f32/f64/i64/f16 sums, f32 avg, f32/i64 max for counts 0, 1, odd and
 * large equal the values computed here in the hierarchical order (each
 * host's ranks in rank order, then the hosts), bit for bit; the INFO log
 * names DG_HOST_ID and the hierarchy; a user's first sub-group is still
 * "1" and works. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dgrad/dist.h"
#include "tests/dist/coll_util.h"
#include "tests/fault/fork_util.h"
#include "tests/test.h"

#define TIMEOUT_MS 20000

static const char *g_layout; /* host of each rank: "AABB" */
static char g_log[8192];
static size_t g_logn;

static void log_fn(void *user, dg_log_level lvl, const char *msg) {
  (void)lvl, (void)user;
  size_t n = strlen(msg);
  if (g_logn + n + 2 < sizeof g_log) {
    memcpy(g_log + g_logn, msg, n);
    g_logn += n;
    g_log[g_logn++] = '\n';
    g_log[g_logn] = 0;
  }
}

/* Rank r's element i: spread exponents and signs, so that order matters. */
static double val(int r, size_t i, dg_dtype dt) {
  uint64_t h = (uint64_t)(r + 1) * 0x9e3779b97f4a7c15ULL ^ (uint64_t)i * 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 29;
  if (dt == DG_I64) return (double)(int64_t)((h >> 20) % 2000000001ULL) - 1e9;
  double m = (double)(h % 1000003) / 997.0, e = (double)((h >> 24) % 7);
  if (dt == DG_F16) m *= 1e-3; /* stays below f16's 65504 */
  return ((h >> 40) & 1 ? -m : m) * (e == 0 ? 1e-3 : e == 1 ? 1e3 : 1.0);
}

/* dst = dst op src, one element, as dgrad's reduction (f16 through f32). */
static void red1(void *d, const void *s, size_t i, dg_dtype dt, dg_redop op) {
  double a = get_val(d, dt, i), b = get_val(s, dt, i);
  if (dt == DG_I64) {
    int64_t x = ((int64_t *)d)[i], y = ((const int64_t *)s)[i];
    ((int64_t *)d)[i] = op == DG_RED_MAX ? (y > x ? y : x) : x + y;
  } else if (dt == DG_F32) {
    float x = (float)a, y = (float)b;
    ((float *)d)[i] = op == DG_RED_MAX ? (y > x ? y : x) : x + y;
  } else if (dt == DG_F64) {
    ((double *)d)[i] = op == DG_RED_MAX ? (b > a ? b : a) : a + b;
  } else {
    float x = (float)a, y = (float)b;
    put_val(d, dt, i, op == DG_RED_MAX ? (y > x ? y : x) : x + y);
  }
}

/* The expected result: each host's ranks folded in rank order, then the
 * hosts in the order of their first rank; AVG divides as dgrad does. */
static void expect(void *out, size_t n, dg_dtype dt, dg_redop op, int W) {
  size_t es = dg_dtype_size(dt);
  char *acc = calloc(n ? n : 1, es), *x = calloc(n ? n : 1, es);
  char seen[8] = {0};
  int first = 1;
  for (int r = 0; r < W; r++) {
    char h = g_layout[r];
    if (strchr(seen, h)) continue;
    seen[strlen(seen)] = h;
    int hfirst = 1;
    for (int q = r; q < W; q++) {
      if (g_layout[q] != h) continue;
      for (size_t i = 0; i < n; i++) put_val(x, dt, i, val(q, i, dt));
      if (dt == DG_I64)
        for (size_t i = 0; i < n; i++) ((int64_t *)x)[i] = (int64_t)val(q, i, dt);
      if (hfirst) memcpy(acc, x, n * es);
      else
        for (size_t i = 0; i < n; i++) red1(acc, x, i, dt, op);
      hfirst = 0;
    }
    if (first) memcpy(out, acc, n * es);
    else
      for (size_t i = 0; i < n; i++) red1(out, acc, i, dt, op);
    first = 0;
  }
  if (op == DG_RED_AVG)
    for (size_t i = 0; i < n; i++) ((float *)out)[i] /= (float)W; /* f32 only here */
  free(acc);
  free(x);
}

static int join(int r, dg_pg **pg) {
  char host[8] = {g_layout[r], 0}, err[512];
  setenv("DG_HOST_ID", host, 1);
  dg_set_log_fn(log_fn, NULL);
  dg_set_log_level(DG_LOG_INFO);
  if (dg_pg_new_from_env(pg, TIMEOUT_MS, err, sizeof err) != DG_OK) {
    fprintf(stderr, "rank %d: %s\n", r, err);
    return 1;
  }
  return 0;
}

/* One allreduce of n elements (at byte offset `mis`: a buffer not aligned
 * to 4) against the expected bits. */
static void one(dg_pg *pg, int r, int W, size_t n, dg_dtype dt, dg_redop op, size_t mis) {
  size_t es = dg_dtype_size(dt);
  char *raw = calloc(n * es + 16, 1), *want = calloc(n * es + 8, 1);
  char *b = raw + mis;
  for (size_t i = 0; i < n; i++) {
    if (dt == DG_I64) ((int64_t *)(void *)b)[i] = (int64_t)val(r, i, dt);
    else put_val(b, dt, i, val(r, i, dt));
  }
  expect(want, n, dt, op, W);
  CHECK(dg_pg_allreduce_algo(pg, n, dt) == DG_ALGO_HIER);
  int rc = dg_pg_allreduce_sync(pg, b, n, dt, op);
  if (rc != DG_OK) T_FAIL_("rank %d: %s", r, dg_pg_errmsg(pg));
  size_t bad = n;
  for (size_t i = 0; i < n && bad == n; i++)
    if (memcmp(b + i * es, want + i * es, es)) bad = i;
  if (bad < n)
    T_FAIL_("rank %d: %s %s[%zu] (offset %zu): element %zu is %.17g, want %.17g", r,
            op == DG_RED_AVG ? "avg" : op == DG_RED_MAX ? "max" : "sum", dg_dtype_name(dt), n,
            mis, bad, get_val(b, dt, bad), get_val(want, dt, bad));
  free(raw);
  free(want);
}

static int layout_rank(int r, int W) {
  dg_pg *pg = NULL;
  if (join(r, &pg)) return 2;
  CHECK_STR_HAS(g_log, "from opts.host_id / DG_HOST_ID");
  CHECK_STR_HAS(g_log, "hierarchical allreduce: host");
  CHECK_STR_HAS(g_log, "the default (DG_ALGO_AUTO)");
  const size_t counts[] = {0, 1, 3, 17, 1001, 65537, 300001};
  for (size_t k = 0; k < sizeof counts / sizeof *counts; k++) {
    size_t n = counts[k];
    one(pg, r, W, n, DG_F32, DG_RED_SUM, 0);
    one(pg, r, W, n, DG_F64, DG_RED_SUM, 0);
    one(pg, r, W, n, DG_I64, DG_RED_SUM, 0);
    one(pg, r, W, n, DG_F32, DG_RED_AVG, 0);
    one(pg, r, W, n, DG_F32, DG_RED_MAX, 0);
    one(pg, r, W, n, DG_I64, DG_RED_MAX, 0);
    one(pg, r, W, n, DG_F16, DG_RED_SUM, 2); /* odd counts: 2-byte tail, unaligned */
  }
  /* forced: still the hierarchy; ring: the flat order, same sums for i64 */
  CHECK_OK(dg_pg_set_algo(pg, DG_ALGO_HIER));
  one(pg, r, W, 4097, DG_I64, DG_RED_SUM, 0);
  CHECK_OK(dg_pg_set_algo(pg, DG_ALGO_RING));
  CHECK(dg_pg_allreduce_algo(pg, 10, DG_F32) == DG_ALGO_RING);
  CHECK_OK(dg_pg_set_algo(pg, DG_ALGO_AUTO));
  /* a user's sub-group: torch's numbering is untouched ("1"), and it works
   * (no hierarchy of its own) */
  dg_pg *sub = NULL;
  char err[512];
  CHECK_OK(dg_pg_new_group(&sub, pg, NULL, 0, err, sizeof err));
  CHECK_STR_HAS(g_log, "sub-group 1, rank");
  if (sub) {
    CHECK(dg_pg_allreduce_algo(sub, 1000, DG_F32) != DG_ALGO_HIER);
    int64_t v = r + 1;
    CHECK_OK(dg_pg_allreduce_sync(sub, &v, 1, DG_I64, DG_RED_SUM));
    CHECK_EQ_INT(v, W * (W + 1) / 2);
    dg_pg_free(sub);
  }
  CHECK_OK(dg_pg_barrier_sync(pg));
  dg_pg_free(pg);
  return dg_test_failures ? 1 : 0;
}

/* Rank 3 (host B, with rank 2) dies while the others wait in a
 * hierarchical allreduce: each fails before the timeout, naming it. */
static int kill_rank(int r, int W) {
  (void)W;
  dg_pg *pg = NULL;
  if (join(r, &pg)) return 2;
  static float b[1 << 20];
  CHECK_OK(dg_pg_allreduce_sync(pg, b, 1 << 20, DG_F32, DG_RED_SUM));
  if (r == 3) {
    usleep(300000); /* let the others post first */
    raise(SIGKILL);
  }
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int rc = dg_pg_allreduce_sync(pg, b, 1 << 20, DG_F32, DG_RED_SUM);
  double ms = fu_ms_since(&t0);
  const char *msg = dg_pg_errmsg(pg);
  fprintf(stderr, "rank %d: %s after %.0f ms: %s\n", r, dg_err_name(rc), ms, msg);
  CHECK(rc == DG_EPEER || rc == DG_ETIMEDOUT);
  CHECK(ms < TIMEOUT_MS); /* the peer's death, not the deadline */
  CHECK_STR_HAS(msg, "rank 3");
  usleep(500000); /* leave only once every survivor has seen rank 3 go */
  dg_pg_free(pg);
  return dg_test_failures ? 1 : 0;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "2x2";
  g_layout = !strcmp(mode, "2x2i") ? "ABAB" : !strcmp(mode, "2p1") ? "AAB" : "AABB";
  int W = (int)strlen(g_layout), st[8];
  int kill = !strcmp(mode, "kill");
  fu_run(W, kill ? kill_rank : layout_rank, 120, st);
  for (int r = 0; r < W; r++) {
    if (kill && r == 3) CHECK(st[r] != -1 && WIFSIGNALED(st[r]));
    else if (st[r] == -1 || !WIFEXITED(st[r]) || WEXITSTATUS(st[r]) != 0)
      T_FAIL_("rank %d: status 0x%x", r, st[r]);
  }
  return TEST_DONE();
}
