/* Multi-head causal self-attention and the pre-LN GPT transformer block.
 * Parameter names follow GPT-2 (attn.c_attn, attn.c_proj, mlp.c_fc, ...). */
#include <math.h>

#include "nn/nn_impl.h"

typedef struct {
  dg_module base; /* children: c_attn (C -> 3C), c_proj (C -> C), [drop] */
  int64_t dim;
  int heads;
  float dropout;
} attn_m;

/* (B, T, C) -> (B*H, T, hd): split heads and bring them forward. */
static dg_tensor *to_heads(dg_ctx *ctx, dg_tensor *x, int64_t B, int64_t T, int H, int64_t hd) {
  int64_t s4[4] = {B, T, H, hd}, s3[3] = {B * H, T, hd};
  int perm[4] = {0, 2, 1, 3};
  dg_tensor *p = dg_permute(ctx, dg_reshape(ctx, x, 4, s4), perm); /* (B, H, T, hd) */
  return dg_reshape(ctx, dg_contiguous(ctx, p), 3, s3);
}

/* Unfused path, for dropout on the attention probabilities. */
static dg_tensor *attn_unfused(dg_ctx *ctx, dg_tensor *qkv, int64_t B, int64_t T, int64_t C,
                               int H, float dropout) {
  int64_t hd = C / H;
  dg_tensor *parts[3] = {NULL, NULL, NULL};
  int64_t sizes[3] = {C, C, C};
  if (dg_split(ctx, qkv, 2, 3, sizes, parts)) return NULL;
  dg_tensor *q = to_heads(ctx, parts[0], B, T, H, hd);
  dg_tensor *k = to_heads(ctx, parts[1], B, T, H, hd);
  dg_tensor *v = to_heads(ctx, parts[2], B, T, H, hd);
  dg_tensor *att = dg_scale(ctx, dg_matmul_t(ctx, q, k, 0, 1), 1.0f / sqrtf((float)hd));
  att = dg_softmax(ctx, dg_causal_mask(ctx, att)); /* (B*H, T, T) */
  att = dg_dropout(ctx, att, dropout);
  dg_tensor *y = dg_matmul(ctx, att, v); /* (B*H, T, hd) */
  int64_t s4[4] = {B, H, T, hd}, s3[3] = {B, T, C};
  int perm[4] = {0, 2, 1, 3};
  y = dg_permute(ctx, dg_reshape(ctx, y, 4, s4), perm); /* (B, T, H, hd) */
  return dg_reshape(ctx, dg_contiguous(ctx, y), 3, s3);
}

/* x (B, T, C) -> the heads' output (B, T, C), before c_proj. */
static dg_tensor *attn_heads(dg_module *m, dg_ctx *ctx, dg_tensor *x) {
  attn_m *a = (attn_m *)m;
  if (!x) return NULL;
  if (x->ndim != 3 || x->shape[2] != a->dim) {
    char b[96];
    dg__set_error(ctx, DG_ESHAPE, "CausalSelfAttention(%lld): input %s, want (B, T, %lld)",
                  (long long)a->dim, dg__shape_str(x, b, sizeof b), (long long)a->dim);
    return NULL;
  }
  int64_t B = x->shape[0], T = x->shape[1], C = a->dim, hd = C / a->heads;
  int drop = a->dropout > 0 && m->train && dg_ctx_is_train(ctx);
  dg_tensor *qkv = dg_module_forward(m->children[0], ctx, x); /* (B, T, 3C) */
  if (!qkv) return NULL;
  return drop ? attn_unfused(ctx, qkv, B, T, C, a->heads, a->dropout)
              : dg_attention(ctx, qkv, a->heads, 1, 1.0f / sqrtf((float)hd)); /* (B, T, C) */
}

static dg_tensor *attn_fwd(dg_module *m, dg_ctx *ctx, dg_tensor *x) {
  attn_m *a = (attn_m *)m;
  dg_tensor *y = dg_module_forward(m->children[1], ctx, attn_heads(m, ctx, x));
  if (a->dropout > 0 && m->train) y = dg_dropout(ctx, y, a->dropout);
  return y;
}

/* res + attn(x): without output dropout, c_proj and the residual add are
 * one dg_linear_add. */
