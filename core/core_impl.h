/* Internal layout of contexts, tensors and parameter stores, and the helpers
 * every op file uses. Not API. */
#ifndef DG_TENSOR_IMPL_H
#define DG_TENSOR_IMPL_H

#include <stdarg.h>

#include "dgrad/autograd.h"
#include "dgrad/ops.h"
#include "dgrad/tensor.h"
#include "backends/backend.h"
#include "base/common_impl.h"

#define DG_ALIGN 64

enum {
  DG_TF_REQUIRES_GRAD = 1u << 0,
  DG_TF_ARENA = 1u << 1,  /* header lives in a ctx arena */
  DG_TF_PARAM = 1u << 2,  /* owned by a dg_params store */
  /* the gradient buffer holds garbage that logically reads as zero: the
   * first writer overwrites instead of adding (lazy zero_grad, fresh
   * activation gradients), and every other reader zeroes it first */
  DG_TF_GRAD_STALE = 1u << 3,
  /* a parameter with a pending writer (an update that lands later, e.g.
   * DDP overlapping the next forward with the all-reduce): every reader
   * waits at the fence (dg__fence, dg__settle) first */
  DG_TF_PENDING = 1u << 4,
  /* a buffer of a store (core/buffers.c; also DG_TF_PARAM: the store owns
   * it): its header is a dg__buffer_hdr, which carries its name */
  DG_TF_BUFFER = 1u << 5,
  /* the gradient buffer holds only masked contributions (zero where the
   * tensor, a ReLU's output, is not > 0): set by its first writer that
   * masked (a linear's input gradient, ops/matmul.c), cleared by any other
   * writer (dg__grad_buf_w) and by the producing node when it runs */
  DG_TF_GRAD_RELU = 1u << 6,
};

typedef struct dg_storage {
  void *base;
  size_t nbytes;
  int device;
  int refcount;
} dg_storage;

struct dg_node;

struct dg_tensor {
  void *data;                 /* first element */
  int64_t shape[DG_MAX_DIMS];
  int64_t stride[DG_MAX_DIMS]; /* elements */
  int ndim;
  dg_dtype dtype;
  int device;
  uint32_t flags;
  dg_tensor *grad;            /* contiguous f32, same shape; NULL until needed */
  struct dg_node *node;       /* producing node on the tape, or NULL (leaf) */
  dg_storage *storage;        /* persistent tensors: shared storage; else NULL */
  dg_params *params;          /* parameters: their store */
  int param_id;               /* index in the store, or -1 */
};

/* ---- arena ---- */

/* A chunk's header is host memory; its bytes are memory of the arena's
 * device (core's caching allocator), so a device arena never needs the host
 * to address its blocks. */
typedef struct dg_arena_chunk {
  struct dg_arena_chunk *next;
  char *mem;
  size_t cap, used;
} dg_arena_chunk;

typedef struct {
  int device; /* where the chunks' bytes live */
  dg_arena_chunk *head, *cur;
  size_t used, peak, reserved;
  struct dg_ctx *owner; /* a context's arena: its growth is watched (NULL: not) */
  size_t step_max; /* the most a step used (at a reset, or a step boundary) */
  /* where the chunks merged away at the last reset were: a pointer there is
   * a tensor of an earlier step, told without reading freed memory */
  struct { uintptr_t lo, hi; } gone[8]; /* addresses only: the bytes are freed */
  int ngone;
} dg_arena;

void *dg__arena_alloc(dg_arena *a, size_t n);
/* 1 when p lies in the part of a's chunks handed out since the last reset,
 * -1 in the rest of a chunk or in a chunk merged away at the last reset
 * (handed out before it), 0 elsewhere. */
int dg__arena_live(const dg_arena *a, const void *p);
/* The owner's say before its arena a takes a new chunk of *cap bytes for a
 * block of n: the context's arena_limit may shrink *cap or refuse (returns
 * nonzero, error recorded), and growth without dg_ctx_reset is warned of. */
int dg__ctx_arena_grow(struct dg_ctx *ctx, dg_arena *a, size_t n, size_t *cap);
/* A backward ended on ctx; epoch: the sum of the zero_grad counts of the
 * stores it involved. A changed epoch without a reset is a training step
 * boundary passed without dg_ctx_reset (micro-batches of one step share an
 * epoch): the first one marks the step's size. */
