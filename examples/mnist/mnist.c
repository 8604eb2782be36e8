/* examples/mnist: trains an MLP or a small CNN on Fashion-MNIST (or any
 * MNIST-format directory) with checkpoints and exact resume.
 *
 *   mnist [--data DIR] [--model mlp|cnn] [--optim sgd|adamw|lamb|lars]
 *         [--batch 64] [--lr LR] [--epochs 3] [--threads N] [--seed 1]
 *         [--checkpoint PATH] [--save-every STEPS] [--resume PATH]
 *         [--max-steps N] [--log-every 100] [--loss-log FILE]
 *         [--schedule cosine|constant] [--stop-at STEP] [--overlap]
 *         [--checkpoint-dir DIR] [--keep 3] [--rescale accum|linear]
 *         [--accum K] [--trace FILE]
 *
 * Models (parameters named "layers.<i>.weight" / ".bias"):
 *   mlp  784-512-256-10, ReLU
 *   cnn  conv 1->32 3x3 pad 1, ReLU, maxpool 2, conv 32->64 3x3 pad 1, ReLU,
 *        maxpool 2, flatten, linear 3136->128, ReLU, linear 128->10
 * Default learning rates: sgd 0.05 (momentum 0.9), adamw 1e-3 (weight decay
 * 0.01), lamb 4e-3, lars 2.0 (trust 0.001, momentum 0.9, wd 5e-4); by
 * default the rate follows a cosine from it to 0 over all the run's steps
 * (--schedule constant keeps it), a pure function of the global step.
 *
 * Checkpoints (dgrad/checkpoint.h, safetensors) are written at each epoch
 * end, every --save-every steps, and when --max-steps stops the run; they
 * hold parameters, optimizer state, step, RNG and loader position, so
 * --resume continues exactly where the run stopped: the same losses, bit
 * for bit, as a run that never stopped (tests/ckpt/test_mnist_resume.py).
 * --max-steps counts global steps, the resumed ones included, and sets the
 * schedule's length; --stop-at STEP stops early (checkpoint saved) without
 * changing the schedule, to test resuming.
 *
 * As a service (dgrad/run.h): with --checkpoint-dir DIR the run saves
 * DIR/ckpt-<step>.safetensors (the newest --keep kept) and, started again
 * with the same command (dgrun --max-restarts, a Slurm requeue, a restarted
 * pod), resumes from the latest complete one by itself. With any
 * checkpointing, SIGTERM or SIGINT to any rank stops every rank after the
 * same step (dg_stop_agree), saves, and exits 0: the resumed run's losses
 * are those of a run never stopped, bit for bit. Resumed on another number
 * of ranks, the rest of the epoch is dealt over the new ranks (no sample
 * skipped or repeated) and --rescale says what a step is: accum (default)
 * keeps the global batch of the first start (per-rank batch x ranks),
 * accumulating micro-batches when fewer ranks carry it (4 -> 2: 2 micro-
 * batches per step; 2 -> 4: half the per-rank batch), same learning rate;
 * linear keeps --batch per rank and scales the rate by new/old global batch
 * (Goyal et al.). The schedule's length, fixed at the first start, is in
 * steps of the first global batch; the rate follows the samples trained.
 * --accum K splits each step's --batch rows per rank into K micro-batches
 * whose gradients accumulate before the one optimizer step (DDP averages
 * once per step): the same global batch in less memory.
 * --throttle-ms sleeps after each step (tests: a run long enough to signal).
 *
 * Output: a progress line every --log-every steps (epoch, step, loss,
 * samples/s, ETA), the test accuracy at each epoch end, and a summary with
 * dgrad's heap allocations during steady-state steps (0: none; counted
 * through dg_set_allocator). --loss-log appends "<step> <loss as %a>" per
 * step (with several ranks, into FILE.rank<R>).
 *
 * Data parallel: under dgrun or srun (WORLD_SIZE or SLURM_NTASKS > 1) the
 * process group comes from the environment, the parameters are wrapped with
 * DDP (dgrad/ddp.h: rank 0's initial values broadcast, gradients averaged
 * over ranks), each rank reads its own shard of every epoch (--batch is per
 * rank), and rank 0 prints and writes checkpoints; every rank resumes from
 * the same file. --overlap hands the optimizer to DDP
 * (dg_ddp_overlap_optimizer): each bucket's update lands when the next
 * forward reads it, so communication also overlaps the forward; the losses
 * are those of the plain loop (tests/ckpt/test_mnist_resume.py).
 *   dgrun --nproc-per-node 2 build/examples/mnist/mnist --model cnn --threads 1 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <dgrad.h>

#include "mnist_opts.h"

/* ---- heap allocations made by dgrad, counted through the allocator hook ---- */

