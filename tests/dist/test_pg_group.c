/* Sub-groups (dg_pg_new_group) on a world of 4 forked ranks over loopback:
 *   groups  {0,1} {2,3} {1,3} (given unsorted) {0,2,3} and every rank,
 *           every collective against exact values, each algorithm, the
 *           shared-memory path and the wire paths; no connection opened
 *           (sockets counted in /proc/self/fd); a sub-group of a sub-group;
 *           collectives on two sub-groups and the parent in flight at once,
 *           posted in a different order on each rank, and send/recv with
 *           one tag on the parent and a sub-group between the same pair;
 *           the parent freed before its sub-groups (which keep working)
 *           on some ranks, after them on others;
 *   mismatch ranks disagreeing on the list fail, naming both; bad lists are
 *           refused at once; the group still works afterwards;
 *   kill    a killed member fails the others before the group's timeout,
 *           naming it in both numberings;
 *   ddp     DDP over {0,2} and over {1,3} of the 4 ranks equals DDP on a
 *           world of 2 (bit for bit) and one process on the whole batch.
 * Usage: test_pg_group main|mismatch|kill|ddp */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dgrad/dist.h"
#include "tests/ddp/ddp_util.h"
#include "tests/dist/coll_util.h"
#include "tests/fault/fork_util.h"
#include "tests/test.h"

#define NW 4
#define TIMEOUT_MS 10000

/* Open sockets of this process. */
static int count_sockets(void) {
  DIR *d = opendir("/proc/self/fd");
  int n = 0;
  struct dirent *e;
  while (d && (e = readdir(d))) {
    char p[300], l[64];
    snprintf(p, sizeof p, "/proc/self/fd/%s", e->d_name);
    ssize_t k = readlink(p, l, sizeof l - 1);
    if (k > 0 && (l[k] = 0, !strncmp(l, "socket:", 7))) n++;
  }
  if (d) closedir(d);
  return n;
}

static int join(dg_pg **pg) {
  char err[512];
  int rc = dg_pg_new_from_env(pg, TIMEOUT_MS, err, sizeof err);
  if (rc) fprintf(stderr, "join: %s\n", err);
  return rc;
}

static dg_pg *group(dg_pg *pg, const int *ranks, int n, int want_member) {
  dg_pg *g = NULL;
  char err[512];
  int rc = dg_pg_new_group(&g, pg, ranks, n, err, sizeof err);
  if (rc) fprintf(stderr, "rank %d: new_group: %s\n", dg_pg_rank(pg), err);
  CHECK_OK(rc);
  CHECK_EQ_INT(g != NULL, want_member);
  return g;
}

/* Every collective on g, whose rank i is parent rank mem[i]; values are
 * built from parent ranks, so a wrong mapping shows. */
