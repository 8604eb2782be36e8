/* Inverted dropout (the op: validation, recording, backward wiring):
 * y = x * keep / (1 - p), where keep = (u >= p) for u uniform from the
 * context's RNG stream.
 *
 * The RNG is counter-based, so the mask is a pure function of (seed, offset):
 * the node keeps those two numbers instead of a mask, and backward draws the
 * same uniforms again. No mask memory, and the mask is reproducible from the
 * seed. The kernels are the backend's (backends/kern_dropout.h). */
#include "backends/kern_dropout.h"
#include "core/core_impl.h"

static int dropout_backward(dg_ctx *ctx, dg_node *n) {
  int overwrite;
  float *dx = dg__grad_buf_w(ctx, n->in[0], &overwrite); /* (N) */
  if (!dx) return ctx->err;
  const dg__backend *be = dg__backend_get(n->out->device);
  dg__dropout_args a = {n->out->grad->data, dx, n->i[2], (float)n->f[0], (float)n->f[1],
                        (uint64_t)n->i[0], (uint64_t)n->i[1], !overwrite};
  be->dropout->bwd(&a);
  return DG_OK;
}

dg_tensor *dg_dropout(dg_ctx *ctx, dg_tensor *x, float p) {
  const dg__backend *be = dg__op_begin(ctx, "dropout", 1, &x, (const char *[]){"x"}, 0);
  if (!be || !dg__check_f32(ctx, "dropout", "x", x)) return NULL;
  if (!(p >= 0.0f && p < 1.0f)) {
    dg__set_error(ctx, DG_EINVAL, "dropout: p = %g is outside [0, 1)", (double)p);
    return NULL;
  }
  if (!dg_ctx_is_train(ctx) || p == 0.0f) return x; /* identity: no copy, no node */
  dg_tensor *y = dg__new_like(ctx, "dropout", x);
  const float *xp = y ? dg__contig_data(ctx, "dropout", x) : NULL; /* (N) */
  if (!xp) return NULL;
  int64_t N = dg__numel(x);
  uint64_t seed = ctx->rng_seed, off = ctx->rng_offset;
  float scale = 1.0f / (1.0f - p);
  dg__dropout_args a = {xp, y->data, N, p, scale, seed, off, 0};
  be->dropout->fwd(&a);
  /* the stream advances as for one draw of N uniforms (dg__ctx_uniform) */
  ctx->rng_offset += ((uint64_t)N + 3) & ~(uint64_t)3;
  if (dg__needs_grad(ctx, 1, &x)) {
    dg_node *n = dg__record(ctx, "dropout", dropout_backward, y, 1, &x);
    if (!n) return NULL;
    n->i[0] = (int64_t)seed, n->i[1] = (int64_t)off, n->i[2] = N;
    n->f[0] = p, n->f[1] = scale;
  }
  return y;
}
