/* Inverted dropout, forward and backward: y = x * keep / (1 - p), where
 * keep = (u >= p) for u uniform from the context's RNG stream.
 *
 * The RNG is counter-based, so the mask is a pure function of (seed, offset):
 * the node keeps those two numbers instead of a mask, and backward draws the
 * same uniforms again. No mask memory, and the mask is reproducible from the
 * seed. Uniforms are drawn in chunks into a stack buffer; chunking does not
 * change them (element i always comes from offset + i). */
#include "core/core_impl.h"
#include "backends/cpu/cpu_impl.h"

#define DROP_CHUNK 256 /* a multiple of 4: chunked draws advance the stream like one draw */

static int dropout_backward(dg_ctx *ctx, dg_node *n) {
  int overwrite;
  float *dx = dg__grad_buf_w(ctx, n->in[0], &overwrite); /* (N) */
  if (!dx) return ctx->err;
  const float *dy = n->out->grad->data;   /* (N) */
  uint64_t seed = (uint64_t)n->i[0], off = (uint64_t)n->i[1];
  int64_t N = n->i[2];
  float p = (float)n->f[0], scale = (float)n->f[1];
  float u[DROP_CHUNK];
  for (int64_t c = 0; c < N; c += DROP_CHUNK) {
    int64_t len = DG_MIN(DROP_CHUNK, N - c);
    dg_rng_uniform(seed, off + (uint64_t)c, u, (size_t)len);
    if (overwrite)
      for (int64_t i = 0; i < len; i++) dx[c + i] = u[i] >= p ? dy[c + i] * scale : 0.0f;
    else
      for (int64_t i = 0; i < len; i++) dx[c + i] += u[i] >= p ? dy[c + i] * scale : 0.0f;
  }
  return DG_OK;
}

dg_tensor *dg_dropout(dg_ctx *ctx, dg_tensor *x, float p) {
  if (!ctx || dg__null_input(ctx, "dropout", "x", x) || !dg__check_f32(ctx, "dropout", "x", x))
    return NULL;
  if (!(p >= 0.0f && p < 1.0f)) {
    dg__set_error(ctx, DG_EINVAL, "dropout: p = %g is outside [0, 1)", (double)p);
    return NULL;
  }
  if (!dg_ctx_is_train(ctx) || p == 0.0f) return x; /* identity: no copy, no node */
  dg_tensor *y = dg__new_like(ctx, "dropout", x);
  const float *xp = y ? dg__contig_data(ctx, "dropout", x) : NULL; /* (N) */
  if (!xp) return NULL;
  float *yp = y->data; /* (N) */
  int64_t N = dg__numel(x);
  uint64_t seed = ctx->rng_seed, off = ctx->rng_offset;
  float scale = 1.0f / (1.0f - p);
  float u[DROP_CHUNK];
  for (int64_t c = 0; c < N; c += DROP_CHUNK) {
    int64_t len = DG_MIN(DROP_CHUNK, N - c);
    dg__ctx_uniform(ctx, u, (size_t)len);
    for (int64_t i = 0; i < len; i++) yp[c + i] = u[i] >= p ? xp[c + i] * scale : 0.0f;
  }
  if (dg__needs_grad(ctx, 1, &x)) {
    dg_node *n = dg__record(ctx, "dropout", dropout_backward, y, 1, &x);
    if (!n) return NULL;
    n->i[0] = (int64_t)seed, n->i[1] = (int64_t)off, n->i[2] = N;
    n->f[0] = p, n->f[1] = scale;
  }
  return y;
}