static void check_collectives(dg_pg *g, const int *mem, const char *what) {
  int n = dg_pg_size(g), r = dg_pg_rank(g), me = mem[r];
  int sum = 0, mx = 0;
  for (int i = 0; i < n; i++) sum += mem[i], mx = mem[i] > mx ? mem[i] : mx;
  static const size_t sizes[] = {1, 37, 5000, 300001};
  for (int s = 0; s < 4; s++) { /* small: rd; large: shm / ring / direct */
    size_t cnt = sizes[s];
    float *b = malloc(cnt * sizeof *b);
    for (size_t i = 0; i < cnt; i++) b[i] = (float)(me + (int)(i % 5));
    int rc = dg_pg_allreduce_sync(g, b, cnt, DG_F32, DG_RED_SUM);
    if (rc) fprintf(stderr, "%s: allreduce: %s\n", what, dg_pg_errmsg(g));
    CHECK_OK(rc);
    size_t bad = 0;
    for (size_t i = 0; i < cnt && !rc; i++)
      if (b[i] != (float)(sum + n * (int)(i % 5))) bad++;
    if (bad) T_FAIL_("%s: allreduce of %zu: %zu wrong elements", what, cnt, bad);
    free(b);
  }
  int64_t v = me;
  CHECK_OK(dg_pg_allreduce_sync(g, &v, 1, DG_I64, DG_RED_MAX));
  CHECK_EQ_INT(v, mx);
  for (int root = 0; root < n; root++) {
    int32_t bc[3] = {-1, -1, -1};
    if (r == root) bc[0] = bc[1] = bc[2] = 100 + mem[root];
    dg_work *w;
    CHECK_OK(dg_pg_broadcast(g, bc, 3, DG_I32, root, &w));
    CHECK_OK(finish(w, what));
    CHECK_EQ_INT(bc[2], 100 + mem[root]);
  }
  int32_t in[2] = {me, 10 * me}, out[2 * NW] = {0};
  dg_work *w;
  CHECK_OK(dg_pg_allgather(g, in, out, 2, DG_I32, &w));
  CHECK_OK(finish(w, what));
  for (int i = 0; i < n; i++) {
    CHECK_EQ_INT(out[2 * i], mem[i]);
    CHECK_EQ_INT(out[2 * i + 1], 10 * mem[i]);
  }
  double rs_in[NW * 3], rs_out[3];
  for (int i = 0; i < n * 3; i++) rs_in[i] = me * 1000 + i;
  CHECK_OK(dg_pg_reduce_scatter(g, rs_in, rs_out, 3, DG_F64, DG_RED_SUM, &w));
  CHECK_OK(finish(w, what));
  for (int k = 0; k < 3; k++) CHECK_EQ_INT((int64_t)rs_out[k], sum * 1000 + n * (r * 3 + k));
  CHECK_OK(dg_pg_barrier_sync(g));
  if (n > 1) { /* a ring of send/recv in group numbering */
    int32_t sv = 7000 + me, rv = -1;
    dg_work *ws, *wr;
    CHECK_OK(dg_pg_recv(g, &rv, 1, DG_I32, (r + n - 1) % n, 5, &wr));
    CHECK_OK(dg_pg_send(g, &sv, 1, DG_I32, (r + 1) % n, 5, &ws));
    CHECK_OK(finish(ws, what));
    CHECK_OK(finish(wr, what));
    CHECK_EQ_INT(rv, 7000 + mem[(r + n - 1) % n]);
  }
}

/* check_collectives under each allreduce algorithm the group has. */
static void check_all_algos(dg_pg *g, const int *mem, const char *what) {
  static const dg_algo algos[] = {DG_ALGO_AUTO, DG_ALGO_RING, DG_ALGO_HALVING_DOUBLING,
                                  DG_ALGO_DIRECT, DG_ALGO_CMA, DG_ALGO_SHM};
  for (int a = 0; a < 6; a++) {
    int rc = dg_pg_set_algo(g, algos[a]);
    if (rc == DG_EUNSUPPORTED && algos[a] >= DG_ALGO_CMA) continue; /* no such path here */
    CHECK_OK(rc);
    char tag[96];
    snprintf(tag, sizeof tag, "%s algo %d", what, algos[a]);
    check_collectives(g, mem, tag);
  }
  CHECK_OK(dg_pg_set_algo(g, DG_ALGO_AUTO));
}

static const int M01[] = {0, 1}, M23[] = {2, 3}, M13[] = {1, 3}, M023[] = {0, 2, 3},
                 MALL[] = {0, 1, 2, 3};

/* Collectives on the parent and two sub-groups in flight together, posted
 * in a different order on odd ranks; p2p with one tag on both. */
