/* The GEMM roofline of a step (see roofline.h). */
#include "roofline.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "bench_util.h"

#if BENCH_OPENBLAS
#include <cblas.h>
#endif

void rl_linear(rl_gemm *g, int *n, int64_t rows, int64_t in, int64_t out, int need_dx) {
  g[(*n)++] = (rl_gemm){0, 1, rows, out, in, 1}; /* y = x W^T: (rows,in) (out,in)^T */
  g[(*n)++] = (rl_gemm){1, 0, out, in, rows, 1}; /* dW = dy^T x: (rows,out)^T (rows,in) */
  if (need_dx) g[(*n)++] = (rl_gemm){0, 0, rows, in, out, 1}; /* dx = dy W */
}

void rl_mlp(rl_gemm *g, int *n, int64_t rows, const int64_t *dims, int layers) {
  for (int l = 0; l < layers; l++) rl_linear(g, n, rows, dims[l], dims[l + 1], l > 0);
}

void rl_conv(rl_gemm *g, int *n, int64_t N, int64_t C, int64_t H, int64_t W, int64_t O,
             int64_t k, int64_t stride, int64_t pad, int need_dx) {
  int64_t OH = (H + 2 * pad - k) / stride + 1, OW = (W + 2 * pad - k) / stride + 1;
  int64_t L = OH * OW, CK = C * k * k;
  g[(*n)++] = (rl_gemm){0, 0, O, L, CK, N};              /* y[i] (O,L) = w (O,CK) col */
  g[(*n)++] = (rl_gemm){0, 1, O, CK, L, N};              /* dw += dy[i] (O,L) col^T */
  if (need_dx) g[(*n)++] = (rl_gemm){1, 0, CK, L, O, N}; /* dcol = w^T dy[i] */
}

int rl_gpt(rl_gemm *g, int64_t B, int64_t layers, int64_t heads, int64_t dim, int64_t context,
           int64_t vocab) {
  int n = 0;
  int64_t rows = B * context, C = dim, T = context;
  if (heads <= 0 || C % heads) return -1;
  int64_t hd = C / heads, pairs = (B * heads + 1) / 2; /* causal: half of each (T, T) */
  rl_linear(g, &n, rows, C, 3 * C, 1);       /* c_attn */
  rl_linear(g, &n, rows, C, C, 1);           /* attention c_proj */
  rl_linear(g, &n, rows, C, 4 * C, 1);       /* c_fc */
  rl_linear(g, &n, rows, 4 * C, C, 1);       /* MLP c_proj */
  g[n++] = (rl_gemm){0, 1, T, T, hd, pairs}; /* S = q k^T */
  g[n++] = (rl_gemm){0, 0, T, hd, T, pairs}; /* y = P v */
  g[n++] = (rl_gemm){0, 1, T, T, hd, pairs}; /* dP = dy v^T */
  g[n++] = (rl_gemm){0, 0, T, hd, T, pairs}; /* dq = dS k */
  g[n++] = (rl_gemm){1, 0, T, hd, T, pairs}; /* dv = P^T dy */
  g[n++] = (rl_gemm){1, 0, T, hd, T, pairs}; /* dk = dS^T q */
  for (int i = 0; i < n; i++) g[i].count *= layers;
  rl_linear(g, &n, rows, C, vocab, 1); /* head (tied or not: same products) */
  return n;
}

#if BENCH_OPENBLAS
/* Seconds per product of one shape: best of 5 rounds, each at least
 * min_ms / 5 of back-to-back calls (the first call, untimed, warms up). */
