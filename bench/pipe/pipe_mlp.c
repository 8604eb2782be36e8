/* Pipeline benchmark (issue #13 item 10): an MLP (Linear + ReLU pairs,
 * cross-entropy, SGD) trained at one global batch three ways:
 *
 *   pipe_mlp --mode single [--threads T]        one process
 *   pipe_mlp --mode ddp                         2 ranks x 1 thread, DDP, B/2 each
 *   pipe_mlp --mode pipe [--micro M] [--schedule gpipe|1f1b] [--balance even|time]
 *                                               2 stages x 1 thread
 *   pipe_mlp --mode gemm [--micro M]            OpenBLAS sgemm alone on the model's GEMMs
 *                                               (1 thread): B rows against M x B/M rows
 *   common: [--batch B] [--steps S] [--warmup N] [--layers 1024,1024,...,10] [--remat 0|1]
 *           [--transport 0|1] (pipe: boundaries through TCP even on one host)
 *
 * Ranks are forked here and meet through a FileStore in a temp dir (TCP on
 * loopback, no port to pick). Every rank prints one JSON line: samples/s of
 * the whole job, and for the pipe its stage's layers, idle fraction (time
 * blocked on the peer over step time, mean of the timed steps), busy
 * seconds per step (step - idle), arena peak and contexts. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <dgrad.h>

#include "bench/bench_util.h"
#include "bench/roofline.h"

typedef struct {
  const char *mode, *layers;
  int micro, one_f_one_b, balance_time, remat, threads, transport;
  long batch, steps, warmup;
} bopts;


static int parse(int argc, char **argv, bopts *o) {
  *o = (bopts){"single", "1024,1024,1024,1024,1024,10", 8, 0, 0, 0, 1, 0, 512, 20, 3};
  for (int i = 1; i + 1 < argc; i += 2) {
    const char *a = argv[i], *v = argv[i + 1];
    if (!strcmp(a, "--mode")) o->mode = v;
    else if (!strcmp(a, "--layers")) o->layers = v;
    else if (!strcmp(a, "--micro")) o->micro = atoi(v);
    else if (!strcmp(a, "--schedule")) o->one_f_one_b = !strcmp(v, "1f1b");
    else if (!strcmp(a, "--balance")) o->balance_time = !strcmp(v, "time");
    else if (!strcmp(a, "--remat")) o->remat = atoi(v);
    else if (!strcmp(a, "--threads")) o->threads = atoi(v);
    else if (!strcmp(a, "--transport")) o->transport = atoi(v);
    else if (!strcmp(a, "--batch")) o->batch = atol(v);
    else if (!strcmp(a, "--steps")) o->steps = atol(v);
    else if (!strcmp(a, "--warmup")) o->warmup = atol(v);
    else {
      fprintf(stderr, "pipe_mlp: unknown option %s\n", a);
      return -1;
    }
  }
  return 0;
}

/* "1024,1024,10" -> w[], the count (at most 32). */
static int widths(const char *spec, int *w) {
  int n = 0;
  for (const char *p = spec; *p && n < 32; p = strchr(p, ',') ? strchr(p, ',') + 1 : "")
    w[n++] = atoi(p);
  return n;
}

/* Linear + ReLU for each width pair, the last Linear bare. */
static dg_module *mlp(const char *spec, int *in, int *ncls) {
  int w[32], n = widths(spec, w);
  dg_module *seq, *l;
  if (dg_nn_sequential(&seq)) return NULL;
  for (int i = 0; i + 1 < n; i++) {
    if (dg_nn_linear(&l, w[i], w[i + 1], 1) || dg_sequential_add(seq, l, NULL)) return NULL;
    if (i + 2 < n && (dg_nn_relu(&l) || dg_sequential_add(seq, l, NULL))) return NULL;
  }
  *in = w[0], *ncls = w[n - 1];
  return seq;
}

static dg_tensor *ce(void *user, dg_ctx *ctx, dg_tensor *out, dg_tensor *t) {
  (void)user;
  return dg_cross_entropy(ctx, out, t);
}

typedef struct {
  float *x;
  int64_t *y;
  int in, ncls;
} data;

static int make_data(data *d, long B, int in, int ncls) {
  d->x = malloc((size_t)B * in * sizeof *d->x);
  d->y = malloc((size_t)B * sizeof *d->y);
  if (!d->x || !d->y) return -1;
  dg_rng_normal(1, 0, d->x, (size_t)B * in);
  for (long i = 0; i < B; i++) d->y[i] = i % ncls;
  d->in = in, d->ncls = ncls;
  return 0;
}

