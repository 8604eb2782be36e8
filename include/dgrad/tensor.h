/* dgrad/tensor.h — contexts, tensors, parameter stores, RNG, memory stats.
 *
 * Ownership. A dg_ctx owns a step arena: every tensor returned by an op or by
 * the dg_ctx-taking constructors below lives there until dg_ctx_reset() or
 * dg_ctx_free(), and must not be freed one by one. Persistent tensors
 * (dg_tensor_new) are owned by the caller until dg_tensor_free(). Parameter
 * tensors are owned by their dg_params store.
 *
 * Errors (the rule is in dgrad/common.h). Ops and the dg_ctx-taking
 * constructors return NULL on failure and leave the detail (op name and
 * shapes) in dg_ctx_errmsg(ctx); store calls leave theirs in
 * dg_params_errmsg(ps). An op given a NULL input returns NULL and keeps the
 * first error, so a chain of ops can be checked once at the end.
 *
 * Threads. A context is used by one thread at a time; different contexts may
 * be used concurrently. Parameter stores may be read concurrently. */
#ifndef DGRAD_TENSOR_H
#define DGRAD_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "dgrad/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DG_MAX_DIMS 4

typedef struct dg_ctx dg_ctx;
typedef struct dg_tensor dg_tensor;
typedef struct dg_params dg_params;

/* Devices (DG_CPU, DG_CUDA + n) are defined in common.h. */

/* ---- context ---- */

typedef struct {
  size_t arena_bytes; /* initial step-arena size; 0: 1 MiB (it grows) */
  uint64_t seed;      /* RNG seed; 0 means 0x5eed */
  /* Most bytes one arena of the context (one per device) may reserve; 0: no
   * limit. Past it an op fails with DG_ENOMEM and a message saying the limit
   * was reached and how much is held since the last dg_ctx_reset. */
  size_t arena_limit;
} dg_ctx_opts;

DG_API int dg_ctx_new(dg_ctx **out, const dg_ctx_opts *opts /* NULL: defaults */);
DG_API void dg_ctx_free(dg_ctx *ctx);
/* Releases every arena tensor and the tape. Keeps the arena's memory, so a
 * steady-state training step allocates nothing from the heap. Call it once
 * per step: without it every step's tensors and tape stay. A context whose
 * arena grows to more than 4x the largest step seen (and at least 16 MiB
 * more) with no reset in between logs one warning naming the likely cause;
 * a step is what ran between two resets, or, with no reset, between two
 * dg_params_zero_grad calls of the stores backward involved (so the
 * micro-batches of gradient accumulation are one step).
 * dg_ctx_opts.arena_limit turns growth into an error.
 * A backward on a tensor of an earlier step (or of another context) is
 * refused with DG_ESTATE while its bytes have not been handed out again;
 * after that its address may be a new tensor's, so do not keep tensors
 * across a reset. */
DG_API void dg_ctx_reset(dg_ctx *ctx);
DG_API const char *dg_ctx_errmsg(const dg_ctx *ctx); /* "" when no error */
DG_API int dg_ctx_errcode(const dg_ctx *ctx);        /* last error code, DG_OK if none */
DG_API void dg_ctx_clear_error(dg_ctx *ctx);
/* Bytes of arena in use now / at most since creation / reserved. */
DG_API size_t dg_ctx_arena_used(const dg_ctx *ctx);
DG_API size_t dg_ctx_arena_peak(const dg_ctx *ctx);
DG_API size_t dg_ctx_arena_reserved(const dg_ctx *ctx);

/* Train mode (dropout active) vs eval; default train. */
DG_API void dg_ctx_set_train(dg_ctx *ctx, int train);
DG_API int dg_ctx_is_train(const dg_ctx *ctx);

/* ---- RNG: Philox4x32-10, counter-based: element i of a draw depends only on
 * (seed, offset + i), never on threads or chunking. ---- */
DG_API void dg_ctx_seed(dg_ctx *ctx, uint64_t seed);
/* Saves / restores (seed, offset) for checkpoints. */
DG_API void dg_ctx_rng_state(const dg_ctx *ctx, uint64_t *seed, uint64_t *offset);
DG_API void dg_ctx_set_rng_state(dg_ctx *ctx, uint64_t seed, uint64_t offset);
/* Stateless fills: uniform in [0, 1), standard normal. */
DG_API void dg_rng_uniform(uint64_t seed, uint64_t offset, float *out, size_t n);
DG_API void dg_rng_normal(uint64_t seed, uint64_t offset, float *out, size_t n);

/* ---- arena tensors (live until dg_ctx_reset) ---- */

