/* Learning-rate schedules (pure functions of the step) and the linear
 * scaling rule. */
#include <math.h>

#include "optim/optim_impl.h"

static double cosine(double base, double min_lr, int64_t s, int64_t total) {
  if (s > total) s = total;
  return min_lr + (base - min_lr) * (1.0 + cos(M_PI * (double)s / (double)total)) / 2.0;
}

float dg_lr_at(const dg_lr_schedule *s, int64_t step) {
  if (!s) return 0.0f;
  const double base = s->base_lr;
  if (step < 0) step = 0;
  switch (s->kind) {
  case DG_LR_STEP:
    if (s->step_size <= 0) return s->base_lr;
    return (float)(base * pow(s->gamma, (double)(step / s->step_size)));
  case DG_LR_COSINE:
    if (s->total_steps <= 0) return s->base_lr;
    return (float)cosine(base, s->min_lr, step, s->total_steps);
  case DG_LR_WARMUP_CONSTANT:
  case DG_LR_WARMUP_COSINE:
    if (step < s->warmup_steps)
      return (float)(base * (double)(step + 1) / (double)s->warmup_steps);
    if (s->kind == DG_LR_WARMUP_CONSTANT || s->total_steps <= s->warmup_steps)
      return s->base_lr;
    return (float)cosine(base, s->min_lr, step - s->warmup_steps,
                         s->total_steps - s->warmup_steps);
  case DG_LR_CONSTANT:
  default:
    return s->base_lr;
  }
}

float dg_lr_scale_linear(float base_lr, int base_batch, int global_batch) {
  if (base_batch <= 0) return base_lr;
  return (float)((double)base_lr * global_batch / base_batch);
}
