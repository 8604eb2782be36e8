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
 * opts.balance gives the layers per stage, else they are split evenly by
 * count (the partition by measured time is dist/pipe_plan.c's, not wired
 * in yet).
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
 * Boundaries carry one f32 tensor per micro-batch; its shape travels with
 * it and must not change between the micro-batches of a step (an error
 * naming both shapes, not a hang).
 *
 * Failure. Every wait is bounded by the group's timeout; an error names the
 * step, the action, the micro-batch and the peer stage. Ranks that disagree
 * on M, the schedule or the balance fail in dg_pipe_new naming both. */
#ifndef DGRAD_PIPE_H
#define DGRAD_PIPE_H

#include "dgrad/dist.h"
#include "dgrad/nn.h"
#include "dgrad/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dg_pipe dg_pipe;

typedef enum { DG_PIPE_GPIPE = 0, DG_PIPE_1F1B = 1 } dg_pipe_schedule;

typedef struct {
  int micro_batches;          /* M >= 1; 0 means 1 */
  dg_pipe_schedule schedule;  /* default GPipe */
  const int *balance;         /* world-size entries, sum = layers; NULL: even */
} dg_pipe_opts;

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

/* This rank's stage and its layer range [first, last). */
DG_API int dg_pipe_stage(const dg_pipe *p, int *first, int *last);
DG_API const char *dg_pipe_errmsg(const dg_pipe *p);

#ifdef __cplusplus
}
#endif
#endif /* DGRAD_PIPE_H */