static void check_concurrent(dg_pg *pg, dg_pg *ga, const int *ma, dg_pg *gb, const int *mb) {
  int r = dg_pg_rank(pg);
  enum { N = 20000 };
  static float bp[N], ba[N], bb[N];
  for (int i = 0; i < N; i++) bp[i] = (float)r, ba[i] = (float)(10 * r), bb[i] = (float)(100 * r);
  dg_work *w[3] = {0};
  for (int round = 0; round < 3; round++) {
    int k = r % 2 ? 2 - round : round;
    if (k == 0) CHECK_OK(dg_pg_allreduce(pg, bp, N, DG_F32, DG_RED_SUM, &w[0]));
    if (k == 1 && ga) CHECK_OK(dg_pg_allreduce(ga, ba, N, DG_F32, DG_RED_SUM, &w[1]));
    if (k == 2 && gb) CHECK_OK(dg_pg_allreduce(gb, bb, N, DG_F32, DG_RED_SUM, &w[2]));
  }
  for (int k = 0; k < 3; k++)
    if (w[k]) CHECK_OK(finish(w[k], "concurrent"));
  int sa = 0, sb = 0;
  for (int i = 0; i < 2; i++) sa += ma[i], sb += mb[i];
  CHECK_EQ_INT((int)bp[N - 1], 6);
  if (ga) CHECK_EQ_INT((int)ba[N - 1], 10 * sa);
  if (gb) CHECK_EQ_INT((int)bb[N - 1], 100 * sb);
}

/* Parent ranks 1 and 3 exchange with tag 9 on the parent and on {1,3}: each
 * receive gets its own group's message, whatever the order. */
static void check_tags(dg_pg *pg, dg_pg *g13) {
  int r = dg_pg_rank(pg);
  if (r != 1 && r != 3) return;
  int32_t a = 1000 + r, b = 2000 + r, ra = -1, rb = -1;
  dg_work *w[4];
  int peer = 4 - r;
  if (r == 1) { /* sends sub-group first, receives parent first */
    CHECK_OK(dg_pg_send(g13, &b, 1, DG_I32, 1, 9, &w[0]));
    CHECK_OK(dg_pg_send(pg, &a, 1, DG_I32, peer, 9, &w[1]));
    CHECK_OK(dg_pg_recv(pg, &ra, 1, DG_I32, peer, 9, &w[2]));
    CHECK_OK(dg_pg_recv(g13, &rb, 1, DG_I32, 1, 9, &w[3]));
  } else {
    CHECK_OK(dg_pg_recv(pg, &ra, 1, DG_I32, peer, 9, &w[2]));
    CHECK_OK(dg_pg_recv(g13, &rb, 1, DG_I32, 0, 9, &w[3]));
    CHECK_OK(dg_pg_send(pg, &a, 1, DG_I32, peer, 9, &w[1]));
    CHECK_OK(dg_pg_send(g13, &b, 1, DG_I32, 0, 9, &w[0]));
  }
  for (int i = 0; i < 4; i++) CHECK_OK(finish(w[i], "tags"));
  CHECK_EQ_INT(ra, 1000 + peer);
  CHECK_EQ_INT(rb, 2000 + peer);
}

