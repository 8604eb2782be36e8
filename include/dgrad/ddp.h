/* dgrad/ddp.h — data-parallel training: wrap a parameter store and a process
 * group, train as on one process, get the same model.
 *
 *   dg_ddp *ddp;
 *   dg_ddp_new(&ddp, ctx, ps, pg, NULL, err, cap); // broadcast + verify
 *   for (each batch) {
 *     loss = forward(ctx, my_shard_of_batch);
 *     dg_backward(ctx, loss);                       // all-reduce overlapped
 *     if (dg_ddp_step_ready(ddp)) {                 // end of accumulation
 *       dg_optim_step(opt);
 *       dg_params_zero_grad(ps);
 *     }
 *     dg_ctx_reset(ctx);
 *   }
 *   dg_ddp_join(ddp);      // every rank, once, when its data runs out
 *
 * What happens. dg_ddp_new broadcasts the parameter values (the whole flat
 * value buffer, frozen parameters included), the store's buffers
 * (dg_params_add_buffer: BatchNorm's running statistics) and opts->buffers
 * from rank 0 and checks that every rank has the same parameters (count,
 * names, shapes, dtypes, trainable flags), the same store buffers (names,
 * shapes) and the same DDP options; a mismatch fails every
 * rank with DG_EMISMATCH and a message (dg_ctx_errmsg(ctx)) naming the first
 * differing parameter and the two ranks.
 *
 * Buckets. Trainable parameters are grouped into buckets of at most
 * bucket_cap_bytes (the first bucket first_bucket_bytes; a parameter that
 * would overflow a non-empty bucket starts the next one, so a parameter larger
 * than the cap gets a bucket of its own), in reverse registration order. A bucket is a contiguous slice of the store's
 * flat gradient buffer: gradients are views into bucket memory and nothing is
 * copied. At the end of the first synchronising backward, before any bucket's
 * all-reduce starts (that backward has no overlap), the store is re-laid out
 * (dg_params_relayout) in the order gradients became ready on rank 0 and the
 * buckets are rebuilt from it, so a bucket's gradients finish together and
 * every step, the first included, sums each element in the same order (a
 * resumed run stays bit-exact). After that backward, parameter offsets have
 * changed: re-read
 * dg_tensor_data / dg_params_offset rather than keeping raw pointers across
 * it (tensor handles stay valid; optimizer state moves along).
 *
 * Overlap. A bucket's all-reduce starts from the grad-ready hook as soon as
 * its last gradient is final, while backward goes on; buckets start in bucket
 * order on every rank. The backward-end hook waits for all (each wait bounded
 * by the group's timeout) and divides: gradients are averaged over the ranks
 * that contributed data. A failure (dead peer, timeout) becomes dg_backward's
 * result and dg_ctx_errmsg(ctx) names the step, the bucket and the failing
 * operation and peer (from dg_pg_errmsg).
 *
 * Unused parameters. A parameter the backward did not reach counts as zero
 * gradient in the average; nothing to configure. Their names are logged once
 * at DG_LOG_INFO.
 *
 * Accumulation. With accum_steps = K, only every K-th backward synchronises;
 * the others only accumulate locally (no communication). On the boundary DDP
 * divides the accumulated gradient by K (so keep the loss a per-micro-batch
 * mean, as on one process): with equal micro-batches the result equals one
 * step on the K micro-batches of all ranks concatenated. dg_ddp_set_sync(0)
 * opens a manual no-sync scope (like torch's no_sync): backwards inside it do
 * not communicate and do not count towards accum_steps, and no extra division
 * is applied (scale the loss yourself).
 *
 * Uneven inputs (Join). Each synchronising step carries a "ranks with data"
 * count: with the built-in comm hooks it rides as one extra element in
 * bucket 0's all-reduce (no extra collective; f32 buckets are staged for
 * that, fp16/bf16 ones already are); with a user hook it is a separate
 * one-integer all-reduce posted at the first grad-ready hook, overlapping
 * backward. A rank whose
 * data has run out calls dg_ddp_join: it keeps answering the other ranks'
 * steps with zero gradients until every rank has joined, and the others
 * divide by the number of ranks still training, so nobody waits forever.
 * Every rank calls dg_ddp_join once, after its last step. When all have
 * joined, parameter values (and the store's buffers) are broadcast from a
 * rank that trained longest,
 * so every rank ends with the same model (optimizer state is not synced,
 * except that a sharded update keeps one: see "The sharded update").
 * opts.no_join = 1 drops the per-step count for groups known to be even;
 * dg_ddp_join then returns DG_ESTATE.
 *
 * Distributed sampling: dg_ddp_loader_opts fills dg_loader_opts (data.h) for
 * this rank: equal shards (pad by wrapping, or drop_last), reshuffled per
 * epoch from a seed shared by all ranks.
 *
 * Ownership. A dg_ddp borrows ctx, ps and pg (they must outlive it) and
 * installs a grad-ready and a backward-end hook on ctx plus attaches ps to
 * it; dg_ddp_free removes the hooks. dg_ddp_free(NULL) is a no-op.
 *
 * Overlap with the next forward. dg_ddp_overlap_optimizer(ddp, opt) hands
 * the optimizer step to DDP, and backward no longer waits for the
 * all-reduces: each bucket's update is applied when the next forward first
 * reads one of its parameters (an op, a view, dg_tensor_data), so
 * communication also overlaps forward, not only backward. Buckets a forward
 * needs first are averaged first (shared-memory path). The result is
 * exactly that of the loop above. In this mode dg_ddp_step_ready is always
 * 0 and dg_optim_step on that optimizer fails (DG_ESTATE): keep the loop as
 * it is, or drop the step and zero_grad. The gradients are zeroed by the
 * next backward. Set a learning-rate schedule before backward as usual: the
 * update uses the rate in force when backward ended. Global-norm clipping
 * cannot run in this mode (it needs every gradient before any update):
 * dg_clip_grad_norm returns DG_ESTATE.
 * Raw access (dg_params_data, dg_params_grad, dg_tensor_data,
 * dg_optim_state_get, so a checkpoint) waits for the pending update first; dg_ddp_flush applies it explicitly
 * and reports a failure (a dead peer then fails the op that reads a
 * parameter, naming the rank). dg_ddp_free and dg_ddp_join apply it too.
 *
 * The sharded update. In overlap mode, between ranks of one host on the
 * shared gradient segment (the built-in f32 reduction), with SGD or AdamW
 * without parameter groups and the same settings on every rank, the update
 * is sharded from the second step on (opts.shard_update -1 turns it off;
 * the ranks decide in their first synchronising step, so hand the optimizer
 * over before it; with static_buckets it stays off):
 * the parameter values and the optimizer's state move into the segment,
 * one copy for all ranks, and whichever rank averages a block of a bucket
 * applies the update to that block there, straight from the average in
 * cache. No rank repeats the others' update, and a rank waiting for a late
 * peer takes over the peer's share of it with its share of the averaging.
 * The result is bit for bit that of every rank updating all of its own
 * copy. What changes for the program:
 *   - pointers into the values or the state (dg_params_data,
 *     dg_tensor_data, dg_optim_state_get) move at the first step and back
 *     at dg_ddp_free: take them again after either;
 *   - after an update, dg_params_grad holds this rank's own gradients (the
 *     average went into the update, not into the gradients);
 *   - the optimizer stays attached until dg_ddp_free
 *     (dg_ddp_overlap_optimizer with another one is DG_ESTATE), and gets no
 *     parameter groups; free the DDP before the optimizer (freed first, it
 *     takes a copy of its state back, and the next step fails on every
 *     rank with data, naming the cause); dg_optim_step of another
 *     optimizer on the store is DG_ESTATE (it would run once per rank);
 *   - after dg_ddp_join, every rank's optimizer takes the step count of
 *     the rank that trained longest (their state is one);
 *   - the learning rate of an update is the one in force when its
 *     backward began;
 *   - a value written on one rank is written on all (they are one copy).
 * dg_ddp_stats.sharded says whether it is on (the values shared). The
 * shared copy takes (1 + state buffers) x the parameter bytes of shared
 * memory per host, mapped when sharding starts (without room for it, the
 * update is not sharded); each rank keeps its private buffers meanwhile,
 * for dg_ddp_free.
 *
 * Threads. A dg_ddp is used by the thread that runs backward on its ctx (in
 * overlap mode also by the next forward's); its all-reduces run in the
 * group's worker thread, and, between ranks on one host, in that thread too
 * (at grad-ready hooks and while it waits for a bucket). Do not post other
 * collectives on the same group from another thread during a backward, or
 * while an update is pending. */
