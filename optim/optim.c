/* Optimizer object, SGD and AdamW: element-wise updates run as one kernel
 * call over each run of consecutive trainable parameters of the flat
 * buffers with the same group settings. The kernels are the backend's
 * (backends/kern_optim.h), reached through the backend of the store's
 * device. */
#include <math.h>
#include <string.h>

#include "optim/optim_impl.h"
#include "backends/kern_optim.h"
#include "core/core_impl.h"
#include "base/trace_impl.h"

const char *dg_optim_errmsg(const dg_optim *o) { return o ? o->errmsg : "no optimizer"; }

int dg__optim_alloc(dg_optim **out, dg_params *ps, dg__optim_kind kind, const char *name,
                    int nstate, const char *const *state_names, char *err, size_t cap) {
  /* the store's device: its flat buffers are host memory (core/params.c) */
  const dg__backend *be = dg__backend_get(DG_CPU);
  dg_optim *o = dg__calloc(1, sizeof *o);
  if (!o) return dg__fail_msg(err, cap, DG_ENOMEM, "optim_new_%s: out of memory", name);
  o->kind = kind;
  o->be = be;
  o->name = name;
  o->ps = ps;
  dg_params_data(ps, &o->n);
  o->nparams = dg_params_count(ps);
  for (int k = 0; k < nstate; k++) {
    o->state_name[k] = state_names[k];
    o->state[k] = dg__calloc(o->n ? o->n : 1, sizeof(float));
    o->nstate = k + 1;
    /* a companion moves with its parameters when the store is re-laid out */
    if (!o->state[k] || dg_params_add_companion(ps, o->state[k]) != DG_OK) {
      dg_optim_free(o);
      return dg__fail_msg(err, cap, DG_ENOMEM, "optim_new_%s: out of memory for %s", name,
                          state_names[k]);
    }
  }
  *out = o;
  return DG_OK;
}

void dg_optim_free(dg_optim *o) {
  if (!o) return;
  if (o->owner_release) o->owner_release(o->owner);
  for (int k = 0; k < o->nstate; k++) {
    if (o->state[k]) dg_params_remove_companion(o->ps, o->state[k]);
    dg__free(o->state[k]);
  }
  dg__free(o->excluded);
  dg__free(o->group_of);
  dg__free(o->groups);
  dg__free(o);
}

void dg__optim_param_range(const dg_optim *o, int i, size_t *lo, size_t *hi) {
  *lo = dg_params_offset(o->ps, i);
  *hi = *lo + (size_t)dg_tensor_numel(dg_params_get(o->ps, i));
}

static int same_hyper(dg__optim_hyper a, dg__optim_hyper b) {
  return a.lr == b.lr && a.wd == b.wd;
}

/* Element-wise kinds: calls o->range on maximal runs of trainable
 * parameters lying in [lo, hi) that sit next to each other in memory
 * (separated at most by alignment padding, which is zero in value, gradient
 * and state, so updating it changes nothing) and share their group
 * settings. Parameters are visited in enumeration order and a run grows at
 * either end, so the reversed order dg_params_relayout gives DDP's buckets
 * merges as well as the original one. Per-parameter kinds: o->param on
 * each. lr is the optimizer's (groups scale it). */
static void apply_span(dg_optim *o, float *w, const float *g, size_t lo, size_t hi, float lr) {
  size_t rlo = 0, rhi = 0;
  dg__optim_hyper rh = {0, 0};
  int open = 0;
  for (int i = 0; i < o->nparams; i++) {
    if (!dg_params_trainable(o->ps, i)) continue;
    size_t plo, phi;
    dg__optim_param_range(o, i, &plo, &phi);
    if (plo < lo || phi > hi || plo == phi) continue;
    dg__optim_hyper h = dg__optim_hyper_of(o, i, lr);
    if (!o->range) {
      o->param(o, h, i, w, g, plo, phi);
      continue;
    }
    if (open && same_hyper(h, rh)) {
      if (plo >= rhi && plo - rhi < 16) {
        rhi = phi;
        continue;
      }
      if (phi <= rlo && rlo - phi < 16) {
        rlo = plo;
        continue;
      }
    }
    if (open) o->range(o, rh, w, g, rlo, rhi);
    rlo = plo, rhi = phi, rh = h, open = 1;
  }
  if (open) o->range(o, rh, w, g, rlo, rhi);
}

