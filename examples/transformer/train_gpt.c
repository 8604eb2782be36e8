/* Character-level GPT on a text file (default: Debian's fortunes corpus).
 *
 *   transformer [--text FILE|DIR] [--steps N] [--lr LR] [--batch B]
 *               [--threads T] [--seed S] [--eval-every N] [--eval-batches N]
 *               [--sample-len N] [--temperature X] [--optim adamw|lamb]
 *               [--layers L] [--heads H] [--dim C] [--context T] [--tie]
 *               [--warmup N] [--weight-decay X] [--clip X] [--log-every N]
 *               [--pipe K [--micro-batches M] [--schedule gpipe|1f1b] [--remat]
 *                [--balance even|time]]
 *               [--swap file|bf16|file+bf16 [--swap-dir DIR] [--swap-lookahead N]
 *                [--swap-min-bytes N]]
 *               [--trace FILE]
 *
 * --swap works with --pipe too: each stage swaps the activations its
 * micro-batches save (dg_pipe_opts.swap) and reports what moved.
 *
 * --trace FILE (or $DG_TRACE, which dgrun --trace sets per rank) writes this
 * rank's timeline as Chrome trace JSON at the end (docs/guide-trace.md).
 *
 * Model: token embedding + learned position embedding, L pre-LN transformer
 * blocks, final layernorm, linear head (tied to the token embedding with
 * --tie). Trained with AdamW (or LAMB) under linear warmup + cosine decay to
 * 10% of --lr, gradients clipped to --clip. LAMB scales each update by
 * ||w|| / ||update||, so with GPT-2's small initial weights it wants a larger
 * --lr than AdamW (a tiny model trained well at 5e-2).
 *
 * Prints the unigram baseline (entropy of the training text's character
 * distribution, nats per character) first, then the train loss and tokens/s
 * every --log-every steps, the validation loss every --eval-every steps, and at
 * the end a text sample drawn with temperature sampling from the seeded RNG,
 * grad mode off. A steady-state step allocates nothing from the heap: the
 * activations live in the ctx's arena, the batch in the loader's buffers, the
 * optimizer state is allocated once. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include <dgrad.h>

#include "gpt_model.h"
#include "pipe_run.h"

typedef struct {
  const char *text;
  long steps, batch, threads, eval_every, eval_batches, sample_len, log_every, warmup;
  long layers, heads, dim, context;
  int tie, lamb;
  double lr, wd, clip, temperature;
  unsigned long long seed;
  long pipe, micro;                     /* --pipe K: pipeline of K stages */
  int one_f_one_b, remat, balance_time; /* its schedule, re-materialization, balance */
  const char *swap, *swap_dir;          /* --swap: activation swapping (swap.h) */
  long swap_lookahead, swap_min_bytes; /* -1: the library's default */
  const char *trace; /* --trace FILE */
} opts;

static void usage(const char *argv0) {
  fprintf(stderr,
          "usage: %s [--text FILE|DIR] [--steps N] [--lr LR] [--batch B] [--threads T]\n"
          "          [--seed S] [--eval-every N] [--eval-batches N] [--sample-len N]\n"
          "          [--temperature X] [--optim adamw|lamb] [--layers L] [--heads H]\n"
          "          [--dim C] [--context T] [--tie] [--warmup N] [--weight-decay X]\n"
          "          [--clip X] [--log-every N]\n"
          "          [--pipe K [--micro-batches M] [--schedule gpipe|1f1b] [--remat]\n"
          "           [--balance even|time]]  (under dgrun: K stages x world/K replicas)\n"
          "          [--swap file|bf16|file+bf16 [--swap-dir DIR] [--swap-lookahead N]\n"
          "           [--swap-min-bytes N]]  (also with --pipe: on every stage)\n"
          "          [--trace FILE]\n",
          argv0);
}

