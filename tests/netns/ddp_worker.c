/* A DDP training program for fault and multi-host tests, run under dgrun:
 * an MLP (32 -> 128 -> 4) on synthetic data, every rank its shard of the
 * batch, AdamW, the gradients averaged by dg_ddp.
 *
 *   ddp_worker [--steps N] [--batch B] [--timeout-ms T] [--sleep-ms S]
 *              [--stop-rank R --stop-at K]
 *
 * Rank 0 prints "step S loss L" after every step, L the loss averaged over
 * ranks with 9 significant digits (runs compare these lines for equality).
 * Every rank prints "ddp_worker: rank R: ready" on stderr once the model is
 * broadcast. A failure prints "ddp_worker: rank R: step S: <library
 * message>" on stderr and exits 1. --timeout-ms is the group's per-operation
 * deadline (0: the library's default, 300 s); --sleep-ms pauses between
 * steps, so a run lasts long enough to be interrupted at random moments;
 * rank R raises SIGSTOP at the start of step K (before its forward), so the
 * others wait for its gradients in that step's backward.
 *
 * SIGTERM and SIGINT only record a stop request (dgrad/run.h), which this
 * program never acts on: when dgrun tears the group down after one rank
 * failed, the others must fail by what the library detects, not by
 * dgrun's SIGTERM. dgrun's SIGKILL after its grace period still ends them. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <dgrad.h>
#include <dgrad/dist.h>
#include <dgrad/run.h>

#define NSAMPLES (1 << 20)
#define NIN 32
#define NHID 128
#define NCLS 4

static int synth_get(void *self, int64_t i, void *const *dst) {
  const float *teacher = self; /* [NCLS, NIN] */
  float *x = dst[0];
  dg_rng_normal(7, (uint64_t)i * NIN, x, NIN);
  int best = 0;
  float bv = -INFINITY;
  for (int c = 0; c < NCLS; c++) {
    float v = 0;
    for (int k = 0; k < NIN; k++) v += teacher[c * NIN + k] * x[k];
    if (v > bv) bv = v, best = c;
  }
  *(int64_t *)dst[1] = best;
  return DG_OK;
}

typedef struct {
  int steps, timeout_ms, sleep_ms, stop_rank, stop_at;
  int64_t batch;
} args;

static int parse(args *a, int argc, char **argv) {
  *a = (args){.steps = 50, .batch = 32, .stop_rank = -1};
  for (int i = 1; i + 1 < argc; i += 2) {
    long v = atol(argv[i + 1]);
    if (!strcmp(argv[i], "--steps")) a->steps = (int)v;
    else if (!strcmp(argv[i], "--batch")) a->batch = v;
    else if (!strcmp(argv[i], "--timeout-ms")) a->timeout_ms = (int)v;
    else if (!strcmp(argv[i], "--sleep-ms")) a->sleep_ms = (int)v;
    else if (!strcmp(argv[i], "--stop-rank")) a->stop_rank = (int)v;
    else if (!strcmp(argv[i], "--stop-at")) a->stop_at = (int)v;
    else return -1;
  }
  return argc % 2 == 1 && a->steps > 0 && a->batch > 0 && a->timeout_ms >= 0 &&
                 a->sleep_ms >= 0
             ? 0
             : -1;
}

typedef struct {
  dg_params *ps;
  dg_tensor *w1, *b1, *w2, *b2;
} model;

static int model_init(model *m) {
  int64_t s1[2] = {NHID, NIN}, s2[2] = {NCLS, NHID}, h = NHID, c = NCLS;
  int rc = dg_params_new(&m->ps);
  if (!rc) rc = dg_params_add(m->ps, "fc1.weight", 2, s1, &m->w1);
  if (!rc) rc = dg_params_add(m->ps, "fc1.bias", 1, &h, &m->b1);
  if (!rc) rc = dg_params_add(m->ps, "fc2.weight", 2, s2, &m->w2);
  if (!rc) rc = dg_params_add(m->ps, "fc2.bias", 1, &c, &m->b2);
  if (rc) return rc;
  dg_init_kaiming_uniform(m->w1, NIN, sqrtf(2.0f), 1);
  dg_init_kaiming_uniform(m->w2, NHID, 1.0f, 2);
  return DG_OK;
}

typedef struct {
  dg_pg *pg;
  dg_ctx *ctx;
  dg_ddp *ddp;
  dg_optim *opt;
  dg_loader *ld;
  model m;
} trainer;

static int fail(const trainer *t, int step, const char *what) {
  fprintf(stderr, "ddp_worker: rank %d: step %d: %s\n", dg_pg_rank(t->pg), step, what);
  return 1;
}

/* One step: forward, backward (DDP averages the gradients), AdamW, and the
 * loss averaged over ranks. */
