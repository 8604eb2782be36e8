/* Shared internals of the built-in modules. Not API. */
#ifndef DG_NN_IMPL_H
#define DG_NN_IMPL_H

#include "dgrad/nn.h"
#include "dgrad/ops.h"
#include "core/core_impl.h"
#include "ops/batchnorm_impl.h"

/* Longest parameter name or module path, with its terminating NUL. */
#define DG__NAME_MAX 256

/* "<prefix>.<name>" (or "<name>" when prefix is empty) into buf; NULL when
 * it does not fit. */
const char *dg__join(char *buf, size_t cap, const char *prefix, const char *name);
/* Per-parameter seed from the model seed and the parameter's full name, so
 * initial values do not depend on registration order or on how a model was
 * split before binding. */
uint64_t dg__param_seed(uint64_t seed, const char *name);
/* Registers "<prefix>.<name>" with the given shape (DG_EINVAL, with the
 * store's error, when the name is too long). */
int dg__bind_param(dg_params *ps, const char *prefix, const char *name, int ndim,
                   const int64_t *shape, dg_tensor **out);
/* Registers buffer "<prefix>.<name>" (dg_params_add_buffer), as
 * dg__bind_param. */
int dg__bind_buffer(dg_params *ps, const char *prefix, const char *name, int ndim,
                    const int64_t *shape, dg_tensor **out);
/* Allocates a zeroed module struct of `size` bytes with vtable vt. */
dg_module *dg__module_alloc(size_t size, const dg_module_vtable *vt);

/* Children: append a named child (ownership moves), bind all children
 * under "<prefix>.<child name>", free all children (idempotent).
 * dg_module_bind / dg_module_release call the last two for every module. */
int dg__child_push(dg_module *m, dg_module *c, const char *name);
int dg__children_bind(dg_module *m, dg_params *ps, const char *prefix, uint64_t seed);
void dg__children_free(dg_module *m);
/* A bound Linear module's weight and bias (NULL without bias), for fused
 * ops; 0 when m is not a bound Linear. */
int dg__linear_weights(dg_module *m, dg_tensor **w, dg_tensor **b);

/* BatchNorm (nn/batchnorm.c). SyncBatchNorm (dist/ddp_syncbn.c) is the same
 * module with its own vtable (type, destroy) and a sync that combines the
 * statistics over a process group. */
typedef struct {
  dg_module base;
  int64_t C;
  float eps, momentum;
  int min_dims, max_dims; /* the input's dims it accepts */
  const char *dims_desc;  /* "(N, C) or (N, C, L)", for errors */
  dg_tensor *w, *b, *rm, *rv;
  const dg__bn_sync *sync; /* NULL: plain BatchNorm */
} dg__bn_module;
/* A BatchNorm module of `size` bytes (>= sizeof(dg__bn_module)) with vt,
 * whose forward is dg__bn_forward and bind dg__bn_bind. */
int dg__bn_new(dg_module **out, size_t size, const dg_module_vtable *vt, int64_t C, float eps,
               float momentum, int min_dims, int max_dims, const char *dims_desc);
/* Training (the module's flag and the ctx's mode) normalises with the
 * batch's statistics and updates the running ones; else the running ones. */
dg_tensor *dg__bn_forward(dg_module *m, dg_ctx *ctx, dg_tensor *x);
/* weight (ones), bias (zeros); buffers running_mean (zeros), running_var
 * (ones). */
int dg__bn_bind(dg_module *m, dg_params *ps, const char *prefix, uint64_t seed);

#endif
