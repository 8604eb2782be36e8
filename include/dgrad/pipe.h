/* dgrad/pipe.h — pipeline-parallel training: a Sequential cut into stages,
 * one stage per rank of a process group, micro-batches streamed through.
 *
 *   dg_pipe *pipe;
 *   dg_pipe_opts po = dg_pipe_defaults();
 *   po.micro_batches = 8;
 *   po.schedule = DG_PIPE_1F1B;
 *   dg_pipe_new(&pipe, pg, seq, ps, seed, &po, err, cap); // binds this rank's stage
 *   for (each batch) {
 *     float loss;
 *     dg_pipe_step(pipe, x, y, loss_fn, NULL, &loss); // x on stage 0, y on the last
 *     dg_optim_step(opt);                            // gradients of this stage
 *     dg_params_zero_grad(ps);
 *   }
 *
 * The model. Every rank builds the same Sequential and hands it over; the
 * pipe keeps the layers of its own stage, frees the others, and binds its
 * stage into ps under the names the whole model would have ("3.weight"),
 * initialised from `seed` exactly as dg_module_bind(seq, ps, "", seed)
 * would on one process. Stage s holds layers [first[s], first[s + 1]):
 * opts.balance gives the layers per stage; else, with opts.profile_input,
 * the split is chosen by measured time (below); else the layers are split
 * evenly by count.
 *
 * Balance by time. Every rank times the forward and backward of a share of
 * the layers (layer i on rank i % K) on profile_input (one micro-batch for
 * stage 0, the same on every rank), the costs are summed over the group,
 * and an exact min-max contiguous partition (dist/pipe_plan.c, tested
 * against brute force) picks the split; identical on every rank. With
 * mem_cap > 0 no stage may need more than mem_cap bytes, counted as each
 * layer's parameter bytes x (2 + optim_factor) (values, gradients, the
 * optimizer's state) plus its saved activations x the micro-batches the
 * schedule keeps alive (M for GPipe, min(M, K) for 1F1B). dg_pipe_layer_cost
 * returns the measured costs.
 *
 * A step. The batch (B, ...) given to stage 0 is cut into M micro-batches
 * along dim 0 (B % M == 0); each stage runs the schedule's table
 * (GPipe: all forwards then all backwards; 1F1B: at most min(M, K - s)
 * micro-batches in flight on stage s), receiving activations from the
 * previous stage and gradients from the next. The last stage computes
 * loss_fn(out, targets) per micro-batch (targets cut like the batch),
 * scaled by 1/M, so the accumulated gradients equal those of the whole
 * batch's mean loss on one process. The mean loss is returned on every
 * rank. Gradients accumulate into ps; the optimizer steps after.
 *
 * Memory. A micro-batch's activations live in one of a few contexts the
 * pipe owns, as many as the schedule keeps micro-batches alive on this
 * stage (the table's validator counts them), and return to the pool once
 * its backward ran and its sends completed: 1F1B's first stage holds about
 * min(M, K) micro-batches where GPipe holds M. With opts.remat, a forward
 * keeps only its boundary input and output (the stage runs without a tape)
 * and the backward recomputes the stage first, with the same random
 * numbers and without moving BatchNorm's running statistics twice; the
 * recomputation has one context of its own, reused by every micro-batch.
 * With opts.swap, activation swapping (swap.h) is on for the contexts that
 * record a tape: the pool's, or with remat the recomputation's (the pool
 * then holds boundaries only). The tensors a micro-batch's forward (or
 * recomputation) saves leave memory and come back for its backward.
 * dg_pipe_contexts reaches the contexts (hooks, swap statistics).
 *
 * Boundaries carry what the stage's last layer returns: one tensor, or up
 * to DG_PIPE_MAX_TENSORS when the layers pass tuples (a module's
 * forward_n, nn.h: a skip connection, ids or a mask beside the
 * activations), of any dtype. A gradient flows back through each f32
 * tensor that requires grad (with remat: each f32 tensor), zeros for one
 * the next stages do not use. The first stage takes one tensor (x); the
 * last stage's layers must end in one (the loss function's input). The
 * tensors' shapes and dtypes travel in a header and must not change
 * between the micro-batches of a step (DG_ESHAPE naming both boundaries,
 * not a hang). Between ranks on one host (a group whose
 * ranks can attach each other's memory, as its allreduce does) a stage
 * writes each boundary straight into a ring of M slots its neighbour holds
 * and reads in place: one copy and a small notice instead of a socket's two
 * copies and a staging copy. A ring is sized as the previous step's
 * boundary, so a step's first boundaries, and a bigger one, go through the
 * transport; each ring holds M boundaries (M x the boundary's bytes per
 * neighbour and direction). opts.transport_boundaries turns it off;
 * dg_pipe_stats counts the bytes each way went.
 *
 * DP x PP. With opts.dp_group (the ranks that hold the same stage in other
 * replicas; each replica's stages form `pg`), the stage's gradients are
 * averaged over dp_group once per step, and the running statistics are
 * broadcast from its rank 0; the parameters are broadcast from it at
 * creation. The all-reduce goes in buckets (about 4 per stage, at most 25
 * MiB each), each posted during the last micro-batch's backward as soon as
 * its gradients are final, so it overlaps the rest of that backward; the
 * step waits for them at its end. Build both groups with
 * dg_pg_new_group.
 *
 * Failure. Every wait is bounded by the group's timeout; an error names the
 * step, the action, the micro-batch and the peer stage. A step that fails
 * once it has begun (not on a bad argument) fails the group with its
 * message: the stages are out of step, so every other one fails at once
 * instead of at its timeout, and the group and pipe must be made anew. Ranks that disagree
 * on the layers, M, the schedule, re-materialization or the balance fail in
 * dg_pipe_new naming both. */