DG_API dg_tensor *dg_empty(dg_ctx *ctx, dg_dtype dt, int ndim, const int64_t *shape);
DG_API dg_tensor *dg_zeros(dg_ctx *ctx, dg_dtype dt, int ndim, const int64_t *shape);
DG_API dg_tensor *dg_full(dg_ctx *ctx, int ndim, const int64_t *shape, float value);
/* Copies n = numel elements of `data` (dtype dt). */
DG_API dg_tensor *dg_from_data(dg_ctx *ctx, dg_dtype dt, int ndim, const int64_t *shape,
                               const void *data);
/* Wraps caller memory without copying (e.g. a data batch). The memory must
 * outlive the step. */
DG_API dg_tensor *dg_wrap(dg_ctx *ctx, dg_dtype dt, int ndim, const int64_t *shape, void *data);
/* f32 uniform [lo, hi) / normal(mean, std) from the ctx RNG. */
DG_API dg_tensor *dg_rand(dg_ctx *ctx, int ndim, const int64_t *shape, float lo, float hi);
DG_API dg_tensor *dg_randn(dg_ctx *ctx, int ndim, const int64_t *shape, float mean, float std);
/* Dtype conversion (f32 <-> f16/bf16/f64, ints <-> f32); not differentiable. */
DG_API dg_tensor *dg_to_dtype(dg_ctx *ctx, dg_tensor *t, dg_dtype dt);

/* ---- persistent tensors (caller-owned) ---- */

/* These three have no object to hold a failure's detail: err (cap bytes, may
 * be NULL) receives it. */
DG_API int dg_tensor_new(dg_tensor **out, dg_dtype dt, int ndim, const int64_t *shape,
                         char *err, size_t cap);
/* A view sharing t's storage (kept alive by reference count). ndim/shape give
 * the new shape; strides are contiguous from element `offset` of t. */
DG_API int dg_tensor_view(dg_tensor **out, dg_tensor *t, int64_t offset, int ndim,
                          const int64_t *shape, char *err, size_t cap);
DG_API void dg_tensor_free(dg_tensor *t);
/* Copies src into dst (same shape; converts dtype). */
DG_API int dg_tensor_copy(dg_tensor *dst, const dg_tensor *src, char *err, size_t cap);

/* ---- inspection (any tensor) ---- */

DG_API int dg_tensor_ndim(const dg_tensor *t);
DG_API int64_t dg_tensor_dim(const dg_tensor *t, int i); /* negative i from the end */
DG_API const int64_t *dg_tensor_shape(const dg_tensor *t);
DG_API const int64_t *dg_tensor_strides(const dg_tensor *t); /* in elements */
DG_API int64_t dg_tensor_numel(const dg_tensor *t);
DG_API dg_dtype dg_tensor_dtype(const dg_tensor *t);
DG_API int dg_tensor_device(const dg_tensor *t);
DG_API int dg_tensor_is_contiguous(const dg_tensor *t);
DG_API void *dg_tensor_data(const dg_tensor *t); /* first element */
/* Value of a one-element tensor (any shape with numel 1) as float
 * (f32/f16/bf16/ints). NAN when t is NULL or holds any other number of
 * elements (where torch's item() raises): test with isnan(). */
DG_API float dg_tensor_item(const dg_tensor *t);
/* Element at flat logical index i (follows strides), as double. */
DG_API double dg_tensor_get(const dg_tensor *t, int64_t i);
/* Gradient after dg_backward, or NULL. Same shape, contiguous, f32. Leaves
 * (parameters, inputs marked requires-grad) keep theirs; an intermediate
 * result's gradient is released during backward once its node has run (its
 * buffer is reused), as torch does for non-leaf tensors. */
DG_API dg_tensor *dg_tensor_grad(const dg_tensor *t);
DG_API void dg_tensor_set_requires_grad(dg_tensor *t, int on);
DG_API int dg_tensor_requires_grad(const dg_tensor *t);
DG_API const char *dg_tensor_name(const dg_tensor *t); /* parameters: their name */
/* "(64, 512) f32" into buf; returns buf. */
DG_API char *dg_tensor_shape_str(const dg_tensor *t, char *buf, size_t cap);

/* ---- parameter store: flat value and gradient buffers, named views ---- */

/* Fails only on a NULL out (DG_EINVAL) or memory (DG_ENOMEM). */
DG_API int dg_params_new(dg_params **out);
/* Freeing a store still attached to a context detaches it and logs a warning
 * (no return value to carry it). */
DG_API void dg_params_free(dg_params *ps);
/* Detail of the last failing call on the store ("" when none): params_add,
 * relayout, companions, dg_clip_grad_norm, dg_module_bind, and a pending
 * update that failed in the background. */
