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
/* x itself when already contiguous, else a packed copy (any dtype) */
DG_API dg_tensor *dg_contiguous(dg_ctx *ctx, dg_tensor *x);

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
/* relu(x @ w^T + b): a linear layer and the ReLU after it as one op, the
 * bits of dg_relu(dg_linear(x, w, b)). On the AVX-512 GEMM the ReLU goes in
 * with the product's last stores, and a dg_linear after it masks its input
 * gradient in its own stores, so neither direction runs a ReLU pass; one
 * output, saved for backward. */
DG_API dg_tensor *dg_linear_relu(dg_ctx *ctx, dg_tensor *x, dg_tensor *w, dg_tensor *b);

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

/* ---- arg-reductions and metrics (no gradient) ---- */
/* Index of the maximum of f32 x along dim (negative counts from the end)
 * -> i64 tensor of x's shape without dim (size 1 with keepdim). Ties: the
 * first index; a NaN wins (the first one), as torch.argmax. The result has
 * no gradient. DG_EINVAL for a dim out of range, DG_ESHAPE when dim is
 * empty (torch refuses it too). */
DG_API dg_tensor *dg_argmax(dg_ctx *ctx, dg_tensor *x, int dim, int keepdim);
/* Counts the rows whose argmax over the last dim equals the target:
 * logits (..., C) f32, targets (...) i32 or i64 -> *correct in [0, numel of
 * targets] (0 for no rows). Returns DG_OK, or an error code with the detail
 * in dg_ctx_errmsg(ctx) naming both shapes: DG_ESHAPE for mismatched
 * shapes, DG_EDTYPE for targets not i32/i64, DG_EINVAL for a target
 * outside [0, C) (naming it and its row) or a NULL argument; *correct is
 * then 0. No tape node. */
DG_API int dg_accuracy(dg_ctx *ctx, dg_tensor *logits, dg_tensor *targets, int64_t *correct);

/* ---- element-wise unary ---- */
DG_API dg_tensor *dg_relu(dg_ctx *ctx, dg_tensor *x);
DG_API dg_tensor *dg_gelu(dg_ctx *ctx, dg_tensor *x); /* tanh approximation */
DG_API dg_tensor *dg_tanh(dg_ctx *ctx, dg_tensor *x);
DG_API dg_tensor *dg_sigmoid(dg_ctx *ctx, dg_tensor *x);
DG_API dg_tensor *dg_exp(dg_ctx *ctx, dg_tensor *x);
DG_API dg_tensor *dg_log(dg_ctx *ctx, dg_tensor *x);
/* x > 0 ? x : slope * x (torch.nn.functional.leaky_relu; torch's default
 * slope is 0.01). The gradient at 0 is slope, as torch's. */
DG_API dg_tensor *dg_leaky_relu(dg_ctx *ctx, dg_tensor *x, float slope);

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
/* Batch normalisation over dim 1, as torch.nn.functional.batch_norm:
 * x (N, C), (N, C, L) or (N, C, H, W); w, b (C) may be NULL; running_mean
 * and running_var (C), contiguous, both or neither. train != 0: normalises
 * each channel with the batch's mean and biased variance (over N and the
 * dims after C; more than one value per channel, else DG_ESHAPE) and, when
 * given, updates the running statistics in place:
 *   running = (1 - momentum) running + momentum batch
 * (the unbiased variance for running_var; an empty batch changes nothing).
 * train == 0: normalises with the running statistics (required). Gradients
 * reach x, w, b, not the running statistics. momentum in [0, 1] (torch's
 * None, a cumulative average, is not offered); eps >= 0. */
DG_API dg_tensor *dg_batchnorm(dg_ctx *ctx, dg_tensor *x, dg_tensor *w, dg_tensor *b,
                               dg_tensor *running_mean, dg_tensor *running_var, int train,
                               float momentum, float eps);
/* weight (V, D), idx any shape (i32/i64) -> idx.shape + (D). */
DG_API dg_tensor *dg_embedding(dg_ctx *ctx, dg_tensor *weight, dg_tensor *idx);
/* Inverted dropout with probability p; identity in eval mode. A dropped
 * element is 0 forward and backward, even where x or the gradient is inf
 * or NaN (torch multiplies by the mask: NaN there). */
DG_API dg_tensor *dg_dropout(dg_ctx *ctx, dg_tensor *x, float p);
/* scores (..., T, T): entries above the diagonal become -inf. */
DG_API dg_tensor *dg_causal_mask(dg_ctx *ctx, dg_tensor *scores);

/* ---- convolution and pooling (NCHW) ---- */
/* x (N, C, H, W), w (O, C, KH, KW), b (O) or NULL -> (N, O, OH, OW). */
DG_API dg_tensor *dg_conv2d(dg_ctx *ctx, dg_tensor *x, dg_tensor *w, dg_tensor *b,
                            int stride, int pad);
/* x (N, C, H, W) -> (N, C, OH, OW), window k, stride s. */
DG_API dg_tensor *dg_maxpool2d(dg_ctx *ctx, dg_tensor *x, int k, int s);
/* Window means: x (N, C, H, W) -> (N, C, OH, OW), OH = (H - k) / s + 1
 * (likewise OW), no padding: torch's avg_pool2d(x, k, s) with ceil_mode
 * False. DG_ESHAPE unless x is 4-d, k >= 1, s >= 1, k <= H and k <= W. */
DG_API dg_tensor *dg_avgpool2d(dg_ctx *ctx, dg_tensor *x, int k, int s);
/* Mean of each plane: x (N, C, H, W) -> (N, C), torch's
 * adaptive_avg_pool2d(x, 1).flatten(1). H or W = 0 gives NaN, as torch.
 * DG_ESHAPE unless x is 4-d. */
DG_API dg_tensor *dg_global_avgpool2d(dg_ctx *ctx, dg_tensor *x);

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
