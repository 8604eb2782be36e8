/* Collectives with ranks as threads over an in-process store and real TCP
 * pairs: world sizes 1..8 x sizes x dtypes, each rank contributing its rank
 * (plus a per-element offset), so every result is known exactly; Gloo's
 * ring and dgrad's own algorithms; every collective; several in flight. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "dgrad/dist.h"
#include "tests/dist/coll_util.h"
#include "tests/test.h"

static const size_t sizes[] = {0, 1, 4, 100, 10000, 1000003};
static const dg_dtype dtypes[] = {DG_F32, DG_F64, DG_F16, DG_BF16, DG_I32, DG_I64};
static pthread_mutex_t fail_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_no_shm; /* "noshm": dg_pg_opts.no_shm set by the program */

typedef struct {
  int rank, W;
  dg_store *store;
} rank_arg;

#define TCHECK(cond, ...)                                     \
  do {                                                        \
    if (!(cond)) {                                            \
      pthread_mutex_lock(&fail_mu);                           \
      T_FAIL_(__VA_ARGS__);                                   \
      pthread_mutex_unlock(&fail_mu);                         \
    }                                                         \
  } while (0)

static void check_sum(dg_pg *pg, dg_dtype dt, size_t n, dg_algo algo) {
  int W = dg_pg_size(pg), r = dg_pg_rank(pg);
  size_t es = dg_dtype_size(dt);
  void *b = malloc(n * es + 1);
  for (size_t i = 0; i < n; i++) put_val(b, dt, i, r + (double)(i % 7));
  TCHECK(dg_pg_set_algo(pg, algo) == DG_OK, "set_algo %d", algo);
  int rc = dg_pg_allreduce_sync(pg, b, n, dt, DG_RED_SUM);
  TCHECK(rc == DG_OK, "allreduce W=%d n=%zu %s algo %d: %s (%s)", W, n, dg_dtype_name(dt), algo,
         dg_err_name(rc), dg_pg_errmsg(pg));
  size_t bad = 0;
  for (size_t i = 0; i < n && rc == DG_OK; i++)
    if (get_val(b, dt, i) != W * (W - 1) / 2.0 + W * (double)(i % 7) && bad++ < 1)
      TCHECK(0, "W=%d n=%zu %s algo %d: element %zu = %g, want %g", W, n, dg_dtype_name(dt),
             algo, i, get_val(b, dt, i), W * (W - 1) / 2.0 + W * (double)(i % 7));
  free(b);
}

static void check_ops(dg_pg *pg) {
  int W = dg_pg_size(pg), r = dg_pg_rank(pg);
  double want[5];
  float b[5][3];
  dg_work *w[5];
  for (int o = 0; o < 5; o++)
    for (int i = 0; i < 3; i++) b[o][i] = (float)(o == DG_RED_PROD ? (r == 1 ? 2 : 1) : r + i);
  for (int o = 0; o < 5; o++) /* all five in flight at once */
    TCHECK(dg_pg_allreduce(pg, b[o], 3, DG_F32, (dg_redop)o, &w[o]) == DG_OK, "post op %d", o);
  want[DG_RED_SUM] = W * (W - 1) / 2.0;
  want[DG_RED_AVG] = (W - 1) / 2.0;
  want[DG_RED_MIN] = 0;
  want[DG_RED_MAX] = W - 1;
  want[DG_RED_PROD] = W > 1 ? 2 : 1;
  for (int o = 0; o < 5; o++) {
    TCHECK(finish(w[o], "op") == DG_OK, "op %d", o);
    double add = o == DG_RED_PROD ? 0 : (o == DG_RED_SUM ? W : 1) * 2.0;
    TCHECK(b[o][2] == (float)(want[o] + add), "W=%d op %d: %g want %g", W, o, b[o][2],
           want[o] + add);
  }
  int32_t iv = r;
  TCHECK(dg_pg_allreduce_sync(pg, &iv, 1, DG_I32, DG_RED_AVG) == DG_OK, "avg i32");
  TCHECK(iv == (W - 1) / 2, "avg i32 %d", iv);
}

