/* Data-parallel training of a small MLP on synthetic data (a random linear
 * "teacher" labels Gaussian inputs), printing the loss every step.
 *
 *   ddp_mlp [--epochs E] [--batch B] [--accum K] [--fp16]     one process
 *   dgrun --nproc-per-node 2 ddp_mlp [...]                     data-parallel
 *
 * Under dgrun (or torchrun: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) each
 * rank trains on its shard of every epoch (dg_ddp_loader_opts: equal shards,
 * reshuffled per epoch) with batch B per rank; dg_ddp averages gradients, so
 * the run equals one process with batch B * world size. Rank 0 prints the
 * loss averaged over ranks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dgrad.h>
#include <dgrad/dist.h>

#define NSAMPLES 8192
#define NIN 32
#define NHID 64
#define NCLS 4

/* ---- synthetic dataset ---- */

typedef struct {
  float teacher[NCLS * NIN];
} synth;

static int synth_get(void *self, int64_t i, void *const *dst) {
  synth *s = self;
  float *x = dst[0];
  dg_rng_normal(7, (uint64_t)i * NIN, x, NIN);
  int best = 0;
  float bv = -INFINITY;
  for (int c = 0; c < NCLS; c++) {
    float v = 0;
    for (int k = 0; k < NIN; k++) v += s->teacher[c * NIN + k] * x[k];
    if (v > bv) bv = v, best = c;
  }
  *(int64_t *)dst[1] = best;
  return DG_OK;
}

static void synth_dataset(synth *s, dg_dataset *ds) {
  dg_rng_normal(99, 0, s->teacher, NCLS * NIN);
  memset(ds, 0, sizeof *ds);
  ds->size = NSAMPLES;
  ds->nfields = 2;
  ds->field[0] = (dg_data_field){.dtype = DG_F32, .ndim = 1, .shape = {NIN}, .numel = NIN};
  ds->field[1] = (dg_data_field){.dtype = DG_I64, .ndim = 0, .numel = 1};
  ds->get = synth_get;
  ds->self = s;
}

/* ---- process group: from the environment, or a group of one ---- */

static int open_group(dg_pg **pg, dg_store **own) {
  char err[256] = "";
  *own = NULL;
  if (getenv("RANK") && getenv("WORLD_SIZE")) {
    if (dg_pg_new_from_env(pg, 0, err, sizeof err) == DG_OK) return 0;
    fprintf(stderr, "ddp_mlp: process group: %s\n", err);
    return 1;
  }
  dg_pg_opts o;
  memset(&o, 0, sizeof o);
  o.world_size = 1;
  if (dg_store_new_mem(own, 0) != DG_OK) return 1;
  o.store = *own;
  if (dg_pg_new(pg, &o, err, sizeof err) == DG_OK) return 0;
  fprintf(stderr, "ddp_mlp: process group: %s\n", err);
  return 1;
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
  /* any values: dg_ddp_new broadcasts rank 0's */
  dg_init_kaiming_uniform(m->w1, NIN, sqrtf(2.0f), 1);
  dg_init_kaiming_uniform(m->w2, NHID, 1.0f, 2);
  return DG_OK;
}

typedef struct {
  int epochs, accum, fp16;
  int64_t batch;
} args;

static int parse(args *a, int argc, char **argv) {
  *a = (args){.epochs = 2, .accum = 1, .batch = 64};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--fp16")) a->fp16 = 1;
    else if (i + 1 >= argc) return -1;
    else if (!strcmp(argv[i], "--epochs")) a->epochs = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--batch")) a->batch = atol(argv[++i]);
    else if (!strcmp(argv[i], "--accum")) a->accum = atoi(argv[++i]);
    else return -1;
  }
  return a->epochs > 0 && a->batch > 0 && a->accum > 0 ? 0 : -1;
}

