/* Transformer training-step benchmark: the default model of
 * examples/transformer (4 layers, 4 heads, d_model 128, context 64, vocab
 * 114, untied head) at batch 16 on synthetic tokens.
 *
 * One step = zero_grad (one memset) + forward + backward + AdamW step (one
 * loop over the flat buffers) + dg_ctx_reset. The batch is a fixed random
 * (B, T) token array and fixed random targets. bench/gpt_torch.py does the
 * same work in PyTorch; bench/run_gpt.sh runs both interleaved.
 *
 *   gpt [--batch N] [--threads T] [--steps S] [--warmup W] [--layers L]
 *       [--dim C] [--heads H] [--context T] [--vocab V] [--no-roofline]
 *
 * Prints one JSON line:
 *   {"impl":"dgrad","model":"gpt","batch":..,"threads":..,"steps":..,
 *    "steps_per_s":..,"tokens_per_s":..,"cpu_ms_per_step":..,"peak_rss_mib":..,"arena_peak_mib":..,
 *    "heap_allocs_per_step":..,"heap_frees_per_step":..,"loss":..,
 *    "gemm_gflop_per_step":..,"sgemm_gflops":..,"step_gflops":..,"roofline_pct":..}
 *
 * The roofline (roofline.h): before the warmup, OpenBLAS sgemm is timed on
 * the step's GEMMs for --threads threads: per layer c_attn, attention c_proj,
 * c_fc and MLP c_proj (forward, dW, dx), the head, and attention's
 * six (T, T, head dim) products per (batch, head) counted at half (causal:
 * dgrad skips the masked triangle). null without OpenBLAS or with
 * --no-roofline.
 *
 * Heap allocations are counted by interposing malloc & co. in this binary
 * (as bench/mlp.c), over the timed steps only. cpu_ms_per_step is process
 * CPU time (all threads) per timed step: on a loaded machine it is a steadier
 * measure of the work than steps_per_s (for 1 thread; with more threads it
 * also counts OpenBLAS's spinning). GPT_TRACE_ALLOCS=1 prints a
 * backtrace for each. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include <dgrad.h>

#include "alloc_count.h"
#include "bench_util.h"
#include "roofline.h"

#include "gpt_model.h"


/* ---- driver ---- */




/* The step's GEMMs (see the top of the file). */
static int gpt_roofline(const gpt_config *c, long B, int threads, rl_result *out) {
  rl_gemm g[64];
  int n = rl_gpt(g, B, c->layers, c->heads, c->dim, c->context, c->vocab);
  return n < 0 ? -1 : roofline_measure(g, n, threads, 40.0, out); /* gpt_new says what is wrong */
}

/* One step; returns the loss or NAN (message printed). x, y (B, T) i64. */
static float step(dg_ctx *ctx, gpt_model *m, dg_optim *opt, int64_t *x, int64_t *y, int64_t B,
                  int64_t T) {
  dg_params_zero_grad(m->ps);
  dg_tensor *loss = gpt_loss(m, ctx, x, y, B, T);
  if (!loss || dg_backward(ctx, loss)) {
    fprintf(stderr, "gpt: step failed: %s\n", dg_ctx_errmsg(ctx));
    return NAN;
  }
  float lv = dg_tensor_item(loss);
  int rc = dg_optim_step(opt);
  dg_ctx_reset(ctx);
  return rc ? NAN : lv;
}

