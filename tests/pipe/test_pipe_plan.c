/* Pipeline planning (dist/pipe_plan.c), checked from outside:
 * - the partition against brute force over every contiguous split, on
 *   random costs with and without a memory cap and the cost of each cut
 *   (a boundary's transfer), and on torchgpipe's
 *   counterexamples ([1]*9+[10] into 2: 10, not 14; [1]*12+[10,10] into 4:
 *   no empty stage);
 * - GPipe and 1F1B tables for every K <= 8, M <= 16 pass the validator,
 *   GPipe's idle fraction is the theory's (K-1)/(M+K-1) and 1F1B keeps at
 *   most min(M, K - s) activations alive on stage s;
 * - broken tables (a swapped send order, a backward before its forward, a
 *   missing receive, a receive that waits for nothing) are refused, naming
 *   the stage and the micro-batch. */
#include <math.h>
#include <stdlib.h>

#include "dgrad.h"
#include "dist/pipe_plan.h"
#include "tests/test.h"

/* cut (may be NULL): what the boundary after layer i adds to both stages */
static const double *g_cut;

static double edges(int lo, int e, int n) {
  return g_cut ? (lo > 0 ? g_cut[lo - 1] : 0) + (e < n ? g_cut[e - 1] : 0) : 0;
}

static double brute(const double *c, const double *m, int n, int k, double cap, int lo, int s) {
  if (s == k - 1) { /* last stage takes [lo, n) */
    double sc = 0, sm = 0;
    for (int i = lo; i < n; i++) sc += c[i], sm += m ? m[i] : 0;
    return (lo < n && (cap <= 0 || sm <= cap)) ? sc + edges(lo, n, n) : INFINITY;
  }
  double best = INFINITY, sc = 0, sm = 0;
  for (int e = lo + 1; e <= n - (k - s - 1); e++) { /* stage s is [lo, e) */
    sc += c[e - 1], sm += m ? m[e - 1] : 0;
    if (cap > 0 && sm > cap) break;
    best = fmin(best, fmax(sc + edges(lo, e, n), brute(c, m, n, k, cap, e, s + 1)));
  }
  return best;
}

/* The split is valid and its cost is what it claims. */
static void check_split(const double *c, const double *m, int n, int k, double cap,
                        const int *first, double claimed) {
  CHECK_EQ_INT(first[0], 0);
  CHECK_EQ_INT(first[k], n);
  double worst = 0;
  for (int s = 0; s < k; s++) {
    CHECK(first[s + 1] > first[s]);
    double sc = 0, sm = 0;
    for (int i = first[s]; i < first[s + 1]; i++) sc += c[i], sm += m ? m[i] : 0;
    if (cap > 0) CHECK(sm <= cap);
    worst = fmax(worst, sc + edges(first[s], first[s + 1], n));
  }
  CHECK(worst == claimed);
}

static void partition_vs_brute(void) {
  srand(7);
  int first[DG__PIPE_MAX_STAGES + 1];
  char err[256];
  for (int trial = 0; trial < 3000; trial++) {
    int n = 1 + rand() % 12, k = 1 + rand() % (n < 5 ? n : 5);
    double c[12], m[12], cut[12], cap = 0;
    for (int i = 0; i < n; i++) c[i] = rand() % 4 == 0 ? rand() % 50 : rand() % 7, m[i] = 1 + rand() % 9;
    for (int i = 0; i < n; i++) cut[i] = rand() % 3 == 0 ? rand() % 40 : rand() % 3;
    const int capped = trial % 2;
    g_cut = trial % 3 ? cut : NULL; /* boundaries that cost as much as layers, or nothing */
    if (capped) cap = 5 + rand() % 30;
    double want = brute(c, capped ? m : NULL, n, k, cap, 0, 0), got = -1;
    int rc = dg__pipe_partition_cut(c, g_cut, capped ? m : NULL, n, k, cap, first, &got, err,
                                    sizeof err);
    if (want == INFINITY) {
      CHECK_EQ_INT(rc, DG_EINVAL);
      continue;
    }
    CHECK_OK(rc);
    if (rc) continue;
    CHECK(got == want);
    check_split(c, capped ? m : NULL, n, k, cap, first, got);
  }
  g_cut = NULL;
}

static void counterexamples(void) {
  int first[DG__PIPE_MAX_STAGES + 1];
  double c[14], got;
  char err[256];
  for (int i = 0; i < 10; i++) c[i] = i < 9 ? 1 : 10;
  CHECK_OK(dg__pipe_partition(c, NULL, 10, 2, 0, first, &got, err, sizeof err));
  CHECK(got == 10); /* torchgpipe's balance gives a stage of 14 */
  for (int i = 0; i < 14; i++) c[i] = i < 12 ? 1 : 10;
  CHECK_OK(dg__pipe_partition(c, NULL, 14, 4, 0, first, &got, err, sizeof err));
  check_split(c, NULL, 14, 4, 0, first, got); /* no empty stage, no layer twice */
  CHECK(got == 10);
  /* misuse */
  CHECK_EQ_INT(dg__pipe_partition(c, NULL, 3, 4, 0, first, &got, err, sizeof err), DG_EINVAL);
  CHECK_STR_HAS(err, "3 layers into 4 stages");
  double mem[3] = {1, 9, 1};
  CHECK_EQ_INT(dg__pipe_partition(c, mem, 3, 2, 5, first, &got, err, sizeof err), DG_EINVAL);
  CHECK_STR_HAS(err, "layer 1 alone needs 9");
  int bal[3] = {2, 0, 1};
  CHECK_EQ_INT(dg__pipe_balance_check(bal, 3, 3, err, sizeof err), DG_EINVAL);
  CHECK_STR_HAS(err, "stage 1 has 0 layers");
  bal[1] = 2;
  CHECK_EQ_INT(dg__pipe_balance_check(bal, 3, 4, err, sizeof err), DG_EINVAL);
  CHECK_STR_HAS(err, "the stages hold 5 layers, the model has 4");
  bal[1] = 1;
  CHECK_OK(dg__pipe_balance_check(bal, 3, 4, err, sizeof err));
}