static int make_pg(int r, int W, const char *dir, dg_store **st, dg_pg **pg) {
  int rc = dg_store_new_file(st, dir, 60000, NULL, 0);
  dg_pg_opts po;
  memset(&po, 0, sizeof po);
  po.rank = r, po.world_size = W, po.store = *st, po.timeout_ms = 60000;
  dg_pg_opts_from_env(&po);
  char err[256] = "";
  if (!rc) rc = dg_pg_new(pg, &po, err, sizeof err);
  if (rc) fprintf(stderr, "pipe_mlp: rank %d: group: %s %s\n", r, dg_strerror(rc), err);
  return rc;
}

static void leave(dg_store *st, dg_pg *pg, int W) {
  int64_t n = 0;
  dg_store_add(st, "bench_done", 1, &n);
  for (int i = 0; i < 4000 && n < W; i++) {
    usleep(5000);
    dg_store_add(st, "bench_done", 0, &n);
  }
  dg_pg_free(pg);
  dg_store_free(st);
}

/* One process (mode single) or one DDP rank of W (mode ddp): rows [lo, hi). */
static int run_plain(const bopts *o, int r, int W, const char *dir) {
  int in, ncls;
  dg_module *m = mlp(o->layers, &in, &ncls);
  data d;
  dg_params *ps;
  dg_ctx *ctx;
  dg_optim *opt;
  dg_store *st = NULL;
  dg_pg *pg = NULL;
  dg_ddp *ddp = NULL;
  if (!m || make_data(&d, o->batch, in, ncls) || dg_params_new(&ps) || dg_ctx_new(&ctx, NULL) ||
      dg_module_bind(m, ps, "", 5) || dg_optim_new_sgd(&opt, ps, NULL, NULL, 0))
    return 1;
  if (W > 1 && (make_pg(r, W, dir, &st, &pg) || dg_ddp_new(&ddp, ctx, ps, pg, NULL, NULL, 0)))
    return 1;
  const long rows = o->batch / W;
  int64_t sx[2] = {rows, in}, sy[1] = {rows};
  double t0 = 0;
  for (long s = 0; s < o->warmup + o->steps; s++) {
    if (s == o->warmup) t0 = now_s();
    dg_tensor *x = dg_wrap(ctx, DG_F32, 2, sx, d.x + (size_t)r * rows * in);
    dg_tensor *y = dg_wrap(ctx, DG_I64, 1, sy, d.y + (size_t)r * rows);
    dg_tensor *l = dg_cross_entropy(ctx, dg_module_forward(m, ctx, x), y);
    if (!l || dg_backward(ctx, l) || dg_optim_step(opt)) {
      fprintf(stderr, "pipe_mlp: rank %d: %s\n", r, dg_ctx_errmsg(ctx));
      return 1;
    }
    dg_params_zero_grad(ps);
    dg_ctx_reset(ctx);
  }
  double secs = (now_s() - t0) / (double)o->steps;
  if (r == 0)
    printf("{\"mode\": \"%s\", \"ranks\": %d, \"threads\": %d, \"batch\": %ld, \"layers\": \"%s\", "
           "\"step_s\": %.6f, \"samples_per_s\": %.1f}\n", o->mode, W, o->threads, o->batch,
           o->layers, secs, (double)o->batch / secs);
  fflush(stdout); /* forked ranks leave by _exit */
  dg_ddp_free(ddp);
  if (pg) leave(st, pg, W);
  return 0;
}

