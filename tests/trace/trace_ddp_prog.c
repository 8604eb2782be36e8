/* A few DDP steps of a small MLP with the timeline on, for trace_ddp.sh:
 * run under `dgrun --trace FILE`, it traces when DG_TRACE is set and writes
 * it there (pid = its rank). Small buckets, so a step has several. Argument:
 * steps (default 4). Exit status 0 on success. */
#include <stdio.h>
#include <stdlib.h>

#include <dgrad.h>

/* l by address: read after the constructor in rc has run */
static int add(dg_module *net, int rc, dg_module **l) {
  if (!rc && (rc = dg_sequential_add(net, *l, NULL))) dg_module_free(*l);
  return rc;
}

int main(int argc, char **argv) {
  int steps = argc > 1 ? atoi(argv[1]) : 4;
  const char *trace = getenv("DG_TRACE");
  char err[512] = "";
  if (trace && dg_trace_start(NULL)) return 2;
  dg_pg *pg = NULL;
  if (dg_pg_new_from_env(&pg, 30000, err, sizeof err)) {
    fprintf(stderr, "trace_ddp_prog: %s\n", err);
    return 1;
  }
  int rank = dg_pg_rank(pg);
  dg_ctx *ctx = NULL;
  dg_params *ps = NULL;
  dg_module *net = NULL, *l = NULL;
  dg_optim *opt = NULL;
  dg_ddp *ddp = NULL;
  int rc = dg_ctx_new(&ctx, NULL);
  if (!rc) rc = dg_params_new(&ps);
  if (!rc) rc = dg_nn_sequential(&net);
  if (!rc) rc = add(net, dg_nn_linear(&l, 16, 64, 1), &l);
  if (!rc) rc = add(net, dg_nn_relu(&l), &l);
  if (!rc) rc = add(net, dg_nn_linear(&l, 64, 64, 1), &l);
  if (!rc) rc = add(net, dg_nn_relu(&l), &l);
  if (!rc) rc = add(net, dg_nn_linear(&l, 64, 4, 1), &l);
  if (!rc) rc = dg_module_bind(net, ps, "", 1);
  dg_sgd_opts so = dg_sgd_defaults();
  if (!rc) rc = dg_optim_new_sgd(&opt, ps, &so, err, sizeof err);
  dg_ddp_opts d = dg_ddp_defaults();
  d.bucket_cap_bytes = 4096, d.first_bucket_bytes = 1024; /* several buckets */
  if (!rc) rc = dg_ddp_new(&ddp, ctx, ps, pg, &d, err, sizeof err);
  float x[8 * 16];
  int64_t y[8];
  for (int i = 0; i < 8 * 16; i++) x[i] = (float)((i * 37 + rank * 11) % 17) / 17.0f - 0.5f;
  for (int i = 0; i < 8; i++) y[i] = (i + rank) % 4;
  for (int s = 0; !rc && s < steps; s++) {
    dg_tensor *xt = dg_wrap(ctx, DG_F32, 2, (int64_t[]){8, 16}, x);
    dg_tensor *yt = dg_wrap(ctx, DG_I64, 1, (int64_t[]){8}, y);
    dg_tensor *loss = dg_cross_entropy(ctx, dg_module_forward(net, ctx, xt), yt);
    if (!loss || (rc = dg_backward(ctx, loss))) {
      snprintf(err, sizeof err, "step %d: %s", s, dg_ctx_errmsg(ctx));
      rc = rc ? rc : DG_EINVAL;
      break;
    }
    if (dg_ddp_step_ready(ddp)) {
      if ((rc = dg_optim_step(opt))) snprintf(err, sizeof err, "%s", dg_optim_errmsg(opt));
      dg_params_zero_grad(ps);
    }
    dg_ctx_reset(ctx);
  }
  if (!rc) rc = dg_ddp_join(ddp);
  if (rc) fprintf(stderr, "trace_ddp_prog: rank %d: %s %s\n", rank, err, dg_ddp_errmsg(ddp));
  if (trace) { /* stopped before the group goes: its threads record nothing more */
    int e = dg_trace_stop();
    if (!e) e = dg_trace_write(trace, rank, err, sizeof err);
    if (e) fprintf(stderr, "trace_ddp_prog: rank %d: trace: %s\n", rank, err);
    rc = rc ? rc : e;
  }
  dg_ddp_free(ddp);
  dg_optim_free(opt);
  dg_module_free(net);
  dg_params_free(ps);
  dg_ctx_free(ctx);
  dg_pg_free(pg);
  return rc ? 1 : 0;
}