#ifndef DGRAD_DDP_H
#define DGRAD_DDP_H

#include <stddef.h>
#include <stdint.h>

#include "dgrad/common.h"
#include "dgrad/data.h"
#include "dgrad/dist.h"
#include "dgrad/nn.h"
#include "dgrad/optim.h"
#include "dgrad/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dg_ddp dg_ddp;

/* ---- communication hooks ---- */

/* One bucket, as a hook sees it. */
typedef struct {
  int index;      /* 0 .. nbuckets-1: the order buckets start in (same on all ranks) */
  int nbuckets;
  float *grad;    /* (n) f32: the bucket's slice of the flat gradient buffer */
  size_t n;       /* elements (alignment padding between parameters included; it is 0) */
  int world_size;
} dg_ddp_bucket;

/* A communication hook replaces the all-reduce of each bucket. start runs on
 * the backward thread as soon as the bucket is ready (and for every bucket of
 * a joined rank's shadow step, whose grad is all zero); it must not block for
 * long: post asynchronous collectives on pg and keep what finish needs in
 * *pending. finish runs at backward end, in bucket order, and must leave in
 * b->grad the value  scale * (sum over ranks of their b->grad)  — scale is
 * 1 / (ranks with data * accum divisor) — waiting for its works (dg_work_wait
 * is bounded by the group's timeout). Return DG_OK or a DG_E* code; the
 * message of a failed work should be copied with dg_ddp_hook_error so that
 * dg_backward reports it. release frees *pending when finish will not be
 * called (an earlier failure); it may be NULL when start allocates nothing.
 * All ranks must install the same hook (its name takes part in the check of
 * dg_ddp_new). Buckets may change size once (the rebuild in the first
 * synchronising step, before its buckets start): key per-bucket buffers by
 * index and size.
 *
 * The built-in hooks: plain f32 all-reduce (DG_DDP_COMM_F32, the default;
 * average in the collective, no extra pass when scale is 1/world), and
 * DG_DDP_COMM_FP16 / DG_DDP_COMM_BF16: multiply by 1/world while converting
 * the bucket to f16/bf16, all-reduce (sum) in that type, convert back while
 * multiplying by scale * world. */
