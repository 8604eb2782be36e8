/* The char-GPT as a pipeline; see pipe_run.h.
 *
 * Ranks: world = K stages x R replicas. Rank w is stage w % K of replica
 * w / K; each replica's K ranks form a pipe group, each stage's R ranks a
 * replica group (DP x PP). Every rank reads the same batches (same seed):
 * stage 0 takes the token ids, the last stage the targets, and replica r
 * the r-th slice of the global batch. The gradient norm is clipped over the
 * whole model (dg_pipe_clip_grad_norm), as one process would. */
#include "pipe_run.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <dgrad.h>

#include "gpt_model.h"

typedef struct {
  dg_pg *world, *pipe_pg, *dp_pg; /* pipe_pg is world when R == 1 */
  int K, R, stage, replica, rank;
  dg_text *text;
  dg_dataset train_ds, val_ds;
  dg_loader *train, *val;
  dg_params *ps;
  dg_pipe *pipe;
  dg_optim *opt;
  dg_ctx *ctx;
} pipe_state;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static dg_tensor *ce(void *user, dg_ctx *ctx, dg_tensor *logits, dg_tensor *targets) {
  (void)user;
  return dg_cross_entropy(ctx, logits, targets); /* (mb, T, V), (mb, T) */
}

/* The pipe groups (one per replica) and the replica groups (one per stage):
 * dg_pg_new_group is collective, so every rank makes all of them in order. */
static int make_groups(pipe_state *s, char *err, size_t cap) {
  if (s->R == 1) {
    s->pipe_pg = s->world;
    return DG_OK;
  }
  int ranks[64];
  for (int r = 0; r < s->R; r++) {
    dg_pg *g = NULL;
    for (int k = 0; k < s->K; k++) ranks[k] = r * s->K + k;
    int rc = dg_pg_new_group(&g, s->world, ranks, s->K, err, cap);
    if (rc) return rc;
    if (g) s->pipe_pg = g;
  }
  for (int k = 0; k < s->K; k++) {
    dg_pg *g = NULL;
    for (int r = 0; r < s->R; r++) ranks[r] = r * s->K + k;
    int rc = dg_pg_new_group(&g, s->world, ranks, s->R, err, cap);
    if (rc) return rc;
    if (g) s->dp_pg = g;
  }
  return DG_OK;
}

static int load_text(pipe_state *s, const gpt_pipe_opts *o, char *err, size_t cap) {
  int rc = dg_text_open(&s->text, o->text, NULL, err, cap);
  if (rc) return rc;
  int T = (int)o->context;
  rc = dg_text_dataset(s->text, DG_SPLIT_TRAIN, T, 1, &s->train_ds);
  rc = rc ? rc : dg_text_dataset(s->text, DG_SPLIT_VAL, T, T, &s->val_ds);
  if (rc) {
    snprintf(err, cap, "text too short for context %d", T);
    return rc;
  }
  dg_loader_opts lo = {o->batch, 1, o->seed, 1, 0, 1, 0};
  rc = dg_loader_new(&s->train, &s->train_ds, &lo, err, cap);
  lo.shuffle = 0;
  lo.drop_last = 0;
  return rc ? rc : dg_loader_new(&s->val, &s->val_ds, &lo, err, cap);
}

static int build(pipe_state *s, const gpt_pipe_opts *o, char *err, size_t cap) {
  gpt_config cfg = {dg_text_vocab_size(s->text), (int)o->layers, (int)o->heads, (int)o->dim,
                    (int)o->context, 0};
  dg_module *seq;
  int rc = gpt_sequential(&seq, &cfg);
  if (rc) {
    snprintf(err, cap, "cannot build the model (%s)", dg_strerror(rc));
    return rc;
  }
  rc = dg_params_new(&s->ps);
  rc = rc ? rc : dg_ctx_new(&s->ctx, NULL);
  if (rc) {
    dg_module_free(seq);
    return rc;
  }
  dg_pipe_opts po = dg_pipe_defaults();
  po.micro_batches = o->micro;
  po.schedule = o->one_f_one_b ? DG_PIPE_1F1B : DG_PIPE_GPIPE;
  po.remat = o->remat;
  po.dp_group = s->dp_pg;
  po.swap = o->swap;
  static int64_t sample[4096];
  int64_t mb = o->batch / s->R / o->micro, shape[2] = {mb, o->context};
  if (o->balance_time && mb * o->context <= 4096) { /* token ids 0: any valid input times the same */
    memset(sample, 0, sizeof sample);
    po.profile_input = dg_wrap(s->ctx, DG_I64, 2, shape, sample);
  }
  rc = dg_pipe_new(&s->pipe, s->pipe_pg, seq, s->ps, o->seed, &po, err, cap);
  dg_ctx_reset(s->ctx);
  if (rc) return rc;
  gpt_init_params(s->ps, cfg.layers, o->seed); /* by name: the values of the whole model */
  dg_adamw_opts ao = dg_adamw_defaults();
  ao.lr = (float)o->lr;
  ao.weight_decay = (float)o->wd;
  return o->lamb ? dg_optim_new_lamb(&s->opt, s->ps, &ao, err, cap)
                 : dg_optim_new_adamw(&s->opt, s->ps, &ao, err, cap);
}