DG_API const char *dg_params_errmsg(const dg_params *ps);
/* Registers an f32 parameter; values start at zero (see nn init). Registration
 * order is fixed: it is the enumeration order, the flat-buffer order and the
 * checkpoint order. Fails with DG_EINVAL on a duplicate name. The returned
 * tensor is owned by the store; its address stays valid, its data pointer
 * may move while parameters are still being added. */
DG_API int dg_params_add(dg_params *ps, const char *name, int ndim, const int64_t *shape,
                         dg_tensor **out);
DG_API int dg_params_count(const dg_params *ps);
DG_API dg_tensor *dg_params_get(const dg_params *ps, int i);
DG_API dg_tensor *dg_params_find(const dg_params *ps, const char *name);
/* Index of a parameter tensor in its store, or -1. */
DG_API int dg_tensor_param_index(const dg_tensor *t);
DG_API dg_params *dg_tensor_param_store(const dg_tensor *t);
/* Element offset of parameter i in the flat buffers. */
DG_API size_t dg_params_offset(const dg_params *ps, int i);
/* Flat buffers: n floats each (includes alignment padding between params,
 * always zero). */
DG_API float *dg_params_data(dg_params *ps, size_t *n);
DG_API float *dg_params_grad(dg_params *ps, size_t *n);
/* O(parameters), no memset: every gradient is marked stale, backward's first
 * write overwrites it, and dg_params_grad / dg_tensor_grad zero any segment
 * still stale before returning it. So read gradients through those calls
 * after zero_grad, not through a pointer kept from before. */
DG_API void dg_params_zero_grad(dg_params *ps);
/* Freeze / unfreeze a parameter (no gradient, skipped by optimizers). */
DG_API void dg_params_set_trainable(dg_params *ps, int i, int on);
DG_API int dg_params_trainable(const dg_params *ps, int i);

/* Re-lays the flat buffers so parameters sit in `order` (a permutation of
 * 0..n-1); enumeration order and names do not change, only offsets. DDP uses
 * it to make gradient buckets contiguous in the order gradients become ready.
 * Values, gradients and every companion buffer move with their parameter. */
DG_API int dg_params_relayout(dg_params *ps, const int *order);
/* Registers a buffer laid out like the flat value buffer (e.g. optimizer
 * state, dg_params_data's n floats) so dg_params_relayout permutes it too.
 * The buffer must stay valid until removed or the store is freed. */
DG_API int dg_params_add_companion(dg_params *ps, float *buf);
DG_API int dg_params_remove_companion(dg_params *ps, float *buf);

/* ---- buffers: persistent state that is not a parameter (torch's buffers,
 * e.g. BatchNorm's running statistics) ---- */

/* Registers an f32 buffer named `name`; values start at zero. Buffers share
 * the parameters' names (a name taken by either is refused, DG_EINVAL) and
 * nothing else: no gradient, not counted by dg_params_count nor returned by
 * dg_params_get / dg_params_find, never touched by optimizers, gradient
 * clipping or DDP's buckets. Checkpoints save and load them under their
 * names (after the parameters); DDP broadcasts them from rank 0
 * (dg_ddp_new, dg_ddp_broadcast_buffers). dg_tensor_name gives the name;
 * dg_tensor_param_index is -1. They live in a flat buffer of their own, in
 * registration order; the returned tensor is owned by the store, its
 * address stays valid, its data pointer may move while buffers are added.
 * Like parameters, they are added before DDP wraps the store (else
 * DG_ESTATE where DDP holds its gradients). Values are f32 only (torch's
 * integer num_batches_tracked has no counterpart). */
DG_API int dg_params_add_buffer(dg_params *ps, const char *name, int ndim, const int64_t *shape,
                                dg_tensor **out);
DG_API int dg_params_buffer_count(const dg_params *ps);
DG_API dg_tensor *dg_params_buffer_get(const dg_params *ps, int i);
DG_API dg_tensor *dg_params_buffer_find(const dg_params *ps, const char *name);
/* The flat buffer: n floats (alignment padding between buffers included,
 * always zero). */
DG_API float *dg_params_buffer_data(dg_params *ps, size_t *n);

/* ---- memory statistics per device (caching allocator) ---- */

typedef struct {
  size_t current_bytes; /* in tensors and arenas now */
  size_t peak_bytes;
  size_t cached_bytes;  /* freed but kept for reuse */
  uint64_t alloc_count; /* allocations served (cache hits included) */
  uint64_t system_allocs; /* allocations that reached the system allocator */
} dg_mem_stats;

DG_API int dg_mem_get_stats(int device, dg_mem_stats *out);
DG_API void dg_mem_reset_peak(int device);
/* Returns cached blocks to the system. */
DG_API void dg_mem_empty_cache(int device);

#ifdef __cplusplus
}
#endif
#endif /* DGRAD_TENSOR_H */
