/* CNN training-step benchmark: the examples/mnist CNN (conv 1->32 3x3 pad 1,
 * ReLU, maxpool 2, conv 32->64 3x3 pad 1, ReLU, maxpool 2, flatten, linear
 * 3136->128, ReLU, linear 128->10) on 28x28 inputs, cross-entropy, SGD.
 *
 * One step = zero_grad (one memset) + forward + backward + SGD update
 * (dg_optim_step, lr 0.01, no momentum) + dg_ctx_reset. Data are synthetic:
 * a fixed random batch and fixed random labels. bench/cnn_torch.py does the
 * same work in PyTorch; bench/run_cnn.py runs both interleaved.
 *
 *   cnn [--batch N] [--threads T] [--steps S] [--warmup W] [--max-seconds X]
 *       [--no-roofline]
 *
 * Prints one JSON line:
 *   {"impl":"dgrad","model":"cnn","batch":..,"threads":..,"steps":..,
 *    "steps_per_s":..,"cpu_ms_per_step":..,"peak_rss_mib":..,"heap_allocs_per_step":..,
 *    "heap_frees_per_step":..,"loss":..,"gemm_gflop_per_step":..,"sgemm_gflops":..,
 *    "step_gflops":..,"roofline_pct":..}
 *
 * The roofline (roofline.h): before the warmup, OpenBLAS sgemm is timed on
 * this step's GEMMs as the CPU backend runs them (per image: each conv's
 * forward, weight gradient and, for the second, input gradient; the linear
 * layers' as in bench/mlp.c) for --threads threads; roofline_pct is their
 * time as a share of the step's (null without OpenBLAS or with
 * --no-roofline). --max-seconds stops the timed loop early once X seconds
 * have passed (the line reports the steps actually run).
 *
 * Heap allocations are counted by interposing malloc & co. in this binary
 * (as bench/mlp.c does): every call, from dgrad, OpenBLAS or libc, counts.
 * The count covers the timed steps only (after warmup). */
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


/* ---- model ---- */

static int add(dg_module *seq, int rc, dg_module **m) {
  if (rc) return rc;
  rc = dg_sequential_add(seq, *m, NULL);
  if (rc) dg_module_free(*m);
  return rc;
}

static int build_cnn(dg_module **out) {
  dg_module *seq, *m = NULL;
  int rc = dg_nn_sequential(&seq);
  if (rc) return rc;
  rc = add(seq, dg_nn_conv2d(&m, 1, 32, 3, 1, 1, 1), &m);
  if (!rc) rc = add(seq, dg_nn_relu(&m), &m);
  if (!rc) rc = add(seq, dg_nn_maxpool2d(&m, 2, 2), &m);
  if (!rc) rc = add(seq, dg_nn_conv2d(&m, 32, 64, 3, 1, 1, 1), &m);
  if (!rc) rc = add(seq, dg_nn_relu(&m), &m);
  if (!rc) rc = add(seq, dg_nn_maxpool2d(&m, 2, 2), &m);
  if (!rc) rc = add(seq, dg_nn_flatten(&m), &m);
  if (!rc) rc = add(seq, dg_nn_linear(&m, 3136, 128, 1), &m);
  if (!rc) rc = add(seq, dg_nn_relu(&m), &m);
  if (!rc) rc = add(seq, dg_nn_linear(&m, 128, 10, 1), &m);
  if (rc) dg_module_free(seq);
  else *out = seq;
  return rc;
}

/* One training step. x (B, 1, 28, 28) f32, y (B) i64 are caller memory.
 * Returns the loss, or NAN on error (message printed). */
static float step(dg_ctx *ctx, dg_module *net, dg_params *ps, dg_optim *opt, float *x,
                  int64_t *y, int64_t B) {
  int64_t xs[4] = {B, 1, 28, 28};
  dg_params_zero_grad(ps);
  dg_tensor *h = dg_module_forward(net, ctx, dg_wrap(ctx, DG_F32, 4, xs, x));
  dg_tensor *loss = dg_cross_entropy(ctx, h, dg_wrap(ctx, DG_I64, 1, &B, y));
  if (!loss || dg_backward(ctx, loss) || dg_optim_step(opt)) {
    fprintf(stderr, "cnn: step failed: %s\n", dg_ctx_errmsg(ctx));
    return NAN;
  }
  float lv = dg_tensor_item(loss);
  dg_ctx_reset(ctx);
  return lv;
}

/* ---- driver ---- */

/* The step's GEMMs: conv 1->32 on 28x28 (its input needs no gradient),
 * conv 32->64 on 14x14, linear 3136->128 and 128->10. */
