/* Causal attention mask, forward and backward: scores (..., T, T) with every
 * entry above the diagonal (key j > query i) set to -inf, so a following
 * softmax gives it weight 0. Backward passes the gradient through where the
 * entry was kept and drops it where it was masked; into a fresh gradient it
 * stores (zeros where masked) instead of clearing and adding. For attention
 * itself, dg_attention (attention.c) fuses mask, scale and softmax. */
#include <math.h>
#include <string.h>

#include "core/core_impl.h"
#include "backends/cpu/cpu_impl.h"

static int mask_backward(dg_ctx *ctx, dg_node *n) {
  int ow;
  float *dx = dg__grad_buf_w(ctx, n->in[0], &ow); /* (B, T, T) */
  if (!dx) return ctx->err;
  const float *dy = n->out->grad->data;         /* (B, T, T) */
  int64_t B = n->i[0], T = n->i[1];
  for (int64_t b = 0; b < B; b++)
    for (int64_t i = 0; i < T; i++) {
      float *restrict d = dx + (b * T + i) * T;
      const float *restrict g = dy + (b * T + i) * T;
      if (ow) { /* fresh gradient: store, zeros where masked */
        memcpy(d, g, (size_t)(i + 1) * sizeof(float));
        memset(d + i + 1, 0, (size_t)(T - i - 1) * sizeof(float));
      } else {
        for (int64_t j = 0; j <= i; j++) d[j] += g[j];
      }
    }
  return DG_OK;
}

dg_tensor *dg_causal_mask(dg_ctx *ctx, dg_tensor *scores) {
  if (!ctx || dg__null_input(ctx, "causal_mask", "scores", scores) ||
      !dg__check_f32(ctx, "causal_mask", "scores", scores))
    return NULL;
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
  float *yp = y->data; /* (B, T, T) */
  for (int64_t b = 0; b < B; b++)
    for (int64_t i = 0; i < T; i++) {
      const float *xr = x + (b * T + i) * T;
      float *restrict yr = yp + (b * T + i) * T;
      memcpy(yr, xr, (size_t)(i + 1) * sizeof(float));
      for (int64_t j = i + 1; j < T; j++) yr[j] = -INFINITY;
    }
  if (dg__needs_grad(ctx, 1, &scores)) {
    dg_node *n = dg__record(ctx, "causal_mask", mask_backward, y, 1, &scores);
    if (!n) return NULL;
    n->i[0] = B, n->i[1] = T;
  }
  return y;
}