static int parse(int argc, char **argv, opts *o) {
  *o = (opts){NULL, 2000, 16, 1, 100, 16, 400, 10, 100, 4, 4, 128, 64, 0, 0,
              2e-3, 0.01, 1.0, 0.8, 1337, 0, 0, 0, 0, 0, NULL, NULL, 2, -1, NULL};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    long *lp = NULL;
    double *dp = NULL;
    if (!strcmp(a, "--tie") || !strcmp(a, "--remat")) {
      *(a[2] == 't' ? &o->tie : &o->remat) = 1;
      continue;
    }
    if (!v) {
      usage(argv[0]);
      return -1;
    }
    if (!strcmp(a, "--text")) o->text = v;
    else if (!strcmp(a, "--optim")) {
      if (strcmp(v, "adamw") && strcmp(v, "lamb")) {
        fprintf(stderr, "transformer: --optim must be adamw or lamb, not %s\n", v);
        return -1;
      }
      o->lamb = !strcmp(v, "lamb");
    } else if (!strcmp(a, "--schedule") || !strcmp(a, "--balance")) {
      int sched = a[2] == 's';
      if (strcmp(v, sched ? "gpipe" : "even") && strcmp(v, sched ? "1f1b" : "time")) {
        fprintf(stderr, "transformer: %s must be %s, not %s\n", a,
                sched ? "gpipe or 1f1b" : "even or time", v);
        return -1;
      }
      *(sched ? &o->one_f_one_b : &o->balance_time) = !strcmp(v, sched ? "1f1b" : "time");
    } else if (!strcmp(a, "--seed")) o->seed = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--pipe")) lp = &o->pipe;
    else if (!strcmp(a, "--swap")) o->swap = v;
    else if (!strcmp(a, "--swap-dir")) o->swap_dir = v;
    else if (!strcmp(a, "--trace")) o->trace = v;
    else if (!strcmp(a, "--swap-lookahead")) lp = &o->swap_lookahead;
    else if (!strcmp(a, "--swap-min-bytes")) lp = &o->swap_min_bytes;
    else if (!strcmp(a, "--micro-batches")) lp = &o->micro;
    else if (!strcmp(a, "--steps")) lp = &o->steps;
    else if (!strcmp(a, "--batch")) lp = &o->batch;
    else if (!strcmp(a, "--threads")) lp = &o->threads;
    else if (!strcmp(a, "--eval-every")) lp = &o->eval_every;
    else if (!strcmp(a, "--eval-batches")) lp = &o->eval_batches;
    else if (!strcmp(a, "--sample-len")) lp = &o->sample_len;
    else if (!strcmp(a, "--log-every")) lp = &o->log_every;
    else if (!strcmp(a, "--warmup")) lp = &o->warmup;
    else if (!strcmp(a, "--layers")) lp = &o->layers;
    else if (!strcmp(a, "--heads")) lp = &o->heads;
    else if (!strcmp(a, "--dim")) lp = &o->dim;
    else if (!strcmp(a, "--context")) lp = &o->context;
    else if (!strcmp(a, "--lr")) dp = &o->lr;
    else if (!strcmp(a, "--weight-decay")) dp = &o->wd;
    else if (!strcmp(a, "--clip")) dp = &o->clip;
    else if (!strcmp(a, "--temperature")) dp = &o->temperature;
    else {
      usage(argv[0]);
      return -1;
    }
    char *end = NULL;
    if (lp) *lp = strtol(v, &end, 10);
    if (dp) *dp = strtod(v, &end);
    if ((lp || dp) && (!end || *end)) {
      fprintf(stderr, "transformer: bad value for %s: %s\n", a, v);
      return -1;
    }
    i++;
  }
  if (o->steps < 0 || o->batch < 1 || o->threads < 1 || o->layers < 1 || o->heads < 1 ||
      o->dim < 1 || o->dim % o->heads || o->context < 2 || o->eval_batches < 1 ||
      o->sample_len < 0 || !(o->lr > 0) || !(o->temperature > 0)) {
    fprintf(stderr, "transformer: invalid option values (dim must divide by heads)\n");
    return -1;
  }
  return 0;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double peak_rss_mib(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_maxrss / 1024.0;
}

/* Entropy (nats) of the byte distribution of a token sequence, and the
 * cross-entropy of `other` under it (add-one smoothed). */
