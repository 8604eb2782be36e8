/* dgrad/nn.h — modules, initialisers, losses.
 *
 * A module is a small vtable (type, forward, bind, destroy) plus an optional
 * list of named children. Modules are built without parameters;
 * dg_module_bind() registers them into a parameter store under dotted names
 * ("layers.3.weight") in a stable order and initialises them from a seed.
 * Binding late lets a Sequential be split at any index and each part bound
 * to its own store (pipeline stages) with the original names kept.
 *
 * Writing your own module (a residual block, say): embed dg_module as the
 * first member of your struct, create it with dg_module_new, add its
 * sub-modules with dg_module_add_child and give the vtable a forward that
 * calls dg_module_forward on m->children[i]. Binding, train mode and freeing
 * walk the children for you; vt->bind and vt->destroy are only for what the
 * module itself holds (its own parameters, its own allocations).
 * examples/custom_module/resnet.c is a complete program. A module whose
 * input or output is several tensors (a skip connection carried past
 * other layers, a mask beside the activations) gives the vtable a
 * forward_n; a Sequential threads such tuples from layer to layer, and a
 * pipeline (pipe.h) carries them across its stage boundaries.
 *
 * Binding (dg_module_bind(m, ps, prefix, seed)):
 *   - m's own parameters (vt->bind) come first, then each child in order,
 *     bound under "<prefix>.<child name>" ("<child name>" when prefix is
 *     ""): child "conv1" of a module bound at "res" owns "res.conv1.weight";
 *     the whole tree bound at "" gives "conv1.weight". A child with no name
 *     (child_names NULL, or its entry NULL) is named by its index.
 *   - Every module of the tree gets the same seed; each randomly initialised
 *     parameter draws from dg_module_param_seed(seed, its full name), so its
 *     values depend neither on registration order nor on how a model was
 *     split, and a tree bound at another prefix gets other values.
 *   - The prefix is recorded as the module's path (m->path), which errors of
 *     dg_module_forward name.
 *   - Names longer than 255 bytes are refused (DG_EINVAL).
 *
 * Ownership: a module owns its children (dg_module_free frees the tree).
 * dg_module_free frees each struct with dgrad's allocator (dg_set_allocator;
 * malloc by default), so create structs with dg_module_new and add children
 * with dg_module_add_child. A struct you allocate yourself (on the stack, in
 * your own pool) is released with dg_module_release and then freed by you;
 * it must not become another module's child. Parameters belong to the store.
 * Modules are not thread-safe; a forward uses the caller's ctx. */
#ifndef DGRAD_NN_H
#define DGRAD_NN_H

#include "dgrad/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dg_module dg_module;

typedef struct {
  const char *type; /* "Linear", ...; errors and dg_module_type show it */
  /* x -> y in ctx's arena; NULL on error (detail in dg_ctx_errmsg(ctx)). */
  dg_tensor *(*forward)(dg_module *m, dg_ctx *ctx, dg_tensor *x);
  /* Registers the module's own parameters (not its children's) as
   * "<prefix>.<name>" ("<name>" when prefix is "") and initialises them,
   * e.g. from dg_module_param_seed(seed, full name); on failure returns the
   * code with the detail in dg_params_errmsg(ps). NULL: none of its own. */
  int (*bind)(dg_module *m, dg_params *ps, const char *prefix, uint64_t seed);
  /* Frees what the module holds besides its children, never the struct
   * itself. dg_module_release frees the children after calling this (a
   * destroy that frees them itself must leave nchildren 0). NULL: nothing. */
  void (*destroy)(dg_module *m);
  /* Optional: several tensors in and out, xs[0..nx) -> ys[0..*ny) with
   * 1 <= *ny <= DG_MODULE_MAX_IO (ys has room for that many); DG_OK, or
   * the code with the detail in ctx. For what travels beside the main
   * activation: a skip connection, an attention mask, positions, a
   * pipeline boundary of several tensors. When present it serves every
   * dg_module_forward_n call, one tensor in included (a Sequential calls
   * its layers that way), and forward serves dg_module_forward; a module
   * with only forward_n also serves dg_module_forward through it. NULL:
   * one in, one out (forward). */
  int (*forward_n)(dg_module *m, dg_ctx *ctx, dg_tensor *const *xs, int nx, dg_tensor **ys,
                   int *ny);
} dg_module_vtable;

/* Most tensors a module takes or returns (dg_module_forward_n). */
#define DG_MODULE_MAX_IO 8