static void schedules(void) {
  char err[256];
  for (int kind = 0; kind < 2; kind++)
    for (int K = 1; K <= 8; K++)
      for (int M = 1; M <= 16; M++) {
        dg__pipe_table t;
        dg__pipe_stats st;
        REQUIRE(dg__pipe_schedule(&t, kind, K, M, err, sizeof err) == DG_OK);
        int rc = dg__pipe_validate(&t, &st, err, sizeof err);
        if (rc) fprintf(stderr, "%s K=%d M=%d: %s\n", dg__pipe_kind_name(kind), K, M, err);
        CHECK_OK(rc);
        for (int s = 0; s < K && !rc; s++)
          CHECK_EQ_INT(st.max_alive[s], kind == DG__PIPE_GPIPE ? M : (M < K - s ? M : K - s));
        if (kind == DG__PIPE_GPIPE && !rc)
          CHECK_NEAR(st.idle, (double)(K - 1) / (M + K - 1), 1e-12);
        dg__pipe_table_free(&t);
      }
}

/* Finds action (op, mb) in stage s's row. */
static int find(const dg__pipe_table *t, int s, int op, int mb) {
  for (int i = t->off[s]; i < t->off[s + 1]; i++)
    if (t->act[i].op == op && t->act[i].mb == mb) return i;
  return -1;
}

static void broken_tables(void) {
  char err[256];
  dg__pipe_table t;
  REQUIRE(dg__pipe_schedule(&t, DG__PIPE_GPIPE, 3, 4, err, sizeof err) == DG_OK);
  /* stage 0 runs micro-batch 1 (forward, send) before 0: stage 1 receives
   * in the other order */
  int a = find(&t, 0, DG__PIPE_FWD, 0), b = find(&t, 0, DG__PIPE_FWD, 1);
  REQUIRE(b == a + 2);
  for (int i = 0; i < 2; i++) {
    dg__pipe_action x = t.act[a + i];
    t.act[a + i] = t.act[b + i], t.act[b + i] = x;
  }
  CHECK_EQ_INT(dg__pipe_validate(&t, NULL, err, sizeof err), DG_EINVAL);
  CHECK_STR_HAS(err, "sends and receives in different orders");
  dg__pipe_table_free(&t);

  REQUIRE(dg__pipe_schedule(&t, DG__PIPE_1F1B, 3, 4, err, sizeof err) == DG_OK);
  a = find(&t, 2, DG__PIPE_FWD, 3), b = find(&t, 2, DG__PIPE_BWD, 3);
  dg__pipe_action y = t.act[a];
  t.act[a] = t.act[b], t.act[b] = y;
  CHECK_EQ_INT(dg__pipe_validate(&t, NULL, err, sizeof err), DG_EINVAL);
  CHECK_STR_HAS(err, "stage 2");
  CHECK_STR_HAS(err, "micro-batch 3");
  dg__pipe_table_free(&t);

  REQUIRE(dg__pipe_schedule(&t, DG__PIPE_1F1B, 2, 3, err, sizeof err) == DG_OK);
  a = find(&t, 1, DG__PIPE_RECV_ACT, 2); /* becomes a second forward receive of mb 1 */
  t.act[a].mb = 1;
  CHECK_EQ_INT(dg__pipe_validate(&t, NULL, err, sizeof err), DG_EINVAL);
  CHECK_STR_HAS(err, "twice");
  dg__pipe_table_free(&t);

  /* stage 0 waits for a gradient before sending its activations: each
   * stage's order is valid on its own, but the pipe cannot move */
  REQUIRE(dg__pipe_schedule(&t, DG__PIPE_GPIPE, 2, 2, err, sizeof err) == DG_OK);
  int n0 = t.off[1];
  dg__pipe_action row[16];
  int r = 0;
  for (int i = 0; i < n0; i++)
    if (t.act[i].op == DG__PIPE_RECV_GRAD && t.act[i].mb == 0) row[r++] = t.act[i];
  for (int i = 0; i < n0; i++)
    if (!(t.act[i].op == DG__PIPE_RECV_GRAD && t.act[i].mb == 0)) row[r++] = t.act[i];
  memcpy(t.act, row, (size_t)n0 * sizeof *row);
  CHECK_EQ_INT(dg__pipe_validate(&t, NULL, err, sizeof err), DG_EINVAL);
  CHECK_STR_HAS(err, "deadlock: stage 0 waits at action 0 (receive gradient of micro-batch 0)");
  dg__pipe_table_free(&t);
}

int main(void) {
  partition_vs_brute();
  counterexamples();
  schedules();
  broken_tables();
  return TEST_DONE();
}
