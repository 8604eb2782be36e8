/* Swapping changes no gradient: the same model and batches on two contexts
 * over one parameter store, one without swapping and one with it, for 3
 * SGD steps (optionally as 2 accumulated micro-batches with no reset
 * between). DG_SWAP_FILE: every gradient bit-identical. DG_SWAP_BF16:
 * the stated bound (see BF16_REL). The statistics show tensors went out
 * and came back.
 *
 * usage: test_swap_exact mlp|gpt file|bf16|file+bf16 LOOKAHEAD [accum2] */
#include "swap_util.h"

/* bf16 keeps 8 significant bits (relative rounding error <= 2^-9 per
 * element); through the few layers of these models the whole gradient's
 * relative L2 error stays below this (measured at most 1.2e-3). */
#define BF16_REL 1e-2

/* One training step's gradients on ctx into g (the store's flat buffer). */
static int grads(sw_model *m, dg_ctx *ctx, int micro, float *g, size_t n) {
  dg_params_zero_grad(m->ps);
  int64_t rows = m->B / micro;
  for (int k = 0; k < micro; k++) {
    dg_tensor *l = sw_loss_rows(m, ctx, k * rows, rows);
    if (!l) {
      fprintf(stderr, "forward: %s\n", dg_ctx_errmsg(ctx));
      return dg_ctx_errcode(ctx);
    }
    int rc = dg_backward(ctx, l);
    if (rc) {
      fprintf(stderr, "backward: %s\n", dg_ctx_errmsg(ctx));
      return rc;
    }
  }
  size_t k;
  memcpy(g, dg_params_grad(m->ps, &k), n * sizeof *g);
  dg_ctx_reset(ctx);
  return DG_OK;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s mlp|gpt file|bf16|file+bf16 LOOKAHEAD [accum2]\n", argv[0]);
    return 2;
  }
  int micro = argc > 4 && !strcmp(argv[4], "accum2") ? 2 : 1;
  sw_model m;
  REQUIRE((!strcmp(argv[1], "gpt") ? sw_gpt_new(&m, 16, 2) : sw_mlp_new(&m, 256)) == DG_OK);
  dg_ctx *ref = NULL, *ctx = NULL;
  REQUIRE(dg_ctx_new(&ref, NULL) == DG_OK && dg_ctx_new(&ctx, NULL) == DG_OK);
  dg_swap_opts o;
  REQUIRE(sw_opts(argv[2], atoi(argv[3]), &o));
  int rc = dg_ctx_set_swap(ctx, &o);
  if (rc) fprintf(stderr, "set_swap: %s\n", dg_ctx_errmsg(ctx));
  REQUIRE(rc == DG_OK);
  size_t n;
  dg_params_data(m.ps, &n);
  float *g0 = malloc(n * sizeof *g0), *g1 = malloc(n * sizeof *g1);
  REQUIRE(g0 && g1);
  int lossless = !(o.target & DG_SWAP_BF16);
  double worst = 0;
  for (int step = 0; step < 3; step++) {
    REQUIRE(grads(&m, ref, micro, g0, n) == DG_OK);
    REQUIRE(grads(&m, ctx, micro, g1, n) == DG_OK);
    size_t differ = 0;
    double d2 = 0, r2 = 0;
    for (size_t i = 0; i < n; i++) {
      differ += memcmp(&g0[i], &g1[i], sizeof *g0) != 0;
      d2 += ((double)g1[i] - g0[i]) * ((double)g1[i] - g0[i]);
      r2 += (double)g0[i] * g0[i];
    }
    double rel = sqrt(d2 / (r2 > 0 ? r2 : 1));
    if (rel > worst) worst = rel;
    fprintf(stderr, "step %d: %zu of %zu gradient elements differ, relative L2 error %.3g\n",
            step, differ, n, rel);
    if (lossless) CHECK_EQ_INT(differ, 0);
    else CHECK(rel <= BF16_REL);
    CHECK(r2 > 0);
    float *w = dg_params_data(m.ps, &n);
    for (size_t i = 0; i < n; i++) w[i] -= 0.05f * g0[i];
  }
  dg_swap_stats st;
  REQUIRE(dg_ctx_swap_stats(ctx, &st) == DG_OK);
  fprintf(stderr, "swap: %llu tensors (%llu bytes) out, %llu in (%llu bytes), stored %llu bytes, "
          "%llu forward reads, %llu kept, peak out %zu, backward waited %.3f s, forward %.3f s, "
          "worst relative error %.3g\n",
          (unsigned long long)st.tensors_out, (unsigned long long)st.bytes_out,
          (unsigned long long)st.tensors_in, (unsigned long long)st.bytes_in,
          (unsigned long long)st.stored_bytes, (unsigned long long)st.forward_reads,
          (unsigned long long)st.kept, st.peak_out_bytes, st.backward_wait_s,
          st.forward_wait_s, worst);
  CHECK(st.tensors_out > 0);
  CHECK(st.tensors_in > 0);
  CHECK(st.bytes_in > 0 && st.bytes_in <= st.bytes_out * 2);
  CHECK(st.peak_out_bytes > 0);
  CHECK_EQ_INT(st.backwards, 3 * micro);
  if (o.target & DG_SWAP_BF16) CHECK(st.stored_bytes * 2 == st.bytes_out);
  else CHECK(st.stored_bytes == st.bytes_out);
  CHECK(st.peak_rss > 0 && st.hwm_rss > 0); /* VmHWM lags VmRSS a little */
  REQUIRE(dg_ctx_set_swap(ctx, NULL) == DG_OK);
  CHECK(dg_ctx_swap_stats(ctx, &st) == DG_ESTATE);
  free(g0);
  free(g1);
  dg_ctx_free(ref);
  dg_ctx_free(ctx);
  sw_free(&m);
  sw_rmdir();
  return TEST_DONE();
}