static void unigram(const uint8_t *tok, size_t n, const uint8_t *other, size_t n_other, int V,
                    double *entropy, double *xent) {
  double cnt[256] = {0};
  for (size_t i = 0; i < n; i++) cnt[tok[i]] += 1.0;
  double h = 0, x = 0, tot = (double)n + V;
  for (int v = 0; v < V; v++)
    if (cnt[v] > 0) h -= cnt[v] / (double)n * log(cnt[v] / (double)n);
  for (size_t i = 0; i < n_other; i++) x -= log((cnt[other[i]] + 1.0) / tot);
  *entropy = h;
  *xent = n_other ? x / (double)n_other : h;
}

/* Mean loss over the first n batches of the validation windows (grad off). */
static double evaluate(gpt_model *m, dg_ctx *ctx, dg_loader *val, long n, int64_t B,
                       int64_t T) {
  int prev = dg_ctx_set_grad_enabled(ctx, 0);
  dg_ctx_set_train(ctx, 0);
  dg_loader_seek(val, 0, 0);
  double sum = 0;
  long k = 0;
  for (; k < n; k++) {
    int64_t rows = 0;
    int rc = dg_loader_next(val, NULL, &rows);
    if (rc) return NAN;
    if (rows == 0) break; /* end of the validation split */
    dg_tensor *loss = gpt_loss(m, ctx, dg_loader_buffer(val, 0), dg_loader_buffer(val, 1),
                               rows, T);
    if (!loss) {
      fprintf(stderr, "transformer: eval failed: %s\n", dg_ctx_errmsg(ctx));
      return NAN;
    }
    sum += dg_tensor_item(loss);
    dg_ctx_reset(ctx);
  }
  (void)B;
  dg_ctx_set_train(ctx, 1);
  dg_ctx_set_grad_enabled(ctx, prev);
  return k ? sum / (double)k : NAN;
}

/* Samples len characters after a newline prompt; prints them. */
static int sample(gpt_model *m, dg_ctx *ctx, const dg_text *text, long len, double temp,
                  uint64_t seed) {
  int64_t T = m->cfg.context, V = m->cfg.vocab;
  int64_t *ids = malloc((size_t)(len + 1) * sizeof *ids);
  char *out = malloc((size_t)len + 2);
  float *probs = malloc((size_t)V * sizeof *probs);
  if (!ids || !out || !probs) {
    free(ids), free(out), free(probs);
    return DG_ENOMEM;
  }
  int nl = dg_text_id(text, '\n');
  ids[0] = nl >= 0 ? nl : 0;
  int prev = dg_ctx_set_grad_enabled(ctx, 0);
  dg_ctx_set_train(ctx, 0);
  int rc = DG_OK;
  for (long i = 1; i <= len; i++) {
    int64_t start = i > T ? i - T : 0, n = i - start;
    dg_tensor *logits = gpt_forward(m, ctx, ids + start, 1, n); /* (1, n, V) */
    if (!logits) {
      fprintf(stderr, "transformer: sampling failed: %s\n", dg_ctx_errmsg(ctx));
      rc = dg_ctx_errcode(ctx);
      break;
    }
    const float *last = (const float *)dg_tensor_data(logits) + (n - 1) * V;
    float mx = -INFINITY;
    for (int64_t v = 0; v < V; v++)
      if (last[v] / temp > mx) mx = (float)(last[v] / temp);
    double z = 0;
    for (int64_t v = 0; v < V; v++) z += probs[v] = expf((float)(last[v] / temp) - mx);
    float u;
    dg_rng_uniform(seed, (uint64_t)i, &u, 1);
    double r = u * z, acc = 0;
    int64_t pick = V - 1;
    for (int64_t v = 0; v < V; v++)
      if ((acc += probs[v]) > r) {
        pick = v;
        break;
      }
    ids[i] = pick;
    dg_ctx_reset(ctx);
  }
  dg_ctx_set_grad_enabled(ctx, prev);
  dg_ctx_set_train(ctx, 1);
  if (!rc) {
    dg_text_decode(text, ids + 1, (size_t)len, out, (size_t)len + 2);
    printf("---- sample (%ld chars, temperature %.2f) ----\n%s\n---- end of sample ----\n",
           len, temp, out);
  }
  free(ids), free(out), free(probs);
  return rc;
}

