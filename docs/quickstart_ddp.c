/* docs/quickstart_ddp.c — docs/quickstart.c made data-parallel: the same
 * MLP on Fashion-MNIST, one process per rank, started by dgrun.
 *
 *   cc -std=c11 quickstart_ddp.c $(pkg-config --cflags --libs dgrad) -o quickstart_ddp
 *   dgrun --nproc-per-node 2 ./quickstart_ddp [DATA_DIR] [STEPS] [CHECKPOINT]
 *
 * What changes from one process (docs/guide-ddp.md says why):
 *   1. join the group (dg_pg_new_from_env reads dgrun's / torchrun's variables);
 *   2. give each rank its own shard of every epoch (dg_ddp_loader_opts);
 *   3. wrap the parameter store in DDP after binding the model;
 *   4. step the optimizer when dg_ddp_step_ready says the gradients are averaged;
 *   5. only rank 0 prints and saves;
 *   6. dg_ddp_join when this rank's data ends, so no rank waits forever.
 * tests/docs runs it under dgrun on 2 ranks. */
#include <dgrad.h>
#include <stdio.h>
#include <stdlib.h>

#define BATCH 32 /* per rank: the global batch is BATCH * world size */

static int add(dg_module *net, int rc, dg_module **l) {
  if (!rc && (rc = dg_sequential_add(net, *l, NULL))) dg_module_free(*l);
  return rc;
}

static int build_model(dg_module **out) {
  dg_module *net, *l = NULL;
  int rc = dg_nn_sequential(&net);
  if (rc) return rc;
  rc = add(net, dg_nn_linear(&l, 784, 128, 1), &l);
  if (!rc) rc = add(net, dg_nn_relu(&l), &l);
  if (!rc) rc = add(net, dg_nn_linear(&l, 128, 10, 1), &l);
  if (rc) dg_module_free(net);
  else *out = net;
  return rc;
}

int main(int argc, char **argv) {
  const char *dir = argc > 1 && argv[1][0] ? argv[1] : NULL;
  int steps = argc > 2 ? atoi(argv[2]) : 300;
  const char *ckpt = argc > 3 ? argv[3] : "quickstart_ddp.safetensors";
  char err[512];
  dg_pg *pg = NULL;
  /* 1. RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from dgrun; the error
   * names a missing or bad variable, and a timeout names the absent ranks */
  if (dg_pg_new_from_env(&pg, /*timeout_ms, 0: 300 s as torch*/ 0, err, sizeof err)) {
    fprintf(stderr, "quickstart_ddp: %s\n", err);
    return 1;
  }
  int rank = dg_pg_rank(pg);
  dg_mnist *train = NULL;
  dg_dataset ds;
  dg_loader *loader = NULL;
  dg_ctx *ctx = NULL;
  dg_params *ps = NULL;
  dg_module *net = NULL;
  dg_optim *opt = NULL;
  dg_ddp *ddp = NULL;
  int rc = dg_mnist_open(&train, dir, 1, err, sizeof err);
  if (!rc) rc = dg_mnist_dataset(train, &ds);
  /* 2. every rank passes the same seed; each gets its own shard */
  dg_loader_opts lo = dg_ddp_loader_opts(pg, BATCH, /*seed*/ 1, /*drop_last*/ 1);
  if (!rc) rc = dg_loader_new(&loader, &ds, &lo, err, sizeof err);
  if (!rc) rc = dg_ctx_new(&ctx, NULL);
  if (!rc) rc = dg_params_new(&ps);
  if (!rc) rc = build_model(&net);
  if (!rc) rc = dg_module_bind(net, ps, "", 1);
  dg_adamw_opts ao = dg_adamw_defaults();
  if (!rc) rc = dg_optim_new_adamw(&opt, ps, &ao, err, sizeof err);
  /* 3. broadcasts rank 0's values; fails on every rank, naming both sides,
   * if the models differ */
  if (!rc) rc = dg_ddp_new(&ddp, ctx, ps, pg, NULL, err, sizeof err);
  if (rc) {
    fprintf(stderr, "quickstart_ddp: rank %d: set-up failed: %s\n", rank, err);
    return 1;
  }
  float loss_v = 0;
  for (int step = 0; step < steps; step++) {
    int64_t rows;
    if ((rc = dg_loader_next(loader, NULL, &rows)) || rows == 0) break; /* one epoch at most */
    dg_tensor *x = dg_wrap(ctx, DG_F32, 2, (int64_t[]){rows, 784}, dg_loader_buffer(loader, 0));
    dg_tensor *y = dg_wrap(ctx, DG_I64, 1, (int64_t[]){rows}, dg_loader_buffer(loader, 1));
    dg_tensor *loss = dg_cross_entropy(ctx, dg_module_forward(net, ctx, x), y);
    /* backward all-reduces the gradients, overlapped with the computation;
     * a dead or late rank fails it with a message naming the rank */
    if (!loss || (rc = dg_backward(ctx, loss))) {
      fprintf(stderr, "quickstart_ddp: rank %d step %d: %s\n", rank, step, dg_ctx_errmsg(ctx));
      rc = rc ? rc : DG_EINVAL;
      break;
    }
    loss_v = dg_tensor_item(loss);
    if (dg_ddp_step_ready(ddp)) { /* 4. */
      if ((rc = dg_optim_step(opt))) {
        fprintf(stderr, "quickstart_ddp: %s\n", dg_optim_errmsg(opt));
        break;
      }
      dg_params_zero_grad(ps);
    }
    dg_ctx_reset(ctx);
    if (rank == 0 && step % 100 == 0) printf("step %d loss %.4f\n", step, loss_v); /* 5. */
  }
  /* 6. a rank whose data ran out keeps answering the others' steps */
  if (!rc) rc = dg_ddp_join(ddp);
  if (rc) fprintf(stderr, "quickstart_ddp: rank %d: %s\n", rank, dg_ddp_errmsg(ddp));
  if (!rc && rank == 0) { /* 5. every rank holds the same weights: one file */
    dg_checkpoint c = {.params = ps, .optim = opt, .step = steps};
    rc = dg_checkpoint_save(ckpt, &c, err, sizeof err);
    if (rc) fprintf(stderr, "quickstart_ddp: %s\n", err);
    else printf("rank 0: last loss %.4f, saved %s\n", loss_v, ckpt);
  }
  dg_ddp_free(ddp);
  dg_optim_free(opt);
  dg_module_free(net);
  dg_params_free(ps);
  dg_ctx_free(ctx);
  dg_loader_free(loader);
  dg_mnist_free(train);
  dg_pg_free(pg); /* rank 0 serves the store until every rank has left */
  return rc ? 1 : 0;
}