static int store_unchanged(dg_optim *o, size_t n) {
  if (n == o->n && dg_params_count(o->ps) == o->nparams) return 1;
  dg__optim_fail(o, DG_ESTATE, "optim_step(%s): the parameter store changed after the "
                 "optimizer was created (%d -> %d parameters)", o->name, o->nparams,
                 dg_params_count(o->ps));
  return 0;
}

/* 1 when the store has trainable parameters and none has a gradient since
 * zero_grad or its creation: every one's gradient is still stale (lazy
 * zero_grad; backward's first write, or a read through dg_params_grad /
 * dg_tensor_grad, clears the mark). */
static int no_gradient_yet(const dg_params *ps) {
  int trainable = 0;
  for (int i = 0; i < ps->n; i++) {
    if (!ps->trainable[i]) continue;
    if (!(ps->t[i]->flags & DG_TF_GRAD_STALE)) return 0;
    trainable = 1;
  }
  return trainable;
}

int dg_optim_step(dg_optim *o) {
  if (!o) return DG_EINVAL;
  if (o->ddp_owned)
    return dg__optim_fail(o, DG_ESTATE, "optim_step(%s): this optimizer is stepped by its DDP "
                          "(dg_ddp_overlap_optimizer); dg_ddp_step_ready is 0 for it", o->name);
  if (o->ps->step_block[0])
    return dg__optim_fail(o, DG_ESTATE, "optim_step(%s): %s", o->name, o->ps->step_block);
  if (o->ps->data_lent)
    return dg__optim_fail(o, DG_ESTATE, "optim_step(%s): the store's values are one copy "
                          "shared by the ranks of a DDP that shards its optimizer's update "
                          "(dg_ddp_overlap_optimizer): a step here would be applied once per "
                          "rank", o->name);
  size_t n;
  float *w = dg_params_data(o->ps, &n); /* lands a pending update; reads no gradient */
  if (!store_unchanged(o, n)) return DG_ESTATE;
  /* before dg_params_grad, which zeroes stale gradients and so makes them
   * look written */
  if (no_gradient_yet(o->ps))
    return dg__optim_fail(o, DG_ESTATE, "optim_step(%s): step before any backward: no parameter "
                          "of the store has a gradient since zero_grad; call dg_backward first",
                          o->name);
  const float *g = dg_params_grad(o->ps, NULL);
  o->step++;
  uint64_t tr0 = dg__trace_t0();
  if (n) apply_span(o, w, g, 0, n, o->lr);
  DG__TRACE_END(tr0, "optimizer step", o->name, "step", o->step, "params", (int64_t)n);
  return DG_OK;
}

int dg__optim_begin_step(dg_optim *o) {
  if (!store_unchanged(o, o->ps->used_total)) return DG_ESTATE;
  o->step++;
  return DG_OK;
}

void dg__optim_step_span(dg_optim *o, size_t lo, size_t hi, float lr) {
  /* raw buffers: the caller made the span's gradients final */
  float *w = o->ps->data, *g = dg__params_grad_raw(o->ps);
  if (o->range && !o->mixed) { /* one run: padding between parameters is zero */
    dg__optim_hyper h = {lr, o->wd};
    o->range(o, h, w, g, lo, hi);
  } else {
    apply_span(o, w, g, lo, hi, lr);
  }
}

const char *dg_optim_name(const dg_optim *o) { return o ? o->name : "?"; }
void dg_optim_set_lr(dg_optim *o, float lr) {
  if (o) o->lr = lr;
}
float dg_optim_lr(const dg_optim *o) { return o ? o->lr : 0.0f; }
int64_t dg_optim_step_count(const dg_optim *o) { return o ? o->step : 0; }
int dg_optim_set_step(dg_optim *o, int64_t step) {
  if (!o) return DG_EINVAL;
  if (step < 0)
    return dg__optim_fail(o, DG_EINVAL, "optim_set_step(%s): negative step %lld", o->name,
                          (long long)step);
  (void)dg__params_flush(o->ps, DG__SETTLE_ALL); /* a pending update has its step */
  o->step = step;
  return DG_OK;
}

int dg_optim_state_count(const dg_optim *o) { return o ? o->nstate : 0; }

