/* dgrad/ops.h — differentiable operations. All f32 unless stated.
 *
 * Every op is eager: it computes now, returns its result in ctx's arena and
 * records a tape node when grad mode is on and an input requires grad. On
 * error it returns NULL and dg_ctx_errmsg(ctx) names the op and the shapes.
 * Shapes are given as (dim0, dim1, ...). */
#ifndef DGRAD_OPS_H
#define DGRAD_OPS_H

#include "dgrad/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- views (share storage; no copy) ---- */
/* One dim of shape may be -1; x contiguous (else copies). */
DG_API dg_tensor *dg_reshape(dg_ctx *ctx, dg_tensor *x, int ndim, const int64_t *shape);
/* Rows [start, end) of dim 0. */
DG_API dg_tensor *dg_slice(dg_ctx *ctx, dg_tensor *x, int64_t start, int64_t end);
DG_API dg_tensor *dg_transpose(dg_ctx *ctx, dg_tensor *x, int d0, int d1);
DG_API dg_tensor *dg_permute(dg_ctx *ctx, dg_tensor *x, const int *perm);
DG_API dg_tensor *dg_contiguous(dg_ctx *ctx, dg_tensor *x); /* x itself when already contiguous */

/* ---- matmul ---- */
/* (M,K) @ (K,N) -> (M,N); batched (B,M,K) @ (B,K,N) or (B,M,K) @ (K,N);
 * ta/tb transpose the last two dims of a/b first. */
DG_API dg_tensor *dg_matmul(dg_ctx *ctx, dg_tensor *a, dg_tensor *b);
DG_API dg_tensor *dg_matmul_t(dg_ctx *ctx, dg_tensor *a, dg_tensor *b, int ta, int tb);
/* x (..., in) @ w(out, in)^T + b(out) -> (..., out); b may be NULL. */
DG_API dg_tensor *dg_linear(dg_ctx *ctx, dg_tensor *x, dg_tensor *w, dg_tensor *b);
/* res + x @ w^T + b, res of the output's shape: a linear layer and the
 * residual add after it as one op (the sum is written once, and neither the
 * linear's own output nor a copy of the gradient is kept). */
DG_API dg_tensor *dg_linear_add(dg_ctx *ctx, dg_tensor *x, dg_tensor *w, dg_tensor *b,
                                dg_tensor *res);

/* ---- element-wise binary, broadcasting (numpy rules, up to 4 dims) ---- */
DG_API dg_tensor *dg_add(dg_ctx *ctx, dg_tensor *a, dg_tensor *b);
DG_API dg_tensor *dg_sub(dg_ctx *ctx, dg_tensor *a, dg_tensor *b);
DG_API dg_tensor *dg_mul(dg_ctx *ctx, dg_tensor *a, dg_tensor *b);
DG_API dg_tensor *dg_div(dg_ctx *ctx, dg_tensor *a, dg_tensor *b);
DG_API dg_tensor *dg_scale(dg_ctx *ctx, dg_tensor *a, float s);      /* a * s */
DG_API dg_tensor *dg_add_scalar(dg_ctx *ctx, dg_tensor *a, float s); /* a + s */

/* ---- reductions ---- */
DG_API dg_tensor *dg_sum(dg_ctx *ctx, dg_tensor *x);  /* -> () one element */
DG_API dg_tensor *dg_mean(dg_ctx *ctx, dg_tensor *x); /* -> () */
DG_API dg_tensor *dg_sum_dim(dg_ctx *ctx, dg_tensor *x, int dim, int keepdim);
DG_API dg_tensor *dg_mean_dim(dg_ctx *ctx, dg_tensor *x, int dim, int keepdim);

/* ---- element-wise unary ---- */
DG_API dg_tensor *dg_relu(dg_ctx *ctx, dg_tensor *x);
DG_API dg_tensor *dg_gelu(dg_ctx *ctx, dg_tensor *x); /* tanh approximation */
DG_API dg_tensor *dg_tanh(dg_ctx *ctx, dg_tensor *x);
DG_API dg_tensor *dg_sigmoid(dg_ctx *ctx, dg_tensor *x);
DG_API dg_tensor *dg_exp(dg_ctx *ctx, dg_tensor *x);
DG_API dg_tensor *dg_log(dg_ctx *ctx, dg_tensor *x);