typedef struct {
  const char *name; /* compared across ranks */
  void *state;
  int (*start)(void *state, dg_pg *pg, const dg_ddp_bucket *b, void **pending);
  int (*finish)(void *state, dg_pg *pg, const dg_ddp_bucket *b, void *pending, float scale);
  void (*release)(void *state, void *pending);
} dg_ddp_comm_hook;

typedef enum {
  DG_DDP_COMM_F32 = 0,
  DG_DDP_COMM_FP16 = 1,
  DG_DDP_COMM_BF16 = 2
} dg_ddp_comm;

/* ---- options ---- */

typedef struct {
  size_t bucket_cap_bytes;   /* 0: 25 MiB */
  size_t first_bucket_bytes; /* 0: 1 MiB */
  int accum_steps;           /* 0 or 1: every backward synchronises */
  dg_ddp_comm comm;          /* built-in reduction (ignored when hook is set) */
  const dg_ddp_comm_hook *hook; /* user hook (copied); NULL: `comm` */
  int no_join;         /* 1: no per-step "ranks with data" count (no Join) */
  int static_buckets;  /* 1: keep the initial buckets (no relayout/rebuild) */
  int no_overlap;      /* 1: start every all-reduce at backward end (a
                          baseline for measuring the overlap) */
  /* Tensors outside the store (e.g. running statistics) broadcast from rank
   * 0 by dg_ddp_new and dg_ddp_broadcast_buffers; contiguous, any dtype. */
  dg_tensor *const *buffers;
  int nbuffers;
  /* Ranks on one host with the built-in f32 reduction average buckets in a
   * shared gradient segment, on backward's thread (at grad-ready hooks) and
   * on a thread waiting for a bucket; an engine in the group's worker thread
   * helps during backward where it has a core of its own. 0: that engine
   * where every rank has a spare core; 1: always; -1: never. Ranks may
   * differ. Example and benchmark programs read DG_DDP_SHM_INLINE (1: -1,
   * 0: 1) into it. */
  int engine_thread;
  /* Overlap mode on the shared segment (see "The sharded update"): 0
   * shards the optimizer's update over the ranks where it applies; -1
   * never (every rank updates all of its own copy). Ranks may differ: the
   * update is sharded only when all agree. */
  int shard_update;
} dg_ddp_opts;

/* All defaults (zeros). */
DG_API dg_ddp_opts dg_ddp_defaults(void);

/* Collective: every rank of pg calls it. On failure *out is NULL and err
 * (cap bytes; may be NULL, then the reason is logged at WARN) says why
 * (DG_EMISMATCH: parameters or options differ between ranks; DG_EPEER /
 * DG_ETIMEDOUT: the broadcast failed; DG_EINVAL: bad options, or a store with
 * no trainable parameter). */
DG_API int dg_ddp_new(dg_ddp **out, dg_ctx *ctx, dg_params *ps, dg_pg *pg,
                      const dg_ddp_opts *opts, char *err, size_t cap);
DG_API void dg_ddp_free(dg_ddp *ddp);

/* No-sync scope: 0 makes the following backwards local only, 1 (default)
 * restores synchronisation. Returns the previous setting. */
DG_API int dg_ddp_set_sync(dg_ddp *ddp, int on);
/* 1 when the next backward will synchronise. */
DG_API int dg_ddp_will_sync(const dg_ddp *ddp);
/* 1 when the last backward synchronised (the gradients are averaged: step
 * the optimizer now, then zero the gradients). */
DG_API int dg_ddp_step_ready(const dg_ddp *ddp);