typedef struct {
  dg_text *text;
  dg_dataset train_ds, val_ds;
  dg_loader *train, *val;
  gpt_model m;
  dg_ctx *ctx;
  dg_optim *opt;
} run_state;

static void run_free(run_state *r) {
  dg_optim_free(r->opt);
  dg_ctx_free(r->ctx);
  gpt_free(&r->m);
  dg_loader_free(r->train);
  dg_loader_free(r->val);
  dg_text_free(r->text);
}

static int setup(run_state *r, const opts *o) {
  char err[512] = "";
  memset(r, 0, sizeof *r);
  int rc = dg_text_open(&r->text, o->text, NULL, err, sizeof err);
  if (rc) {
    fprintf(stderr, "transformer: %s\n", err[0] ? err : dg_strerror(rc));
    return rc;
  }
  int T = (int)o->context;
  rc = dg_text_dataset(r->text, DG_SPLIT_TRAIN, T, 1, &r->train_ds);
  rc = rc ? rc : dg_text_dataset(r->text, DG_SPLIT_VAL, T, T, &r->val_ds);
  if (rc) {
    fprintf(stderr, "transformer: text too short for context %d (%s)\n", T, dg_strerror(rc));
    return rc;
  }
  dg_loader_opts lo = {o->batch, 1, o->seed, 1, 0, 1, 0};
  rc = dg_loader_new(&r->train, &r->train_ds, &lo, NULL, 0);
  lo.shuffle = 0;
  lo.drop_last = 0;
  rc = rc ? rc : dg_loader_new(&r->val, &r->val_ds, &lo, NULL, 0);
  gpt_config cfg = {dg_text_vocab_size(r->text), (int)o->layers, (int)o->heads, (int)o->dim,
                    T, o->tie};
  rc = rc ? rc : gpt_new(&r->m, &cfg, o->seed);
  dg_ctx_opts co = {.seed = o->seed};
  rc = rc ? rc : dg_ctx_new(&r->ctx, &co);
  if (!rc) {
    dg_adamw_opts ao = dg_adamw_defaults();
    ao.lr = (float)o->lr;
    ao.weight_decay = (float)o->wd;
    rc = o->lamb ? dg_optim_new_lamb(&r->opt, r->m.ps, &ao, NULL, 0)
                 : dg_optim_new_adamw(&r->opt, r->m.ps, &ao, NULL, 0);
  }
  if (rc) fprintf(stderr, "transformer: setup failed: %s\n", dg_strerror(rc));
  return rc;
}

/* One training step on the next batch; returns the loss or NAN. */
static float train_step(run_state *r, const opts *o, float lr) {
  int64_t rows = 0;
  int rc = dg_loader_next(r->train, NULL, &rows);
  if (rc == DG_OK && rows == 0) rc = dg_loader_next(r->train, NULL, &rows); /* next epoch */
  if (rc) {
    fprintf(stderr, "transformer: loader: %s\n", dg_strerror(rc));
    return NAN;
  }
  dg_params_zero_grad(r->m.ps);
  dg_tensor *loss = gpt_loss(&r->m, r->ctx, dg_loader_buffer(r->train, 0),
                             dg_loader_buffer(r->train, 1), rows, o->context);
  if (!loss || dg_backward(r->ctx, loss)) {
    fprintf(stderr, "transformer: step failed: %s\n", dg_ctx_errmsg(r->ctx));
    return NAN;
  }
  float lv = dg_tensor_item(loss);
  if (o->clip > 0) dg_clip_grad_norm(r->m.ps, o->clip, NULL);
  dg_optim_set_lr(r->opt, lr);
  rc = dg_optim_step(r->opt);
  dg_ctx_reset(r->ctx);
  return rc ? NAN : lv;
}

/* --swap: saved activations leave memory during forward and come back,
 * prefetched, for backward (include/dgrad/swap.h). */