static int train_step(trainer *t, int step) {
  int64_t rows;
  if (dg_loader_next(t->ld, NULL, &rows) != DG_OK || rows <= 0)
    return fail(t, step, "the loader ran out of batches");
  int64_t xs[2] = {rows, NIN};
  dg_tensor *x = dg_wrap(t->ctx, DG_F32, 2, xs, dg_loader_buffer(t->ld, 0));
  dg_tensor *y = dg_wrap(t->ctx, DG_I64, 1, &rows, dg_loader_buffer(t->ld, 1));
  dg_tensor *h = dg_relu(t->ctx, dg_linear(t->ctx, x, t->m.w1, t->m.b1));
  dg_tensor *loss = dg_cross_entropy(t->ctx, dg_linear(t->ctx, h, t->m.w2, t->m.b2), y);
  if (!loss || dg_backward(t->ctx, loss) != DG_OK) {
    const char *e = dg_ctx_errmsg(t->ctx);
    return fail(t, step, e && *e ? e : dg_ddp_errmsg(t->ddp));
  }
  float lv = dg_tensor_item(loss);
  dg_ctx_reset(t->ctx);
  if (!dg_ddp_step_ready(t->ddp)) return fail(t, step, "DDP did not synchronise");
  dg_optim_step(t->opt);
  dg_params_zero_grad(t->m.ps);
  if (dg_pg_allreduce_sync(t->pg, &lv, 1, DG_F32, DG_RED_AVG) != DG_OK)
    return fail(t, step, dg_pg_errmsg(t->pg));
  if (dg_pg_rank(t->pg) == 0) {
    printf("step %d loss %.9g\n", step, (double)lv);
    fflush(stdout);
  }
  return 0;
}

static int setup(trainer *t, const args *a, float *teacher, dg_dataset *ds) {
  char err[512] = "";
  if (dg_pg_new_from_env(&t->pg, a->timeout_ms, err, sizeof err) != DG_OK) {
    fprintf(stderr, "ddp_worker: rank %s: process group: %s\n", getenv("RANK"), err);
    return 1;
  }
  dg_rng_normal(99, 0, teacher, NCLS * NIN);
  memset(ds, 0, sizeof *ds);
  ds->size = NSAMPLES;
  ds->nfields = 2;
  ds->field[0] = (dg_data_field){.dtype = DG_F32, .ndim = 1, .shape = {NIN}, .numel = NIN};
  ds->field[1] = (dg_data_field){.dtype = DG_I64, .ndim = 0, .numel = 1};
  ds->get = synth_get;
  ds->self = teacher;
  dg_loader_opts lo = dg_ddp_loader_opts(t->pg, a->batch, 1234, 1);
  dg_ddp_opts dopt = dg_ddp_defaults();
  dg_adamw_opts ao = dg_adamw_defaults();
  ao.lr = 3e-3f;
  if (dg_loader_new(&t->ld, ds, &lo, err, sizeof err) || model_init(&t->m) ||
      dg_ctx_new(&t->ctx, NULL) || dg_optim_new_adamw(&t->opt, t->m.ps, &ao, err, sizeof err) ||
      dg_ddp_new(&t->ddp, t->ctx, t->m.ps, t->pg, &dopt, err, sizeof err)) {
    fprintf(stderr, "ddp_worker: rank %d: setup: %s\n", dg_pg_rank(t->pg),
            err[0] ? err : "out of memory");
    return 1;
  }
  fprintf(stderr, "ddp_worker: rank %d: ready\n", dg_pg_rank(t->pg));
  return 0;
}

int main(int argc, char **argv) {
  args a;
  if (parse(&a, argc, argv)) {
    fprintf(stderr, "usage: %s [--steps N] [--batch B] [--timeout-ms T] [--sleep-ms S] "
            "[--stop-rank R --stop-at K]\n", argv[0]);
    return 2;
  }
  char err[256];
  if (dg_stop_install(NULL, 0, err, sizeof err) != DG_OK) {
    fprintf(stderr, "ddp_worker: %s\n", err);
    return 1;
  }
  static float teacher[NCLS * NIN];
  dg_dataset ds;
  trainer t = {0};
  int rc = setup(&t, &a, teacher, &ds);
  struct timespec pause = {a.sleep_ms / 1000, (long)(a.sleep_ms % 1000) * 1000000L};
  for (int s = 1; s <= a.steps && !rc; s++) {
    if (s == a.stop_at && dg_pg_rank(t.pg) == a.stop_rank) raise(SIGSTOP);
    rc = train_step(&t, s);
    if (!rc && a.sleep_ms) nanosleep(&pause, NULL);
  }
  if (!rc && dg_ddp_join(t.ddp) != DG_OK) rc = fail(&t, a.steps, dg_ddp_errmsg(t.ddp));
  dg_ddp_free(t.ddp);
  dg_optim_free(t.opt);
  dg_ctx_free(t.ctx);
  if (t.m.ps) dg_params_free(t.m.ps);
  dg_loader_free(t.ld);
  dg_pg_free(t.pg);
  return rc;
}
