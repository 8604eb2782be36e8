/* dgrad/nn.h — modules, initialisers, losses.
 *
 * A module is a small vtable (forward, bind, name) that user code can
 * implement: embed dg_module as the first member of your struct and fill in
 * a dg_module_vtable. Modules are built without parameters; dg_module_bind()
 * registers them into a parameter store under dotted names
 * ("layers.3.weight") in a stable order and initialises them from a seed.
 * Binding late lets a Sequential be split at any index and each part bound
 * to its own store (pipeline stages) with the original names kept.
 *
 * Ownership: a container owns its children (dg_module_free frees the tree).
 * Parameters belong to the store. Modules are not thread-safe; a forward uses
 * the caller's ctx. */
#ifndef DGRAD_NN_H
#define DGRAD_NN_H

#include "dgrad/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dg_module dg_module;

typedef struct {
  const char *type; /* "Linear", ... */
  /* x -> y in ctx's arena; NULL on error (detail in dg_ctx_errmsg(ctx)). */
  dg_tensor *(*forward)(dg_module *m, dg_ctx *ctx, dg_tensor *x);
  /* Registers this module's parameters as "<prefix>.<name>" (prefix may be
   * "") and initialises them from `seed`. NULL when the module has none. */
  int (*bind)(dg_module *m, dg_params *ps, const char *prefix, uint64_t seed);
  /* Frees what the module owns (children included), not the struct itself
   * when it is embedded elsewhere; NULL when there is nothing to free. */
  void (*destroy)(dg_module *m);
} dg_module_vtable;

struct dg_module {
  const dg_module_vtable *vt;
  int train; /* set by dg_module_set_train */
  /* containers: children; leaves: 0 / NULL */
  int nchildren;
  dg_module **children;
  char **child_names;
};

/* Calls vt->forward. */
DG_API dg_tensor *dg_module_forward(dg_module *m, dg_ctx *ctx, dg_tensor *x);
/* Registers and initialises every parameter of the tree. On failure
 * dg_params_errmsg(ps) names the parameter and why. */
DG_API int dg_module_bind(dg_module *m, dg_params *ps, const char *prefix, uint64_t seed);
/* Train/eval mode for the tree (dropout reads the ctx's mode; this flag is
 * for user modules that care). */
DG_API void dg_module_set_train(dg_module *m, int train);
DG_API const char *dg_module_type(const dg_module *m);
/* Frees the tree (vt->destroy, then the struct via dg's allocator). For
 * modules created by dgrad's constructors. NULL: no-op. */
DG_API void dg_module_free(dg_module *m);

/* ---- built-in modules ---- */

DG_API int dg_nn_linear(dg_module **out, int64_t in, int64_t outf, int bias);
/* Conv2d NCHW with square kernel k, stride, zero padding. */
DG_API int dg_nn_conv2d(dg_module **out, int64_t cin, int64_t cout, int k, int stride, int pad,
                        int bias);
DG_API int dg_nn_maxpool2d(dg_module **out, int k, int stride);
DG_API int dg_nn_relu(dg_module **out);
DG_API int dg_nn_gelu(dg_module **out);
DG_API int dg_nn_tanh(dg_module **out);
DG_API int dg_nn_dropout(dg_module **out, float p);
/* (N, C, H, W) -> (N, C*H*W) */
DG_API int dg_nn_flatten(dg_module **out);
DG_API int dg_nn_layernorm(dg_module **out, int64_t dim, float eps);
/* Token ids (B, T) i32/i64 -> (B, T, dim). */
DG_API int dg_nn_embedding(dg_module **out, int64_t vocab, int64_t dim);
/* Multi-head causal self-attention, (B, T, C) -> (B, T, C); C % heads == 0. */
DG_API int dg_nn_causal_attention(dg_module **out, int64_t dim, int heads, float dropout);
/* Pre-LN GPT block: x + attn(ln1(x)), then + mlp(ln2(.)) with GELU, 4x hidden. */
DG_API int dg_nn_transformer_block(dg_module **out, int64_t dim, int heads, float dropout);

/* Sequential with named children ("0", "1", ... unless named). */
DG_API int dg_nn_sequential(dg_module **out);
/* Appends `child` (ownership moves to the sequential); name NULL: its index. */
DG_API int dg_sequential_add(dg_module *seq, dg_module *child, const char *name);
DG_API int dg_sequential_len(const dg_module *seq);
DG_API dg_module *dg_sequential_get(const dg_module *seq, int i);
/* Moves children [k, len) into a new Sequential *tail, keeping their names,
 * so "layers.3.weight" is still "layers.3.weight" in the tail. */
DG_API int dg_sequential_split(dg_module *seq, int k, dg_module **tail);

/* ---- initialisers (seeded; element i depends only on (seed, i)) ---- */
/* uniform(-b, b) with b = gain * sqrt(3 / fan_in) (torch kaiming_uniform_
 * with a = sqrt(5) uses gain sqrt(1/3): pass gain = 1/sqrt(3) for that). */
DG_API void dg_init_kaiming_uniform(dg_tensor *w, int64_t fan_in, float gain, uint64_t seed);
DG_API void dg_init_xavier_uniform(dg_tensor *w, int64_t fan_in, int64_t fan_out, uint64_t seed);
DG_API void dg_init_normal(dg_tensor *w, float mean, float std, uint64_t seed);
DG_API void dg_init_uniform(dg_tensor *w, float lo, float hi, uint64_t seed);
DG_API void dg_init_constant(dg_tensor *w, float v);

#ifdef __cplusplus
}
#endif
#endif /* DGRAD_NN_H */
