/* DDP's reducer: how a bucket's gradients are averaged over the ranks. DDP
 * (ddp.c, ddp_bucket.c, ddp_overlap.c) drives rounds and buckets through
 * this table alone; two implementations:
 *   - the shared gradient segment (ddp_shm.c): ranks on one host with the
 *     built-in f32 reduction keep their gradient buffers in one mapping and
 *     average buckets in place, cooperatively;
 *   - the transport collectives (ddp_coll.c): the comm hook (built-in or
 *     the user's) posts dg_pg collectives per bucket.
 * Every function runs on the thread that runs backward (or, in overlap
 * mode, the next forward's). Internal. */
#ifndef DG_DDP_REDUCER_H
#define DG_DDP_REDUCER_H

#include <stdint.h>

typedef struct dg_ddp dg_ddp;

typedef struct {
  const char *name;
  /* 1: the ranks-with-data count travels with the round (no separate
   * all-reduce, no staging of bucket 0). */
  int count_rides;
  /* The buckets were (re)built (d->b, d->nb). */
  void (*layout)(dg_ddp *d);
  /* A synchronising round begins; `have` is this rank's has-data (0/1). */
  void (*begin_round)(dg_ddp *d, int32_t have);
  /* Bucket k's gradients are final on this rank (d->b[k].started set);
   * records a failure in d. */
  void (*start)(dg_ddp *d, int k);
  /* A grad-ready hook that started no bucket: work that needs no waiting
   * (NULL: none). */
  void (*progress)(dg_ddp *d);
  /* Makes bucket k's average final in the store's gradients, scaled by
   * 1 / (active * accum_div), and marks it finished. Returns d->err. */
  int (*finish)(dg_ddp *d, int k);
  /* Ranks with data in this round (may finish buckets to learn it); 0 with
   * the failure recorded in d. */
  int32_t (*count)(dg_ddp *d);
  /* The round is over (every bucket finished, or a failure): releases what
   * the started buckets hold. */
  void (*end_round)(dg_ddp *d);
  /* The sharded update (NULL: not offered): share moves the store's
   * values and d->opt's state into one copy all ranks update (collective:
   * every rank with d->shard_ok calls it after the first step's update);
   * unshare_state gives d->opt its own state back (the optimizer is being
   * freed). free gives the values back. */
  int (*share)(dg_ddp *d);
  void (*unshare_state)(dg_ddp *d);
  /* The DDP is freed. */
  void (*free)(dg_ddp *d);
} dg__ddp_reducer;

/* Picks the reducer for d (collective: every rank decides alike, options
 * being verified equal): the shared segment where it applies and can be
 * mapped, else the collectives. Sets d->red; a failure is recorded. */
int dg__ddp_reducer_init(dg_ddp *d);

/* ddp_shm.c: the shared segment; DG_OK with d->red unset where it does
 * not apply (another host, no segment, a comm hook or compression). */
int dg__ddp_shm_init(dg_ddp *d);
/* ddp_coll.c: the collectives through d->hook. */
extern const dg__ddp_reducer dg__ddp_coll_reducer;

#endif