static void state_free(pipe_state *s) {
  dg_optim_free(s->opt);
  dg_pipe_free(s->pipe);
  dg_params_free(s->ps);
  dg_ctx_free(s->ctx);
  dg_loader_free(s->train);
  dg_loader_free(s->val);
  dg_text_free(s->text);
  if (s->pipe_pg != s->world) dg_pg_free(s->pipe_pg);
  dg_pg_free(s->dp_pg);
  dg_pg_free(s->world);
}

/* The replica's rows of the loader's batch: ids and targets (B/R, T). */
static int batch_of(pipe_state *s, dg_loader *ld, int64_t T, dg_tensor **x, dg_tensor **y) {
  int64_t rows = 0;
  int rc = dg_loader_next(ld, NULL, &rows);
  if (!rc && rows == 0 && ld == s->train) rc = dg_loader_next(ld, NULL, &rows); /* next epoch */
  if (rc || rows == 0) return rc ? rc : DG_ENOTFOUND;
  int64_t shape[2] = {rows, T}, per = rows / s->R;
  *x = dg_wrap(s->ctx, DG_I64, 2, shape, dg_loader_buffer(ld, 0));
  *y = dg_wrap(s->ctx, DG_I64, 2, shape, dg_loader_buffer(ld, 1));
  *x = dg_slice(s->ctx, *x, s->replica * per, (s->replica + 1) * per);
  *y = dg_slice(s->ctx, *y, s->replica * per, (s->replica + 1) * per);
  return *x && *y ? DG_OK : DG_ENOMEM;
}

/* The mean over the replicas (each pipe already agrees on its loss). */
static float global_mean(pipe_state *s, float v) {
  if (s->dp_pg) dg_pg_allreduce_sync(s->dp_pg, &v, 1, DG_F32, DG_RED_AVG);
  return v;
}

static int train_step(pipe_state *s, const gpt_pipe_opts *o, float lr, float *loss) {
  dg_tensor *x = NULL, *y = NULL;
  int rc = batch_of(s, s->train, o->context, &x, &y);
  if (rc) return rc;
  dg_params_zero_grad(s->ps);
  rc = dg_pipe_step(s->pipe, x, y, ce, NULL, loss);
  if (!rc && o->clip > 0) rc = dg_pipe_clip_grad_norm(s->pipe, o->clip, NULL);
  dg_optim_set_lr(s->opt, lr);
  if (!rc) rc = dg_optim_step(s->opt);
  dg_ctx_reset(s->ctx);
  *loss = global_mean(s, *loss);
  return rc;
}

static double evaluate(pipe_state *s, const gpt_pipe_opts *o) {
  dg_pipe_set_train(s->pipe, 0);
  dg_loader_seek(s->val, 0, 0);
  double sum = 0;
  long k = 0;
  for (; k < o->eval_batches; k++) {
    dg_tensor *x, *y;
    float l;
    int rc = batch_of(s, s->val, o->context, &x, &y);
    if (rc == DG_ENOTFOUND) break;
    if (!rc && dg_tensor_dim(x, 0) % o->micro) break; /* a short last batch */
    if (!rc) rc = dg_pipe_eval(s->pipe, x, y, ce, NULL, &l);
    dg_ctx_reset(s->ctx);
    if (rc) return NAN;
    sum += global_mean(s, l);
  }
  dg_pipe_set_train(s->pipe, 1);
  return k ? sum / (double)k : NAN;
}

static int setup(pipe_state *s, const gpt_pipe_opts *o, char *err, size_t cap) {
  int rc = dg_pg_new_from_env(&s->world, 0, err, cap);
  if (rc) return rc;
  int W = dg_pg_size(s->world);
  s->rank = dg_pg_rank(s->world), s->K = o->stages;
  if (s->K < 1 || W % s->K || W / s->K > 64 || o->batch % (W / s->K * o->micro)) {
    snprintf(err, cap, "--pipe %d: the world of %d ranks must be a multiple of the stages, and "
             "--batch %ld a multiple of replicas x --micro-batches (%d x %d)", s->K, W, o->batch,
             s->K >= 1 ? W / s->K : 0, o->micro);
    return DG_EINVAL;
  }
  s->R = W / s->K, s->stage = s->rank % s->K, s->replica = s->rank / s->K;
  rc = make_groups(s, err, cap);
  rc = rc ? rc : load_text(s, o, err, cap);
  return rc ? rc : build(s, o, err, cap);
}

