/* Gradient clipping by global L2 norm (torch.nn.utils.clip_grad_norm_). */
#include <math.h>

#include "optim/optim_impl.h"
#include "core/core_impl.h"

int dg_clip_grad_norm(dg_params *ps, double max_norm, double *total_norm) {
  if (total_norm) *total_norm = 0;
  if (!ps) return DG_EINVAL;
  if (!(max_norm >= 0))
    return dg__params_fail(ps, DG_EINVAL, "clip_grad_norm: max_norm %g must be >= 0", max_norm);
  if (ps->update_owned)
    return dg__params_fail(ps, DG_ESTATE, "clip_grad_norm: a DDP applies this store's updates "
                           "bucket by bucket (dg_ddp_overlap_optimizer): there is no moment "
                           "when every gradient is final and none applied; clipping by "
                           "global norm needs the plain loop");
  /* stale gradients (no backward wrote them since zero_grad) are zero and
   * stay stale: reading them through dg_params_grad would make them look
   * written, and a step would no longer see that no backward ran */
  (void)dg__params_flush(ps, DG__SETTLE_ALL);
  float *g = dg__params_grad_raw(ps);
  int np = dg_params_count(ps);
  double sum = 0;
  for (int i = 0; i < np; i++) {
    if (!dg_params_trainable(ps, i) || (ps->t[i]->flags & DG_TF_GRAD_STALE)) continue;
    size_t lo = dg_params_offset(ps, i);
    size_t hi = lo + (size_t)dg_tensor_numel(dg_params_get(ps, i));
    for (size_t j = lo; j < hi; j++) sum += (double)g[j] * g[j];
  }
  double total = sqrt(sum);
  if (total_norm) *total_norm = total;
  if (!isfinite(total)) {
    DG_LOGW("clip_grad_norm: the total gradient norm is %g; gradients left as they are",
            total);
    return DG_OK;
  }
  double coef = max_norm / (total + 1e-6);
  if (coef >= 1.0) return DG_OK; /* torch multiplies by 1.0: a no-op */
  const float c = (float)coef;
  for (int i = 0; i < np; i++) {
    if (!dg_params_trainable(ps, i) || (ps->t[i]->flags & DG_TF_GRAD_STALE)) continue;
    size_t lo = dg_params_offset(ps, i);
    size_t hi = lo + (size_t)dg_tensor_numel(dg_params_get(ps, i));
    for (size_t j = lo; j < hi; j++) g[j] *= c;
  }
  return DG_OK;
}