int main(int argc, char **argv) {
  long batch = 16, threads = 1, steps = 50, warmup = 5;
  long layers = 4, dim = 128, heads = 4, context = 64, vocab = 114;
  int roofline = 1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--batch")) batch = arg_long(argc, argv, &i, 1);
    else if (!strcmp(argv[i], "--threads")) threads = arg_long(argc, argv, &i, 1);
    else if (!strcmp(argv[i], "--steps")) steps = arg_long(argc, argv, &i, 1);
    else if (!strcmp(argv[i], "--warmup")) warmup = arg_long(argc, argv, &i, 1);
    else if (!strcmp(argv[i], "--layers")) layers = arg_long(argc, argv, &i, 1);
    else if (!strcmp(argv[i], "--dim")) dim = arg_long(argc, argv, &i, 1);
    else if (!strcmp(argv[i], "--heads")) heads = arg_long(argc, argv, &i, 1);
    else if (!strcmp(argv[i], "--context")) context = arg_long(argc, argv, &i, 1);
    else if (!strcmp(argv[i], "--vocab")) vocab = arg_long(argc, argv, &i, 1);
    else if (!strcmp(argv[i], "--no-roofline")) roofline = 0;
    else {
      fprintf(stderr,
              "usage: %s [--batch N] [--threads T] [--steps S] [--warmup W] [--layers L]\n"
              "          [--dim C] [--heads H] [--context T] [--vocab V] [--no-roofline]\n",
              argv[0]);
      return 2;
    }
  }
  if (warmup < 2) warmup = 2; /* the arena settles after its first step */
  dg_set_num_threads((int)threads);

  gpt_config cfg = {(int)vocab, (int)layers, (int)heads, (int)dim, (int)context, 0};
  rl_result rl;
  int have_rl = roofline && !gpt_roofline(&cfg, batch, (int)threads, &rl);
  gpt_model m;
  dg_ctx *ctx = NULL;
  dg_optim *opt = NULL;
  int rc = gpt_new(&m, &cfg, 1234);
  if (!rc) rc = dg_ctx_new(&ctx, NULL);
  if (!rc) rc = dg_optim_new_adamw(&opt, m.ps, NULL, NULL, 0);
  size_t n = (size_t)batch * (size_t)context;
  int64_t *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
  float *u = malloc(2 * n * sizeof *u);
  if (rc || !x || !y || !u) {
    fprintf(stderr, "gpt: setup failed: %s\n", dg_strerror(rc ? rc : DG_ENOMEM));
    return 1;
  }
  dg_rng_uniform(42, 0, u, 2 * n);
  for (size_t i = 0; i < n; i++) {
    x[i] = (int64_t)(u[i] * (float)vocab) % vocab;
    y[i] = (int64_t)(u[n + i] * (float)vocab) % vocab;
  }
  free(u);

  float loss = 0;
  for (long s = 0; s < warmup; s++) {
    if (isnan(loss = step(ctx, &m, opt, x, y, batch, context))) return 1;
    if (s == 0) dg_mem_empty_cache(DG_CPU); /* chunks the arena merged away */
  }

  bench_trace_from_env("GPT_TRACE_ALLOCS");
  uint64_t a0 = allocs_now(), f0 = frees_now();
  double c0 = cpu_s();
  double t0 = now_s();
  for (long s = 0; s < steps; s++)
    if (isnan(loss = step(ctx, &m, opt, x, y, batch, context))) return 1;
  double dt = now_s() - t0;
  double cpu = cpu_s() - c0;
  uint64_t a1 = allocs_now(), f1 = frees_now();
  bench_trace_allocs(0);

  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  printf("{\"impl\":\"dgrad\",\"model\":\"gpt\",\"batch\":%ld,\"threads\":%ld,\"steps\":%ld,"
         "\"steps_per_s\":%.3f,\"tokens_per_s\":%.0f,\"cpu_ms_per_step\":%.2f,\"peak_rss_mib\":%.1f,"
         "\"arena_peak_mib\":%.1f,\"heap_allocs_per_step\":%.3g,\"heap_frees_per_step\":%.3g,"
         "\"loss\":%.5f",
         batch, threads, steps, (double)steps / dt, (double)(steps * (long)n) / dt,
         1e3 * cpu / (double)steps,
         (double)ru.ru_maxrss / 1024.0, (double)dg_ctx_arena_peak(ctx) / (1024.0 * 1024.0),
         (double)(a1 - a0) / (double)steps, (double)(f1 - f0) / (double)steps, (double)loss);
  roofline_print_json(have_rl ? &rl : NULL, dt / (double)steps);
  printf("}\n");
  fflush(stdout);

  dg_optim_free(opt);
  dg_ctx_free(ctx);
  gpt_free(&m);
  free(x);
  free(y);
  return 0;
}
