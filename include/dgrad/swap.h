/* dgrad/swap.h — activation swapping: the tensors a forward saves for
 * backward leave memory while forward runs and come back, prefetched, just
 * before backward needs them.
 *
 * One call turns it on for a context:
 *
 *   dg_swap_opts o;
 *   dg_swap_opts_init(&o);             // lookahead 2, 256 KiB threshold
 *   o.target = DG_SWAP_FILE;           // or DG_SWAP_BF16, or both
 *   o.dir = "/var/tmp";                // local storage for the swap file
 *   if (dg_ctx_set_swap(ctx, &o)) ...  // dg_ctx_errmsg(ctx) says why
 *
 * It is built on the saved-tensor hooks of autograd.h (it installs the
 * pair; a context has either swapping or user hooks). The tape is linear, so
 * backward reads saved tensors in exactly the reverse order forward saved
 * them and the prefetch is exact.
 *
 * How (CPU context): a saved tensor (any dtype) of at least min_bytes that
 * lives in the context's arena is handed to a background I/O thread once the
 * op that saved it has returned; the whole pages inside its data are written
 * to the swap file (DG_SWAP_FILE) or packed to bf16 in memory (DG_SWAP_BF16;
 * with both, bf16 is written to the file) and then released with
 * madvise(MADV_DONTNEED), so they leave the process's resident set. Backward
 * reads them back into the same addresses `lookahead` nodes before the node
 * that needs them runs. A forward op (or a raw accessor such as
 * dg_tensor_data) that reads a released tensor brings it back first, so
 * swapping never changes what an op reads (bf16 excepted: its values are
 * rounded). DG_SWAP_FILE alone is lossless: gradients are bit-identical to
 * a run without swapping. DG_SWAP_BF16 rounds each swapped element to bf16
 * (relative error at most 2^-9).
 *
 * Errors: a failed write or read, a full disk, or an I/O thread that misses
 * the deadline fails the next op or the backward with DG_EIO / DG_ETIMEDOUT
 * (or DG_ENOMEM), and dg_ctx_errmsg names the swap file, the op and node that
 * saved the tensor and its shape. No gradient is ever computed from data
 * that did not come back. A steady-state step makes no heap allocation.
 *
 * Device contexts: DG_SWAP_HOST (copies to a pinned host slab on a side
 * stream) is the target of a CUDA context and needs the CUDA backend, which
 * this release does not have: dg_ctx_set_swap refuses it with
 * DG_EUNSUPPORTED. Saved tensors on another device than the CPU are not
 * swapped by the CPU targets. */
#ifndef DGRAD_SWAP_H
#define DGRAD_SWAP_H

#include "dgrad/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
  DG_SWAP_FILE = 1u << 0, /* CPU: a file in `dir`, written and read by an I/O thread */
  DG_SWAP_BF16 = 1u << 1, /* CPU: f32 packed to bf16 in memory (or, with FILE, in the file) */
  DG_SWAP_HOST = 1u << 2, /* CUDA: a pinned host slab (needs the CUDA backend: not built) */
};

typedef struct dg_swap_opts {
  unsigned target;      /* DG_SWAP_* flags; 0 is refused (pass NULL to turn swapping off) */
  const char *dir;      /* DG_SWAP_FILE: directory on local storage (NULL: "/var/tmp");
                           the file is created there and unlinked at once */
  size_t min_bytes;     /* saved tensors smaller than this stay resident */
  int lookahead;        /* backward prefetches the saved tensors of this many nodes
                           ahead of the running one; 0: each is read when needed */
  size_t staging_bytes; /* bound on swapped bytes in flight: written-behind in forward
                           (forward waits beyond it) and prefetched ahead in backward
                           (0: no bound beyond lookahead) */
  int io_timeout_ms;    /* deadline of every wait for the I/O thread */
} dg_swap_opts;

/* Defaults: target 0 (set it), dir NULL, min_bytes 256 KiB, lookahead 2,
 * staging_bytes 0, io_timeout_ms 60000. */
DG_API void dg_swap_opts_init(dg_swap_opts *o);

/* Turns swapping on for ctx with opts (copied; dir too), or off with NULL.
 * Only between steps: DG_ESTATE while the tape holds nodes, inside a
 * backward, or while user saved-tensor hooks are set. Starts the I/O thread
 * and creates the swap file; a directory that is missing or not writable is
 * DG_EIO naming it. dg_ctx_free turns it off. */
DG_API int dg_ctx_set_swap(dg_ctx *ctx, const dg_swap_opts *opts);

/* Scope for a part of the model (a module, a pipeline stage's blocks): with
 * on = 0, tensors saved from now on stay resident until it is turned on
 * again. Returns the previous setting (0 when swapping is off). */
DG_API int dg_ctx_swap_scope(dg_ctx *ctx, int on);

typedef struct dg_swap_stats {
  uint64_t bytes_out;      /* bytes of saved tensors stored (before bf16 packing) */
  uint64_t bytes_in;       /* bytes brought back (prefetch, on demand, forward reads) */
  uint64_t stored_bytes;   /* bytes written to the file or packed (bf16 halves them) */
  uint64_t tensors_out, tensors_in;
  uint64_t forward_reads;  /* forward ops or raw accessors that brought a tensor back */
  uint64_t kept;           /* saved tensors left resident (small, other device, pinned) */
  double backward_wait_s;  /* time backward waited for a swapped tensor */
  double forward_wait_s;   /* time forward waited (staging bound, forward reads) */
  size_t peak_rss;         /* the largest VmRSS sampled when a backward starts and ends */
  size_t hwm_rss;          /* the process's VmHWM now (peak resident set since start) */
  size_t peak_out_bytes;   /* the most bytes released at one time */
  int backwards;           /* backwards since dg_ctx_set_swap or dg_ctx_swap_stats_reset */
} dg_swap_stats;

/* Statistics since dg_ctx_set_swap or the last reset of them. DG_ESTATE when
 * swapping is off. The reset also restarts the process's VmHWM (Linux
 * /proc/self/clear_refs), so hwm_rss is the peak since then. */
DG_API int dg_ctx_swap_stats(const dg_ctx *ctx, dg_swap_stats *out);
DG_API void dg_ctx_swap_stats_reset(dg_ctx *ctx);

#ifdef __cplusplus
}
#endif
#endif /* DGRAD_SWAP_H */