/* ---- softmax family and losses ---- */
DG_API dg_tensor *dg_softmax(dg_ctx *ctx, dg_tensor *x);     /* over the last dim */
DG_API dg_tensor *dg_log_softmax(dg_ctx *ctx, dg_tensor *x); /* over the last dim */
/* logits (N, C) or (..., C), targets (N) / (...) i32 or i64 -> () mean loss.
 * A target outside [0, C) is an error naming the row. */
DG_API dg_tensor *dg_cross_entropy(dg_ctx *ctx, dg_tensor *logits, dg_tensor *targets);
DG_API dg_tensor *dg_mse(dg_ctx *ctx, dg_tensor *pred, dg_tensor *target); /* -> () mean */

/* ---- normalisation, embedding, dropout, masking ---- */
/* Over the last dim; w, b (C) may be NULL. */
DG_API dg_tensor *dg_layernorm(dg_ctx *ctx, dg_tensor *x, dg_tensor *w, dg_tensor *b, float eps);
/* weight (V, D), idx any shape (i32/i64) -> idx.shape + (D). */
DG_API dg_tensor *dg_embedding(dg_ctx *ctx, dg_tensor *weight, dg_tensor *idx);
/* Inverted dropout with probability p; identity in eval mode. */
DG_API dg_tensor *dg_dropout(dg_ctx *ctx, dg_tensor *x, float p);
/* scores (..., T, T): entries above the diagonal become -inf. */
DG_API dg_tensor *dg_causal_mask(dg_ctx *ctx, dg_tensor *scores);

/* ---- convolution and pooling (NCHW) ---- */
/* x (N, C, H, W), w (O, C, KH, KW), b (O) or NULL -> (N, O, OH, OW). */
DG_API dg_tensor *dg_conv2d(dg_ctx *ctx, dg_tensor *x, dg_tensor *w, dg_tensor *b,
                            int stride, int pad);
/* x (N, C, H, W) -> (N, C, OH, OW), window k, stride s. */
DG_API dg_tensor *dg_maxpool2d(dg_ctx *ctx, dg_tensor *x, int k, int s);

/* ---- concat / split ---- */
DG_API dg_tensor *dg_concat(dg_ctx *ctx, int n, dg_tensor *const *xs, int dim);
/* Splits x along dim into n parts of sizes[i] (sum = dim size); returns DG_OK
 * and the parts in out[0..n), or an error code. */
DG_API int dg_split(dg_ctx *ctx, dg_tensor *x, int dim, int n, const int64_t *sizes,
                    dg_tensor **out);

/* ---- fused attention ---- */
/* Multi-head self-attention on the packed projection of a c_attn linear:
 * qkv (B, T, 3C), laid out [q | k | v] along the last dim, each split into
 * `heads` blocks of C / heads -> y (B, T, C), heads merged:
 *   y[b, :, h] = softmax(scale * q[b, :, h] k[b, :, h]^T [+ causal mask]) v[b, :, h]
 * causal != 0 masks key j > query i. One op forward and backward: no
 * split, permute or head copies; saves qkv and the probabilities
 * (B, heads, T, T). No dropout on the probabilities (compose
 * dg_matmul_t / dg_causal_mask / dg_softmax / dg_dropout for that). */
DG_API dg_tensor *dg_attention(dg_ctx *ctx, dg_tensor *qkv, int heads, int causal, float scale);

/* ---- fused MLP ---- */
/* The transformer MLP, linear -> tanh GELU -> linear, as one op:
 *   y = gelu(x w1^T + b1) w2^T + b2
 * x (..., C), w1 (F, C), b1 (F) or NULL, w2 (O, F), b2 (O) or NULL
 * -> y (..., O). Same result as dg_linear / dg_gelu / dg_linear, in less
 * memory: saves x and the pre-activation (R, F) only; the GELU output
 * lives in per-block scratch and backward recomputes it. */
DG_API dg_tensor *dg_mlp_gelu(dg_ctx *ctx, dg_tensor *x, dg_tensor *w1, dg_tensor *b1,
                              dg_tensor *w2, dg_tensor *b2);
/* res + dg_mlp_gelu(x, ...), res of the output's shape: the transformer
 * block's residual add fused in (written once, no extra gradient copy). */
DG_API dg_tensor *dg_mlp_gelu_add(dg_ctx *ctx, dg_tensor *x, dg_tensor *w1, dg_tensor *b1,
                                  dg_tensor *w2, dg_tensor *b2, dg_tensor *res);

#ifdef __cplusplus
}
#endif
#endif /* DGRAD_OPS_H */