static int main_rank(int r, int ws) {
  (void)ws;
  dg_pg *pg;
  if (join(&pg)) return 2;
  /* the first store request after the rendezvous reconnects to the store:
   * count from after that */
  dg_pg *g01 = group(pg, M01, 2, r < 2);
  int s0 = count_sockets();
  dg_pg *g23 = group(pg, M23, 2, r >= 2);
  dg_pg *g13 = group(pg, (const int[]){3, 1}, 2, r % 2 == 1);
  dg_pg *g023 = group(pg, (const int[]){3, 0, 2}, 3, r != 1);
  dg_pg *gall = group(pg, NULL, 0, 1);
  /* a sub-group of a sub-group: {0, 3} of {0,2,3} is its ranks {0, 2} */
  dg_pg *g03 = r != 1 ? group(g023, (const int[]){0, 2}, 2, r != 2) : NULL;
  CHECK_EQ_INT(count_sockets(), s0);
  if (g13) CHECK_EQ_INT(dg_pg_rank(g13), r == 1 ? 0 : 1);
  if (g023) CHECK_EQ_INT(dg_pg_size(g023), 3);
  CHECK_EQ_INT(dg_pg_rank(gall), r);
  if (g01) check_all_algos(g01, M01, "{0,1}");
  if (g23) check_all_algos(g23, M23, "{2,3}");
  if (g13) check_all_algos(g13, M13, "{1,3}");
  if (g023) check_all_algos(g023, M023, "{0,2,3}");
  if (g03) check_collectives(g03, (const int[]){0, 3}, "{0,3} of {0,2,3}");
  check_collectives(gall, MALL, "all");
  check_collectives(pg, MALL, "parent");
  for (int i = 0; i < 3; i++) check_concurrent(pg, r < 2 ? g01 : g23, r < 2 ? M01 : M23, g13, M13);
  check_tags(pg, g13);
  /* free order: {0,1} and {2,3} before the parent, the others after it */
  dg_pg_free(g01);
  dg_pg_free(g23);
  CHECK_OK(dg_pg_barrier_sync(pg));
  dg_pg_free(pg);
  if (g13) check_collectives(g13, M13, "{1,3} after its parent was freed");
  check_collectives(gall, MALL, "all after the parent was freed");
  dg_pg_free(g03);
  dg_pg_free(g13);
  dg_pg_free(g023);
  CHECK_OK(dg_pg_barrier_sync(gall));
  dg_pg_free(gall);
  return dg_test_failures ? 1 : 0;
}

static int mismatch_rank(int r, int ws) {
  (void)ws;
  dg_pg *pg, *g = NULL;
  if (join(&pg)) return 2;
  char err[512] = "";
  /* refused at once, before anything is exchanged */
  CHECK_EQ_INT(dg_pg_new_group(&g, pg, (const int[]){1, 1}, 2, err, sizeof err), DG_EINVAL);
  CHECK_STR_HAS(err, "rank 1 is listed twice");
  CHECK_EQ_INT(dg_pg_new_group(&g, pg, (const int[]){0, 4}, 2, err, sizeof err), DG_EINVAL);
  CHECK_STR_HAS(err, "rank 4 is not a rank of the parent");
  CHECK_EQ_INT(dg_pg_new_group(&g, pg, NULL, 3, err, sizeof err), DG_EINVAL);
  CHECK_EQ_INT(dg_pg_new_group(NULL, pg, NULL, 0, err, sizeof err), DG_EINVAL);
  /* ranks 2 and 3 ask for another group */
  const int *mine = r < 2 ? (const int[]){0, 1} : (const int[]){0, 2};
  int rc = dg_pg_new_group(&g, pg, mine, 2, err, sizeof err);
  CHECK_EQ_INT(rc, DG_EMISMATCH);
  CHECK(g == NULL);
  CHECK_STR_HAS(err, "asks for ranks");
  CHECK_STR_HAS(err, r < 2 ? "asks for ranks [0, 1] but rank" : "asks for ranks [0, 2] but rank");
  CHECK_STR_HAS(err, r < 2 ? "asks for [0, 2]" : "asks for [0, 1]");
  /* the parent is intact and the numbering still agrees */
  dg_pg *ok = group(pg, M13, 2, r % 2 == 1);
  if (ok) check_collectives(ok, M13, "{1,3} after a mismatch");
  check_collectives(pg, MALL, "parent after a mismatch");
  dg_pg_free(ok);
  dg_pg_free(pg);
  return dg_test_failures ? 1 : 0;
}

/* Rank 3 dies after making {1,3} and {0,2,3}, once the others have posted
 * an allreduce on them; each names it in both numberings. */
