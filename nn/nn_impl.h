/* Shared internals of the built-in modules. Not API. */
#ifndef DG_NN_IMPL_H
#define DG_NN_IMPL_H

#include "dgrad/nn.h"
#include "dgrad/ops.h"
#include "core/core_impl.h"

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

#endif
