/* BatchNorm1d and BatchNorm2d: torch's modules with affine weight and bias
 * and tracked running statistics. The running statistics are buffers of the
 * store ("<prefix>.running_mean", "<prefix>.running_var"), so checkpoints
 * keep them and DDP broadcasts them; torch's num_batches_tracked is not
 * kept (it only matters for momentum None, which dgrad does not offer).
 * SyncBatchNorm (dist/ddp_syncbn.c) reuses this forward and bind. */
#include "nn/nn_impl.h"

dg_tensor *dg__bn_forward(dg_module *m, dg_ctx *ctx, dg_tensor *x) {
  dg__bn_module *bn = (dg__bn_module *)m;
  if (!bn->w) {
    dg__set_error(ctx, DG_ESTATE, "%s: forward before dg_module_bind", dg_module_type(m));
    return NULL;
  }
  if (!x) return NULL; /* dg_module_forward names it */
  if (x->ndim < bn->min_dims || x->ndim > bn->max_dims) {
    char s[96];
    /* dg_module_forward puts the module's path and type in front */
    dg__set_error(ctx, DG_ESHAPE, "expected x %s, got %s", bn->dims_desc,
                  dg__shape_str(x, s, sizeof s));
    return NULL;
  }
  /* like dropout: training needs both the module's flag and the ctx's mode */
  int train = m->train && dg_ctx_is_train(ctx);
  return dg__batchnorm_ex(ctx, x, bn->w, bn->b, bn->rm, bn->rv, train, bn->momentum, bn->eps,
                          train ? bn->sync : NULL);
}

int dg__bn_bind(dg_module *m, dg_params *ps, const char *prefix, uint64_t seed) {
  dg__bn_module *bn = (dg__bn_module *)m;
  (void)seed;
  int rc = dg__bind_param(ps, prefix, "weight", 1, &bn->C, &bn->w);
  if (!rc) rc = dg__bind_param(ps, prefix, "bias", 1, &bn->C, &bn->b);
  if (!rc) rc = dg__bind_buffer(ps, prefix, "running_mean", 1, &bn->C, &bn->rm);
  if (!rc) rc = dg__bind_buffer(ps, prefix, "running_var", 1, &bn->C, &bn->rv);
  if (rc) return rc;
  dg_init_constant(bn->w, 1.0f);
  dg_init_constant(bn->b, 0.0f);
  dg_init_constant(bn->rm, 0.0f);
  dg_init_constant(bn->rv, 1.0f);
  return DG_OK;
}

int dg__bn_new(dg_module **out, size_t size, const dg_module_vtable *vt, int64_t C, float eps,
               float momentum, int min_dims, int max_dims, const char *dims_desc) {
  if (!out) return DG_EINVAL;
  *out = NULL;
  if (C <= 0 || !(eps >= 0) || !(momentum >= 0 && momentum <= 1)) return DG_EINVAL;
  dg__bn_module *bn = (dg__bn_module *)dg__module_alloc(size, vt);
  if (!bn) return DG_ENOMEM;
  bn->C = C, bn->eps = eps, bn->momentum = momentum;
  bn->min_dims = min_dims, bn->max_dims = max_dims, bn->dims_desc = dims_desc;
  *out = &bn->base;
  return DG_OK;
}

static const dg_module_vtable bn1d_vt = {"BatchNorm1d", dg__bn_forward, dg__bn_bind, NULL, NULL};
static const dg_module_vtable bn2d_vt = {"BatchNorm2d", dg__bn_forward, dg__bn_bind, NULL, NULL};

int dg_nn_batchnorm1d(dg_module **out, int64_t C, float eps, float momentum) {
  return dg__bn_new(out, sizeof(dg__bn_module), &bn1d_vt, C, eps, momentum, 2, 3,
                    "(N, C) or (N, C, L)");
}

int dg_nn_batchnorm2d(dg_module **out, int64_t C, float eps, float momentum) {
  return dg__bn_new(out, sizeof(dg__bn_module), &bn2d_vt, C, eps, momentum, 4, 4,
                    "(N, C, H, W)");
}