void dg__ctx_backward_done(struct dg_ctx *ctx, uint64_t epoch);
void dg__arena_reset(dg_arena *a);
void dg__arena_free(dg_arena *a);

/* ---- autograd node ---- */

#define DG_NODE_MAX_IN 6
#define DG_NODE_MAX_SAVED 4

typedef struct dg_node dg_node;
/* Accumulates gradients for node->in[] from node->out->grad. Returns DG_OK
 * or an error code (with dg__set_error on ctx). */
typedef int (*dg_backward_fn)(dg_ctx *ctx, dg_node *node);

struct dg_node {
  const char *op;
  dg_backward_fn backward;
  dg_tensor *out;
  int nin, nsaved, index;
  dg_tensor *in[DG_NODE_MAX_IN];
  void *saved[DG_NODE_MAX_SAVED]; /* tensor, or pack-hook handle */
  double f[4];                    /* op scalar attributes */
  int64_t i[4];
  void *extra;                    /* op-specific arena data */
  int release_out;                /* first node recorded for `out`: its
                                     gradient is dead once this node ran */
  int consumed;                   /* a backward walked it: a second backward
                                     through it is an error */
};

typedef struct {
  int id;
  dg_grad_ready_fn ready;
  dg_backward_end_fn end;
  void *user;
} dg_hook;

#define DG_MAX_HOOKS 8
#define DG_MAX_STORES 8

/* One store's part of a context's current backward: which node first used
 * each parameter (its gradient is final once backward passes that node),
 * which parameters backward reached, which ready hooks fired. It lives on
 * the context, so forwards on several contexts over one store (micro-batch
 * i's tape pending while i+1's forward runs, or two threads) never write
 * the store. The arrays are kept across steps and grown to the store. */
typedef struct {
  dg_params *ps;
  int cap;
  int *first_use; /* tape index, -1 when unused */
  uint8_t *reached, *fired;
} dg_tape_store;

struct dg_ctx {
  dg_arena arena; /* host: headers, tape nodes, CPU tensor data */
  /* tensor data of other devices, one arena each, made on first use */
  dg_arena *dev_arena[DG__MAX_DEVICES];
  /* the device the running op (or backward node, or constructor) computes
   * on: dg__new and step scratch put their data there. dg__op_begin sets it
   * from the inputs, backward from each node's output. */
  int op_device;
  int err;
  char errmsg[512];
  int grad_enabled, train;
  uint64_t rng_seed, rng_offset;
  dg_node **tape;
  int ntape, tape_cap;
  dg_tape_store stores[DG_MAX_STORES]; /* involved in the current tape */
  int nstores;
  dg_params *attached[DG_MAX_STORES];
  int nattached;
  dg_hook ready_hooks[DG_MAX_HOOKS], end_hooks[DG_MAX_HOOKS];
  int nready_hooks, nend_hooks, next_hook_id;
  dg_pack_fn pack;
  dg_unpack_fn unpack;
  void *pack_user;
  int pack_id;
  int in_backward;
  /* Growth watch (forgotten dg_ctx_reset; each arena's step_max): backwards
   * and step boundaries since the last reset, the zero_grad epoch of the
   * last backward, whether the one warning was given, and the options'
   * arena_limit (0: none). */
  size_t arena_limit;
  int backwards_since_reset, steps_since_reset, grow_warned;
  uint64_t bwd_epoch;
  /* Backward gradient buffers of intermediates are dead once their node has
   * run: they go on free lists by exact byte size and are reused within the
   * step, so backward needs a few buffers instead of one per activation. */
  struct {
    size_t bytes;
    void *head;
  } gpool[32];
  /* activation swapping (autograd/swap.c): NULL when off; core calls it
   * through swap_vt where ops start, at a reset and at free */
  struct dg__swap *swap;
  const struct dg__swap_vt *swap_vt;
};

/* ---- activation swapping (autograd/swap.c, include/dgrad/swap.h) ---- */
struct dg__swap;
typedef struct dg__swap_vt {
  /* an op is about to read in[0..n): released inputs come back first;
   * nonzero with the error recorded on the swap's context */
  int (*op_begin)(struct dg__swap *s, const char *op, int n, dg_tensor *const *in);
  void (*reset)(struct dg__swap *s); /* dg_ctx_reset: drains the I/O thread */
  void (*free)(struct dg__swap *s);  /* dg_ctx_free */
} dg__swap_vt;
/* Set while any context swaps: a raw accessor's read of arena tensor t
 * brings it back and keeps it resident for the rest of the step. */