static uint64_t g_allocs; /* atomic: the store server's thread allocates too */
static void *count_malloc(size_t n) {
  __atomic_fetch_add(&g_allocs, 1, __ATOMIC_RELAXED);
  return malloc(n);
}
static void *count_realloc(void *p, size_t n) {
  __atomic_fetch_add(&g_allocs, 1, __ATOMIC_RELAXED);
  return realloc(p, n);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- model ---- */

/* Appends the module a constructor just made (rc: the constructor's code). */
static int add(dg_module *seq, int rc, dg_module **m) {
  if (rc) return rc;
  rc = dg_sequential_add(seq, *m, NULL);
  if (rc) dg_module_free(*m);
  return rc;
}

static int build_model(const char *kind, dg_module **out) {
  dg_module *seq, *m = NULL;
  int rc = dg_nn_sequential(&seq);
  if (rc) return rc;
  if (!strcmp(kind, "mlp")) {
    rc = add(seq, dg_nn_linear(&m, 784, 512, 1), &m);
    if (!rc) rc = add(seq, dg_nn_relu(&m), &m);
    if (!rc) rc = add(seq, dg_nn_linear(&m, 512, 256, 1), &m);
    if (!rc) rc = add(seq, dg_nn_relu(&m), &m);
    if (!rc) rc = add(seq, dg_nn_linear(&m, 256, 10, 1), &m);
  } else {
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
  }
  if (rc) dg_module_free(seq);
  else *out = seq;
  return rc;
}

/* Builds the optimizer and describes its hyper-parameters in hp (saved in
 * checkpoints as "optim_hparams"). */
static int build_optim(const mnist_opts *o, dg_params *ps, dg_optim **out, char *hp,
                       size_t cap) {
  if (!strcmp(o->optim, "sgd")) {
    dg_sgd_opts s = dg_sgd_defaults();
    s.lr = o->lr, s.momentum = 0.9f;
    snprintf(hp, cap, "lr=%g momentum=%g dampening=%g nesterov=%d weight_decay=%g",
             (double)s.lr, (double)s.momentum, (double)s.dampening, s.nesterov,
             (double)s.weight_decay);
    return dg_optim_new_sgd(out, ps, &s, NULL, 0);
  }
  if (!strcmp(o->optim, "adamw") || !strcmp(o->optim, "lamb")) {
    int adamw = !strcmp(o->optim, "adamw");
    dg_adamw_opts a = adamw ? dg_adamw_defaults() : dg_lamb_defaults();
    a.lr = o->lr;
    snprintf(hp, cap, "lr=%g beta1=%g beta2=%g eps=%g weight_decay=%g", (double)a.lr,
             (double)a.beta1, (double)a.beta2, (double)a.eps, (double)a.weight_decay);
    return adamw ? dg_optim_new_adamw(out, ps, &a, NULL, 0) : dg_optim_new_lamb(out, ps, &a, NULL, 0);
  }
  dg_lars_opts l = dg_lars_defaults();
  l.lr = o->lr;
  snprintf(hp, cap, "lr=%g momentum=%g weight_decay=%g trust_coef=%g eps=%g adapt_1d=%d",
           (double)l.lr, (double)l.momentum, (double)l.weight_decay, (double)l.trust_coef,
           (double)l.eps, l.adapt_1d);
  return dg_optim_new_lars(out, ps, &l, NULL, 0);
}

/* ---- training state ---- */

typedef struct {
  mnist_opts o;
  dg_ctx *ctx;
  dg_params *ps;
  dg_module *net;
  dg_optim *opt;
  dg_mnist *train, *test;
  dg_dataset train_ds, test_ds;
  dg_loader *loader, *test_loader;
  int rank, world; /* data-parallel position (1 process: 0, 1) */
  dg_pg *pg;       /* NULL on one process */
  dg_ddp *ddp;
  dg_lr_schedule sched;
  char hparams[256]; /* optimizer hyper-parameters, for checkpoints */
  int64_t step;    /* global steps taken */
  /* what a step is on this world size (see the header: --rescale) */
  int micro, accum;      /* per-rank micro-batch, micro-batches per step */
  float lr_scale;        /* linear rule: this global batch / the first one */
  int64_t global0;       /* the first start's global batch */
  int64_t sched_total;   /* schedule length, in steps of global0 samples */
  int64_t samples;       /* samples trained, all ranks */
  char from[4096];       /* checkpoint to resume from ("" none) */
  FILE *loss_log;
  uint64_t steady_allocs;
  double t_start;
  int64_t steps_this_run;
  int stopped; /* the signal all ranks agreed to stop on, or 0 */
} trainer;

/* With WORLD_SIZE (or, under srun, SLURM_NTASKS) > 1: the process group
 * from the environment (dgrun, torchrun, Slurm variables). */
static int dist_setup(trainer *t) {
  const char *ws = getenv("WORLD_SIZE");
  if (!ws) ws = getenv("SLURM_NTASKS");
  t->world = 1, t->rank = 0;
  if (!ws || atoi(ws) <= 1) return DG_OK;
  char err[512];
  int rc = dg_pg_new_from_env(&t->pg, 0, err, sizeof err);
  if (rc) {
    fprintf(stderr, "mnist: process group: %s\n", err);
    return rc;
  }
  t->rank = dg_pg_rank(t->pg), t->world = dg_pg_size(t->pg);
  return DG_OK;
}

/* An integer metadata value of checkpoint path, or def when absent. */
static int64_t meta_i64(const char *path, const char *key, int64_t def) {
  char v[64];
  if (dg_checkpoint_meta(path, key, v, sizeof v, NULL, 0)) return def;
  return strtoll(v, NULL, 10);
}

/* Finds the checkpoint to resume from (--resume, or the latest of
 * --checkpoint-dir) and decides what a step is on this world size. */
static int plan(trainer *t) {
  char err[512];
  t->from[0] = 0;
  if (t->o.resume) snprintf(t->from, sizeof t->from, "%s", t->o.resume);
  else if (t->o.checkpoint_dir) {
    int rc = dg_checkpoint_dir_latest(t->o.checkpoint_dir, t->from, sizeof t->from, NULL, err,
                                      sizeof err);
    if (rc && rc != DG_ENOTFOUND) {
      fprintf(stderr, "mnist: %s\n", err);
      return rc;
    }
  }
  /* B: the per-rank rows of a step; mb: the most rows of one micro-batch */
  const int64_t W = t->world, B = t->o.batch, mb = B / t->o.accum;
  const int64_t w0 = t->from[0] ? meta_i64(t->from, "world_size", W) : W;
  t->global0 = t->from[0] ? meta_i64(t->from, "global_batch", B * w0) : B * W;
  t->micro = (int)mb, t->accum = t->o.accum, t->lr_scale = 1.0f;
  if (t->global0 == B * W) return DG_OK;
  if (t->o.linear) {
    t->lr_scale = dg_lr_scale_linear(1.0f, (int)t->global0, (int)(B * W));
  } else if (t->global0 % W) {
    fprintf(stderr, "mnist: %s: the global batch %" PRId64 " of the first start does not "
            "split over %" PRId64 " ranks; use --rescale linear\n", t->from, t->global0, W);
    return DG_EINVAL;
  } else {
    int64_t per = t->global0 / W, k = (per + mb - 1) / mb; /* per rank, per step */
    while (per % k) k++;
    t->accum = (int)k, t->micro = (int)(per / k);
  }
  if (t->rank == 0)
    printf("resuming a run of %" PRId64 " rank(s) (global batch %" PRId64 ") on %" PRId64
           ": %s, per-rank batch %d x %d accumulated, learning rate x %g\n", w0, t->global0, W,
           t->o.linear ? "linear scaling rule" : "global batch kept", t->micro, t->accum,
           (double)t->lr_scale);
  return DG_OK;
}

static int open_data(trainer *t) {
  char err[512];
  int rc = dg_mnist_open(&t->train, t->o.data, 1, err, sizeof err);
  if (!rc) rc = dg_mnist_open(&t->test, t->o.data, 0, err, sizeof err);
  if (rc) {
    fprintf(stderr, "mnist: %s\n", err);
    return rc;
  }
  dg_mnist_dataset(t->train, &t->train_ds);
  dg_mnist_dataset(t->test, &t->test_ds);
  dg_loader_opts lo = {t->micro, 1, t->o.seed, 1, t->rank, t->world, 0};
  rc = dg_loader_new(&t->loader, &t->train_ds, &lo, err, sizeof err);
  dg_loader_opts to = {500, 0, 0, 0, 0, 1, 0};
  if (!rc) rc = dg_loader_new(&t->test_loader, &t->test_ds, &to, err, sizeof err);
  if (rc) fprintf(stderr, "mnist: %s\n", err);
  return rc;
}

static int trainer_init(trainer *t) {
  int rc = dist_setup(t);
  if (!rc) rc = plan(t);
  if (!rc) rc = open_data(t);
  if (rc) return rc;
  dg_ctx_opts co = {.arena_bytes = 64u << 20, .seed = t->o.seed};
  if ((rc = dg_ctx_new(&t->ctx, &co)) || (rc = dg_params_new(&t->ps)) ||
      (rc = build_model(t->o.model, &t->net)) ||
      (rc = dg_module_bind(t->net, t->ps, "layers", t->o.seed)) ||
      (rc = build_optim(&t->o, t->ps, &t->opt, t->hparams, sizeof t->hparams))) {
    fprintf(stderr, "mnist: cannot build the %s model / %s optimizer: %s\n", t->o.model,
            t->o.optim, dg_strerror(rc));
    return rc;
  }
  dg_ddp_opts dopt = dg_ddp_defaults();
  /* DG_DDP_SHM_INLINE (README): "1" no averaging engine in the group's
   * thread, "0" always one; the rest are dg_pg_new_from_env's */
  const char *e = getenv("DG_DDP_SHM_INLINE");
  if (e && (*e == '0' || *e == '1')) dopt.engine_thread = *e == '1' ? -1 : 1;
  dopt.accum_steps = t->accum; /* DDP divides by it */
  char err[512];
  if (t->pg && (rc = dg_ddp_new(&t->ddp, t->ctx, t->ps, t->pg, &dopt, err, sizeof err))) {
    fprintf(stderr, "mnist: ddp: %s\n", err);
    return rc;
  }
  if (t->o.overlap && t->accum > 1) {
    fprintf(stderr, "mnist: --overlap with %d accumulated micro-batches per step (a run "
            "resumed on fewer ranks): resume with --rescale linear or without --overlap\n",
            t->accum);
    return DG_EINVAL;
  }
  if (t->o.overlap && !t->ddp) {
    fprintf(stderr, "mnist: --overlap needs data-parallel ranks (run under dgrun)\n");
    return DG_EINVAL;
  }
  if (t->o.overlap && (rc = dg_ddp_overlap_optimizer(t->ddp, t->opt))) {
    fprintf(stderr, "mnist: ddp: %s\n", dg_ddp_errmsg(t->ddp));
    return rc;
  }
  /* the schedule's length is the first start's (kept in checkpoints) */
  int64_t total = t->o.epochs * (dg_loader_batches_per_epoch(t->loader) / t->accum);
  if (t->o.max_steps > 0 && t->o.max_steps < total) total = t->o.max_steps;
  if (t->from[0]) total = meta_i64(t->from, "sched_total", total);
  t->sched_total = total;
  t->sched = (dg_lr_schedule){t->o.cosine ? DG_LR_COSINE : DG_LR_CONSTANT,
                              t->o.lr * t->lr_scale, 0, total, 0, 1.0f, 0.0f};
  char path[4096]; /* with several ranks, one loss log per rank: FILE.rank<R> */
  if (t->o.loss_log) {
    if (t->world > 1) snprintf(path, sizeof path, "%s.rank%d", t->o.loss_log, t->rank);
    else snprintf(path, sizeof path, "%s", t->o.loss_log);
    if (!(t->loss_log = fopen(path, "a"))) {
      fprintf(stderr, "mnist: cannot open %s\n", path);
      return DG_EIO;
    }
  }
  return DG_OK;
}

static void trainer_free(trainer *t) {
  if (t->loss_log) fclose(t->loss_log);
  dg_ddp_free(t->ddp);
  dg_loader_free(t->loader);
  dg_loader_free(t->test_loader);
  dg_mnist_free(t->train);
  dg_mnist_free(t->test);
  dg_optim_free(t->opt);
  dg_module_free(t->net);
  dg_params_free(t->ps);
  dg_ctx_free(t->ctx);
  dg_pg_free(t->pg);
}

/* ---- checkpoints ---- */

static int saving(const trainer *t) { return t->o.checkpoint || t->o.checkpoint_dir; }

static int save(trainer *t, const char *why) {
  if (!saving(t) || t->rank != 0) return DG_OK;
  char batch[32], lr[32], seed[32], world[16], g0[32], total[32], samples[32], err[512];
  char path[4096];
  snprintf(batch, sizeof batch, "%d", t->o.batch);
  snprintf(lr, sizeof lr, "%.9g", (double)t->o.lr);
  snprintf(seed, sizeof seed, "%" PRIu64, t->o.seed);
  snprintf(world, sizeof world, "%d", t->world);
  snprintf(g0, sizeof g0, "%" PRId64, t->global0);
  snprintf(total, sizeof total, "%" PRId64, t->sched_total);
  snprintf(samples, sizeof samples, "%" PRId64, t->samples);
  const char *keys[] = {"model", "optim_kind", "optim_hparams", "schedule", "batch", "base_lr",
                        "seed", "world_size", "data", "global_batch", "sched_total", "samples"};
  const char *vals[] = {t->o.model, t->o.optim, t->hparams, t->o.cosine ? "cosine" : "constant",
                        batch, lr, seed, world, t->o.data, g0, total, samples};
  dg_checkpoint c = {t->ps, t->opt, t->ctx, t->loader, t->step, 12, keys, vals};
  int rc;
  if (t->o.checkpoint_dir)
    rc = dg_checkpoint_dir_save(t->o.checkpoint_dir, &c, t->o.keep, path, sizeof path, err,
                                sizeof err);
  else
    rc = dg_checkpoint_save(t->o.checkpoint, &c, err, sizeof err);
  if (rc) fprintf(stderr, "mnist: checkpoint: %s\n", err);
  else printf("checkpoint %s saved at step %" PRId64 " (%s)\n",
              t->o.checkpoint_dir ? path : t->o.checkpoint, t->step, why);
  fflush(stdout);
  return rc;
}

/* The run's settings must match the checkpoint's (model, optimizer kind,
 * batch, seed); then everything is restored. */
static int resume(trainer *t) {
  if (!t->from[0]) return DG_OK; /* a first start */
  char err[512], v[256], want[64];
  const char *keys[] = {"model", "optim_kind", "batch", "seed"};
  for (int i = 0; i < 4; i++) {
    if (i == 2) snprintf(want, sizeof want, "%d", t->o.batch);
    else if (i == 3) snprintf(want, sizeof want, "%" PRIu64, t->o.seed);
    else snprintf(want, sizeof want, "%s", i ? t->o.optim : t->o.model);
    int rc = dg_checkpoint_meta(t->from, keys[i], v, sizeof v, err, sizeof err);
    if (rc || strcmp(v, want)) {
      fprintf(stderr, "mnist: cannot resume: %s\n", rc ? err : "");
      if (!rc)
        fprintf(stderr, "mnist: %s: %s is %s in the checkpoint, %s on the command line\n",
                t->from, keys[i], v, want);
      return rc ? rc : DG_EMISMATCH;
    }
  }
  dg_checkpoint c = {t->ps, t->opt, t->ctx, t->loader, 0, 0, NULL, NULL};
  int rc = dg_checkpoint_load(t->from, &c, err, sizeof err);
  if (rc) {
    fprintf(stderr, "mnist: cannot resume: %s\n", err);
    return rc;
  }
  t->step = c.step;
  t->samples = meta_i64(t->from, "samples", t->step * t->global0);
  int64_t ep, bt;
  dg_loader_position(t->loader, &ep, &bt);
  printf("resumed from %s: step %" PRId64 ", epoch %" PRId64 ", batch %" PRId64 "\n",
         t->from, t->step, ep + 1, bt);
  return DG_OK;
}

/* ---- steps ---- */

static dg_tensor *input(trainer *t, float *x, int64_t rows) {
  int cnn = !strcmp(t->o.model, "cnn");
  int64_t s2[2] = {rows, 784}, s4[4] = {rows, 1, 28, 28};
  return dg_wrap(t->ctx, DG_F32, cnn ? 4 : 2, cnn ? s4 : s2, x);
}

/* Forward and backward of the loader's current batch; after the step's
 * last micro-batch also the optimizer step. */
static int micro_step(trainer *t, int64_t rows, int last, float *loss) {
  dg_ctx *ctx = t->ctx;
  float *x = dg_loader_buffer(t->loader, 0);
  int64_t *y = dg_loader_buffer(t->loader, 1);
  dg_tensor *logits = dg_module_forward(t->net, ctx, input(t, x, rows));
  dg_tensor *l = dg_cross_entropy(ctx, logits, dg_wrap(ctx, DG_I64, 1, &rows, y));
  /* one process accumulating: the mean of the micro-batch means (DDP
   * divides by accum_steps itself) */
  dg_tensor *obj = l && t->accum > 1 && !t->ddp ? dg_scale(ctx, l, 1.0f / (float)t->accum) : l;
  int rc = obj ? dg_backward(ctx, obj) : dg_ctx_errcode(ctx);
  if (!rc && last && !t->o.overlap) rc = dg_optim_step(t->opt); /* DDP: averaged by now */
  if (rc) fprintf(stderr, "mnist: step %" PRId64 ": %s\n", t->step + 1,
                  dg_ctx_errmsg(ctx)[0] ? dg_ctx_errmsg(ctx) : dg_strerror(rc));
  else *loss = dg_tensor_item(l);
  dg_ctx_reset(ctx);
  return rc;
}

/* One training step: the loader's current batch and accum - 1 more (the
 * caller made sure the epoch has them). */
static int train_step(trainer *t, int64_t rows, float *loss) {
  /* the rate before backward ends: with --overlap DDP applies the update
   * later, with the rate in force then; it follows the samples trained */
  dg_optim_set_lr(t->opt, dg_lr_at(&t->sched, t->samples / t->global0));
  if (!t->o.overlap) dg_params_zero_grad(t->ps); /* else DDP zeroes them */
  float sum = 0, l = 0;
  int rc = DG_OK;
  for (int k = 0; k < t->accum && !rc; k++) {
    if (k && !(rc = dg_loader_next(t->loader, NULL, &rows)) && rows == 0) rc = DG_ESTATE;
    if (!rc) rc = micro_step(t, rows, k == t->accum - 1, &l);
    sum = k ? sum + l : l;
    t->samples += rows * t->world; /* drop_last: every rank the same rows */
  }
  *loss = t->accum > 1 ? sum / (float)t->accum : sum;
  return rc;
}

/* After each step, every rank: has any rank been asked to stop? Then save
 * (rank 0) and wait for it (all), so that an exit 0 means saved. */
static int stop_check(trainer *t, int *stop) {
  char err[512];
  int sig = 0, rc = dg_stop_agree(t->pg, &sig, err, sizeof err);
  if (rc) fprintf(stderr, "mnist: %s\n", err);
  if (rc || !sig) return rc;
  char why[64];
  snprintf(why, sizeof why, "signal %d on %s", sig, dg_stop_signal() ? "this rank" : "a rank");
  if ((rc = save(t, why))) return rc;
  if (t->pg && (rc = dg_pg_barrier_sync(t->pg)))
    fprintf(stderr, "mnist: barrier after the stop checkpoint: %s\n", dg_pg_errmsg(t->pg));
  *stop = sig;
  return rc;
}

/* Test-set accuracy (eval mode, no tape). */
static int evaluate(trainer *t, double *acc) {
  int64_t rows, correct = 0, total = 0;
  int prev = dg_ctx_set_grad_enabled(t->ctx, 0), rc;
  dg_ctx_set_train(t->ctx, 0);
  dg_loader_seek(t->test_loader, 0, 0);
  while ((rc = dg_loader_next(t->test_loader, NULL, &rows)) == DG_OK && rows > 0) {
    float *x = dg_loader_buffer(t->test_loader, 0);
    int64_t *y = dg_loader_buffer(t->test_loader, 1);
    dg_tensor *out = dg_module_forward(t->net, t->ctx, input(t, x, rows)); /* (rows, 10) */
    int64_t right;
    if ((rc = dg_accuracy(t->ctx, out, dg_wrap(t->ctx, DG_I64, 1, &rows, y), &right))) {
      fprintf(stderr, "mnist: eval: %s\n", dg_ctx_errmsg(t->ctx));
      break;
    }
    correct += right;
    total += rows;
    dg_ctx_reset(t->ctx);
  }
  dg_ctx_reset(t->ctx);
  dg_ctx_set_train(t->ctx, 1);
  dg_ctx_set_grad_enabled(t->ctx, prev);
  *acc = total ? (double)correct / (double)total : 0;
  return rc;
}

static void progress(trainer *t, int64_t epoch, int64_t batch, float loss) {
  int64_t nb = dg_loader_batches_per_epoch(t->loader);
  int64_t total = t->o.epochs * nb;
  if (t->o.max_steps > 0 && t->o.max_steps < total) total = t->o.max_steps;
  double el = now_s() - t->t_start, rate = (double)t->steps_this_run / el;
  double eta = rate > 0 ? (double)(total - t->step) / rate : 0;
  printf("epoch %" PRId64 "/%d step %" PRId64 "/%" PRId64 " (global %" PRId64 ") loss %.4f  "
         "%.0f samples/s  ETA %dm%02ds\n", epoch + 1, t->o.epochs, batch, nb, t->step,
         (double)loss, rate * t->o.batch * t->world, (int)eta / 60, (int)eta % 60);
  fflush(stdout);
}

static int end_epoch(trainer *t, int64_t epoch, double *ep_start) {
  double acc, dt = now_s() - *ep_start;
  int rc = evaluate(t, &acc);
  if (rc || t->rank) return rc;
  printf("epoch %" PRId64 " done: test accuracy %.2f%% (%" PRId64 " test images), epoch "
         "time %.1fs\n", epoch + 1, 100.0 * acc, dg_mnist_count(t->test), dt);
  fflush(stdout);
  *ep_start = now_s();
  return save(t, "epoch end");
}

static int train(trainer *t) {
  int64_t epoch, batch, rows;
  double ep_start = now_s();
  t->t_start = ep_start;
  for (;;) {
    dg_loader_position(t->loader, &epoch, &batch);
    if (epoch >= t->o.epochs) return DG_OK;
    if (t->o.max_steps > 0 && t->step >= t->o.max_steps) return save(t, "max steps");
    if (t->o.stop_at > 0 && t->step >= t->o.stop_at) return save(t, "stop-at");
    int64_t left = dg_loader_batches_left(t->loader);
    if (left > 0 && left < t->accum) /* not a whole step: the epoch is over */
      dg_loader_seek_samples(t->loader, epoch, t->train_ds.size);
    int rc = dg_loader_next(t->loader, NULL, &rows);
    if (rc == DG_OK && rows == 0) rc = end_epoch(t, epoch, &ep_start);
    else if (rc == DG_OK) {
      float loss = 0;
      uint64_t a0 = __atomic_load_n(&g_allocs, __ATOMIC_RELAXED);
      rc = train_step(t, rows, &loss);
      if (t->steps_this_run >= 2)
        t->steady_allocs += __atomic_load_n(&g_allocs, __ATOMIC_RELAXED) - a0;
      t->step++, t->steps_this_run++;
      if (t->loss_log) { /* flushed: a run killed later keeps its steps' lines */
        fprintf(t->loss_log, "%" PRId64 " %a\n", t->step, (double)loss);
        fflush(t->loss_log);
      }
      if (!rc && t->rank == 0 && t->o.log_every > 0 && t->step % t->o.log_every == 0)
        progress(t, epoch, batch + 1, loss);
      if (!rc && t->o.save_every > 0 && t->step % t->o.save_every == 0) rc = save(t, "periodic");
      if (!rc && t->o.throttle_ms) usleep((useconds_t)t->o.throttle_ms * 1000);
      if (!rc && saving(t) && (rc = stop_check(t, &t->stopped)) == DG_OK && t->stopped)
        return DG_OK;
    }
    if (rc) return rc;
  }
}

int main(int argc, char **argv) {
  trainer t;
  memset(&t, 0, sizeof t);
  int rc = mnist_parse_opts(argc, argv, &t.o);
  if (rc) return rc > 0 ? 0 : 2;
  dg_set_allocator(count_malloc, count_realloc, free);
  dg_set_num_threads(t.o.threads);
  printf("mnist: model %s, optimizer %s (lr %g, %s), batch %d, epochs %d, threads %d, seed %"
         PRIu64 ", data %s\n", t.o.model, t.o.optim, (double)t.o.lr,
         t.o.cosine ? "cosine" : "constant", t.o.batch, t.o.epochs, t.o.threads, t.o.seed,
         t.o.data);
  fflush(stdout);
  char err[256]; /* checkpointing runs stop gracefully on SIGTERM / SIGINT */
  if ((t.o.checkpoint || t.o.checkpoint_dir) && (rc = dg_stop_install(NULL, 0, err, sizeof err))) {
    fprintf(stderr, "mnist: %s\n", err);
    return 1;
  }
  const char *trace = t.o.trace ? t.o.trace : getenv("DG_TRACE");
  if (trace && (rc = dg_trace_start(NULL))) {
    fprintf(stderr, "mnist: --trace %s: %s\n", trace, dg_strerror(rc));
    return 1;
  }
  rc = trainer_init(&t);
  if (!rc) rc = resume(&t);
  if (!rc) rc = train(&t);
  if (!rc && t.ddp && (rc = dg_ddp_join(t.ddp)))
    fprintf(stderr, "mnist: ddp join: %s\n", dg_ddp_errmsg(t.ddp));
  if (!rc && t.stopped)
    printf("stopped by signal %d after step %" PRId64 " (checkpoint saved); exiting 0\n",
           t.stopped, t.step);
  else if (!rc)
    printf("done: %" PRId64 " steps in %.1fs; dgrad heap allocations in steady-state steps: %"
           PRIu64 "\n", t.step, now_s() - t.t_start, t.steady_allocs);
  if (trace) { /* the timeline of this rank, whatever the run's outcome */
    int e = dg_trace_stop();
    if (e) snprintf(err, sizeof err, "trace stop: %s", dg_strerror(e));
    else e = dg_trace_write(trace, t.rank, err, sizeof err);
    if (e) fprintf(stderr, "mnist: %s\n", err);
    rc = rc ? rc : e;
  }
  trainer_free(&t);
  return rc ? 1 : 0;
}
