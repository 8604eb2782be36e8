/* Parameter groups (torch's param_groups): a weight decay and an lr
 * multiplier per group of parameters, chosen by a selector over names and
 * tensors. Configuration only: the step reads group_of, allocated here. */
#include <math.h>
#include <string.h>

#include "optim/optim_impl.h"
#include "core/core_impl.h"

int dg__has_suffix(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return b <= a && !strcmp(s + a - b, suf);
}

int dg_param_filter_1d(void *user, int index, const char *name, const dg_tensor *param) {
  (void)user, (void)index, (void)name;
  return dg_tensor_ndim(param) <= 1;
}

int dg_param_filter_prefix(void *user, int index, const char *name, const dg_tensor *param) {
  (void)index, (void)param;
  for (const char *const *p = user; p && *p; p++)
    if (!strncmp(name, *p, strlen(*p))) return 1;
  return 0;
}

int dg_param_filter_suffix(void *user, int index, const char *name, const dg_tensor *param) {
  (void)index, (void)param;
  for (const char *const *p = user; p && *p; p++)
    if (dg__has_suffix(name, *p)) return 1;
  return 0;
}

/* Grows the group table by one and makes sure group_of exists. */
static int add_slot(dg_optim *o) {
  if (o->ngroups >= UINT16_MAX)
    return dg__optim_fail(o, DG_EINVAL, "optim_set_group(%s): more than %d groups", o->name,
                          UINT16_MAX);
  if (!o->group_of) {
    o->group_of = dg__calloc(o->nparams ? (size_t)o->nparams : 1, sizeof *o->group_of);
    if (!o->group_of) return dg__optim_fail(o, DG_ENOMEM, "optim_set_group(%s): out of memory",
                                            o->name);
  }
  dg__optim_group *g = dg__realloc(o->groups, (size_t)(o->ngroups + 1) * sizeof *g);
  if (!g) return dg__optim_fail(o, DG_ENOMEM, "optim_set_group(%s): out of memory", o->name);
  o->groups = g;
  return DG_OK;
}

int dg_optim_set_group(dg_optim *o, dg_param_filter_fn select, void *user, float weight_decay,
                       float lr_scale) {
  if (!o) return DG_EINVAL;
  if (!(weight_decay >= 0) || !isfinite(weight_decay) || !(lr_scale >= 0) ||
      !isfinite(lr_scale))
    return dg__optim_fail(o, DG_EINVAL, "optim_set_group(%s): weight_decay %g and lr_scale %g "
                          "must be finite and >= 0", o->name, weight_decay, lr_scale);
  if (dg_params_count(o->ps) != o->nparams)
    return dg__optim_fail(o, DG_ESTATE, "optim_set_group(%s): the parameter store changed "
                          "after the optimizer was created (%d -> %d parameters)", o->name,
                          o->nparams, dg_params_count(o->ps));
  int rc = add_slot(o);
  if (rc) return rc;
  /* a pending update (DDP overlap) belongs to the step before this call */
  (void)dg__params_flush(o->ps, DG__SETTLE_ALL);
  const uint16_t id = (uint16_t)(o->ngroups + 1);
  int selected = 0;
  for (int i = 0; i < o->nparams; i++) {
    dg_tensor *t = dg_params_get(o->ps, i);
    if (select && !select(user, i, dg_tensor_name(t), t)) continue;
    o->group_of[i] = id;
    selected++;
  }
  o->groups[o->ngroups++] = (dg__optim_group){weight_decay, lr_scale};
  o->mixed = 0; /* decided once here, not per step: does any setting differ? */
  for (int i = 0; i < o->nparams && !o->mixed; i++) {
    const int g = o->group_of[i];
    o->mixed = g && (o->groups[g - 1].weight_decay != o->wd || o->groups[g - 1].lr_scale != 1.0f);
  }
  return selected;
}

int dg_optim_param_group(const dg_optim *o, int i, float *lr, float *weight_decay) {
  if (!o || i < 0 || i >= o->nparams) return DG_EINVAL;
  dg__optim_hyper h = dg__optim_hyper_of(o, i, o->lr);
  if (lr) *lr = h.lr;
  if (weight_decay) *weight_decay = h.wd;
  return o->group_of ? o->group_of[i] : 0;
}