extern void (*volatile dg__swap_touch)(const dg_tensor *t);

#define DG__SETTLE_ALL (-1)
#define DG__SETTLE_BACKWARD (-2)
typedef int (*dg__writer_fn)(void *user, dg_params *ps, int i, char *err, size_t cap);

/* A store's buffers (core/buffers.c): persistent f32 state that is not a
 * parameter (running statistics), in a flat buffer of their own, so no
 * code that walks parameters (optimizers, clipping, DDP buckets, the tape)
 * sees them. */
typedef struct {
  int n, cap;
  dg_tensor **t;      /* headers (dg__buffer_hdr), registration order */
  size_t *offset;     /* element offsets in data */
  size_t total, used; /* floats allocated / in use */
  float *data;
} dg__buffers;

struct dg_params {
  int n, cap;
  dg_tensor **t;      /* headers (heap) */
  char **names;
  size_t *offset;     /* element offsets in the flat buffers */
  uint8_t *trainable;
  size_t total;       /* floats allocated in each flat buffer */
  size_t used_total;  /* floats in use (end of the last parameter) */
  float *data, *grad; /* flat buffers */
  /* the last backward's outcome (written when a backward ends) */
  uint8_t *reached;
  int unreached;
  dg_ctx *attached_to[DG_MAX_STORES]; /* contexts that attached the store */
  int nattached_to;
  float **companions; /* buffers laid out like data (optimizer state) */
  int ncompanions;
  int grad_lent;      /* grad is someone else's memory (DDP's shared segment) */
  int data_lent;      /* data is one copy shared by a DDP's ranks (sharded update) */
  /* The pending writer of parameters flagged DG_TF_PENDING: writer(user,
   * ps, i, ..) brings parameter i up to date, i = DG__SETTLE_ALL every
   * parameter, DG__SETTLE_BACKWARD every parameter before a backward writes
   * gradients. Set by whoever owns the update (today DDP's overlap mode). */
  dg__writer_fn writer;
  void *writer_user;
  int update_owned;   /* the writer applies the optimizer step (no global clipping) */
  /* Why an optimizer step must wait ("" when it need not): set by DDP while
   * the gradients are one rank's partial sum inside an accumulation window,
   * cleared by the synchronising backward, zero_grad and dg_ddp_free. */
  char step_block[200];
  uint64_t zero_grads; /* dg_params_zero_grad calls: training step boundaries */
  dg__buffers buf;    /* buffers (dg_params_add_buffer) */
  char errmsg[256];   /* the last failure of a call on the store */
};

/* Records the detail of a failing call on ps (non-NULL) for dg_params_errmsg;
 * returns code. */
#define dg__params_fail(ps, code, ...) \
  dg__fail_msg((ps)->errmsg, sizeof (ps)->errmsg, code, __VA_ARGS__)

/* ---- errors ---- */

/* Records an error on ctx (first error wins until dg_ctx_clear_error / reset)
 * and returns code. */
