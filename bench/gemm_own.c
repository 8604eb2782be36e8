/* dgrad's own SGEMM (backends/cpu/gemm_own.c) against OpenBLAS on
 * one thread, on the GEMM shapes of a training step of the MLP benchmark
 * (784-512-256-10 at batch 64 and 256) and of char-GPT (bench/gpt.c's
 * default model at batch 16). Which kernel dgrad runs follows the CPU
 * (gemm_own.c, own_decide); this program shows what that choice is worth on
 * the CPU at hand, whichever it is.
 *
 *   gemm_own [--rounds R]
 *
 * Prints one line per shape to stderr and one JSON line per step to stdout:
 *   {"impl":"gemm_own","model":"mlp","batch":64,"openblas_gflops":..,
 *    "own_gflops":..,"dgrad_gflops":..,"speedup":..,"dgrad_kernel":".."}
 * own_gflops: the own kernel on every shape; dgrad_gflops: each shape on the
 * kernel dgrad gives it on this CPU (the own kernel where it is chosen and
 * its shape rule takes the shape, OpenBLAS on the rest; DG_GEMM=own shows
 * the rule on any AVX2 or AVX-512 CPU); speedup: OpenBLAS's step time over that;
 * dgrad_kernel: "own" where dgrad chose its kernel here, else "openblas". Rounds alternate
 * the two kernels; each shape's time is its best round. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu_impl.h"
#include "bench_util.h"
#include "roofline.h"

static double time_one(int own, const rl_gemm *s, const float *a, const float *b, float *c) {
  int64_t lda = s->ta ? s->M : s->K, ldb = s->tb ? s->K : s->N;
  long calls = 0;
  double t0 = now_s(), dt;
  do {
    if (!own || dg__sgemm_own(s->ta, s->tb, s->M, s->N, s->K, 1.0f, a, lda, b, ldb, 0.0f, c, s->N))
      cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans,
                  s->tb ? CblasTrans : CblasNoTrans, (int)s->M, (int)s->N, (int)s->K, 1.0f, a,
                  (int)lda, b, (int)ldb, 0.0f, c, (int)s->N);
    calls++;
  } while ((dt = now_s() - t0) < 0.01);
  return dt / (double)calls;
}

static void run(const char *model, int batch, const rl_gemm *g, int n, int rounds) {
  double flop = 0, t_blas = 0, t_own = 0, t_dg = 0;
  for (int i = 0; i < n; i++) {
    const rl_gemm *s = &g[i];
    size_t na = (size_t)(s->M * s->K), nb = (size_t)(s->K * s->N), nc = (size_t)(s->M * s->N);
    float *a = malloc((na + nb + nc) * sizeof *a);
    if (!a) exit(1);
    for (size_t k = 0; k < na + nb; k++) a[k] = (float)(k % 13) * 0.01f - 0.06f;
    double best[2] = {1e30, 1e30};
    for (int r = 0; r < rounds; r++)
      for (int own = 0; own < 2; own++) {
        double t = time_one(own, s, a, a + na, a + na + nb);
        best[own] = t < best[own] ? t : best[own];
      }
    free(a);
    double f = 2.0 * (double)(s->M * s->N * s->K), w = (double)s->count;
    int fits = dg__sgemm_own_fits(s->M, s->N, s->K);
    fprintf(stderr,
            "%s b%d: ta %d tb %d %5lldx%5lldx%5lld x%-4lld OpenBLAS %6.1f own %6.1f GFLOP/s%s\n",
            model, batch, s->ta, s->tb, (long long)s->M, (long long)s->N, (long long)s->K,
            (long long)s->count, f / best[0] / 1e9, f / best[1] / 1e9,
            fits ? "" : "  (OpenBLAS's)");
    flop += f * w, t_blas += best[0] * w, t_own += best[1] * w;
    t_dg += (fits ? best[1] : best[0]) * w;
  }
  const char *e = dg__sgemm_own_on() ? "own" : "openblas";
  printf("{\"impl\":\"gemm_own\",\"model\":\"%s\",\"batch\":%d,\"openblas_gflops\":%.2f,"
         "\"own_gflops\":%.2f,\"dgrad_gflops\":%.2f,\"speedup\":%.4f,\"dgrad_kernel\":\"%s\"}\n",
         model, batch, flop / t_blas / 1e9, flop / t_own / 1e9, flop / t_dg / 1e9, t_blas / t_dg,
         e);
}

int main(int argc, char **argv) {
  int rounds = 5;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: %s [--rounds R]\n", argv[0]);
      return 2;
    }
  }
  if (rounds < 1 || !dg__sgemm_own_cpu()) {
    fprintf(stderr, "%s\n",
            rounds < 1 ? "--rounds: at least 1" : "no AVX2 and FMA: no own kernel");
    return rounds < 1 ? 2 : 0;
  }
  dg_set_num_threads(1);
  openblas_set_num_threads(1);
  rl_gemm g[64];
  static const int64_t mlp_dims[4] = {784, 512, 256, 10}; /* bench/mlp.c's model */
  for (int b = 64; b <= 256; b *= 4) {
    int n = 0;
    rl_mlp(g, &n, b, mlp_dims, 3);
    run("mlp", b, g, n, rounds);
  }
  run("gpt", 16, g, rl_gpt(g, 16, 4, 4, 128, 64, 114), rounds); /* bench/gpt.c's defaults */
  return 0;
}
