/* Causal attention mask (the op: validation, recording, backward wiring):
 * scores (..., T, T) with every entry above the diagonal (key j > query i)
 * set to -inf, so a following softmax gives it weight 0. Backward passes the
 * gradient through where the entry was kept and drops it where it was
 * masked. For attention itself, dg_attention (attention.c) fuses mask, scale
 * and softmax. The kernels are the backend's (backends/kern_mask.h). */
#include "backends/kern_mask.h"
#include "core/core_impl.h"

static int mask_backward(dg_ctx *ctx, dg_node *n) {
  int ow;
  float *dx = dg__grad_buf_w(ctx, n->in[0], &ow); /* (B, T, T) */
  if (!dx) return ctx->err;
  const dg__backend *be = dg__backend_get(n->out->device);
  dg__mask_args a = {NULL, n->out->grad->data, dx, n->i[0], n->i[1], !ow};
  be->mask->causal_bwd(&a);
  return DG_OK;
}

dg_tensor *dg_causal_mask(dg_ctx *ctx, dg_tensor *scores) {
  const dg__backend *be =
      dg__op_begin(ctx, "causal_mask", 1, &scores, (const char *[]){"scores"}, 0);
  if (!be || !dg__check_f32(ctx, "causal_mask", "scores", scores)) return NULL;
  int nd = scores->ndim;
  if (nd < 2 || scores->shape[nd - 1] != scores->shape[nd - 2]) {
    char ss[96];
    dg__set_error(ctx, DG_ESHAPE, "causal_mask: scores %s must be (..., T, T)",
                  dg__shape_str(scores, ss, sizeof ss));
    return NULL;
  }
  int64_t T = scores->shape[nd - 1], B = T ? dg__numel(scores) / (T * T) : 0;
  dg_tensor *y = dg__new_like(ctx, "causal_mask", scores);
  const float *x = y ? dg__contig_data(ctx, "causal_mask", scores) : NULL; /* (B, T, T) */
  if (!x) return NULL;
  dg__mask_args a = {x, NULL, y->data, B, T, 0};
  be->mask->causal_fwd(&a);
  if (dg__needs_grad(ctx, 1, &scores)) {
    dg_node *n = dg__record(ctx, "causal_mask", mask_backward, y, 1, &scores);
    if (!n) return NULL;
    n->i[0] = B, n->i[1] = T;
  }
  return y;
}