struct dg_module {
  const dg_module_vtable *vt;
  int train; /* set by dg_module_set_train; 1 when created */
  /* sub-modules, owned; fill with dg_module_add_child (arrays filled by hand
   * must come from dgrad's allocator, which frees them) */
  int nchildren;
  dg_module **children;
  char **child_names;
  /* the prefix of the last dg_module_bind ("" for a root bound at ""),
   * NULL before; owned by the module */
  char *path;
};

/* A zeroed module struct of `size` bytes (>= sizeof(dg_module); your struct
 * embeds dg_module first) with vt set and train mode on, allocated with
 * dgrad's allocator so that dg_module_free can free it. */
DG_API int dg_module_new(dg_module **out, size_t size, const dg_module_vtable *vt);
/* Appends `child` under `name` (NULL: its index, "0", "1", ...; "" is
 * refused). Ownership moves to m on success only. */
DG_API int dg_module_add_child(dg_module *m, dg_module *child, const char *name);
/* Calls vt->forward. When it fails and the ctx had no error before, the
 * error names the innermost failing module by path and type:
 * "features.3 (Conv2d): conv2d: ..." (a root bound at "" or a module never
 * bound: "Conv2d: ..."). The code is the failing op's.
 * A forward that returns NULL without recording an error gets one. */
DG_API dg_tensor *dg_module_forward(dg_module *m, dg_ctx *ctx, dg_tensor *x);
/* Several tensors through m: xs[0..nx) -> ys[0..*ny) (ys: room for
 * DG_MODULE_MAX_IO). vt->forward_n when m has one; else m takes one tensor
 * (nx 1, or DG_EINVAL naming the module) and returns one. dg_module_forward
 * on a module with only forward_n takes one tensor and wants one back.
 * Errors name the innermost failing module, as dg_module_forward. */
DG_API int dg_module_forward_n(dg_module *m, dg_ctx *ctx, dg_tensor *const *xs, int nx,
                               dg_tensor **ys, int *ny);
/* Registers and initialises every parameter of the tree (rules above). On
 * failure dg_params_errmsg(ps) names the parameter and why. */
DG_API int dg_module_bind(dg_module *m, dg_params *ps, const char *prefix, uint64_t seed);
/* The seed a parameter named `name` (its full name) is initialised from,
 * for a tree bound with `seed`; what the built-in modules use. */
DG_API uint64_t dg_module_param_seed(uint64_t seed, const char *name);
/* Train/eval mode for the tree, like torch's module.train()/eval(). Dropout
 * (the Dropout module and the dropout inside attention and transformer
 * blocks) is active only while both this flag and the ctx's mode
 * (dg_ctx_set_train) are on: either one turns it off. BatchNorm likewise
 * uses (and updates) batch statistics only while both are on, and its
 * running statistics otherwise. */
DG_API void dg_module_set_train(dg_module *m, int train);
DG_API const char *dg_module_type(const dg_module *m);
/* Frees what m holds: vt->destroy, then its children (dg_module_free on
 * each) and their names, then its path; m itself is left to its owner and
 * may be reused. NULL: no-op. */
DG_API void dg_module_release(dg_module *m);
/* dg_module_release, then the struct via dgrad's allocator: for modules
 * from dg_module_new and the dg_nn_* constructors. NULL: no-op. */
DG_API void dg_module_free(dg_module *m);

/* ---- parameter counts and model summary ---- */

/* Elements of the store's parameters (of its trainable ones when
 * trainable_only); buffers are not parameters and not counted. 0 for NULL. */
DG_API int64_t dg_params_numel(const dg_params *ps, int trainable_only);
/* A table of the bound tree m (its parameters in ps) into buf (cap bytes,
 * always terminated when cap > 0; buf may be NULL when cap is 0), one row
 * per module, depth-first, indented by depth:
 *   module       type        params  trainable  own parameters and buffers
 *   layers       Sequential     618        618
 *     layers.0   Linear         288        288  weight (32, 8), bias (32,)
 *     layers.1   ReLU             0          0
 * params / trainable count the module's subtree; own tensors are named
 * relative to the module's path, "frozen" marks a frozen parameter and
 * "buffer" a buffer (running statistics, not counted as parameters). Then
 * a total line (parameters, tensors, trainable and frozen, buffers,
 * modules) and, when the store holds parameters outside m, how many. A
 * tensor belongs to the deepest module whose path prefixes its name.
 * Returns the length of the whole table (as snprintf: it was cut when >=
 * cap), DG_EINVAL for NULL m or ps, DG_ESTATE when m was never bound,
 * DG_ENOMEM. */