static int kill_rank(int r, int ws) {
  (void)ws;
  dg_pg *pg;
  if (join(&pg)) return 2;
  dg_pg *g13 = group(pg, M13, 2, r % 2 == 1);
  dg_pg *g023 = group(pg, M023, 3, r != 1);
  CHECK_OK(dg_pg_barrier_sync(pg));
  if (r == 3) {
    usleep(200000); /* let the others post first */
    raise(SIGKILL);
  }
  dg_pg *g = r == 1 ? g13 : g023;
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  float b[64] = {0};
  int rc = dg_pg_allreduce_sync(g, b, 64, DG_F32, DG_RED_SUM);
  double ms = fu_ms_since(&t0);
  const char *msg = dg_pg_errmsg(g);
  fprintf(stderr, "rank %d: %s after %.0f ms: %s\n", r, dg_err_name(rc), ms, msg);
  CHECK(rc == DG_EPEER || rc == DG_ETIMEDOUT);
  CHECK(ms < TIMEOUT_MS); /* the peer's death, not the deadline */
  CHECK_STR_HAS(msg, "rank 3");
  CHECK_STR_HAS(msg, r == 1 ? "rank 1 of sub-group 1 is rank 3 of its parent"
                            : "rank 2 of sub-group 2 is rank 3 of its parent");
  /* the parent shares the connections: it has failed too */
  CHECK(dg_pg_barrier_sync(pg) != DG_OK);
  usleep(500000); /* leave only once every survivor has seen rank 3 go */
  dg_pg_free(g13);
  dg_pg_free(g023);
  dg_pg_free(pg);
  return dg_test_failures ? 1 : 0;
}

#define STEPS 5
#define MB 8
static char g_dir[64];

/* Trains the MLP of the DDP tests with DDP over g (rank i seeded 42 + i, so
 * the broadcast matters) on the rows a world of g's size would take;
 * checks it against one process on the whole batch and writes the
 * parameters to <g_dir>/<tag>_<rank>. */
static int ddp_train(dg_pg *g, const char *tag) {
  int r = dg_pg_rank(g), n = dg_pg_size(g);
  du_mlp m, ref;
  dg_ctx *ctx = NULL;
  dg_optim *opt = NULL, *ropt = NULL;
  dg_ddp *ddp = NULL;
  char err[512];
  REQUIRE(!du_mlp_init(&m, 0, 42 + (uint64_t)r) && !du_optim("sgd", m.ps, &opt) &&
          !dg_ctx_new(&ctx, NULL));
  dg_ddp_opts o = du_ddp_defaults();
  int rc = dg_ddp_new(&ddp, ctx, m.ps, g, &o, err, sizeof err);
  if (rc) fprintf(stderr, "%s rank %d: ddp_new: %s\n", tag, r, err);
  REQUIRE(rc == DG_OK);
  for (int s = 0; s < STEPS; s++) {
    dg_tensor *loss = du_loss(ctx, &m, (int64_t)(s * n + r) * MB, MB);
    REQUIRE(loss && dg_backward(ctx, loss) == DG_OK);
    CHECK(dg_ddp_step_ready(ddp));
    CHECK_OK(dg_optim_step(opt));
    dg_params_zero_grad(m.ps);
    dg_ctx_reset(ctx);
  }
  dg_ddp_free(ddp);
  REQUIRE(!du_mlp_init(&ref, 0, 42) && !du_optim("sgd", ref.ps, &ropt));
  for (int s = 0; s < STEPS; s++) {
    dg_tensor *loss = du_loss(ctx, &ref, (int64_t)s * n * MB, (int64_t)n * MB);
    REQUIRE(loss && dg_backward(ctx, loss) == DG_OK);
    CHECK_OK(dg_optim_step(ropt));
    dg_params_zero_grad(ref.ps);
    dg_ctx_reset(ctx);
  }
  double rel = du_rel_diff(m.ps, ref.ps);
  fprintf(stderr, "%s rank %d: max rel diff to one process %.3g\n", tag, r, rel);
  CHECK(rel <= 1e-5);
  char path[128];
  snprintf(path, sizeof path, "%s/%s_%d", g_dir, tag, r);
  FILE *f = fopen(path, "wb");
  REQUIRE(f);
  for (int i = 0; i < dg_params_count(m.ps); i++) {
    dg_tensor *t = dg_params_get(m.ps, i);
    fwrite(dg_tensor_data(t), 4, (size_t)dg_tensor_numel(t), f);
  }
  fclose(f);
  dg_optim_free(opt);
  dg_optim_free(ropt);
  dg_params_free(m.ps);
  dg_params_free(ref.ps);
  dg_ctx_free(ctx);
  return dg_test_failures ? 1 : 0;
}