int dg__set_error(dg_ctx *ctx, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* For ops: returns 1 (and records DG_EINVAL "op: input NAME is NULL" unless
 * an earlier error is kept) when t is NULL. */
int dg__null_input(dg_ctx *ctx, const char *op, const char *what, const dg_tensor *t);
/* Checks t is f32 on CPU; records "op: NAME must be f32, got (..) bf16". */
int dg__check_f32(dg_ctx *ctx, const char *op, const char *what, const dg_tensor *t);

/* ---- the op prologue ---- */

#define DG__OPT(k) (1u << (k)) /* input k (< 32) may be NULL; later inputs are required */
/* Every op passes this first: each input in[k] (named names[k] in
 * messages) must be non-NULL unless optional; a parameter with a pending
 * writer is waited for (the fence); all inputs must be on one device
 * (DG_EDEVICE naming the op and both devices). Returns that device's
 * backend, or NULL with the error recorded (ctx NULL: NULL). */
const dg__backend *dg__op_begin(dg_ctx *ctx, const char *op, int n, dg_tensor *const *in,
                                const char *const *names, unsigned optional);

/* The fence, in two forms. Ops wait in their input check (dg__check_f32),
 * views in dg__alias and conversions in dg_to_dtype through dg__fence:
 * the pending writer of parameter t lands its update first, and a failure
 * is recorded on ctx naming op and returned. Raw accessors (data and
 * gradient pointers, element reads, optimizer state, checkpoints) call
 * dg__settle, which logs a failure instead. */
int dg__fence(dg_ctx *ctx, const char *op, const dg_tensor *t);
/* Brings every parameter of ps up to date (`i` as for the writer); failures
 * are logged and returned. */
int dg__params_flush(dg_params *ps, int i);
/* Installs (fn non-NULL) or removes the pending writer of ps; removing it
 * clears every parameter's pending flag. */
void dg__params_set_writer(dg_params *ps, dg__writer_fn fn, void *user);
/* 1 when ps has a pending writer (installed with `user`, or any when user
 * is NULL). */
int dg__params_has_writer(const dg_params *ps, const void *user);
/* Marks parameter i of ps as having (on) or not having a pending update. */
void dg__param_set_pending(dg_params *ps, int i, int on);
/* Sets (why non-NULL, formatted) or clears ps->step_block. */
void dg__params_block_step(dg_params *ps, const char *why, ...)
    __attribute__((format(printf, 2, 3)));
/* The pending writer applies the optimizer step (global clipping refused). */
void dg__params_set_update_owned(dg_params *ps, int on);
static inline void dg__settle(const dg_tensor *t) {
  if (t && (t->flags & DG_TF_PENDING)) (void)dg__params_flush(t->params, t->param_id);
  if (t && (t->flags & DG_TF_ARENA) && dg__swap_touch) dg__swap_touch(t);
}

/* ---- tensor helpers ---- */

/* Fills header t (zeroed first): contiguous over data on device, not a
 * parameter, no gradient. Returns t. */
dg_tensor *dg__tensor_init(dg_tensor *t, void *data, int device, dg_dtype dt, int ndim,
                           const int64_t *shape, uint32_t flags);
/* New contiguous arena tensor (uninitialised). Records ENOMEM naming `op`. */
dg_tensor *dg__new(dg_ctx *ctx, const char *op, dg_dtype dt, int ndim, const int64_t *shape);
/* New arena tensor with x's shape, f32. */
dg_tensor *dg__new_like(dg_ctx *ctx, const char *op, const dg_tensor *x);
/* Arena header that aliases x (for views); shape/strides to be filled. */
dg_tensor *dg__alias(dg_ctx *ctx, const char *op, dg_tensor *x);
void dg__set_contig_strides(dg_tensor *t);
int dg__is_contig(const dg_tensor *t);
int dg__same_shape(const dg_tensor *a, const dg_tensor *b);
int64_t dg__numel(const dg_tensor *t);
/* Writes "(a, b, c)" into buf. */
const char *dg__shape_str(const dg_tensor *t, char *buf, size_t cap);
const char *dg__dims_str(int ndim, const int64_t *shape, char *buf, size_t cap);
/* Largest tensor in bytes: 2^62, so byte offsets, strides and the arena's
 * rounding never overflow. */
#define DG_MAX_BYTES ((int64_t)1 << 62)
/* Elements of shape, or -1 when a size is negative or the shape spans more
 * than DG_MAX_BYTES at es bytes an element (zero-size dims counted as 1,
 * so that strides fit as well). */
int64_t dg__shape_numel(int ndim, const int64_t *shape, size_t es);
/* DG_OK, or DG_EINVAL with msg naming the bad ndim, dtype or shape. */
int dg__shape_error(int ndim, const int64_t *shape, dg_dtype dt, char *msg, size_t cap);
/* Contiguous f32 data of x: x->data itself, or a packed arena copy. */
const float *dg__contig_data(dg_ctx *ctx, const char *op, dg_tensor *x);
/* A packed copy of x, of x's dtype, where x lives (an arena tensor of ctx). */
dg_tensor *dg__contig_copy(dg_ctx *ctx, const char *op, dg_tensor *x);
/* Indices of i32/i64 tensor t (any strides) as a contiguous int64 copy on
 * the op's device, each checked to lie in [0, limit): otherwise NULL and
 * "op: <what> V <where> K is outside [0, limit)" (what: "index", "target";
 * where: "at position", "in row"). */
int64_t *dg__index_data(dg_ctx *ctx, const char *op, const char *what, const char *where,
                        dg_tensor *t, int64_t limit);
/* `bytes` of step memory on `device` (ctx->arena for the CPU, else that
 * device's arena, made on first use); NULL when out of memory. */
void *dg__arena_data(dg_ctx *ctx, int device, size_t bytes);
/* Step memory for a kernel of the running op: on its device. */
static inline void *dg__op_data(dg_ctx *ctx, size_t bytes) {
  return dg__arena_data(ctx, ctx->op_device, bytes);
}
/* The backend of t's device (it exists: t was made on it). */
static inline const dg__backend *dg__be_of(const dg_tensor *t) {
  return dg__backend_get(t->device);
}

/* ---- autograd helpers for ops ---- */

/* 1 when grad mode is on and any input requires grad. */
int dg__needs_grad(dg_ctx *ctx, int nin, dg_tensor *const *in);
/* Records a node producing `out` from inputs (marks out requires-grad).
 * Returns NULL (and records ENOMEM) on failure; callers then return NULL. */
dg_node *dg__record(dg_ctx *ctx, const char *op, dg_backward_fn fn, dg_tensor *out,
                    int nin, dg_tensor *const *in);
/* Saves a tensor for backward through the pack hook. */
int dg__save(dg_ctx *ctx, dg_node *node, dg_tensor *t);
/* Retrieves saved tensor k through the unpack hook (NULL on failure). */
dg_tensor *dg__saved(dg_ctx *ctx, dg_node *node, int k);
/* Gradient buffer of t (contiguous, t's logical shape), created zeroed on
 * first use; NULL when t needs no gradient (or ENOMEM: check ctx->err). */
float *dg__grad_buf(dg_ctx *ctx, dg_tensor *t);
/* Like dg__grad_buf, but when the buffer is stale (logically zero) it is not
 * cleared and *overwrite is set: the caller must then write (=) every
 * element instead of adding. */
float *dg__grad_buf_w(dg_ctx *ctx, dg_tensor *t, int *overwrite);
/* Step scratch: an arena block of `bytes`, from the pool of dead buffers of
 * that size when there is one (NULL and ENOMEM on failure); give it back
 * when done so later ops of the step (forward or backward) reuse it. */
void *dg__scratch_take(dg_ctx *ctx, size_t bytes);
void dg__scratch_give(dg_ctx *ctx, void *p, size_t bytes);
/* Zeroes a parameter's stale gradient segment now (readers outside
 * backward). */
void dg__param_grad_materialize(dg_tensor *t);
/* Raw flat gradient buffer without materialising stale segments (for code
 * that reads only parameters whose gradient is final, e.g. DDP buckets). */
float *dg__params_grad_raw(dg_params *ps);
/* Moves the flat gradient buffer into `buf` (at least used_total floats,
 * owned by the caller, e.g. DDP's shared-memory segment) or, with NULL,
 * back into a private allocation; views follow. While lent, parameters
 * cannot be added (DG_ESTATE). */
int dg__params_lend_grad(dg_params *ps, float *buf);
/* Points the flat value buffer at `buf` (at least used_total floats, the
 * values already copied in by the caller; DDP's shared segment while the
 * update is sharded) and returns the previous buffer, which the caller
 * keeps and swaps back before the store is freed; `lent` marks the values
 * shared (dg_optim_step of another optimizer is refused). Views follow. Only while the gradients are lent too, so
 * no parameter can be added meanwhile. */
float *dg__params_swap_data(dg_params *ps, float *buf, int lent);
/* 1 when t takes a gradient. */
static inline int dg__wants_grad(const dg_tensor *t) {
  return t && (t->flags & DG_TF_REQUIRES_GRAD);
}

/* Forgets every context's attachment of ps (dg_params_free). */
void dg__params_detach_all(dg_params *ps);
/* core/buffers.c: the name of buffer header t (DG_TF_BUFFER); frees a
 * store's buffers (dg_params_free). */
const char *dg__buffer_name(const dg_tensor *t);
void dg__params_free_buffers(dg_params *ps);

/* ---- RNG (the generator: base/rng_impl.h) ---- */
/* Draws n uniforms from ctx's stream and advances it. */
void dg__ctx_uniform(dg_ctx *ctx, float *out, size_t n);

/* ---- storage allocator (caching, with stats) ---- */
void *dg__dev_alloc(int device, size_t nbytes);
void dg__dev_free(int device, void *p, size_t nbytes);
/* Returns a block to the system instead of the cache (one-off big blocks). */
void dg__dev_release(int device, void *p, size_t nbytes);

#endif
