/* Internal: the DDP object shared by dist/ddp*.c. Not API. */
#ifndef DG_DDP_IMPL_H
#define DG_DDP_IMPL_H

#include "dgrad/autograd.h"
#include "dgrad/ddp.h"
#include "dist/ddp_reducer.h"
#include "base/common_impl.h"
#include "base/trace_impl.h"

#define DG_DDP_ERRMSG 512

typedef struct {
  size_t lo, hi;      /* element range [lo, hi) of the flat gradient buffer */
  int first, nparams; /* first parameter (in bucket order) and count */
  int pending;        /* gradients of this backward not yet final */
  int started;        /* the reducer started it in this round */
  int finished;       /* its average is final in the store's gradients */
  int applied;        /* overlap mode: its parameters were updated */
  void *work;         /* the comm hook's pending state (collectives reducer) */
  uint64_t trace_t0;  /* start of its traced all-reduce (0: none open) */
} dg__ddp_bucket;

struct dg_ddp {
  dg_ctx *ctx;
  dg_params *ps;
  dg_pg *pg;
  int rank, world;
  dg_ddp_opts opts;
  dg_ddp_comm_hook hook;
  const dg__ddp_reducer *red; /* how buckets are averaged (ddp_reducer.h) */
  void *red_state;            /* the reducer's own state */
  int ready_id, end_id;
  int attached; /* this DDP attached ps to ctx: free detaches it */
  /* buckets */
  int nparams;        /* parameters in the store */
  int ntrain;         /* trainable parameters (in buckets) */
  dg__ddp_bucket *b;  /* (nb) */
  int nb;
  int *pbucket;       /* (nparams) bucket of parameter i, -1 when frozen */
  int next_start;     /* first bucket not started yet */
  int rebuilt;
  /* ready order observed in the first backward (parameter indices) */
  int *order;
  int norder, order_done;
  /* per-backward state */
  int in_step;        /* a ready/end hook of this backward ran */
  int syncing;        /* this backward synchronises */
  int micro;          /* backwards since the last sync (accumulation) */
  int last_synced;
  int sync_on;
  int32_t has_data;   /* count all-reduce buffer / this rank's contribution */
  int32_t active;     /* ranks with data this round, -1 until known */
  int accum_div;      /* this round's accumulation divisor */
  dg_work *count_work;
  /* Join's ranks-with-data count rides as one extra element in bucket 0's
   * all-reduce (built-in hooks; a user hook gets a separate all-reduce) */
  int piggy;          /* this DDP carries the count in bucket 0 */
  float *stage;       /* (stage_cap) f32: bucket 0's gradients + the count */
  size_t stage_cap;
  int unused_logged;
  /* overlap with the next forward (dg_ddp_overlap_optimizer): the step is
   * applied bucket by bucket when a parameter is first read */
  struct dg_optim *opt;
  int pending;        /* a synchronised step not yet applied everywhere */
  float pend_lr;      /* the learning rate when that backward ended */
  int zero_due;       /* gradients consumed by our update: zero them before
                         the next backward accumulates */
  int in_gate;
  /* the sharded update (ddp_shm.c): the values and the optimizer state live
   * in the shared segment, one copy for all ranks, and whoever averages a
   * block of a bucket applies the update to it there */
  int shard_ok;       /* every rank agreed at the first layout (collective) */
  int shard;          /* the store's values and opt's state are the segment's */
  int round_fused;    /* this round's average went into the update, not the gradients */
  float *priv_data;   /* the store's own value buffer, for the way back */
  float *priv_state[2]; /* opt's own state buffers, likewise */
  /* built-in compression: per-bucket half buffers */
  uint16_t **half;
  size_t *half_cap;
  int nhalf;
  /* errors and stats */
  int err;
  char errmsg[DG_DDP_ERRMSG];
  dg_ddp_stats st;
};

/* ddp_bucket.c */
/* Builds the buckets over the current layout: ascending memory order when
 * `ascending`, else descending (reverse registration). */
int dg__ddp_build_buckets(dg_ddp *d, int ascending);
/* Broadcasts rank 0's ready order, re-lays the store out in it and rebuilds
 * the buckets (ascending). Collective. */
int dg__ddp_rebuild(dg_ddp *d);
/* 1 while the first synchronising round has not laid the buckets out yet;
 * dg__ddp_first_layout does it (before any bucket starts). */
int dg__ddp_layout_due(const dg_ddp *d);
int dg__ddp_first_layout(dg_ddp *d);
/* Starts bucket k (hook start); records a failure. */
void dg__ddp_start_bucket(dg_ddp *d, int k);
/* Starts every bucket not started yet, in order. */
void dg__ddp_start_rest(dg_ddp *d);
/* Makes bucket k's average final in the store's gradients (scaled by
 * 1 / (active * accum_div)) through the reducer: waits for it (through the
 * hooks, in bucket order, or, in the shared segment, for k alone). Returns
 * d->err. */
int dg__ddp_finish_bucket(dg_ddp *d, int k);
/* Finishes every started bucket; after a failure releases the rest and
 * ends the round. Returns the first error. */
int dg__ddp_finish_all(dg_ddp *d);
/* The round is over (every bucket finished, or a failure): the reducer
 * releases what the buckets hold. */
void dg__ddp_end_round(dg_ddp *d);
/* The hook's view of bucket k. */
void dg__ddp_view(const dg_ddp *d, int k, dg_ddp_bucket *out);
/* This round's factor: 1 / (active * accum_div) (0 when nobody has data). */
float dg__ddp_round_scale(const dg_ddp *d);

/* ddp_hook.c: the built-in hook for opts.comm. */
void dg__ddp_builtin_hook(dg_ddp *d, dg_ddp_comm_hook *out);
void dg__ddp_hook_free(dg_ddp *d);
/* Whether the built-in hook can carry the count for this world size. */
int dg__ddp_can_piggy(const dg_ddp *d);
/* Waits for bucket 0's reduction (started, carrying the count) and returns
 * the number of ranks with data; on failure records it and returns -1. */
int32_t dg__ddp_piggy_count(dg_ddp *d, void *pending);

/* ddp.c */
/* Ranks with data in this round (0 on failure, with the error recorded). */
int32_t dg__ddp_round_count(dg_ddp *d);
/* Completes a synchronising round now: every bucket, the scale, the first
 * rebuild. */
int dg__ddp_finish_round(dg_ddp *d);
/* Records the first failure: code and message (printf format). */
int dg__ddp_fail(dg_ddp *d, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
double dg__ddp_now(void);

/* ddp_verify.c */
/* Checks parameters and options across ranks (collective). */
int dg__ddp_verify(dg_ddp *d);
/* Broadcasts values and the store's buffers from `root`, and opts->buffers
 * when with_buffers. */
int dg__ddp_broadcast_state(dg_ddp *d, int root, int with_buffers);
/* Broadcasts the store's buffers (dg_params_add_buffer) from `root`, and
 * opts->buffers (checked contiguous) when with_opts. */
int dg__ddp_broadcast_buffers(dg_ddp *d, int root, int with_opts);

/* ddp_overlap.c: the update overlapping the next forward. */
/* The store's pending writer: brings parameter i (or all) up to date. */
int dg__ddp_settle(void *user, dg_params *ps, int i, char *err, size_t cap);
/* At the end of a synchronising backward: counts the optimizer step and
 * leaves the buckets to finish on demand (or, on the first step, before the
 * rebuild, and with one rank, finishes and applies them now). */
int dg__ddp_defer_step(dg_ddp *d);
/* Finishes and applies every pending bucket. */
int dg__ddp_land_all(dg_ddp *d);

#endif