static dg_tensor *attn_residual(dg_module *m, dg_ctx *ctx, dg_tensor *x, dg_tensor *res) {
  attn_m *a = (attn_m *)m;
  dg_tensor *w, *b;
  if ((a->dropout > 0 && m->train) || !dg__linear_weights(m->children[1], &w, &b))
    return dg_add(ctx, res, attn_fwd(m, ctx, x));
  dg_tensor *y = attn_heads(m, ctx, x);
  return y ? dg_linear_add(ctx, y, w, b, res) : NULL;
}

/* children are bound and freed by dg_module_bind / dg_module_release */
static const dg_module_vtable attn_vt = {"CausalSelfAttention", attn_fwd, NULL, NULL, NULL};

/* rc is the constructor's result; *c is read after it ran (argument
 * evaluation order is unspecified, so the child is passed by address). */
static int push_new(dg_module *m, int rc, dg_module **c, const char *name) {
  if (rc) return rc;
  rc = dg__child_push(m, *c, name);
  if (rc) dg_module_free(*c);
  return rc;
}

int dg_nn_causal_attention(dg_module **out, int64_t dim, int heads, float dropout) {
  if (!out) return DG_EINVAL;
  *out = NULL;
  if (dim <= 0 || heads <= 0 || dim % heads || !(dropout >= 0 && dropout < 1)) return DG_EINVAL;
  attn_m *a = (attn_m *)dg__module_alloc(sizeof *a, &attn_vt);
  if (!a) return DG_ENOMEM;
  a->dim = dim, a->heads = heads, a->dropout = dropout;
  dg_module *c = NULL;
  int rc = push_new(&a->base, dg_nn_linear(&c, dim, 3 * dim, 1), &c, "c_attn");
  rc = rc ? rc : push_new(&a->base, dg_nn_linear(&c, dim, dim, 1), &c, "c_proj");
  if (rc) {
    dg_module_free(&a->base);
    return rc;
  }
  *out = &a->base;
  return DG_OK;
}

/* ---- transformer block: children ln_1, attn, ln_2, mlp.c_fc, mlp.c_proj ---- */

typedef struct {
  dg_module base;
  float dropout;
} block_m;

static dg_tensor *block_fwd(dg_module *m, dg_ctx *ctx, dg_tensor *x) {
  block_m *b = (block_m *)m;
  dg_module **c = m->children;
  x = attn_residual(c[1], ctx, dg_module_forward(c[0], ctx, x), x);
  dg_tensor *h = dg_module_forward(c[2], ctx, x);
  dg_tensor *w1, *b1, *w2, *b2;
  int drop = b->dropout > 0 && m->train;
  if (!dg__linear_weights(c[3], &w1, &b1) || !dg__linear_weights(c[4], &w2, &b2)) {
    h = dg_module_forward(c[4], ctx, dg_gelu(ctx, dg_module_forward(c[3], ctx, h)));
    return dg_add(ctx, x, h); /* unbound: the modules report it */
  }
  /* one (B, T, 4C) activation kept, not two; the residual add fused in */
  if (!drop) return dg_mlp_gelu_add(ctx, h, w1, b1, w2, b2, x);
  return dg_add(ctx, x, dg_dropout(ctx, dg_mlp_gelu(ctx, h, w1, b1, w2, b2), b->dropout));
}

static const dg_module_vtable block_vt = {"TransformerBlock", block_fwd, NULL, NULL, NULL};

int dg_nn_transformer_block(dg_module **out, int64_t dim, int heads, float dropout) {
  if (!out) return DG_EINVAL;
  *out = NULL;
  if (dim <= 0 || heads <= 0 || dim % heads || !(dropout >= 0 && dropout < 1)) return DG_EINVAL;
  block_m *b = (block_m *)dg__module_alloc(sizeof *b, &block_vt);
  if (!b) return DG_ENOMEM;
  b->dropout = dropout;
  dg_module *c = NULL, *m = &b->base;
  int rc = push_new(m, dg_nn_layernorm(&c, dim, 1e-5f), &c, "ln_1");
  rc = rc ? rc : push_new(m, dg_nn_causal_attention(&c, dim, heads, dropout), &c, "attn");
  rc = rc ? rc : push_new(m, dg_nn_layernorm(&c, dim, 1e-5f), &c, "ln_2");
  rc = rc ? rc : push_new(m, dg_nn_linear(&c, dim, 4 * dim, 1), &c, "mlp.c_fc");
  rc = rc ? rc : push_new(m, dg_nn_linear(&c, 4 * dim, dim, 1), &c, "mlp.c_proj");
  if (rc) {
    dg_module_free(m);
    return rc;
  }
  *out = m;
  return DG_OK;
}
