/* Arg-reductions and metrics, no gradient (the ops: validation, shape
 * inference): argmax along one dim (an i64 tensor), and the accuracy count
 * of logits against integer targets. Ties go to the first index and a NaN
 * wins (the first one), as in PyTorch. Neither op records a tape node. The
 * kernels are the backend's reduction table (backends/kern_reduce.h). */
#include <stdio.h>

#include "backends/kern_reduce.h"
#include "core/core_impl.h"

/* x (O, D, I) -> (O, I) or (O, 1, I) with keepdim; dims counted as sum_dim. */
dg_tensor *dg_argmax(dg_ctx *ctx, dg_tensor *x, int dim, int keepdim) {
  const dg__backend *be = dg__op_begin(ctx, "argmax", 1, &x, (const char *[]){"x"}, 0);
  if (!be || !dg__check_f32(ctx, "argmax", "x", x)) return NULL;
  char sx[96];
  int nd = x->ndim, d = dim < 0 ? dim + (nd ? nd : 1) : dim;
  if (d < 0 || d >= (nd ? nd : 1)) {
    dg__set_error(ctx, DG_EINVAL, "argmax: dim %d out of range for x %s", dim,
                  dg__shape_str(x, sx, sizeof sx));
    return NULL;
  }
  int64_t O = 1, D = nd ? x->shape[d] : 1, I = 1, shape[DG_MAX_DIMS];
  if (D == 0) { /* torch refuses it too: no maximum to index */
    dg__set_error(ctx, DG_ESHAPE, "argmax: dim %d of x %s is empty", dim,
                  dg__shape_str(x, sx, sizeof sx));
    return NULL;
  }
  int ond = 0;
  for (int i = 0; i < nd; i++) {
    if (i < d) O *= x->shape[i];
    if (i > d) I *= x->shape[i];
    if (i != d) shape[ond++] = x->shape[i];
    else if (keepdim) shape[ond++] = 1;
  }
  dg_tensor *y = dg__new(ctx, "argmax", DG_I64, ond, shape);
  const float *xp = y ? dg__contig_data(ctx, "argmax", x) : NULL; /* (O, D, I) */
  if (!xp) return NULL;
  dg__argmax_args a = {xp, y->data, O, D, I}; /* y (O, I) */
  be->reduce->argmax(&a);
  return y;
}

/* logits (..., C) f32, targets (...) i32/i64 -> *correct. */
int dg_accuracy(dg_ctx *ctx, dg_tensor *logits, dg_tensor *targets, int64_t *correct) {
  if (correct) *correct = 0;
  if (!ctx) return DG_EINVAL;
  dg_tensor *in[2] = {logits, targets};
  const dg__backend *be =
      dg__op_begin(ctx, "accuracy", 2, in, (const char *[]){"logits", "targets"}, 0);
  if (!be || !dg__check_f32(ctx, "accuracy", "logits", logits)) return ctx->err;
  char sl[96], st[96], op[256];
  dg__shape_str(logits, sl, sizeof sl);
  dg__shape_str(targets, st, sizeof st);
  if (!correct)
    return dg__set_error(ctx, DG_EINVAL, "accuracy: logits %s, targets %s: correct is NULL", sl,
                         st);
  if (targets->dtype != DG_I32 && targets->dtype != DG_I64)
    return dg__set_error(ctx, DG_EDTYPE, "accuracy: targets %s must be i32 or i64, got %s", st,
                         dg_dtype_name(targets->dtype));
  int ok = logits->ndim >= 1 && targets->ndim == logits->ndim - 1;
  for (int i = 0; ok && i < targets->ndim; i++) ok = targets->shape[i] == logits->shape[i];
  if (!ok)
    return dg__set_error(ctx, DG_ESHAPE,
                         "accuracy: logits %s (..., C) need targets of shape (...), got %s", sl,
                         st);
  int64_t C = logits->shape[logits->ndim - 1], N = dg__numel(targets);
  snprintf(op, sizeof op, "accuracy: logits %s, targets %s", sl, st);
  /* the targets first: with C = 0 every one is out of range */
  int64_t *t = dg__index_data(ctx, op, "target", "in row", targets, C); /* (N) */
  if (!t) return ctx->err;
  if (N == 0) return DG_OK;
  const float *x = dg__contig_data(ctx, "accuracy", logits); /* (N, C) */
  int64_t *idx = x ? dg__op_data(ctx, (size_t)N * sizeof *idx) : NULL; /* (N) */
  if (!idx) {
    if (x) dg__set_error(ctx, DG_ENOMEM, "accuracy: out of memory");
    return ctx->err;
  }
  dg__argmax_args a = {x, idx, N, C, 1};
  be->reduce->argmax(&a);
  *correct = be->reduce->count_eq(idx, t, N);
  return DG_OK;
}
