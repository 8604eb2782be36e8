/* MLP training-step benchmark: 784-512-256-10, ReLU, cross-entropy, plain SGD.
 * The hidden layers are dg_linear_relu (the ReLU in the GEMM's stores), as
 * an application would write them.
 *
 * One step = zero_grad (lazy) + forward + backward + SGD update (dgrad's SGD,
 * by default fused into backward: each parameter is updated the moment its
 * gradient is final; --separate-step runs dg_optim_step after backward
 * instead) + dg_ctx_reset. Data are synthetic: a fixed random batch and fixed
 * random labels. bench/mlp_torch.py does the same work in PyTorch.
 *
 *   mlp [--batch N] [--threads T] [--steps S] [--warmup W] [--max-seconds X]
 *       [--separate-step] [--no-roofline]
 *
 * --max-seconds stops the timed loop early once X seconds have passed (the
 * line then reports the steps actually run), so that a run on a loaded
 * machine stays bounded.
 *
 * Prints one JSON line:
 *   {"impl":"dgrad","batch":..,"threads":..,"steps":..,"steps_per_s":..,
 *    "cpu_ms_per_step":..,"peak_rss_mib":..,"heap_allocs_per_step":..,
 *    "heap_frees_per_step":..,"loss":..,"gemm_gflop_per_step":..,"sgemm_gflops":..,
 *    "step_gflops":..,"roofline_pct":..}
 *
 * The roofline (roofline.h): before the warmup, OpenBLAS sgemm is timed on
 * this step's GEMMs (3 forward, 3 weight-gradient and 2 input-gradient
 * products; the input needs no gradient) for --threads threads;
 * roofline_pct is their time as a share of the step's (null without OpenBLAS
 * or with --no-roofline).
 *
 * cpu_ms_per_step is the process's CPU time (user + system, all threads) over
 * the timed steps: on a shared machine it moves less than wall time when the
 * process is descheduled, so 1-thread runs can be compared by it too.
 *
 * Heap allocations are counted by interposing malloc/calloc/realloc/free (and
 * the aligned variants) in this binary: every call, from dgrad, OpenBLAS or
 * libc, goes through the counters below and on to glibc's __libc_* entry
 * points. The count covers the timed steps only (after warmup). */
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

#define NLAYERS 3
static const int64_t k_dims[NLAYERS + 1] = {784, 512, 256, 10};

typedef struct {
  dg_params *ps;
  dg_optim *opt;         /* torch.optim.SGD(lr): dgrad's SGD over the flat buffer */
  int fused;             /* the SGD step runs inside backward */
  dg_tensor *w[NLAYERS]; /* (out, in) */
  dg_tensor *b[NLAYERS]; /* (out) */
} mlp;

/* Registers the layers and fills them like torch.nn.Linear's default:
 * uniform in [-1/sqrt(in), 1/sqrt(in)). */
static int mlp_init(mlp *m) {
  int rc = dg_params_new(&m->ps);
  for (int l = 0; !rc && l < NLAYERS; l++) {
    char name[32];
    int64_t ws[2] = {k_dims[l + 1], k_dims[l]};
    snprintf(name, sizeof name, "fc%d.weight", l + 1);
    rc = dg_params_add(m->ps, name, 2, ws, &m->w[l]);
    snprintf(name, sizeof name, "fc%d.bias", l + 1);
    if (!rc) rc = dg_params_add(m->ps, name, 1, ws, &m->b[l]);
  }
  if (rc) return rc;
  uint64_t off = 0;
  for (int l = 0; l < NLAYERS; l++) {
    float bound = 1.0f / sqrtf((float)k_dims[l]);
    dg_tensor *ts[2] = {m->w[l], m->b[l]};
    for (int k = 0; k < 2; k++) {
      float *p = dg_tensor_data(ts[k]);
      size_t n = (size_t)dg_tensor_numel(ts[k]);
      dg_rng_uniform(1234, off, p, n);
      off += (n + 3) & ~(size_t)3;
      for (size_t i = 0; i < n; i++) p[i] = (2.0f * p[i] - 1.0f) * bound;
    }
  }
  dg_sgd_opts so = dg_sgd_defaults();
  so.lr = 0.01f;
  return dg_optim_new_sgd(&m->opt, m->ps, &so, NULL, 0);
}

/* One training step. x (B, 784) f32, y (B) i64 are caller memory. Returns the
 * loss, or NAN on error (message printed). */
static float step(dg_ctx *ctx, mlp *m, float *x, int64_t *y, int64_t B, float lr) {
  int64_t xs[2] = {B, k_dims[0]};
  dg_params_zero_grad(m->ps);
  dg_tensor *h = dg_wrap(ctx, DG_F32, 2, xs, x);
  for (int l = 0; l < NLAYERS; l++) /* ReLU after each hidden layer, in its GEMM */
    h = l < NLAYERS - 1 ? dg_linear_relu(ctx, h, m->w[l], m->b[l])
                        : dg_linear(ctx, h, m->w[l], m->b[l]);
  dg_tensor *yt = dg_wrap(ctx, DG_I64, 1, &B, y);
  dg_tensor *loss = dg_cross_entropy(ctx, h, yt);
  if (!loss || dg_backward(ctx, loss)) {
    fprintf(stderr, "mlp: step failed: %s\n", dg_ctx_errmsg(ctx));
    return NAN;
  }
  float lv = dg_tensor_item(loss);
  (void)lr; /* set on the optimizer */
  if (!m->fused && dg_optim_step(m->opt)) return NAN;
  dg_ctx_reset(ctx);
  return lv;
}