DG_API int dg_module_summary(const dg_module *m, const dg_params *ps, char *buf,
                             size_t cap);

/* ---- built-in modules ---- */

DG_API int dg_nn_linear(dg_module **out, int64_t in, int64_t outf, int bias);
/* Conv2d NCHW with square kernel k, stride, zero padding. */
DG_API int dg_nn_conv2d(dg_module **out, int64_t cin, int64_t cout, int k, int stride, int pad,
                        int bias);
DG_API int dg_nn_maxpool2d(dg_module **out, int k, int stride);
/* AvgPool2d (dg_avgpool2d): window k, stride, no padding. DG_EINVAL unless
 * k >= 1 and stride >= 1. */
DG_API int dg_nn_avgpool2d(dg_module **out, int k, int stride);
/* (N, C, H, W) -> (N, C), the mean of each plane (dg_global_avgpool2d). */
DG_API int dg_nn_global_avgpool2d(dg_module **out);
DG_API int dg_nn_relu(dg_module **out);
/* LeakyReLU (dg_leaky_relu) with the given slope (torch's default 0.01). */
DG_API int dg_nn_leaky_relu(dg_module **out, float slope);
DG_API int dg_nn_gelu(dg_module **out);
DG_API int dg_nn_tanh(dg_module **out);
/* Active only in train mode (dg_module_set_train and dg_ctx_set_train). */
DG_API int dg_nn_dropout(dg_module **out, float p);
/* (N, C, H, W) -> (N, C*H*W) */
DG_API int dg_nn_flatten(dg_module **out);
DG_API int dg_nn_layernorm(dg_module **out, int64_t dim, float eps);
/* BatchNorm over channels (dg_batchnorm), torch's BatchNorm1d / BatchNorm2d
 * with affine=True, track_running_stats=True (torch's defaults: eps 1e-5,
 * momentum 0.1; momentum in [0, 1], eps >= 0, else DG_EINVAL). 1d takes
 * (N, C) or (N, C, L), 2d (N, C, H, W). Bind registers the parameters
 * "<prefix>.weight" (ones) and "<prefix>.bias" (zeros) and the store
 * buffers (dg_params_add_buffer) "<prefix>.running_mean" (zeros) and
 * "<prefix>.running_var" (ones); torch's num_batches_tracked is not kept
 * (only momentum None reads it). Training, as for Dropout, needs both the
 * module's flag (dg_module_set_train) and the ctx's mode (dg_ctx_set_train):
 * then each forward normalises with its own batch's statistics and updates
 * the running statistics once, whether or not grad mode is on; otherwise
 * it normalises with the running statistics and changes nothing.
 * Micro-batches: with gradient accumulation (several forwards and
 * backwards, then one optimizer step; DDP's accum_steps, and a pipeline's
 * micro-batches) each micro-batch is normalised with its own statistics
 * and the running statistics move once per micro-batch, as in torch: M
 * micro-batches are M momentum updates, not one update with the
 * statistics of their union. The running statistics are written by the
 * forward: forwards of one module on several threads at once are not
 * supported. SyncBatchNorm (statistics over a process group):
 * dg_nn_sync_batchnorm2d in ddp.h. */
DG_API int dg_nn_batchnorm1d(dg_module **out, int64_t C, float eps, float momentum);
DG_API int dg_nn_batchnorm2d(dg_module **out, int64_t C, float eps, float momentum);
/* Token ids (B, T) i32/i64 -> (B, T, dim). */
DG_API int dg_nn_embedding(dg_module **out, int64_t vocab, int64_t dim);
/* Multi-head causal self-attention, (B, T, C) -> (B, T, C); C % heads == 0. */
DG_API int dg_nn_causal_attention(dg_module **out, int64_t dim, int heads, float dropout);
/* Pre-LN GPT block: x + attn(ln1(x)), then + mlp(ln2(.)) with GELU, 4x hidden. */
DG_API int dg_nn_transformer_block(dg_module **out, int64_t dim, int heads, float dropout);

/* Sequential with named children ("0", "1", ... unless named). */
DG_API int dg_nn_sequential(dg_module **out);
/* dg_module_add_child for a Sequential (DG_EINVAL on any other module). */
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