static int swap_opts(const opts *o, dg_swap_opts *so) {
  dg_swap_opts_init(so);
  so->target = !strcmp(o->swap, "file") ? DG_SWAP_FILE
               : !strcmp(o->swap, "bf16") ? DG_SWAP_BF16
               : !strcmp(o->swap, "file+bf16") ? DG_SWAP_FILE | DG_SWAP_BF16 : 0;
  so->dir = o->swap_dir;
  so->lookahead = (int)o->swap_lookahead;
  if (o->swap_min_bytes >= 0) so->min_bytes = (size_t)o->swap_min_bytes;
  if (so->target) return DG_OK;
  fprintf(stderr, "transformer: --swap must be file, bf16 or file+bf16, not %s "
                  "(host needs the CUDA backend)\n", o->swap);
  return DG_EINVAL;
}

static int swap_setup(dg_ctx *ctx, const opts *o) {
  dg_swap_opts so;
  if (swap_opts(o, &so)) return DG_EINVAL;
  int rc = dg_ctx_set_swap(ctx, &so);
  if (rc) fprintf(stderr, "transformer: --swap: %s\n", dg_ctx_errmsg(ctx));
  return rc;
}

static void swap_report(dg_ctx *ctx, const char *target) {
  dg_swap_stats st;
  if (dg_ctx_swap_stats(ctx, &st)) return;
  printf("swap (%s): %.1f MiB out / %.1f MiB in over %d backwards (%.1f MiB stored), at most "
         "%.1f MiB out at once; backward waited %.3f s, forward %.3f s (%llu forward reads); "
         "peak VmRSS %.1f MiB\n",
         target, st.bytes_out / 1048576.0, st.bytes_in / 1048576.0, st.backwards,
         st.stored_bytes / 1048576.0, st.peak_out_bytes / 1048576.0, st.backward_wait_s,
         st.forward_wait_s, (unsigned long long)st.forward_reads, st.peak_rss / 1048576.0);
}

/* --pipe: the same model and loop as a pipeline (pipe_run.c). */
static int pipe_main(const opts *o) {
  if (o->tie || o->pipe < 1 || o->micro < 0) {
    fprintf(stderr, "transformer: --pipe needs K >= 1 and no --tie (the head would share the "
                    "embedding across the first and the last stage)\n");
    return 2;
  }
  gpt_pipe_opts po = {o->text, o->steps, o->batch, o->eval_every, o->eval_batches,
                      o->log_every, o->warmup, o->layers, o->heads, o->dim, o->context,
                      o->lamb, o->lr, o->wd, o->clip, o->seed, (int)o->pipe,
                      o->micro ? (int)o->micro : 2 * (int)o->pipe, o->one_f_one_b, o->remat,
                      o->balance_time, NULL, NULL};
  dg_swap_opts so;
  if (o->swap) {
    if (swap_opts(o, &so)) return 2;
    po.swap = &so;
    po.swap_name = o->swap;
  }
  return gpt_pipe_run(&po);
}

/* --trace: this rank's timeline to path (pid: $RANK, as dgrun sets it);
 * returns code, or 1 when the trace could not be written. */
static int trace_end(const char *path, int code) {
  if (!path) return code;
  char err[256];
  int e = dg_trace_stop();
  if (e) snprintf(err, sizeof err, "trace stop: %s", dg_strerror(e));
  else e = dg_trace_write(path, getenv("RANK") ? atoi(getenv("RANK")) : 0, err, sizeof err);
  if (e) fprintf(stderr, "transformer: %s\n", err);
  return e ? 1 : code;
}