/* Hands opt's steps to DDP (see "Overlap with the next forward"); opt must
 * update this DDP's store. NULL gives the step back. DG_ESTATE inside a
 * step or when opt is already fused into backward or owned by a DDP. */
DG_API int dg_ddp_overlap_optimizer(dg_ddp *ddp, dg_optim *opt);
/* Applies a pending update now (every bucket). DG_OK or the failure. */
DG_API int dg_ddp_flush(dg_ddp *ddp);

/* Join (see above): returns when every rank has joined, after the final
 * parameter broadcast. DG_ESTATE with no_join, else DG_OK or the group's
 * failure (message in dg_ddp_errmsg). */
DG_API int dg_ddp_join(dg_ddp *ddp);

/* Broadcasts the store's buffers and opts->buffers from rank 0 again
 * (collective: every rank calls it at the same point). Plain BatchNorm
 * under DDP updates each rank's running statistics from its own shard, so
 * they drift apart: call this before evaluating or saving a checkpoint on
 * every rank (or once per step, which is what torch's DDP does with
 * broadcast_buffers=True, before each forward). SyncBatchNorm keeps them
 * identical on every rank without it. */
DG_API int dg_ddp_broadcast_buffers(dg_ddp *ddp);

/* Last failure ("" when none). */
DG_API const char *dg_ddp_errmsg(const dg_ddp *ddp);
/* For hooks: records msg as the detail of the hook's failure. */
DG_API void dg_ddp_hook_error(dg_ddp *ddp, const char *msg);

typedef struct {
  int nbuckets;
  int rebuilt;            /* 1 once buckets follow the observed ready order */
  int64_t sync_steps;     /* synchronising backwards with data */
  int64_t local_steps;    /* backwards without communication */
  int64_t shadow_steps;   /* steps answered while joined */
  int64_t overlapped_steps; /* updates applied during the next forward */
  double wait_s;          /* time spent waiting for buckets (backward end, or
                             the next forward's reads in overlap mode) */
  double bytes_reduced;   /* f32 gradient bytes put through hooks */
  int64_t peer_blocks;    /* shared segment: blocks of peers' share of the
                             averaging this rank did while waiting for them */
  int sharded;            /* 1: the update is sharded (one shared copy of the
                             values and the optimizer state) */
} dg_ddp_stats;

DG_API int dg_ddp_get_stats(const dg_ddp *ddp, dg_ddp_stats *out);
/* Bucket k: parameter count, bytes (f32), first parameter's index. */
DG_API int dg_ddp_bucket_info(const dg_ddp *ddp, int k, int *nparams, size_t *bytes, int *first);

/* ---- SyncBatchNorm ----
 *
 * BatchNorm (nn.h: dg_nn_batchnorm1d / 2d, same parameters, buffers and
 * train-mode rule) whose training statistics are those of the batch of the
 * whole group pg, as torch.nn.SyncBatchNorm: each forward all-gathers every
 * rank's per-channel count, mean and sum of squared deviations (f64) and
 * combines them (ranks may have different batch sizes, but each at least
 * one row: an empty batch on any rank fails every rank's forward with
 * DG_EINVAL), and each backward all-reduces per channel sum(dy) and
 * sum(dy * xhat), so the output and the input gradients are those of one
 * BatchNorm over the concatenated batch. The weight and bias gradients are
 * this rank's own sums (as torch): DDP's average completes them. The
 * running statistics move with the group's mean and unbiased variance and
 * are identical on every rank. In eval mode nothing is communicated.
 * The collectives run on pg in call order: every rank must run the same
 * SyncBatchNorm layers, in the same order and the same mode, forward and
 * backward. pg may be DDP's group (its collectives stay in the same order
 * on every rank) and must outlive the module; the module must outlive
 * every backward through it. Type "SyncBatchNorm"; 1d takes (N, C) or
 * (N, C, L), 2d (N, C, H, W). DG_EINVAL for a NULL pg or bad C, eps,
 * momentum. */
DG_API int dg_nn_sync_batchnorm1d(dg_module **out, int64_t C, float eps, float momentum,
                                  dg_pg *pg);
DG_API int dg_nn_sync_batchnorm2d(dg_module **out, int64_t C, float eps, float momentum,
                                  dg_pg *pg);

/* dg_loader_opts for this rank of pg: shuffle from `seed` per epoch, equal
 * shards of the dataset (drop_last 0: pad by wrapping around, as torch's
 * DistributedSampler; 1: drop the tail), batches of `batch` per rank.
 * Fields not named here keep their zero default. */
DG_API dg_loader_opts dg_ddp_loader_opts(const dg_pg *pg, int64_t batch, uint64_t seed,
                                         int drop_last);

#ifdef __cplusplus
}
#endif
#endif /* DGRAD_DDP_H */
