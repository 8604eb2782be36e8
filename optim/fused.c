/* The optimizer step fused into backward: each parameter is updated from its
 * grad-ready hook, the moment its gradient is final and while it is still in
 * cache, instead of in a separate pass over the whole flat buffer after
 * backward. Same arithmetic as dg_optim_step, one parameter at a time. */
#include "optim/optim_impl.h"
#include "core/core_impl.h"

static void fused_ready(void *user, dg_params *ps, int i, int reached) {
  dg_optim *o = user;
  (void)reached; /* an unreached parameter steps with a zero gradient, as in
                    dg_optim_step */
  if (ps != o->ps) return;
  if (!o->fused_in_step) { /* first parameter of this backward */
    o->step++;
    o->fused_in_step = 1;
  }
  size_t lo, hi;
  dg__optim_param_range(o, i, &lo, &hi);
  o->range(o, dg__optim_hyper_of(o, i, o->lr), ps->data, dg__params_grad_raw(ps), lo, hi);
}

static int fused_end(void *user, dg_ctx *ctx) {
  (void)ctx;
  ((dg_optim *)user)->fused_in_step = 0;
  return DG_OK;
}

int dg_optim_fuse_backward(dg_optim *o, dg_ctx *ctx) {
  if (!o) return DG_EINVAL;
  if (!ctx) return dg__optim_fail(o, DG_EINVAL, "optim_fuse_backward(%s): ctx is NULL", o->name);
  if (o->fused_ctx || o->ddp_owned)
    return dg__optim_fail(o, DG_ESTATE, "optim_fuse_backward(%s): already %s", o->name,
                          o->fused_ctx ? "fused into a context's backward"
                                       : "stepped by its DDP (dg_ddp_overlap_optimizer)");
  if (!o->range)
    return dg__optim_fail(o, DG_EUNSUPPORTED, "optim_fuse_backward(%s): only element-wise "
                          "optimizers (sgd, adamw) can step inside backward; %s needs "
                          "whole-parameter norms", o->name, o->name);
  int r = dg_ctx_add_grad_ready_hook(ctx, fused_ready, o);
  if (r < 0) return r;
  int e = dg_ctx_add_backward_end_hook(ctx, fused_end, o);
  if (e < 0) {
    dg_ctx_remove_hook(ctx, r);
    return e;
  }
  o->fused_ctx = ctx;
  o->fused_ready_id = r;
  o->fused_end_id = e;
  o->fused_in_step = 0;
  return DG_OK;
}

int dg_optim_unfuse_backward(dg_optim *o) {
  if (!o) return DG_EINVAL;
  if (!o->fused_ctx)
    return dg__optim_fail(o, DG_ESTATE, "optim_unfuse_backward(%s): not fused", o->name);
  dg_ctx_remove_hook(o->fused_ctx, o->fused_ready_id);
  dg_ctx_remove_hook(o->fused_ctx, o->fused_end_id);
  o->fused_ctx = NULL;
  return DG_OK;
}
