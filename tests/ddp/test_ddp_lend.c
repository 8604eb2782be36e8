/* DDP on the shared segment installs the lend probe (base/lend.c), and
 * with it starts the lend worker thread, only where a product can be lent:
 * the CPU backend's own kernel is on (backends/cpu/blas.c can_lend), and
 * DG_LEND is not 0. With OpenBLAS (DG_GEMM=blas, Intel CPUs) no idle
 * thread is started in every rank. The probe goes with the DDP.
 *
 *   test_ddp_lend     (2 ranks; the meson cases set DG_GEMM and DG_LEND;
 *                      skip 77 without the shared segment, e.g. DG_SHM=0)
 */
#include "backends/backend.h"
#include "backends/kern_blas.h"
#include "base/lend_impl.h"
#include "tests/ddp/ddp_util.h"

static int rank_main(int r, int W, void *arg) {
  (void)arg;
  dg_store *st = NULL;
  dg_pg *pg = NULL;
  if (du_pg(r, W, &st, &pg)) return 2;
  dg_ctx *ctx = NULL;
  dg_ddp *ddp = NULL;
  du_mlp m;
  if (dg_ctx_new(&ctx, NULL) || du_mlp_init(&m, 0, 42)) return 3;
  dg_ddp_opts o = du_ddp_defaults();
  char err[512];
  REQUIRE(!dg__lend_armed());
  if (dg_ddp_new(&ddp, ctx, m.ps, pg, &o, err, sizeof err)) {
    fprintf(stderr, "rank %d: ddp_new: %s\n", r, err);
    return 4;
  }
  const char *e = getenv("DG_LEND");
  const struct dg__kern_blas *blas = dg__cpu_backend.blas;
  int want = (!e || strcmp(e, "0")) && blas->can_lend && blas->can_lend();
  fprintf(stderr, "rank %d: own kernel %s, DG_LEND=%s: lend probe %s\n", r,
          blas->can_lend() ? "on" : "off", e ? e : "(unset)",
          dg__lend_armed() ? "installed" : "not installed");
  CHECK_EQ_INT(dg__lend_armed(), want);
  dg_ddp_free(ddp);
  CHECK_EQ_INT(dg__lend_armed(), 0);
  dg_params_free(m.ps);
  dg_ctx_free(ctx);
  du_leave(st, pg, W);
  return dg_test_failures ? 1 : 0;
}

int main(void) {
  const char *shm = getenv("DG_SHM");
  if (shm && !strcmp(shm, "0")) {
    fprintf(stderr, "SKIP: DG_SHM=0: no shared gradient segment\n");
    return 77;
  }
  CHECK_EQ_INT(du_run(2, rank_main, NULL, 60, NULL), 0);
  return TEST_DONE();
}