static double time_shape(const rl_gemm *s, double min_ms, float *a, float *b, float *c) {
  int64_t lda = s->ta ? s->M : s->K, ldb = s->tb ? s->K : s->N;
  enum CBLAS_TRANSPOSE ta = s->ta ? CblasTrans : CblasNoTrans;
  enum CBLAS_TRANSPOSE tb = s->tb ? CblasTrans : CblasNoTrans;
  cblas_sgemm(CblasRowMajor, ta, tb, (int)s->M, (int)s->N, (int)s->K, 1.0f, a, (int)lda, b,
              (int)ldb, 0.0f, c, (int)s->N);
  double best = 1e30, round_s = min_ms / 5e3;
  for (int r = 0; r < 5; r++) {
    long calls = 0;
    double t0 = now_s(), dt;
    do {
      cblas_sgemm(CblasRowMajor, ta, tb, (int)s->M, (int)s->N, (int)s->K, 1.0f, a, (int)lda, b,
                  (int)ldb, 0.0f, c, (int)s->N);
      calls++;
    } while ((dt = now_s() - t0) < round_s);
    if (dt / (double)calls < best) best = dt / (double)calls;
  }
  return best;
}

int roofline_measure(const rl_gemm *g, int n, int threads, double min_ms, rl_result *out) {
  size_t na = 1, nb = 1, nc = 1;
  for (int i = 0; i < n; i++) {
    size_t sa = (size_t)(g[i].M * g[i].K), sb = (size_t)(g[i].K * g[i].N);
    size_t sc = (size_t)(g[i].M * g[i].N);
    na = sa > na ? sa : na;
    nb = sb > nb ? sb : nb;
    nc = sc > nc ? sc : nc;
  }
  float *a = malloc(na * sizeof *a), *b = malloc(nb * sizeof *b), *c = malloc(nc * sizeof *c);
  if (!a || !b || !c) {
    free(a), free(b), free(c);
    return -1;
  }
  for (size_t i = 0; i < na; i++) a[i] = (float)(i % 13) * 0.01f - 0.06f;
  for (size_t i = 0; i < nb; i++) b[i] = (float)(i % 7) * 0.02f - 0.06f;
  int before = openblas_get_num_threads();
  *out = (rl_result){0, 0, 0};
  for (int i = 0; i < n; i++) {
    /* T threads: the faster of OpenBLAS on T threads and perfect scaling of
     * its 1-thread time (OpenBLAS runs small shapes on one thread) */
    openblas_set_num_threads(1);
    double t = time_shape(&g[i], min_ms, a, b, c) / (double)threads;
    if (threads > 1) {
      openblas_set_num_threads(threads);
      double tt = time_shape(&g[i], min_ms, a, b, c);
      t = tt < t ? tt : t;
    }
    out->flop += 2.0 * (double)g[i].M * (double)g[i].N * (double)g[i].K * (double)g[i].count;
    out->sgemm_s += t * (double)g[i].count;
  }
  openblas_set_num_threads(before);
  /* OpenBLAS's own threads spin (sched_yield) for about 2^28 cycles after
   * their last job, and after the library starts, before they sleep (its
   * THREAD_TIMEOUT): a step timed in that window shares its cores with them
   * (a 2-thread MLP run of 0.3 s lost 5-10% so). Wait it out. */
  struct timespec ts = {0, 400 * 1000000L};
  nanosleep(&ts, NULL);
  out->gflops = out->flop / out->sgemm_s / 1e9;
  free(a), free(b), free(c);
  return 0;
}
#else
int roofline_measure(const rl_gemm *g, int n, int threads, double min_ms, rl_result *out) {
  (void)g, (void)n, (void)threads, (void)min_ms, (void)out;
  return -1; /* no OpenBLAS in this build: no roofline to measure */
}
#endif

void roofline_print_json(const rl_result *r, double step_s) {
  if (!r) {
    printf(",\"gemm_gflop_per_step\":null,\"sgemm_gflops\":null,\"step_gflops\":null,"
           "\"roofline_pct\":null");
    return;
  }
  printf(",\"gemm_gflop_per_step\":%.5f,\"sgemm_gflops\":%.2f,\"step_gflops\":%.2f,"
         "\"roofline_pct\":%.1f",
         r->flop / 1e9, r->gflops, r->flop / step_s / 1e9, 100.0 * r->sgemm_s / step_s);
}