#ifndef DGRAD_PIPE_H
#define DGRAD_PIPE_H

#include "dgrad/dist.h"
#include "dgrad/nn.h"
#include "dgrad/swap.h"
#include "dgrad/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dg_pipe dg_pipe;

/* Most tensors a boundary carries: what a module returns. */
#define DG_PIPE_MAX_TENSORS DG_MODULE_MAX_IO

typedef enum { DG_PIPE_GPIPE = 0, DG_PIPE_1F1B = 1 } dg_pipe_schedule;

typedef struct {
  int micro_batches;          /* M >= 1; 0 means 1 */
  dg_pipe_schedule schedule;  /* default GPipe */
  const int *balance;         /* world-size entries, sum = layers; NULL: by time or even */
  dg_tensor *profile_input;   /* one micro-batch for stage 0: balance by time; NULL: even */
  double mem_cap;             /* bytes per stage when balancing by time; 0: no cap */
  double optim_factor;        /* optimizer state per parameter byte (AdamW 2); default 2 */
  int remat;                  /* 1: keep boundaries only, recompute in backward */
  dg_pg *dp_group;            /* DP x PP: this stage's replicas; NULL: none */
  const dg_swap_opts *swap;   /* activation swapping on this stage's contexts that
                                 record a tape (copied; stages may differ); NULL: off */
  int transport_boundaries;   /* 1: through the transport even between ranks that could
                                 write each other's memory (every rank the same) */
} dg_pipe_opts;

/* What the last step did on this stage (dg_pipe_get_stats). */
typedef struct {
  int64_t steps;          /* training and eval steps run */
  double step_seconds;    /* wall time of the last step */
  double wait_seconds;    /* of it, blocked on peers: receives, sends, the loss */
  size_t arena_peak;      /* most bytes in use at once by the stage's contexts, last step */
  size_t arena_reserved;  /* bytes the stage's contexts hold now */
  int contexts;           /* micro-batch contexts: the schedule's most alive at once */
  size_t bytes_direct;    /* boundary bytes this stage sent in the last step, written
                             into the neighbour's ring */
  size_t bytes_transport; /* ... sent through the transport */
  int dp_buckets;         /* DP x PP: buckets of the replicas' gradient all-reduce */
  int dp_buckets_early;   /* of them, posted during the last backward (overlapped) */
  double dp_wait_seconds; /* blocked on them after the last backward */
} dg_pipe_stats;

/* Loss of one micro-batch on the last stage: out (mb, ...) and targets
 * (mb, ...) in ctx -> a one-element tensor (NULL on error, detail in ctx). */
typedef dg_tensor *(*dg_pipe_loss_fn)(void *user, dg_ctx *ctx, dg_tensor *out,
                                      dg_tensor *targets);