static void report(pipe_state *s, const gpt_pipe_opts *o) {
  int first, last;
  dg_pipe_stage(s->pipe, &first, &last);
  dg_pipe_stats st;
  dg_pipe_get_stats(s->pipe, &st);
  printf("rank %d (stage %d of replica %d): layers %d-%d, %lld parameters, idle %.1f%% of the "
         "last step, arena %.1f MiB in %d contexts\n", s->rank, s->stage, s->replica, first,
         last - 1, (long long)dg_params_numel(s->ps, 1),
         st.step_seconds > 0 ? 100.0 * st.wait_seconds / st.step_seconds : 0,
         (double)st.arena_reserved / (1024.0 * 1024.0), st.contexts);
  if (s->R > 1)
    printf("rank %d: the replicas' all-reduce in %d buckets, %d of them overlapped with the last "
           "backward, %.2f ms waited after it\n", s->rank, st.dp_buckets, st.dp_buckets_early,
           1e3 * st.dp_wait_seconds);
  if (!o->swap) return;
  int n = 0, on = 0;
  double out = 0, in = 0, wait = 0;
  if (dg_pipe_contexts(s->pipe, NULL, 0, &n) != DG_OK || n < 1) return; /* how many first */
  dg_ctx **ctxs = malloc((size_t)n * sizeof *ctxs);
  if (!ctxs || dg_pipe_contexts(s->pipe, ctxs, n, &n) != DG_OK) {
    free(ctxs);
    return;
  }
  for (int i = 0; i < n; i++) {
    dg_swap_stats sw;
    if (dg_ctx_swap_stats(ctxs[i], &sw) != DG_OK) continue; /* a context without a tape */
    out += (double)sw.bytes_out, in += (double)sw.bytes_in, wait += sw.backward_wait_s, on++;
  }
  free(ctxs);
  printf("rank %d: swap (%s): %.1f MiB out / %.1f MiB in over %d contexts; backward waited "
         "%.3f s\n", s->rank, o->swap_name ? o->swap_name : "on", out / 1048576.0,
         in / 1048576.0, on, wait);
}

int gpt_pipe_run(const gpt_pipe_opts *o) {
  pipe_state s;
  memset(&s, 0, sizeof s);
  char err[512] = "";
  int rc = setup(&s, o, err, sizeof err);
  if (rc) {
    fprintf(stderr, "transformer: rank %d: %s (%s)\n", s.rank, err, dg_err_name(rc));
    state_free(&s);
    return 1;
  }
  if (s.rank == 0)
    printf("pipeline: %d stages x %d replicas, %d micro-batches, %s%s, balance %s\n", s.K, s.R,
           o->micro, o->one_f_one_b ? "1F1B" : "GPipe", o->remat ? ", re-materialization" : "",
           o->balance_time ? "by time" : "even");
  dg_lr_schedule sched = {DG_LR_WARMUP_COSINE, (float)o->lr, o->warmup, o->steps, 0, 0,
                          (float)(0.1 * o->lr)};
  double loss_sum = 0, t_log = now_s(), t0 = t_log, val = NAN;
  long since = 0;
  for (long step = 0; !rc && step < o->steps; step++) {
    float l;
    rc = train_step(&s, o, dg_lr_at(&sched, step), &l);
    if (rc) break;
    loss_sum += l, since++;
    if (s.rank == 0 && ((step + 1) % o->log_every == 0 || step + 1 == o->steps)) {
      double dt = now_s() - t_log;
      printf("step %5ld  train loss %.4f  lr %.2e  %.0f tokens/s\n", step + 1,
             loss_sum / (double)since, (double)dg_lr_at(&sched, step),
             (double)(since * o->batch * o->context) / dt);
      fflush(stdout);
    }
    if ((step + 1) % o->log_every == 0) loss_sum = 0, since = 0, t_log = now_s();
    if (o->eval_every > 0 && ((step + 1) % o->eval_every == 0 || step + 1 == o->steps)) {
      val = evaluate(&s, o);
      if (s.rank == 0) printf("step %5ld  val loss %.4f\n", step + 1, val);
    }
  }
  if (rc) {
    const char *m = dg_pipe_errmsg(s.pipe);
    fprintf(stderr, "transformer: rank %d: %s\n", s.rank,
            m && *m ? m : dg_optim_errmsg(s.opt));
  } else {
    report(&s, o);
    if (s.rank == 0)
      printf("done: %ld steps in %.1f s; final val loss %.4f\n", o->steps, now_s() - t0, val);
  }
  fflush(stdout);
  state_free(&s);
  return rc ? 1 : 0;
}