int dg_optim_state_get(dg_optim *o, int k, const char **name, float **buf, size_t *n) {
  if (!o) return DG_EINVAL;
  if (k < 0 || k >= o->nstate)
    return dg__optim_fail(o, DG_EINVAL, "optim_state_get(%s): state %d outside [0, %d)",
                          o->name, k, o->nstate);
  (void)dg__params_flush(o->ps, DG__SETTLE_ALL); /* a pending DDP update moves it */
  if (name) *name = o->state_name[k];
  if (buf) *buf = o->state[k];
  if (n) *n = o->n;
  return DG_OK;
}

/* ---- SGD ---- */

dg_sgd_opts dg_sgd_defaults(void) {
  dg_sgd_opts d = {0.01f, 0.0f, 0.0f, 0, 0.0f};
  return d;
}

/* The kernel over [lo, hi) of w, g and buf (the momentum buffer or NULL)
 * at step `step`. */
static void sgd_call(dg_optim *o, dg__optim_hyper h, int64_t step, float *w, const float *g,
                     float *buf, size_t lo, size_t hi) {
  dg__sgd_args a = {w, g, buf, lo, hi, h.lr, h.wd, o->sgd.momentum,
                    o->sgd.dampening, step == 1, o->sgd.nesterov};
  o->be->optim->sgd(&a);
}

static void sgd_range(dg_optim *o, dg__optim_hyper h, float *w, const float *g, size_t lo,
                      size_t hi) {
  sgd_call(o, h, o->step, w, g, o->state[0], lo, hi);
}

int dg_optim_new_sgd(dg_optim **out, dg_params *ps, const dg_sgd_opts *opts, char *err,
                     size_t cap) {
  dg_sgd_opts op = opts ? *opts : dg_sgd_defaults();
  if (out) *out = NULL;
  if (!out || !ps) return dg__fail_msg(err, cap, DG_EINVAL, "optim_new_sgd: NULL out or store");
  if (!(op.lr >= 0) || !(op.momentum >= 0) || !(op.weight_decay >= 0) ||
      (op.nesterov && (op.momentum <= 0 || op.dampening != 0)))
    return dg__fail_msg(err, cap, DG_EINVAL, "optim_new_sgd: invalid options (lr %g, momentum "
                        "%g, dampening %g, nesterov %d, weight_decay %g): lr, momentum and "
                        "weight_decay must be >= 0; nesterov needs momentum > 0 and no "
                        "dampening", op.lr, op.momentum, op.dampening, op.nesterov,
                        op.weight_decay);
  static const char *const names[] = {"momentum_buffer"};
  int rc = dg__optim_alloc(out, ps, DG__OPT_SGD, "sgd", op.momentum != 0 ? 1 : 0, names, err,
                           cap);
  if (rc) return rc;
  (*out)->sgd = op;
  (*out)->lr = op.lr;
  (*out)->wd = op.weight_decay;
  (*out)->range = sgd_range;
  return DG_OK;
}

/* ---- AdamW ---- */

dg_adamw_opts dg_adamw_defaults(void) {
  dg_adamw_opts d = {1e-3f, 0.9f, 0.999f, 1e-8f, 1e-2f};
  return d;
}

/* torch.optim.AdamW's step constants; the kernel does the rest. */
static void adamw_call(dg_optim *o, dg__optim_hyper h, int64_t step, float *w, const float *g,
                       float *m, float *v, size_t lo, size_t hi) {
  const dg_adamw_opts *a = &o->adam;
  const double t = (double)step;
  dg__adamw_args k = {w, g, m, v, lo, hi,
                      (float)(1.0 - (double)h.lr * h.wd),
                      (float)(h.lr / (1.0 - pow(a->beta1, t))),
                      (float)sqrt(1.0 - pow(a->beta2, t)), a->beta1, a->beta2, 1.0f - a->beta1,
                      1.0f - a->beta2, a->eps};
  o->be->optim->adamw(&k);
}

static void adamw_range(dg_optim *o, dg__optim_hyper h, float *w, const float *g, size_t lo,
                        size_t hi) {
  adamw_call(o, h, o->step, w, g, o->state[0], o->state[1], lo, hi);
}