/* One micro-step; prints the rank-averaged loss after each optimizer step. */
static int train_step(dg_ctx *ctx, model *m, dg_ddp *ddp, dg_optim *opt, dg_pg *pg,
                      dg_loader *ld, int64_t rows, long *step) {
  int64_t xs[2] = {rows, NIN};
  dg_tensor *x = dg_wrap(ctx, DG_F32, 2, xs, dg_loader_buffer(ld, 0));
  dg_tensor *y = dg_wrap(ctx, DG_I64, 1, &rows, dg_loader_buffer(ld, 1));
  dg_tensor *h = dg_relu(ctx, dg_linear(ctx, x, m->w1, m->b1));
  dg_tensor *loss = dg_cross_entropy(ctx, dg_linear(ctx, h, m->w2, m->b2), y);
  if (!loss || dg_backward(ctx, loss) != DG_OK) {
    fprintf(stderr, "ddp_mlp: rank %d: %s\n", dg_pg_rank(pg), dg_ctx_errmsg(ctx));
    return 1;
  }
  float lv = dg_tensor_item(loss);
  dg_ctx_reset(ctx);
  if (!dg_ddp_step_ready(ddp)) return 0;
  dg_optim_step(opt);
  dg_params_zero_grad(m->ps);
  if (dg_pg_allreduce_sync(pg, &lv, 1, DG_F32, DG_RED_AVG) != DG_OK) return 1;
  if (dg_pg_rank(pg) == 0) printf("step %ld loss %.4f\n", ++*step, (double)lv);
  return 0;
}

int main(int argc, char **argv) {
  args a;
  if (parse(&a, argc, argv)) {
    fprintf(stderr, "usage: %s [--epochs E] [--batch B] [--accum K] [--fp16]\n", argv[0]);
    return 2;
  }
  dg_pg *pg = NULL;
  dg_store *own = NULL;
  if (open_group(&pg, &own)) return 1;
  synth s;
  dg_dataset ds;
  synth_dataset(&s, &ds);
  dg_loader_opts lo = dg_ddp_loader_opts(pg, a.batch, 1234, 0);
  dg_loader *ld = NULL;
  model m;
  dg_ctx *ctx = NULL;
  dg_optim *opt = NULL;
  dg_ddp *ddp = NULL;
  dg_ddp_opts dopt = dg_ddp_defaults();
  dopt.accum_steps = a.accum;
  dopt.comm = a.fp16 ? DG_DDP_COMM_FP16 : DG_DDP_COMM_F32;
  const char *e = getenv("DG_DDP_SHM_INLINE"); /* "1": no engine thread, "0": one */
  if (e && (*e == '0' || *e == '1')) dopt.engine_thread = *e == '1' ? -1 : 1;
  dg_adamw_opts ao = dg_adamw_defaults();
  ao.lr = 3e-3f;
  char err[512] = "";
  if (dg_loader_new(&ld, &ds, &lo, err, sizeof err) || model_init(&m) ||
      dg_ctx_new(&ctx, NULL) || dg_optim_new_adamw(&opt, m.ps, &ao, err, sizeof err) ||
      dg_ddp_new(&ddp, ctx, m.ps, pg, &dopt, err, sizeof err)) {
    fprintf(stderr, "ddp_mlp: setup failed: %s\n", err[0] ? err : "out of memory");
    return 1;
  }
  if (dg_pg_rank(pg) == 0)
    printf("world %d, batch %lld per rank, accum %d, %lld batches per epoch per rank\n",
           dg_pg_size(pg), (long long)a.batch, a.accum,
           (long long)dg_loader_batches_per_epoch(ld));
  long step = 0;
  int rc = 0;
  for (int e = 0; e < a.epochs && !rc; e++) {
    int64_t rows;
    while (!rc && dg_loader_next(ld, NULL, &rows) == DG_OK && rows > 0)
      rc = train_step(ctx, &m, ddp, opt, pg, ld, rows, &step);
  }
  if (!rc && dg_ddp_join(ddp) != DG_OK) {
    fprintf(stderr, "ddp_mlp: join: %s\n", dg_ddp_errmsg(ddp));
    rc = 1;
  }
  dg_ddp_free(ddp);
  dg_optim_free(opt);
  dg_ctx_free(ctx);
  dg_params_free(m.ps);
  dg_loader_free(ld);
  dg_pg_free(pg);
  dg_store_free(own);
  return rc;
}
