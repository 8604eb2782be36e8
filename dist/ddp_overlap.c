/* DDP with the optimizer step overlapping the next forward
 * (dg_ddp_overlap_optimizer). Backward only publishes its buckets; the
 * all-reduces run on. DDP is the store's pending writer: every trainable
 * parameter is marked pending, and the first read of one (at the core's
 * fence: an op's input check, a view, a conversion, raw access) comes here:
 * its bucket's average is waited for, the optimizer updates that bucket's
 * parameters, and their pending marks clear. The
 * forward reads the first layer first, whose bucket is ready last, so the
 * shared-memory engines average the bucket the forward needs first.
 * Parameters nothing read are brought up to date before the next backward
 * writes gradients. The arithmetic is dg_optim_step's, bucket by bucket. */
#include <stdio.h>

#include "dist/ddp_impl.h"
#include "dist/pg_ext.h"
#include "optim/optim_impl.h"
#include "core/core_impl.h"

/* Updates bucket k's parameters (their average is final); clears their pending marks. */
static void apply(dg_ddp *d, int k) {
  dg__ddp_bucket *b = &d->b[k];
  if (!d->round_fused) { /* (sharded: the averaging updated the shared copy) */
    uint64_t tr0 = dg__trace_t0();
    dg__optim_step_span(d->opt, b->lo, b->hi, d->pend_lr);
    DG__TRACE_END(tr0, "optimizer step", dg_optim_name(d->opt), "bucket", k, NULL, 0);
  }
  b->applied = 1;
  for (int i = 0; i < d->nparams; i++)
    if (d->pbucket[i] == k) dg__param_set_pending(d->ps, i, 0);
}

/* Finishes and applies bucket k (hooks finish earlier buckets with it). */
static int land(dg_ddp *d, int k) {
  double t0 = dg__ddp_now();
  int rc = dg__ddp_finish_bucket(d, k);
  d->st.wait_s += dg__ddp_now() - t0;
  if (rc) return rc;
  int left = 0;
  for (int j = 0; j < d->nb; j++) {
    if (d->b[j].finished && !d->b[j].applied) apply(d, j);
    left += !d->b[j].applied;
  }
  if (!left) { /* the step is complete */
    d->pending = 0;
    d->zero_due = 1;
    dg__ddp_end_round(d);
  }
  return DG_OK;
}

int dg__ddp_land_all(dg_ddp *d) {
  /* the order the engines prefer: the next forward's */
  for (int k = d->nb - 1; k >= 0 && d->pending; k--)
    if (!d->b[k].applied && land(d, k)) break;
  if (d->err) dg__ddp_end_round(d);
  return d->err;
}

int dg__ddp_defer_step(dg_ddp *d) {
  int rc = dg__optim_begin_step(d->opt);
  if (rc) { /* finish the round all the same: the peers are in it */
    dg__ddp_finish_round(d);
    return dg__ddp_fail(d, rc, "ddp: rank %d: the optimizer's parameter store changed after "
                        "it was created", d->rank);
  }
  d->pend_lr = dg_optim_lr(d->opt); /* a schedule may set the next rate before the update lands */
  if (d->world == 1 || dg__ddp_layout_due(d)) {
    /* one rank has nothing to wait for; the first step re-lays the store
     * out (the rebuild) before its buckets start: no overlap to gain */
    if ((rc = dg__ddp_finish_round(d))) return rc;
    for (int k = 0; k < d->nb; k++) apply(d, k);
    d->zero_due = 1;
    /* every rank updated alike: from here on one copy, updated sharded */
    return d->shard_ok && !d->shard ? d->red->share(d) : DG_OK;
  }
  dg__ddp_start_rest(d);
  /* backward does not wait here: report a failure the group already knows */
  int e = dg__pg_error(d->pg, NULL, 0);
  if (e && !d->err)
    dg__ddp_fail(d, e, "ddp: rank %d: step %lld: the group failed: %s", d->rank,
                 (long long)d->st.sync_steps, dg_pg_errmsg(d->pg));
  if (d->err) {
    dg__ddp_end_round(d);
    return d->err;
  }
  d->pending = 1;
  d->st.overlapped_steps++;
  for (int i = 0; i < d->nparams; i++)
    if (d->pbucket[i] >= 0) dg__param_set_pending(d->ps, i, 1);
  return DG_OK;
}

int dg__ddp_settle(void *user, dg_params *ps, int i, char *err, size_t cap) {
  dg_ddp *d = user;
  if (d->in_gate || ps != d->ps) return DG_OK;
  d->in_gate = 1;
  int rc = DG_OK;
  if (d->pending) {
    int k = i >= 0 && i < d->nparams ? d->pbucket[i] : -1;
    if (i < 0) rc = dg__ddp_land_all(d);
    else if (k >= 0 && !d->b[k].applied) rc = land(d, k);
  }
  if (!rc && i == DG__SETTLE_BACKWARD && d->zero_due) {
    d->zero_due = 0; /* what dg_params_zero_grad after dg_optim_step does */
    dg_params_zero_grad(ps);
  }
  d->in_gate = 0;
  if (rc) snprintf(err, cap, "%s", d->errmsg);
  return rc;
}