/* ---- driver ---- */

/* The step's GEMMs: every layer's forward and weight gradient, the input
 * gradient of all but the first (x needs none). */
static int mlp_roofline(long batch, int threads, rl_result *out) {
  rl_gemm g[3 * NLAYERS];
  int n = 0;
  rl_mlp(g, &n, batch, k_dims, NLAYERS);
  return roofline_measure(g, n, threads, 40.0, out);
}




int main(int argc, char **argv) {
  long batch = 64, threads = 1, steps = 200, warmup = 20, max_s = 0;
  int separate = 0, roofline = 1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--batch")) batch = arg_long(argc, argv, &i, 0);
    else if (!strcmp(argv[i], "--threads")) threads = arg_long(argc, argv, &i, 0);
    else if (!strcmp(argv[i], "--steps")) steps = arg_long(argc, argv, &i, 0);
    else if (!strcmp(argv[i], "--warmup")) warmup = arg_long(argc, argv, &i, 0);
    else if (!strcmp(argv[i], "--max-seconds")) max_s = arg_long(argc, argv, &i, 0);
    else if (!strcmp(argv[i], "--separate-step")) separate = 1;
    else if (!strcmp(argv[i], "--no-roofline")) roofline = 0;
    else {
      fprintf(stderr,
              "usage: %s [--batch N] [--threads T] [--steps S] [--warmup W] [--max-seconds X]"
              " [--separate-step] [--no-roofline]\n",
              argv[0]);
      return 2;
    }
  }
  if (batch < 1 || threads < 1 || steps < 1) {
    fprintf(stderr, "mlp: batch, threads and steps must be >= 1\n");
    return 2;
  }
  if (warmup < 2) warmup = 2; /* the arena settles after its first step */
  dg_set_num_threads((int)threads);
  rl_result rl;
  int have_rl = roofline && !mlp_roofline(batch, (int)threads, &rl);

  mlp m;
  memset(&m, 0, sizeof m);
  dg_ctx *ctx = NULL;
  int rc = mlp_init(&m);
  if (!rc) rc = dg_ctx_new(&ctx, NULL);
  if (!rc && !separate) rc = dg_optim_fuse_backward(m.opt, ctx);
  m.fused = !separate;
  float *x = malloc((size_t)batch * (size_t)k_dims[0] * sizeof *x);
  int64_t *y = malloc((size_t)batch * sizeof *y);
  if (rc || !x || !y) {
    fprintf(stderr, "mlp: setup failed: %s\n", dg_strerror(rc ? rc : DG_ENOMEM));
    return 1;
  }
  dg_rng_normal(42, 0, x, (size_t)batch * (size_t)k_dims[0]);
  float *u = malloc((size_t)batch * sizeof *u);
  if (!u) return 1;
  dg_rng_uniform(43, 0, u, (size_t)batch);
  for (long i = 0; i < batch; i++) {
    y[i] = (int64_t)(u[i] * (float)k_dims[NLAYERS]);
    if (y[i] >= k_dims[NLAYERS]) y[i] = k_dims[NLAYERS] - 1;
  }
  free(u);

  const float lr = 0.01f;
  float loss = 0;
  for (long s = 0; s < warmup; s++)
    if (isnan(loss = step(ctx, &m, x, y, batch, lr))) return 1;

  bench_trace_from_env("MLP_TRACE_ALLOCS");
  uint64_t a0 = allocs_now(), f0 = frees_now();
  double t0 = now_s(), c0 = cpu_s();
  long done = 0;
  while (done < steps) {
    if (isnan(loss = step(ctx, &m, x, y, batch, lr))) return 1;
    done++;
    if (max_s > 0 && now_s() - t0 > (double)max_s) break;
  }
  double dt = now_s() - t0, dc = cpu_s() - c0;
  steps = done;
  uint64_t a1 = allocs_now(), f1 = frees_now();
  bench_trace_allocs(0);

  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  printf("{\"impl\":\"dgrad\",\"step\":\"%s\",\"batch\":%ld,\"threads\":%ld,\"steps\":%ld,"
         "\"steps_per_s\":%.2f,\"cpu_ms_per_step\":%.4f,\"peak_rss_mib\":%.1f,\"heap_allocs_per_step\":%.3g,"
         "\"heap_frees_per_step\":%.3g,\"loss\":%.5f",
         m.fused ? "fused" : "separate", batch, threads, steps, (double)steps / dt, 1e3 * dc / (double)steps,
         (double)ru.ru_maxrss / 1024.0,
         (double)(a1 - a0) / (double)steps, (double)(f1 - f0) / (double)steps, (double)loss);
  roofline_print_json(have_rl ? &rl : NULL, dt / (double)steps);
  printf("}\n");
  fflush(stdout);

  dg_ctx_free(ctx);
  dg_params_free(m.ps);
  free(x);
  free(y);
  return 0;
}