static int cnn_roofline(long batch, int threads, rl_result *out) {
  rl_gemm g[12];
  int n = 0;
  rl_conv(g, &n, batch, 1, 28, 28, 32, 3, 1, 1, 0);
  rl_conv(g, &n, batch, 32, 14, 14, 64, 3, 1, 1, 1);
  rl_linear(g, &n, batch, 3136, 128, 1);
  rl_linear(g, &n, batch, 128, 10, 1);
  return roofline_measure(g, n, threads, 40.0, out);
}



static void synth_batch(float *x, int64_t *y, long batch) {
  dg_rng_normal(42, 0, x, (size_t)batch * 784);
  float u[4096];
  for (long i = 0; i < batch; i += 4096) {
    long k = batch - i < 4096 ? batch - i : 4096;
    dg_rng_uniform(43, (uint64_t)i, u, (size_t)k);
    for (long j = 0; j < k; j++) y[i + j] = u[j] >= 1.0f ? 9 : (int64_t)(u[j] * 10.0f);
  }
}

int main(int argc, char **argv) {
  long batch = 64, threads = 1, steps = 50, warmup = 5, max_s = 0;
  int roofline = 1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--batch")) batch = arg_long(argc, argv, &i, 0);
    else if (!strcmp(argv[i], "--threads")) threads = arg_long(argc, argv, &i, 0);
    else if (!strcmp(argv[i], "--steps")) steps = arg_long(argc, argv, &i, 0);
    else if (!strcmp(argv[i], "--warmup")) warmup = arg_long(argc, argv, &i, 0);
    else if (!strcmp(argv[i], "--max-seconds")) max_s = arg_long(argc, argv, &i, 0);
    else if (!strcmp(argv[i], "--no-roofline")) roofline = 0;
    else {
      fprintf(stderr,
              "usage: %s [--batch N] [--threads T] [--steps S] [--warmup W] [--max-seconds X]"
              " [--no-roofline]\n",
              argv[0]);
      return 2;
    }
  }
  if (batch < 1 || threads < 1 || steps < 1) {
    fprintf(stderr, "cnn: batch, threads and steps must be >= 1\n");
    return 2;
  }
  if (warmup < 2) warmup = 2; /* the arena settles after its first step */
  dg_set_num_threads((int)threads);
  rl_result rl;
  int have_rl = roofline && !cnn_roofline(batch, (int)threads, &rl);

  dg_ctx *ctx = NULL;
  dg_params *ps = NULL;
  dg_module *net = NULL;
  dg_optim *opt = NULL;
  dg_sgd_opts so = dg_sgd_defaults();
  so.lr = 0.01f;
  int rc = dg_ctx_new(&ctx, NULL);
  if (!rc) rc = dg_params_new(&ps);
  if (!rc) rc = build_cnn(&net);
  if (!rc) rc = dg_module_bind(net, ps, "layers", 1234);
  if (!rc) rc = dg_optim_new_sgd(&opt, ps, &so, NULL, 0);
  float *x = malloc((size_t)batch * 784 * sizeof *x);
  int64_t *y = malloc((size_t)batch * sizeof *y);
  if (rc || !x || !y) {
    fprintf(stderr, "cnn: setup failed: %s\n", dg_strerror(rc ? rc : DG_ENOMEM));
    return 1;
  }
  synth_batch(x, y, batch);

  float loss = 0;
  for (long s = 0; s < warmup; s++)
    if (isnan(loss = step(ctx, net, ps, opt, x, y, batch))) return 1;
  bench_trace_from_env("CNN_TRACE_ALLOCS");
  uint64_t a0 = allocs_now(), f0 = frees_now();
  double t0 = now_s(), c0 = cpu_s();
  long done = 0;
  while (done < steps) {
    if (isnan(loss = step(ctx, net, ps, opt, x, y, batch))) return 1;
    done++;
    if (max_s > 0 && now_s() - t0 > (double)max_s) break;
  }
  double dt = now_s() - t0, dc = cpu_s() - c0;
  steps = done;
  uint64_t a1 = allocs_now(), f1 = frees_now();
  bench_trace_allocs(0);

  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  printf("{\"impl\":\"dgrad\",\"model\":\"cnn\",\"batch\":%ld,\"threads\":%ld,\"steps\":%ld,"
         "\"steps_per_s\":%.3f,\"cpu_ms_per_step\":%.4f,\"peak_rss_mib\":%.1f,"
         "\"heap_allocs_per_step\":%.3g,\"heap_frees_per_step\":%.3g,\"loss\":%.5f",
         batch, threads, steps, (double)steps / dt, 1e3 * dc / (double)steps,
         (double)ru.ru_maxrss / 1024.0, (double)(a1 - a0) / (double)steps,
         (double)(f1 - f0) / (double)steps, (double)loss);
  roofline_print_json(have_rl ? &rl : NULL, dt / (double)steps);
  printf("}\n");
  fflush(stdout);
  dg_optim_free(opt);
  dg_module_free(net);
  dg_params_free(ps);
  dg_ctx_free(ctx);
  free(x);
  free(y);
  return 0;
}
