/* Embedding lookup (the op: validation, recording, backward wiring):
 * out[k] = weight[idx[k]], and backward scatter-adds each output row's
 * gradient into the weight gradient row it came from (repeated indices
 * accumulate). The indices are validated once and kept as int64 in the
 * node. The kernels are the backend's (backends/kern_embedding.h). */
#include "backends/kern_embedding.h"
#include "core/core_impl.h"

static int emb_backward(dg_ctx *ctx, dg_node *n) {
  float *dw = dg__grad_buf(ctx, n->in[0]); /* (V, D) */
  if (!dw) return ctx->err;
  const dg__backend *be = dg__backend_get(n->out->device);
  /* idx (K) kept in the node; dy (K, D) */
  dg__emb_args a = {NULL, n->out->grad->data, n->extra, NULL, dw, n->i[0], n->i[1]};
  be->embedding->bwd(&a);
  return DG_OK;
}

static int emb_check(dg_ctx *ctx, dg_tensor *weight, dg_tensor *idx) {
  char sw[96], si[96];
  if (!dg__check_f32(ctx, "embedding", "weight", weight)) return ctx->err;
  if (idx->dtype != DG_I32 && idx->dtype != DG_I64)
    return dg__set_error(ctx, DG_EDTYPE, "embedding: idx %s must be i32 or i64, got %s",
                         dg__shape_str(idx, si, sizeof si), dg_dtype_name(idx->dtype));
  if (weight->ndim != 2 || idx->ndim + 1 > DG_MAX_DIMS)
    return dg__set_error(ctx, DG_ESHAPE,
                         "embedding: need weight (V, D) and idx of at most %d dims; got weight %s, idx %s",
                         DG_MAX_DIMS - 1, dg__shape_str(weight, sw, sizeof sw),
                         dg__shape_str(idx, si, sizeof si));
  return DG_OK;
}

dg_tensor *dg_embedding(dg_ctx *ctx, dg_tensor *weight, dg_tensor *idx) {
  dg_tensor *in[2] = {weight, idx};
  const dg__backend *be =
      dg__op_begin(ctx, "embedding", 2, in, (const char *[]){"weight", "idx"}, 0);
  if (!be || emb_check(ctx, weight, idx))
    return NULL;
  int64_t V = weight->shape[0], D = weight->shape[1], K = dg__numel(idx);
  int64_t shape[DG_MAX_DIMS];
  for (int i = 0; i < idx->ndim; i++) shape[i] = idx->shape[i];
  shape[idx->ndim] = D;
  dg_tensor *y = dg__new(ctx, "embedding", DG_F32, idx->ndim + 1, shape);
  int64_t *ix = y ? dg__index_data(ctx, "embedding", "index", "at position", idx, V)
                  : NULL; /* (K) */
  if (!ix) return NULL;
  const float *w = dg__contig_data(ctx, "embedding", weight); /* (V, D) */
  if (!w) return NULL;
  dg__emb_args a = {w, NULL, ix, y->data, NULL, K, D}; /* y (K, D) */
  be->embedding->fwd(&a);
  if (dg__needs_grad(ctx, 1, &weight)) {
    dg_node *n = dg__record(ctx, "embedding", emb_backward, y, 1, &weight);
    if (!n) return NULL;
    n->extra = ix;
    n->i[0] = K, n->i[1] = D;
  }
  return y;
}