static int world2_rank(int r, int ws) {
  (void)r, (void)ws;
  dg_pg *pg;
  if (join(&pg)) return 2;
  int rc = ddp_train(pg, "world2");
  dg_pg_free(pg);
  return rc;
}

static int ddp_rank(int r, int ws) {
  (void)ws;
  dg_pg *pg;
  if (join(&pg)) return 2;
  dg_pg *g02 = group(pg, (const int[]){0, 2}, 2, r % 2 == 0);
  dg_pg *g13 = group(pg, M13, 2, r % 2 == 1);
  int rc = ddp_train(g02 ? g02 : g13, g02 ? "sub02" : "sub13");
  dg_pg_free(g02);
  dg_pg_free(g13);
  CHECK_OK(dg_pg_barrier_sync(pg));
  dg_pg_free(pg);
  return rc | (dg_test_failures ? 1 : 0);
}

static char *slurp(const char *tag, int r, size_t *n) {
  char path[128];
  snprintf(path, sizeof path, "%s/%s_%d", g_dir, tag, r);
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *b = malloc(1 << 16);
  *n = fread(b, 1, 1 << 16, f);
  fclose(f);
  return b;
}

/* DDP over the sub-groups, then on a world of 2: same bytes. */
static void run_ddp_mode(void) {
  snprintf(g_dir, sizeof g_dir, "/tmp/dg_pg_group_XXXXXX");
  REQUIRE(mkdtemp(g_dir));
  int st[NW];
  fu_run(NW, ddp_rank, 120, st);
  for (int r = 0; r < NW; r++)
    if (st[r] == -1 || !WIFEXITED(st[r]) || WEXITSTATUS(st[r]) != 0)
      T_FAIL_("sub-groups: rank %d: status 0x%x", r, st[r]);
  fu_run(2, world2_rank, 120, st);
  for (int r = 0; r < 2; r++)
    if (st[r] == -1 || !WIFEXITED(st[r]) || WEXITSTATUS(st[r]) != 0)
      T_FAIL_("world of 2: rank %d: status 0x%x", r, st[r]);
  for (int r = 0; r < 2; r++) {
    size_t n0 = 0, n1 = 0, n2 = 0;
    char *a = slurp("world2", r, &n0), *b = slurp("sub02", r, &n1), *c = slurp("sub13", r, &n2);
    CHECK(a && b && c && n0 > 0 && n0 == n1 && n0 == n2);
    if (a && b && c && n0 == n1 && n0 == n2) {
      CHECK(!memcmp(a, b, n0));
      CHECK(!memcmp(a, c, n0));
    }
    free(a), free(b), free(c);
  }
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "main";
  int (*fn)(int, int) = !strcmp(mode, "mismatch") ? mismatch_rank
                        : !strcmp(mode, "kill")   ? kill_rank
                                                  : main_rank;
  if (!strcmp(mode, "ddp")) {
    run_ddp_mode();
    return TEST_DONE();
  }
  int st[NW];
  fu_run(NW, fn, 120, st);
  for (int r = 0; r < NW; r++) {
    int died = !strcmp(mode, "kill") && r == 3;
    if (died) CHECK(st[r] != -1 && WIFSIGNALED(st[r]));
    else if (st[r] == -1 || !WIFEXITED(st[r]) || WEXITSTATUS(st[r]) != 0)
      T_FAIL_("rank %d: status 0x%x", r, st[r]);
  }
  return TEST_DONE();
}
