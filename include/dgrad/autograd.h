/* dgrad/autograd.h — the tape, backward, grad mode and hooks.
 *
 * Ops record a node on the context's tape when grad mode is on and an input
 * requires grad. dg_backward walks the tape in reverse and accumulates (+=)
 * into parameter gradients, so micro-batch accumulation is the default; call
 * dg_params_zero_grad between optimizer steps. Backward consumes the tape and
 * releases the gradients of intermediate results as it goes (leaves keep
 * theirs).
 *
 * Hooks run on the thread that calls dg_backward. */
#ifndef DGRAD_AUTOGRAD_H
#define DGRAD_AUTOGRAD_H

#include "dgrad/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Backpropagates from `loss` (any shape; seeded with ones). */
DG_API int dg_backward(dg_ctx *ctx, dg_tensor *loss);
/* Backpropagates with an explicit output gradient (same shape as out). */
DG_API int dg_backward_with(dg_ctx *ctx, dg_tensor *out, dg_tensor *grad_out);
/* Backpropagates from n outputs at once, outs[k] seeded with grads[k] (its
 * shape, f32; grads NULL: ones for every output), in one walk of the tape:
 * the gradients are those of sum_k <outs[k], grads[k]>, and each
 * parameter's grad-ready hook fires once. Every output must require grad
 * (an error names the first that does not); all are checked before any
 * gradient is written. A stage of a pipeline whose boundary carries
 * several tensors runs its backward this way. */
DG_API int dg_backward_multi(dg_ctx *ctx, int n, dg_tensor *const *outs,
                             dg_tensor *const *grads);

/* Returns the previous setting. With grad mode off no tape is recorded. */
DG_API int dg_ctx_set_grad_enabled(dg_ctx *ctx, int on);
DG_API int dg_ctx_is_grad_enabled(const dg_ctx *ctx);
/* Number of nodes on the tape now. */
DG_API int dg_ctx_tape_size(const dg_ctx *ctx);

/* Parameter-gradient-ready: fires exactly once per trainable parameter of every
 * store the backward involved (a store is involved when one of its parameters
 * was used since the last backward, or it was attached), at the moment that
 * parameter's gradient is final, in that order. reached = 0 for a parameter
 * backward never reached (it fires for those just before backward-end, in
 * registration order). */
typedef void (*dg_grad_ready_fn)(void *user, dg_params *ps, int index, int reached);
/* Backward-end: after the last node and the last grad-ready hook. A non-OK
 * return becomes dg_backward's result (e.g. a failed all-reduce). */
typedef int (*dg_backward_end_fn)(void *user, dg_ctx *ctx);
/* Saved-tensor hooks: pack runs when a node saves a tensor for backward and
 * returns an opaque handle (or NULL on failure); unpack turns the handle back
 * into a tensor with the same shape and values when backward needs it. */
typedef void *(*dg_pack_fn)(void *user, dg_ctx *ctx, dg_tensor *t);
typedef dg_tensor *(*dg_unpack_fn)(void *user, dg_ctx *ctx, void *packed);

/* Add hooks (up to 8 of each kind). Return a hook id > 0, or a DG_E* code. */
DG_API int dg_ctx_add_grad_ready_hook(dg_ctx *ctx, dg_grad_ready_fn fn, void *user);
DG_API int dg_ctx_add_backward_end_hook(dg_ctx *ctx, dg_backward_end_fn fn, void *user);
/* Only one pair of saved-tensor hooks at a time (nesting is the caller's). */
DG_API int dg_ctx_set_saved_tensor_hooks(dg_ctx *ctx, dg_pack_fn pack, dg_unpack_fn unpack,
                                         void *user);
DG_API int dg_ctx_remove_hook(dg_ctx *ctx, int id);
/* Makes `ps` take part in every backward on this ctx, used or not, until
 * dg_ctx_detach_params (DG_ENOTFOUND when not attached) or dg_ctx_free.
 * Freeing a store that is still attached logs an error and detaches it. */
DG_API int dg_ctx_attach_params(dg_ctx *ctx, dg_params *ps);
DG_API int dg_ctx_detach_params(dg_ctx *ctx, dg_params *ps);

/* After a backward: 1 when parameter i of ps received a gradient in the
 * last backward that involved ps (on any context). */
DG_API int dg_params_reached(const dg_params *ps, int i);
/* Number of trainable parameters the last backward did not reach. */
DG_API int dg_params_unreached_count(const dg_params *ps);

#ifdef __cplusplus
}
#endif
#endif /* DGRAD_AUTOGRAD_H */