DG_API dg_pipe_opts dg_pipe_defaults(void);

/* Collective over pg (one stage per rank). Takes ownership of seq (also on
 * failure). ps receives this stage's parameters. On failure *out is NULL and
 * err names the problem (DG_EINVAL: bad balance or options; DG_EMISMATCH:
 * ranks disagree). */
DG_API int dg_pipe_new(dg_pipe **out, dg_pg *pg, dg_module *seq, dg_params *ps, uint64_t seed,
                       const dg_pipe_opts *opts, char *err, size_t cap);
DG_API void dg_pipe_free(dg_pipe *p);

/* One training step (collective). x: the batch on stage 0 (ignored
 * elsewhere, may be NULL); targets: on the last stage (i32/i64 or f32, B
 * rows; ignored elsewhere). *loss (may be NULL): the mean loss, on every
 * rank. Gradients accumulate into this stage's parameters. */
DG_API int dg_pipe_step(dg_pipe *p, dg_tensor *x, dg_tensor *targets, dg_pipe_loss_fn loss_fn,
                        void *user, float *loss);

/* Forward only (collective), e.g. for validation: x on stage 0, targets and
 * loss_fn on the last stage as for a step; no tape, no gradients. *loss:
 * the mean loss on every rank. loss_fn sees every micro-batch's output, so
 * it may also count what user asks (accuracy). */
DG_API int dg_pipe_eval(dg_pipe *p, dg_tensor *x, dg_tensor *targets, dg_pipe_loss_fn loss_fn,
                        void *user, float *loss);

/* Clips the gradients by the global L2 norm of the whole model (every
 * stage's, summed over the group; collective), as dg_clip_grad_norm on one
 * process would. *total_norm (may be NULL): that norm. */
/* The pipe's step counter: the steps and evals run since creation. It
 * seeds each micro-batch's random numbers (dropout) and tags every
 * boundary, so a run resumed from a checkpoint sets it to the value it had
 * when saved (every rank the same; a boundary from another step is
 * refused) and draws the masks the uninterrupted run would. step >= 0. */
DG_API int dg_pipe_set_step(dg_pipe *p, int64_t step);
DG_API int64_t dg_pipe_get_step(const dg_pipe *p);

DG_API int dg_pipe_clip_grad_norm(dg_pipe *p, double max_norm, double *total_norm);

/* Train or eval mode of this stage's layers (dropout, BatchNorm). */
DG_API void dg_pipe_set_train(dg_pipe *p, int train);
/* This stage's layers (a Sequential owned by the pipe), e.g. to save them. */
DG_API dg_module *dg_pipe_module(const dg_pipe *p);
DG_API int dg_pipe_get_stats(const dg_pipe *p, dg_pipe_stats *out);
/* Per-layer seconds (forward + backward of one micro-batch) measured when
 * balancing by time: n layers into cost (cap entries); DG_ENOTFOUND when
 * the balance was not measured. */
DG_API int dg_pipe_layer_cost(const dg_pipe *p, double *cost, int cap, int *n);
/* What a boundary after layer i costs each of its two stages, measured with
 * the layer costs: the activation's bytes (and its gradient's, for floats)
 * over the slowest link between neighbouring ranks, latency included
 * (n - 1 entries into cut). The split minimises the largest stage cost,
 * boundaries counted. DG_ENOTFOUND when the balance was not measured. */
DG_API int dg_pipe_boundary_cost(const dg_pipe *p, double *cut, int cap, int *n);

/* The contexts this stage runs on, the first cap of them into ctxs, and
 * their total into *n (it may exceed cap; ctxs NULL with cap 0 asks): the
 * micro-batch pool (dg_pipe_stats.contexts), then with opts.remat the
 * recomputation context, where every backward runs. For grad-ready and
 * backward-end hooks and dg_ctx_swap_stats; the pipe owns them: do not
 * free, reset or re-configure them. */
DG_API int dg_pipe_contexts(const dg_pipe *p, dg_ctx **ctxs, int cap, int *n);

/* This rank's stage and its layer range [first, last). */
DG_API int dg_pipe_stage(const dg_pipe *p, int *first, int *last);
DG_API const char *dg_pipe_errmsg(const dg_pipe *p);

#ifdef __cplusplus
}
#endif
#endif /* DGRAD_PIPE_H */