static int run_pipe(const bopts *o, int r, const char *dir) {
  int in, ncls;
  dg_module *m = mlp(o->layers, &in, &ncls);
  data d;
  dg_params *ps;
  dg_ctx *ctx;
  dg_store *st;
  dg_pg *pg;
  if (!m || make_data(&d, o->batch, in, ncls) || dg_params_new(&ps) || dg_ctx_new(&ctx, NULL) ||
      make_pg(r, 2, dir, &st, &pg))
    return 1;
  int64_t sx[2] = {o->batch, in}, sy[1] = {o->batch};
  dg_tensor *x = dg_wrap(ctx, DG_F32, 2, sx, d.x), *y = dg_wrap(ctx, DG_I64, 1, sy, d.y);
  dg_pipe_opts po = dg_pipe_defaults();
  po.micro_batches = o->micro;
  po.schedule = o->one_f_one_b ? DG_PIPE_1F1B : DG_PIPE_GPIPE;
  po.remat = o->remat;
  po.transport_boundaries = o->transport;
  if (o->balance_time) po.profile_input = dg_slice(ctx, x, 0, o->batch / o->micro);
  dg_pipe *p;
  dg_optim *opt;
  char err[512];
  if (dg_pipe_new(&p, pg, m, ps, 5, &po, err, sizeof err) ||
      dg_optim_new_sgd(&opt, ps, NULL, NULL, 0)) {
    fprintf(stderr, "pipe_mlp: rank %d: %s\n", r, err);
    return 1;
  }
  double t0 = 0, idle = 0, busy = 0;
  for (long s = 0; s < o->warmup + o->steps; s++) {
    if (s == o->warmup) t0 = now_s();
    if (dg_pipe_step(p, x, y, ce, NULL, NULL) || dg_optim_step(opt)) {
      fprintf(stderr, "pipe_mlp: rank %d: %s\n", r, dg_pipe_errmsg(p));
      return 1;
    }
    dg_params_zero_grad(ps);
    dg_pipe_stats ss;
    dg_pipe_get_stats(p, &ss);
    if (s >= o->warmup) {
      idle += ss.wait_seconds / ss.step_seconds;
      busy += ss.step_seconds - ss.wait_seconds;
    }
  }
  double secs = (now_s() - t0) / (double)o->steps;
  int first, last;
  dg_pipe_stage(p, &first, &last);
  dg_pipe_stats ss;
  dg_pipe_get_stats(p, &ss);
  printf("{\"mode\": \"pipe\", \"rank\": %d, \"micro\": %d, \"schedule\": \"%s\", \"balance\": "
         "\"%s\", \"remat\": %d, \"batch\": %ld, \"layers\": \"%s\", \"first\": %d, \"last\": %d, "
         "\"step_s\": %.6f, \"samples_per_s\": %.1f, \"idle\": %.4f, \"theory_idle\": %.4f, "
         "\"busy_s\": %.6f, \"arena_peak\": %zu, \"contexts\": %d, \"transport\": %d, "
         "\"bytes_direct\": %zu, \"bytes_transport\": %zu}\n", r, o->micro,
         o->one_f_one_b ? "1f1b" : "gpipe", o->balance_time ? "time" : "even", o->remat,
         o->batch, o->layers, first, last, secs, (double)o->batch / secs,
         idle / (double)o->steps, 1.0 / (o->micro + 1.0), busy / (double)o->steps,
         ss.arena_peak, ss.contexts, o->transport, ss.bytes_direct, ss.bytes_transport);
  fflush(stdout);
  leave(st, pg, 2);
  return 0;
}

/* The GEMMs of a step at B rows against M micro-batches of B/M rows: a
 * pipe's stages together cannot beat the second, however they overlap. */
static int run_gemm(const bopts *o) {
  int w[32], n = widths(o->layers, w), ng[2] = {0, 0};
  rl_gemm g[2][96];
  for (int k = 0; k < 2; k++) {
    const int64_t rows = k ? o->batch / o->micro : o->batch;
    for (int i = 0; i + 1 < n; i++) rl_linear(g[k], &ng[k], rows, w[i], w[i + 1], i > 0);
    for (int i = 0; k && i < ng[k]; i++) g[k][i].count *= o->micro;
  }
  rl_result r[2];
  if (roofline_measure(g[0], ng[0], 1, 300, &r[0]) ||
      roofline_measure(g[1], ng[1], 1, 300, &r[1])) {
    fprintf(stderr, "pipe_mlp: --mode gemm needs a build with OpenBLAS\n");
    return 1;
  }
  printf("{\"mode\": \"gemm\", \"batch\": %ld, \"micro\": %d, \"layers\": \"%s\", "
         "\"sgemm_s_batch\": %.6f, \"sgemm_s_micro\": %.6f, \"micro_over_batch\": %.3f}\n",
         o->batch, o->micro, o->layers, r[0].sgemm_s, r[1].sgemm_s, r[1].sgemm_s / r[0].sgemm_s);
  return 0;
}

int main(int argc, char **argv) {
  bopts o;
  if (parse(argc, argv, &o)) return 2;
  dg_set_num_threads(o.threads);
  if (!strcmp(o.mode, "single")) return run_plain(&o, 0, 1, NULL);
  if (!strcmp(o.mode, "gemm")) return run_gemm(&o);
  char dir[] = "/tmp/dg_pipe_bench_XXXXXX";
  if (!mkdtemp(dir)) return 1;
  pid_t pid[2];
  for (int r = 0; r < 2; r++) {
    pid[r] = fork();
    if (pid[r] == 0)
      _exit(!strcmp(o.mode, "pipe") ? run_pipe(&o, r, dir) : run_plain(&o, r, 2, dir));
  }
  int bad = 0;
  for (int r = 0; r < 2; r++) {
    int st;
    waitpid(pid[r], &st, 0);
    bad |= !WIFEXITED(st) || WEXITSTATUS(st);
  }
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd)) bad = 1;
  return bad;
}