static void check_others(dg_pg *pg) {
  int W = dg_pg_size(pg), r = dg_pg_rank(pg);
  size_t n = 1001;
  int64_t *bc = malloc(n * 8), *in = malloc(n * 8), *out = malloc(n * 8 * (size_t)W);
  double *rs_in = malloc(n * 8 * (size_t)W), rs_out[1001];
  for (size_t i = 0; i < n; i++) bc[i] = r == W - 1 ? (int64_t)i * 3 : -1;
  for (size_t i = 0; i < n; i++) in[i] = r * 100000 + (int64_t)i;
  for (size_t i = 0; i < n * (size_t)W; i++) rs_in[i] = r + (double)i;
  dg_work *w[6] = {0};
  int rc = dg_pg_broadcast(pg, bc, n, DG_I64, W - 1, &w[0]);
  rc |= dg_pg_allgather(pg, in, out, n, DG_I64, &w[1]);
  rc |= dg_pg_reduce_scatter(pg, rs_in, rs_out, n, DG_F64, DG_RED_SUM, &w[2]);
  rc |= dg_pg_barrier(pg, &w[3]);
  int64_t tok = r, got = -1;
  rc |= dg_pg_recv(pg, &got, 1, DG_I64, (r + W - 1) % W == r ? (r + 1) % W : (r + W - 1) % W,
                   77, &w[4]);
  TCHECK(W == 1 || rc == DG_OK, "posting");
  if (W == 1) /* send/recv to self are invalid; the rest must work */
    TCHECK(w[4] == NULL, "failed post leaves no work");
  if (W > 1) rc |= dg_pg_send(pg, &tok, 1, DG_I64, (r + 1) % W, 77, &w[5]);
  const char *names[] = {"broadcast", "allgather", "reduce_scatter", "barrier", "recv", "send"};
  for (int i = 0; i < (W > 1 ? 6 : 4); i++)
    TCHECK(finish(w[i], names[i]) == DG_OK, "W=%d %s", W, names[i]);
  for (size_t i = 0; i < n; i++) {
    if (bc[i] != (int64_t)i * 3) { TCHECK(0, "W=%d broadcast[%zu]=%lld", W, i, (long long)bc[i]); break; }
  }
  for (int q = 0; q < W; q++)
    for (size_t i = 0; i < n; i++)
      if (out[(size_t)q * n + i] != q * 100000 + (int64_t)i) {
        TCHECK(0, "W=%d allgather block %d [%zu]", W, q, i);
        q = W;
        break;
      }
  for (size_t i = 0; i < n; i++) {
    double want = W * (W - 1) / 2.0 + W * (double)((size_t)r * n + i);
    if (rs_out[i] != want) { TCHECK(0, "W=%d reduce_scatter[%zu]=%g want %g", W, i, rs_out[i], want); break; }
  }
  if (W > 1) TCHECK(got == (r + W - 1) % W, "W=%d recv got %lld", W, (long long)got);
  free(bc); free(in); free(out); free(rs_in);
}

static void *rank_main(void *p) {
  rank_arg *a = p;
  dg_pg *pg = NULL;
  char err[512];
  dg_pg_opts o = {.rank = a->rank, .world_size = a->W, .store = a->store, .timeout_ms = 60000,
                  .no_shm = g_no_shm};
  dg_pg_opts_from_env(&o); /* the meson cases set DG_BACKEND, DG_SHM */
  int rc = dg_pg_new(&pg, &o, err, sizeof err);
  TCHECK(rc == DG_OK, "rank %d/%d init: %s", a->rank, a->W, err);
  if (rc != DG_OK) return NULL;
  TCHECK(dg_pg_all_dgrad(pg), "all_dgrad");
  int W = a->W;
  for (size_t d = 0; d < sizeof dtypes / sizeof *dtypes; d++)
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
      /* the largest size: every dtype at W <= 3, f32 and f16 above */
      if (sizes[s] > 100000 && W > 3 && dtypes[d] != DG_F32 && dtypes[d] != DG_F16) continue;
      check_sum(pg, dtypes[d], sizes[s], DG_ALGO_AUTO);
      if (dtypes[d] == DG_F32 || dtypes[d] == DG_I64) {
        check_sum(pg, dtypes[d], sizes[s], DG_ALGO_RING);
        check_sum(pg, dtypes[d], sizes[s], DG_ALGO_HALVING_DOUBLING);
        check_sum(pg, dtypes[d], sizes[s], DG_ALGO_DIRECT);
        if (W > 1) check_sum(pg, dtypes[d], sizes[s], DG_ALGO_CMA);
        if (W > 1 && !o.no_shm) check_sum(pg, dtypes[d], sizes[s], DG_ALGO_SHM);
        else if (W > 1) TCHECK(dg_pg_set_algo(pg, DG_ALGO_SHM) == DG_EUNSUPPORTED, "no_shm");
      }
    }
  dg_pg_set_algo(pg, DG_ALGO_AUTO);
  check_ops(pg);
  check_others(pg);
  dg_pg_free(pg);
  return NULL;
}

static void run_world(int W) {
  fprintf(stderr, "-- world size %d\n", W);
  dg_store *root = NULL;
  CHECK_OK(dg_store_new_mem(&root, 60000));
  pthread_t th[8];
  rank_arg a[8];
  for (int r = 0; r < W; r++) {
    a[r] = (rank_arg){r, W, NULL};
    CHECK_OK(dg_store_clone(&a[r].store, root));
    pthread_create(&th[r], NULL, rank_main, &a[r]);
  }
  for (int r = 0; r < W; r++) {
    pthread_join(th[r], NULL);
    dg_store_free(a[r].store);
  }
  dg_store_free(root);
}

/* test_coll [W [noshm]] */
int main(int argc, char **argv) {
  int lo = 1, hi = 8;
  if (argc > 1) lo = hi = atoi(argv[1]);
  g_no_shm = argc > 2 && !strcmp(argv[2], "noshm");
  for (int W = lo; W <= hi; W++) run_world(W);
  return TEST_DONE();
}