int main(int argc, char **argv) {
  opts o;
  if (parse(argc, argv, &o)) return 2;
  dg_set_num_threads((int)o.threads);
  const char *trace = o.trace ? o.trace : getenv("DG_TRACE");
  int trc = trace ? dg_trace_start(NULL) : 0;
  if (trc) {
    fprintf(stderr, "transformer: --trace %s: %s\n", trace, dg_strerror(trc));
    return 1;
  }
  if (o.pipe) return trace_end(trace, pipe_main(&o));
  run_state r;
  if (setup(&r, &o) || (o.swap && swap_setup(r.ctx, &o))) {
    run_free(&r);
    return 1;
  }
  size_t ntr = 0, nva = 0;
  const uint8_t *tr = dg_text_tokens(r.text, DG_SPLIT_TRAIN, &ntr);
  const uint8_t *va = dg_text_tokens(r.text, DG_SPLIT_VAL, &nva);
  double ent, xent;
  unigram(tr, ntr, va, nva, dg_text_vocab_size(r.text), &ent, &xent);
  printf("text: %s, %zu train / %zu val chars, vocab %d\n",
         o.text ? o.text : DG_FORTUNES_DIR, ntr, nva, dg_text_vocab_size(r.text));
  printf("model: %ld layers, %ld heads, d_model %ld, context %ld%s, %lld parameters; "
         "%s lr %g, batch %ld, %ld threads, seed %llu\n",
         o.layers, o.heads, o.dim, o.context, o.tie ? ", tied head" : "",
         (long long)gpt_num_params(&r.m), o.lamb ? "lamb" : "adamw", o.lr, o.batch, o.threads,
         o.seed);
  printf("unigram baseline: %.4f nats/char (train entropy; val cross-entropy %.4f)\n", ent,
         xent);
  fflush(stdout);

  dg_lr_schedule sched = {DG_LR_WARMUP_COSINE, (float)o.lr, o.warmup, o.steps, 0, 0,
                          (float)(0.1 * o.lr)};
  int64_t tokens_per_step = o.batch * o.context;
  double t_start = now_s(), t_since_log = 0, t_train = 0;
  long below_at = -1, steps_since_log = 0;
  double loss_sum = 0, last_val = NAN;
  dg_mem_stats ms0 = {0}, ms1 = {0};
  for (long s = 0; s < o.steps; s++) {
    if (s == 10) dg_mem_get_stats(DG_CPU, &ms0);
    double t0 = now_s();
    float lv = train_step(&r, &o, dg_lr_at(&sched, s));
    double dt = now_s() - t0;
    t_train += dt, t_since_log += dt;
    if (isnan(lv)) {
      run_free(&r);
      return 1;
    }
    /* The first step grew the arena chunk by chunk and reset merged the
     * chunks into one; hand the old ones back to the system. */
    if (s == 0) dg_mem_empty_cache(DG_CPU);
    loss_sum += lv, steps_since_log++;
    if ((s + 1) % o.log_every == 0 || s + 1 == o.steps) {
      printf("step %5ld  train loss %.4f  lr %.2e  %.0f tokens/s\n", s + 1,
             loss_sum / (double)steps_since_log, (double)dg_lr_at(&sched, s),
             (double)(steps_since_log * tokens_per_step) / t_since_log);
      loss_sum = 0, steps_since_log = 0, t_since_log = 0;
      fflush(stdout);
    }
    if (o.eval_every > 0 && ((s + 1) % o.eval_every == 0 || s + 1 == o.steps)) {
      if (s >= 10) dg_mem_get_stats(DG_CPU, &ms1);
      last_val = evaluate(&r.m, r.ctx, r.val, o.eval_batches, o.batch, o.context);
      if (below_at < 0 && last_val < ent) below_at = s + 1;
      printf("step %5ld  val loss %.4f%s\n", s + 1, last_val,
             last_val < ent ? "  (below unigram baseline)" : "");
      fflush(stdout);
    }
  }
  double wall = now_s() - t_start;
  if (o.eval_every <= 0 || o.steps <= 10) dg_mem_get_stats(DG_CPU, &ms1);
  printf("done: %ld steps in %.1f s (%.1f s training, %.0f tokens/s); final val loss %.4f; "
         "unigram baseline %.4f first beaten at step %ld\n",
         o.steps, wall, t_train, t_train > 0 ? (double)(o.steps * tokens_per_step) / t_train : 0,
         last_val, ent, below_at);
  if (o.steps > 10)
    printf("steady state (steps 11..): %llu system allocations by dgrad; arena peak %.1f MiB\n",
           (unsigned long long)(ms1.system_allocs - ms0.system_allocs),
           (double)dg_ctx_arena_peak(r.ctx) / (1024.0 * 1024.0));
  if (o.swap) swap_report(r.ctx, o.swap);
  int rc = sample(&r.m, r.ctx, r.text, o.sample_len, o.temperature, o.seed ^ 0x5a5a5a5aull);
  printf("peak RSS %.1f MiB\n", peak_rss_mib());
  run_free(&r);
  return trace_end(trace, rc ? 1 : 0);
}
