/* DDP: construction, the grad-ready and backward-end hooks that drive the
 * bucket reductions (through the reducer, ddp_reducer.h), accumulation /
 * no-sync, Join, accessors. */
#include <stdarg.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "dist/ddp_impl.h"
#include "optim/optim_impl.h"
#include "core/core_impl.h"

#define MiB ((size_t)1 << 20)

double dg__ddp_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int dg__ddp_fail(dg_ddp *d, int code, const char *fmt, ...) {
  char tmp[DG_DDP_ERRMSG];
  va_list ap;
  va_start(ap, fmt);
  dg__vfmt(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (!d->err) {
    d->err = code;
    memcpy(d->errmsg, tmp, sizeof tmp);
  }
  DG_LOGD("%s", tmp);
  return code;
}

dg_ddp_opts dg_ddp_defaults(void) {
  dg_ddp_opts o;
  memset(&o, 0, sizeof o);
  return o;
}

/* ---- per-backward state ---- */

/* The count of ranks with data travels with the round: in the shared
 * segment, in bucket 0's all-reduce (built-in hooks: no extra collective
 * per step), else as a separate tiny all-reduce posted at the first
 * grad-ready hook so that it overlaps backward. */
static void reset_buckets(dg_ddp *d) {
  for (int k = 0; k < d->nb; k++) {
    dg__ddp_bucket *b = &d->b[k];
    b->pending = b->nparams;
    b->started = b->finished = b->applied = 0;
  }
  d->next_start = 0;
}

static void begin_round(dg_ddp *d, int32_t have) {
  reset_buckets(d);
  d->has_data = have;
  d->active = -1;
  d->accum_div = 1;
  d->red->begin_round(d, have);
}

/* Starts every bucket when the count rides in bucket 0 or the segment. */
int32_t dg__ddp_round_count(dg_ddp *d) {
  if (d->active >= 0) return d->active;
  int32_t n = d->red->count(d);
  if (!d->err) d->active = n;
  return n;
}

/* First hook of a backward: does it synchronise? */
static void begin_step(dg_ddp *d) {
  if (d->in_step) return;
  d->in_step = 1;
  d->syncing = 0;
  if (d->sync_on) {
    int K = d->opts.accum_steps > 1 ? d->opts.accum_steps : 1;
    d->syncing = ++d->micro >= K;
  }
  if (d->syncing && !d->err) begin_round(d, 1);
}

static void on_ready(void *user, dg_params *ps, int i, int reached) {
  dg_ddp *d = user;
  (void)reached;
  if (ps != d->ps) return;
  begin_step(d);
  if (!d->order_done && d->norder < d->nparams) d->order[d->norder++] = i;
  if (!d->syncing || d->opts.no_overlap || d->err || d->world == 1 || dg__ddp_layout_due(d))
    return;
  int k = d->pbucket[i];
  if (k < 0 || --d->b[k].pending > 0) {
    if (d->red->progress) d->red->progress(d); /* a look between buckets */
    return;
  }
  DG__TRACE_INSTANT("bucket ready", "bucket", k, NULL, 0);
  while (d->next_start < d->nb && d->b[d->next_start].pending <= 0)
    dg__ddp_start_bucket(d, d->next_start++);
}

static void log_unused(dg_ddp *d) {
  if (d->unused_logged || dg_params_unreached_count(d->ps) == 0) return;
  d->unused_logged = 1;
  char names[400];
  size_t len = 0;
  names[0] = '\0';
  for (int i = 0; i < d->nparams && len + 2 < sizeof names; i++) {
    if (!dg_params_trainable(d->ps, i) || dg_params_reached(d->ps, i)) continue;
    int w = snprintf(names + len, sizeof names - len, "%s%s", len ? ", " : "",
                     dg_tensor_name(dg_params_get(d->ps, i)));
    if (w > 0) len += (size_t)w;
  }
  DG_LOGI("ddp: rank %d: %d parameter(s) received no gradient in a backward and count as zero "
          "in the average: %s", d->rank, dg_params_unreached_count(d->ps), names);
}

int dg__ddp_finish_round(dg_ddp *d) {
  if (d->world == 1) { /* nothing to exchange: only the accumulation divisor */
    if (d->accum_div > 1) {
      size_t n;
      float *g = dg_params_grad(d->ps, &n);
      const float s = 1.0f / (float)d->accum_div;
      for (size_t j = 0; j < n; j++) g[j] *= s;
    }
    for (int k = 0; k < d->nb; k++) d->b[k].finished = 1;
    return d->err;
  }
  int rc = dg__ddp_first_layout(d);
  dg__ddp_start_rest(d);
  if (!rc) rc = dg__ddp_finish_all(d);
  return rc ? rc : d->err;
}

int dg__ddp_layout_due(const dg_ddp *d) { return !d->rebuilt && !d->opts.static_buckets; }

/* Whether the ranks shard the update from the second step on (collective,
 * once, in the first synchronising round): every rank has data, an
 * optimizer handed over that any block can update alone, and the same
 * settings, on the shared segment. */
static int shard_agree(dg_ddp *d) {
  int ok = d->red->share && d->opts.shard_update >= 0 && d->opt && d->has_data &&
           dg__optim_shardable(d->opt);
  int64_t h = ok ? (int64_t)(dg__optim_fingerprint(d->opt) >> 2) : 0;
  int64_t v[3] = {ok, h, -h}; /* min of ok; min and max of the settings */
  int rc = dg_pg_allreduce_sync(d->pg, v, 3, DG_I64, DG_RED_MIN);
  if (rc) return dg__ddp_fail(d, rc, "ddp: rank %d: agreeing on the sharded update failed: %s",
                              d->rank, dg_pg_errmsg(d->pg));
  d->shard_ok = v[0] == 1 && v[1] == -v[2];
  return DG_OK;
}

/* The first synchronising round lays the buckets out in the ready order
 * before any of them starts (it has no overlap), so every round sums each
 * element in the same order: a run resumed from a checkpoint, whose first
 * round would otherwise use the initial layout, stays bit-exact over a
 * ring, where the layout decides the order. Joined ranks do it at the same
 * point of their shadow round (dg_ddp_join). */
int dg__ddp_first_layout(dg_ddp *d) {
  if (!dg__ddp_layout_due(d) || d->world == 1) return DG_OK;
  int rc = dg__ddp_rebuild(d);
  if (!rc) reset_buckets(d);
  return rc ? rc : shard_agree(d);
}

static int on_end(void *user, dg_ctx *ctx) {
  dg_ddp *d = user;
  if (!d->in_step) return d->err;
  d->in_step = 0;
  d->order_done = 1;
  log_unused(d);
  d->last_synced = 0;
  if (!d->syncing) {
    d->st.local_steps++;
    /* a step now would apply this rank's partial sum alone: ranks drift.
     * A manual no-sync scope is the user's own (local SGD, say). */
    if (d->sync_on)
      dg__params_block_step(d->ps, "the gradients are rank %d's local sum of %d of %d "
                            "micro-batches (DDP accum_steps %d): a step now would make the "
                            "ranks drift apart; step when dg_ddp_step_ready(ddp) is 1", d->rank,
                            d->micro, d->opts.accum_steps, d->opts.accum_steps);
    return DG_OK;
  }
  dg__params_block_step(d->ps, NULL);
  d->syncing = 0;
  double t0 = dg__ddp_now();
  uint64_t tr0 = dg__trace_t0();
  int K = d->opts.accum_steps > 1 ? d->opts.accum_steps : 1;
  d->accum_div = d->micro > 1 ? K : 1;
  int rc = d->opt ? dg__ddp_defer_step(d) : dg__ddp_finish_round(d);
  DG__TRACE_END(tr0, "ddp sync", NULL, "buckets", d->nb, NULL, 0);
  d->micro = 0;
  d->st.wait_s += dg__ddp_now() - t0;
  d->st.sync_steps++;
  if (rc) {
    dg__set_error(ctx, rc, "%s", d->errmsg);
    return rc;
  }
  d->last_synced = !d->opt; /* with an owned optimizer the update is ours */
  return DG_OK;
}

/* ---- construction ---- */

int dg__ddp_reducer_init(dg_ddp *d) {
  int rc = dg__ddp_shm_init(d);
  if (!rc && !d->red) d->red = &dg__ddp_coll_reducer;
  if (!rc) DG_LOGD("ddp: rank %d: buckets averaged through the %s", d->rank, d->red->name);
  return rc;
}

static int setup(dg_ddp *d) {
  d->nparams = dg_params_count(d->ps);
  for (int i = 0; i < d->nparams; i++) d->ntrain += dg_params_trainable(d->ps, i) != 0;
  if (d->ntrain == 0)
    return dg__ddp_fail(d, DG_EINVAL, "ddp_new: the store has no trainable parameter");
  if (dg__params_has_writer(d->ps, NULL))
    return dg__ddp_fail(d, DG_ESTATE, "ddp_new: another DDP wraps this parameter store");
  if (d->opts.accum_steps < 0 || d->opts.nbuffers < 0 || (d->opts.nbuffers && !d->opts.buffers))
    return dg__ddp_fail(d, DG_EINVAL, "ddp_new: invalid options (accum_steps %d, nbuffers %d)",
                        d->opts.accum_steps, d->opts.nbuffers);
  if (d->opts.hook && (!d->opts.hook->start || !d->opts.hook->finish || !d->opts.hook->name))
    return dg__ddp_fail(d, DG_EINVAL, "ddp_new: a comm hook needs name, start and finish");
  if (!d->opts.bucket_cap_bytes) d->opts.bucket_cap_bytes = 25 * MiB;
  if (!d->opts.first_bucket_bytes) d->opts.first_bucket_bytes = 1 * MiB;
  if (d->opts.hook) d->hook = *d->opts.hook;
  else dg__ddp_builtin_hook(d, &d->hook);
  d->pbucket = dg__malloc((size_t)d->nparams * sizeof *d->pbucket);
  d->order = dg__malloc((size_t)d->nparams * sizeof *d->order);
  if (!d->pbucket || !d->order) return dg__ddp_fail(d, DG_ENOMEM, "ddp_new: out of memory");
  int rc = dg__ddp_verify(d);
  if (!rc) rc = dg__ddp_broadcast_state(d, 0, 1);
  if (!rc) rc = dg__ddp_reducer_init(d);
  d->piggy = dg__ddp_can_piggy(d);
  if (!rc) rc = dg__ddp_build_buckets(d, 0);
  if (rc) return d->err ? d->err : dg__ddp_fail(d, rc, "ddp_new: %s", dg_strerror(rc));
  d->ready_id = dg_ctx_add_grad_ready_hook(d->ctx, on_ready, d);
  d->end_id = d->ready_id > 0 ? dg_ctx_add_backward_end_hook(d->ctx, on_end, d) : d->ready_id;
  if (d->end_id > 0) rc = dg_ctx_attach_params(d->ctx, d->ps);
  else rc = d->end_id;
  d->attached = rc == DG_OK;
  if (!rc) dg__params_set_writer(d->ps, dg__ddp_settle, d);
  if (rc) return dg__ddp_fail(d, rc, "ddp_new: installing the autograd hooks failed (%s)",
                              dg_strerror(rc));
  return DG_OK;
}

int dg_ddp_new(dg_ddp **out, dg_ctx *ctx, dg_params *ps, dg_pg *pg, const dg_ddp_opts *opts,
               char *err, size_t cap) {
  if (out) *out = NULL;
  if (!out || !ctx || !ps || !pg)
    return dg__fail_msg(err, cap, DG_EINVAL, "ddp_new: NULL %s",
                        !out ? "out" : !ctx ? "ctx" : !ps ? "store" : "group");
  dg_ddp *d = dg__calloc(1, sizeof *d);
  if (!d) return dg__fail_msg(err, cap, DG_ENOMEM, "ddp_new: out of memory");
  d->ctx = ctx;
  d->ps = ps;
  d->pg = pg;
  d->rank = dg_pg_rank(pg);
  d->world = dg_pg_size(pg);
  d->opts = opts ? *opts : dg_ddp_defaults();
  d->sync_on = 1;
  int rc = setup(d);
  if (rc) {
    /* the cause may lie on another rank: seen even when err is not read */
    if (!err || !cap) DG_LOGW("%s", d->errmsg);
    dg__fail_msg(err, cap, rc, "%s", d->errmsg);
    dg_ddp_free(d);
    return rc;
  }
  *out = d;
  return DG_OK;
}

/* The owned optimizer is being freed: the pending update lands first. */
static void release_opt(void *owner) {
  dg_ddp *d = owner;
  if (d->pending && dg__ddp_land_all(d)) {
    DG_LOGE("optim_free: rank %d: DDP's pending update failed and is dropped: %s", d->rank,
            d->errmsg);
    d->pending = 0;
    for (int i = 0; i < d->nparams; i++) dg__param_set_pending(d->ps, i, 0);
  }
  if (d->shard) d->red->unshare_state(d); /* the optimizer keeps its state */
  d->opt = NULL;
  dg__params_set_update_owned(d->ps, 0);
}

static void own(dg_ddp *d, dg_optim *o, int on) {
  char err[160];
  (void)dg__optim_set_owner(o, d->ps, on ? d : NULL, release_opt, err, sizeof err);
}

void dg_ddp_free(dg_ddp *d) {
  if (!d) return;
  if (d->pending && dg__ddp_land_all(d))
    DG_LOGE("ddp_free: rank %d: the last update was not applied: %s", d->rank, d->errmsg);
  if (dg__params_has_writer(d->ps, d)) /* (a DDP refused for this store installed none) */
    dg__params_set_writer(d->ps, NULL, NULL); /* clears the pending flags too */
  if (d->opt) {
    own(d, d->opt, 0);
    dg__params_set_update_owned(d->ps, 0);
  }
  dg__params_block_step(d->ps, NULL);
  if (d->ready_id > 0) dg_ctx_remove_hook(d->ctx, d->ready_id);
  if (d->end_id > 0) dg_ctx_remove_hook(d->ctx, d->end_id);
  if (d->attached) dg_ctx_detach_params(d->ctx, d->ps);
  dg__ddp_end_round(d);
  if (d->red && d->red->free) d->red->free(d);
  dg__ddp_hook_free(d);
  dg__free(d->b);
  dg__free(d->pbucket);
  dg__free(d->order);
  dg__free(d);
}

/* ---- Join ---- */

/* Once all have joined: values from the rank that trained longest. */
static int final_sync(dg_ddp *d) {
  int64_t key = d->st.sync_steps * d->world + (d->world - 1 - d->rank);
  dg_work *w = NULL;
  int rc = dg_pg_allreduce(d->pg, &key, 1, DG_I64, DG_RED_MAX, &w);
  if (!rc) rc = dg_work_wait(w, 0);
  if (rc)
    dg__ddp_fail(d, rc, "ddp_join: rank %d: choosing the final root failed: %s", d->rank,
                 w ? dg_work_errmsg(w) : dg_pg_errmsg(d->pg));
  dg_work_free(w);
  if (rc) return rc;
  int root = d->world - 1 - (int)(key % d->world);
  if ((rc = dg__ddp_broadcast_state(d, root, 0)) || !d->shard) return rc;
  /* one shared optimizer state, last updated at the root's step: every rank
   * takes its step count with it (bias corrections, a checkpoint) */
  int64_t step = d->opt ? dg_optim_step_count(d->opt) : 0;
  if ((rc = dg_pg_broadcast_sync(d->pg, &step, 1, DG_I64, root)))
    return dg__ddp_fail(d, rc, "ddp_join: rank %d: broadcast of the optimizer's step count "
                        "from rank %d failed: %s", d->rank, root, dg_pg_errmsg(d->pg));
  if (d->opt) (void)dg_optim_set_step(d->opt, step);
  return DG_OK;
}

int dg_ddp_join(dg_ddp *d) {
  if (!d) return DG_EINVAL;
  if (d->opts.no_join)
    return dg__ddp_fail(d, DG_ESTATE, "ddp_join: created with no_join");
  if (d->in_step) return dg__ddp_fail(d, DG_ESTATE, "ddp_join: called inside a backward");
  if (d->pending && dg__ddp_land_all(d)) return d->err;
  uint64_t tr0 = dg__trace_t0();
  while (!d->err) {
    begin_round(d, 0);
    if (dg__ddp_first_layout(d)) break;
    if (d->piggy) { /* the count comes with the (zero) buckets */
      dg_params_zero_grad(d->ps); /* shadow step: this rank contributes zeros */
      (void)dg_params_grad(d->ps, NULL); /* materialise the lazy zeros */
    }
    int32_t active = dg__ddp_round_count(d);
    if (d->err) break;
    if (active == 0) { /* every rank has joined: same on all, no rebuild */
      if (d->piggy) dg__ddp_finish_all(d);
      break;
    }
    if (!d->piggy) {
      dg_params_zero_grad(d->ps);
      (void)dg_params_grad(d->ps, NULL);
    }
    if (dg__ddp_finish_round(d)) break;
    d->st.shadow_steps++;
  }
  dg__ddp_end_round(d);
  DG__TRACE_END(tr0, "ddp join", NULL, "shadow_steps", (int64_t)d->st.shadow_steps, NULL, 0);
  d->micro = 0;
  if (d->err) return d->err;
  return final_sync(d);
}

/* ---- accessors ---- */

int dg_ddp_set_sync(dg_ddp *d, int on) {
  if (!d) return 0;
  int prev = d->sync_on;
  d->sync_on = !!on;
  return prev;
}

int dg_ddp_will_sync(const dg_ddp *d) {
  if (!d || !d->sync_on) return 0;
  int K = d->opts.accum_steps > 1 ? d->opts.accum_steps : 1;
  return d->micro + 1 >= K;
}

int dg_ddp_step_ready(const dg_ddp *d) { return d ? d->last_synced : 0; }

int dg_ddp_overlap_optimizer(dg_ddp *d, dg_optim *opt) {
  if (!d) return DG_EINVAL;
  if (opt && opt == d->opt) return DG_OK;
  if (d->in_step || d->pending)
    return dg__ddp_fail(d, DG_ESTATE, "ddp_overlap_optimizer: called inside a step");
  if (d->shard) { /* refused; the DDP goes on (no recorded failure) */
    if (!d->err)
      snprintf(d->errmsg, sizeof d->errmsg, "ddp_overlap_optimizer: rank %d: the update is "
               "sharded over the ranks since the first step (one shared copy of the values "
               "and the optimizer's state): the optimizer stays until dg_ddp_free", d->rank);
    return DG_ESTATE;
  }
  char err[160];
  int rc = opt ? dg__optim_set_owner(opt, d->ps, d, release_opt, err, sizeof err) : DG_OK;
  if (rc) return dg__ddp_fail(d, rc, "ddp_overlap_optimizer: %s", err);
  if (d->opt) own(d, d->opt, 0);
  d->opt = opt;
  dg__params_set_update_owned(d->ps, opt != NULL);
  return DG_OK;
}

int dg_ddp_flush(dg_ddp *d) {
  if (!d) return DG_EINVAL;
  return d->pending ? dg__ddp_land_all(d) : d->err;
}

int dg_ddp_broadcast_buffers(dg_ddp *d) {
  if (!d) return DG_EINVAL;
  return dg__ddp_broadcast_buffers(d, 0, 1);
}

const char *dg_ddp_errmsg(const dg_ddp *d) { return d ? d->errmsg : ""; }

void dg_ddp_hook_error(dg_ddp *d, const char *msg) {
  if (!d || d->err || !msg) return;
  snprintf(d->errmsg, sizeof d->errmsg, "%s", msg);
}

int dg_ddp_get_stats(const dg_ddp *d, dg_ddp_stats *out) {
  if (!d || !out) return DG_EINVAL;
  *out = d->st;
  out->nbuckets = d->nb;
  out->rebuilt = d->rebuilt;
  out->sharded = d->shard;
  return DG_OK;
}

int dg_ddp_bucket_info(const dg_ddp *d, int k, int *nparams, size_t *bytes, int *first) {
  if (!d || k < 0 || k >= d->nb) return DG_EINVAL;
  if (nparams) *nparams = d->b[k].nparams;
  if (bytes) *bytes = (d->b[k].hi - d->b[k].lo) * sizeof(float);
  if (first) *first = d->b[k].first;
  return DG_OK;
}

dg_loader_opts dg_ddp_loader_opts(const dg_pg *pg, int64_t batch, uint64_t seed, int drop_last) {
  dg_loader_opts o;
  memset(&o, 0, sizeof o);
  o.batch_size = batch;
  o.shuffle = 1;
  o.seed = seed;
  o.drop_last = !!drop_last;
  o.rank = pg ? dg_pg_rank(pg) : 0;
  o.world_size = pg ? dg_pg_size(pg) : 1;
  o.shard_drop = !!drop_last;
  return o;
}
