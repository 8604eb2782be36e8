/* One GPT-2-style pre-LN transformer block against PyTorch (fixtures/gpt.dgref):
 * tokens (B=2, T=8) -> wte + wpe (d 32) -> x + attn(ln1(x)) (4 heads, causal)
 * -> x + mlp(ln2(x)) (GELU tanh, hidden 128) -> ln_f -> head (no bias) -> logits
 * (2, 8, 16), cross-entropy on the shifted targets. Attention is spelled out
 * exactly as in make_fixtures.py's Block.attn; a second run checks the fused
 * ops the transformer block uses (dg_attention, dg_linear_add,
 * dg_mlp_gelu_add) against the same fixture. */
#include "ref_fixture.h"

enum { B = 2, T = 8, D = 32, H = 4, HD = D / H };
#define LN_EPS 1e-5f

/* (B, T, D) -> (B*H, T, HD) */
static dg_tensor *to_heads(dg_ctx *c, dg_tensor *x) {
  static const int64_t bthd[4] = {B, T, H, HD}, bh_t_hd[3] = {B * H, T, HD};
  static const int perm[4] = {0, 2, 1, 3};
  x = dg_reshape(c, dg_contiguous(c, x), 4, bthd);
  x = dg_contiguous(c, dg_permute(c, x, perm)); /* (B, H, T, HD) */
  return dg_reshape(c, x, 3, bh_t_hd);
}

/* (B*H, T, HD) -> (B, T, D) */
static dg_tensor *from_heads(dg_ctx *c, dg_tensor *y) {
  static const int64_t bhthd[4] = {B, H, T, HD}, btd[3] = {B, T, D};
  static const int perm[4] = {0, 2, 1, 3};
  y = dg_permute(c, dg_reshape(c, y, 4, bhthd), perm); /* (B, T, H, HD) */
  return dg_reshape(c, dg_contiguous(c, y), 3, btd);
}

static dg_tensor *attn(ref_env *e, dg_tensor *x /* (B, T, D) */) {
  dg_ctx *c = e->ctx;
  dg_tensor *qkv = dg_linear(c, x, ref_param(e, "block.attn_qkv.weight"),
                             ref_param(e, "block.attn_qkv.bias")); /* (B, T, 3D) */
  static const int64_t sizes[3] = {D, D, D};
  dg_tensor *p[3] = {NULL, NULL, NULL};
  if (!qkv || dg_split(c, qkv, 2, 3, sizes, p) != DG_OK) return NULL;
  dg_tensor *q = to_heads(c, p[0]), *k = to_heads(c, p[1]), *v = to_heads(c, p[2]);
  dg_tensor *att = dg_matmul_t(c, q, k, 0, 1); /* (B*H, T, T) */
  att = dg_scale(c, att, 1.0f / sqrtf((float)HD));
  att = dg_softmax(c, dg_causal_mask(c, att));
  dg_tensor *y = from_heads(c, dg_matmul(c, att, v)); /* (B, T, D) */
  return dg_linear(c, y, ref_param(e, "block.attn_proj.weight"),
                   ref_param(e, "block.attn_proj.bias"));
}

/* res + attn(x), fused as the transformer block does it */
static dg_tensor *attn_fused(ref_env *e, dg_tensor *x /* (B, T, D) */, dg_tensor *res) {
  dg_ctx *c = e->ctx;
  dg_tensor *qkv = dg_linear(c, x, ref_param(e, "block.attn_qkv.weight"),
                             ref_param(e, "block.attn_qkv.bias")); /* (B, T, 3D) */
  return dg_linear_add(c, dg_attention(c, qkv, H, 1, 1.0f / sqrtf((float)HD)),
                       ref_param(e, "block.attn_proj.weight"),
                       ref_param(e, "block.attn_proj.bias"), res);
}

static dg_tensor *forward(ref_env *e, dg_tensor **out, void *user) {
  int fused = *(const int *)user;
  dg_ctx *c = e->ctx;
  int64_t pos_data[T], t_shape[1] = {T};
  for (int t = 0; t < T; t++) pos_data[t] = t;
  dg_tensor *pos = dg_from_data(c, DG_I64, 1, t_shape, pos_data);
  dg_tensor *x = dg_add(c, dg_embedding(c, ref_param(e, "wte.weight"), ref_input(e, "idx")),
                        dg_embedding(c, ref_param(e, "wpe.weight"), pos)); /* (B,T,D) + (T,D) */
  dg_tensor *h = dg_layernorm(c, x, ref_param(e, "block.ln1.weight"),
                              ref_param(e, "block.ln1.bias"), LN_EPS);
  x = fused ? attn_fused(e, h, x) : dg_add(c, x, attn(e, h));
  h = dg_layernorm(c, x, ref_param(e, "block.ln2.weight"), ref_param(e, "block.ln2.bias"),
                   LN_EPS);
  if (fused) {
    x = dg_mlp_gelu_add(c, h, ref_param(e, "block.mlp_fc.weight"),
                        ref_param(e, "block.mlp_fc.bias"), ref_param(e, "block.mlp_proj.weight"),
                        ref_param(e, "block.mlp_proj.bias"), x);
  } else {
    h = dg_gelu(c, dg_linear(c, h, ref_param(e, "block.mlp_fc.weight"),
                             ref_param(e, "block.mlp_fc.bias"))); /* (B, T, 4D) */
    x = dg_add(c, x, dg_linear(c, h, ref_param(e, "block.mlp_proj.weight"),
                               ref_param(e, "block.mlp_proj.bias")));
  }
  h = dg_layernorm(c, x, ref_param(e, "ln_f.weight"), ref_param(e, "ln_f.bias"), LN_EPS);
  *out = dg_linear(c, h, ref_param(e, "head.weight"), NULL); /* (B, T, 16) */
  return dg_cross_entropy(c, *out, ref_input(e, "targets"));
}

int main(int argc, char **argv) {
  ref_env env;
  ref_env_open(&env, "gpt", argc > 1 ? argv[1] : NULL);
  for (int fused = 0; fused < 2; fused++) {
    const char *what = fused ? "gpt (fused attention and MLP)" : "gpt";
    int bad = ref_env_pass(&env, forward, &fused, REF_TOL, 1);
    printf("%s: %d tensor(s) out of tolerance %.0e\n", what, bad, REF_TOL);
    bad = ref_env_pass(&env, forward, &fused, REF_TOL, 2);
    printf("%s: second step without zero_grad: %d tensor(s) off twice the reference "
           "gradient\n", what, bad);
  }
  fflush(stdout);
  ref_env_close(&env);
  return TEST_DONE();
}
