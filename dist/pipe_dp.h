/* DP x PP: a pipe stage's replicas (the ranks holding the same stage in the
 * other pipelines) average its gradients once per step. The all-reduce is
 * cut into buckets of contiguous gradients, in the order the backward makes
 * them final: during the last micro-batch's backward (the grad-ready hook,
 * armed for that backward only) a bucket is posted as soon as its last
 * parameter is final and every bucket before it was posted, so the
 * all-reduce of the stage's last layers runs while its first layers are
 * still differentiated; the step's end posts what is left and waits.
 * Every replica posts the same buckets in the same order. Internal. */
#ifndef DG_PIPE_DP_H
#define DG_PIPE_DP_H

#include <stddef.h>

#include "dgrad/autograd.h"
#include "dgrad/dist.h"

typedef struct dg__pipe_dp dg__pipe_dp;

/* Collective over dp: the replicas must hold the same stage (stage,
 * layers [first, last), parameter count); parameters and buffers start as
 * replica 0's. */
int dg__pipe_dp_new(dg__pipe_dp **out, dg_pg *dp, dg_params *ps, const int64_t id[4], char *err,
                    size_t cap);
/* Installs the grad-ready hook on a context where the stage's backward runs. */
int dg__pipe_dp_hook(dg__pipe_dp *d, dg_ctx *c);
/* Arms (1) the hook for the backward about to run, the step's last, or
 * disarms it (0). */
void dg__pipe_dp_arm(dg__pipe_dp *d, int on);
/* After the last backward: posts the buckets not yet posted, waits for all
 * (bounded by dp's timeout), broadcasts the buffers from replica 0. */
int dg__pipe_dp_sync(dg__pipe_dp *d, char *err, size_t cap);
/* A failed step: fails dp with msg when it had started (past its argument
 * checks) or a bucket was posted, so that the other replicas, waiting in
 * their all-reduce, fail at once instead of at their timeout; drops the
 * posted works. own: msg is this stage's own failure (dg__pg_abort). */
void dg__pipe_dp_abort(dg__pipe_dp *d, int code, const char *msg, int started, int own);
/* Buckets, those posted during the last backward, seconds waited in sync. */
void dg__pipe_dp_stats(const dg__pipe_dp *d, int *buckets, int *early, double *wait);
void dg__pipe_dp_free(dg__pipe_dp *d);

#endif