int dg__adam_opts_ok(const dg_adamw_opts *a) {
  return a->lr >= 0 && a->beta1 >= 0 && a->beta1 < 1 && a->beta2 >= 0 && a->beta2 < 1 &&
         a->eps >= 0 && a->weight_decay >= 0;
}

int dg__adam_opts_fail(const dg_adamw_opts *a, const char *name, char *err, size_t cap) {
  return dg__fail_msg(err, cap, DG_EINVAL, "optim_new_%s: invalid options (lr %g, betas %g %g, "
                      "eps %g, weight_decay %g): betas must lie in [0, 1), the rest >= 0",
                      name, a->lr, a->beta1, a->beta2, a->eps, a->weight_decay);
}

int dg_optim_new_adamw(dg_optim **out, dg_params *ps, const dg_adamw_opts *opts, char *err,
                       size_t cap) {
  dg_adamw_opts op = opts ? *opts : dg_adamw_defaults();
  if (out) *out = NULL;
  if (!out || !ps)
    return dg__fail_msg(err, cap, DG_EINVAL, "optim_new_adamw: NULL out or store");
  if (!dg__adam_opts_ok(&op)) return dg__adam_opts_fail(&op, "adamw", err, cap);
  static const char *const names[] = {"exp_avg", "exp_avg_sq"};
  int rc = dg__optim_alloc(out, ps, DG__OPT_ADAMW, "adamw", 2, names, err, cap);
  if (rc) return rc;
  (*out)->adam = op;
  (*out)->lr = op.lr;
  (*out)->wd = op.weight_decay;
  (*out)->range = adamw_range;
  return DG_OK;
}


int dg__optim_set_owner(dg_optim *o, dg_params *ps, void *owner, void (*release)(void *owner),
                        char *err, size_t cap) {
  if (owner && o->ps != ps) {
    snprintf(err, cap, "the optimizer (%s) updates another parameter store", o->name);
    return DG_EINVAL;
  }
  if (owner && ((o->ddp_owned && o->owner != owner) || o->fused_ctx)) {
    snprintf(err, cap, "the optimizer (%s) is already stepped by %s", o->name,
             o->fused_ctx ? "backward" : "a DDP");
    return DG_ESTATE;
  }
  o->ddp_owned = owner != NULL;
  o->owner_release = owner ? release : NULL;
  o->owner = owner;
  return DG_OK;
}

/* ---- the sharded update (DDP) ---- */

int dg__optim_shardable(const dg_optim *o) {
  return (o->kind == DG__OPT_SGD || o->kind == DG__OPT_ADAMW) && !o->mixed;
}

void dg__optim_update_at(dg_optim *o, float lr, int64_t step, size_t lo, const float *g,
                         size_t n) {
  /* pointers offset here, the kernel over [0, n): every one stays in its buffer */
  dg__optim_hyper h = {lr, o->wd};
  float *w = o->ps->data + lo;
  if (o->kind == DG__OPT_SGD)
    sgd_call(o, h, step, w, g, o->nstate ? o->state[0] + lo : NULL, 0, n);
  else
    adamw_call(o, h, step, w, g, o->state[0] + lo, o->state[1] + lo, 0, n);
}

float *dg__optim_swap_state(dg_optim *o, int k, float *buf) {
  float *old = o->state[k];
  for (int c = 0; c < o->ps->ncompanions; c++) /* in place: nothing to allocate */
    if (o->ps->companions[c] == old) o->ps->companions[c] = buf;
  o->state[k] = buf;
  return old;
}

uint64_t dg__optim_fingerprint(const dg_optim *o) {
  /* what an update does besides lr and the step (FNV-1a over the settings) */
  struct {
    int kind, nstate, nesterov;
    float wd, momentum, dampening, b1, b2, eps;
  } k = {(int)o->kind, o->nstate, o->sgd.nesterov, o->wd, o->sgd.momentum, o->sgd.dampening,
         o->adam.beta1, o->adam.beta2, o->adam.eps};
  if (o->kind != DG__OPT_SGD) k.nesterov = 0, k.momentum = k.dampening = 0;
  else k.b1 = k.b2 = k.eps = 0;
  uint64_t h = 1469598103934665603ull;
  const unsigned char *b = (const unsigned char *)&k;
  for (size_t i = 0; i < sizeof k; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}
