/* Layer-wise adaptive optimizers: LAMB (You et al. 2019) and LARS (You et al.
 * 2017). Both need per-parameter norms, so they walk the store parameter by
 * parameter; the per-parameter math is the backend's kernel
 * (backends/kern_optim.h). */
#include <math.h>
#include <string.h>

#include "optim/optim_impl.h"
#include "backends/kern_optim.h"

/* ---- LAMB ---- */

dg_lamb_opts dg_lamb_defaults(void) { return dg_adamw_defaults(); }

static void lamb_param(dg_optim *o, dg__optim_hyper h, int i, float *w, const float *g,
                       size_t lo, size_t hi) {
  (void)i;
  const dg_adamw_opts *a = &o->adam;
  const double t = (double)o->step;
  dg__lamb_args k = {w, g, o->state[0], o->state[1], lo, hi, h.lr, a->beta1, a->beta2, a->eps,
                     h.wd, (float)(1.0 - pow(a->beta1, t)), (float)(1.0 - pow(a->beta2, t))};
  o->be->optim->lamb(&k);
}

int dg_optim_new_lamb(dg_optim **out, dg_params *ps, const dg_lamb_opts *opts, char *err,
                      size_t cap) {
  dg_lamb_opts op = opts ? *opts : dg_lamb_defaults();
  if (out) *out = NULL;
  if (!out || !ps)
    return dg__fail_msg(err, cap, DG_EINVAL, "optim_new_lamb: NULL out or store");
  if (!dg__adam_opts_ok(&op)) return dg__adam_opts_fail(&op, "lamb", err, cap);
  static const char *const names[] = {"exp_avg", "exp_avg_sq"};
  int rc = dg__optim_alloc(out, ps, DG__OPT_LAMB, "lamb", 2, names, err, cap);
  if (rc) return rc;
  (*out)->adam = op;
  (*out)->lr = op.lr;
  (*out)->wd = op.weight_decay;
  (*out)->param = lamb_param;
  return DG_OK;
}

/* ---- LARS ---- */

dg_lars_opts dg_lars_defaults(void) {
  dg_lars_opts d;
  memset(&d, 0, sizeof d);
  d.lr = 0.1f;
  d.momentum = 0.9f;
  d.weight_decay = 5e-4f;
  d.trust_coef = 1e-3f;
  return d;
}

static void lars_param(dg_optim *o, dg__optim_hyper h, int i, float *w, const float *g,
                       size_t lo, size_t hi) {
  dg__lars_args k = {w, g, o->state[0], lo, hi, h.lr, o->lars.momentum, h.wd,
                     o->lars.trust_coef, o->lars.eps, o->excluded[i]};
  o->be->optim->lars(&k);
}

/* Fills o->excluded from the rules documented in optim.h. */
static void lars_exclusions(dg_optim *o, const dg_lars_opts *op) {
  for (int i = 0; i < o->nparams; i++) {
    dg_tensor *t = dg_params_get(o->ps, i);
    const char *name = dg_tensor_name(t);
    int ex = !op->adapt_1d && dg_tensor_ndim(t) <= 1;
    for (int k = 0; !ex && k < op->n_exclude_suffixes; k++)
      ex = op->exclude_suffixes[k] && dg__has_suffix(name, op->exclude_suffixes[k]);
    if (!ex && op->exclude) ex = op->exclude(op->exclude_user, i, name, t) != 0;
    o->excluded[i] = (unsigned char)ex;
  }
}

int dg_optim_new_lars(dg_optim **out, dg_params *ps, const dg_lars_opts *opts, char *err,
                      size_t cap) {
  dg_lars_opts op = opts ? *opts : dg_lars_defaults();
  if (out) *out = NULL;
  if (op.trust_coef == 0) op.trust_coef = 1e-3f;
  if (!out || !ps)
    return dg__fail_msg(err, cap, DG_EINVAL, "optim_new_lars: NULL out or store");
  if (!(op.lr >= 0) || !(op.momentum >= 0) || !(op.weight_decay >= 0) ||
      !(op.trust_coef > 0) || !(op.eps >= 0) || op.n_exclude_suffixes < 0 ||
      (op.n_exclude_suffixes > 0 && !op.exclude_suffixes))
    return dg__fail_msg(err, cap, DG_EINVAL, "optim_new_lars: invalid options (lr %g, momentum "
                        "%g, weight_decay %g, trust_coef %g, eps %g, %d exclude suffixes at %p)",
                        op.lr, op.momentum, op.weight_decay, op.trust_coef, op.eps,
                        op.n_exclude_suffixes, (const void *)op.exclude_suffixes);
  static const char *const names[] = {"momentum_buffer"};
  int rc = dg__optim_alloc(out, ps, DG__OPT_LARS, "lars", 1, names, err, cap);
  if (rc) return rc;
  dg_optim *o = *out;
  o->excluded = dg__calloc(o->nparams ? (size_t)o->nparams : 1, 1);
  if (!o->excluded) {
    dg_optim_free(o);
    *out = NULL;
    return dg__fail_msg(err, cap, DG_ENOMEM, "optim_new_lars: out of memory");
  }
  lars_exclusions(o, &op);
  op.exclude_suffixes = NULL;
  op.n_exclude_suffixes = 0;
  op.exclude = NULL;
  op.exclude_user = NULL;
  o->lars = op;
  o->lr = op.lr;
  o->wd = op.weight_decay;
  o->param = lars_param;
  return DG_OK;
}
