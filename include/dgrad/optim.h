/* dgrad/optim.h — optimizers (SGD, AdamW, LAMB, LARS), gradient clipping,
 * learning-rate schedules.
 *
 * Optimizers update a dg_params store in place: they read the flat gradient
 * buffer and write the flat value buffer. Element-wise updates run as one
 * loop over each run of consecutive trainable parameters with the same group
 * settings (dg_optim_set_group); LAMB and LARS work per parameter (trust
 * ratios). Frozen parameters (dg_params_trainable == 0) are skipped and their
 * state is left untouched.
 *
 * Ownership. An optimizer borrows its store: the store must outlive it and
 * must not gain parameters after the optimizer is created (dg_optim_step then
 * returns DG_ESTATE). The optimizer owns its state buffers, allocated once by
 * the constructor and registered as companions of the store (so
 * dg_params_relayout moves them with their parameters); dg_optim_step never
 * allocates. dg_optim_free(NULL) is a no-op.
 *
 * Threads. An optimizer is used by one thread at a time, and nothing may run
 * backward into its store during dg_optim_step. dg_lr_at and
 * dg_lr_scale_linear are pure and may be called from any thread. */
#ifndef DGRAD_OPTIM_H
#define DGRAD_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "dgrad/common.h"
#include "dgrad/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dg_optim dg_optim;

/* torch.optim.SGD semantics (PyTorch 1.13):
 *   d = g + weight_decay * w
 *   buf = d on the first step, else momentum * buf + (1 - dampening) * d
 *   d = nesterov ? d + momentum * buf : buf      (when momentum != 0)
 *   w -= lr * d
 * State "momentum_buffer" exists only when momentum != 0. */
typedef struct {
  float lr;
  float momentum;
  float dampening;
  int nesterov; /* needs momentum > 0 and dampening == 0 (as torch) */
  float weight_decay;
} dg_sgd_opts;

/* torch.optim.AdamW semantics (PyTorch 1.13, amsgrad off), t = step:
 *   w *= 1 - lr * weight_decay
 *   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
 *   w -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
 * State "exp_avg", "exp_avg_sq". */
typedef struct {
  float lr;    /* torch default 1e-3 */
  float beta1; /* 0.9 */
  float beta2; /* 0.999 */
  float eps;   /* 1e-8 */
  float weight_decay; /* 1e-2 */
} dg_adamw_opts;

/* LAMB (You et al. 2019), per parameter:
 *   m, v as AdamW; m_hat = m / (1 - b1^t), v_hat = v / (1 - b2^t)
 *   r = m_hat / (sqrt(v_hat) + eps) + weight_decay * w
 *   ratio = ||w|| / ||r||  (1 when either norm is 0)
 *   w -= lr * ratio * r
 * Norms in double. State "exp_avg", "exp_avg_sq". */
typedef dg_adamw_opts dg_lamb_opts;

/* Decides whether parameter `index` (name, tensor) is selected: excluded
 * from LARS adaptation and weight decay (dg_lars_opts.exclude), or a member
 * of a parameter group (dg_optim_set_group). Return nonzero to select. */
typedef int (*dg_param_filter_fn)(void *user, int index, const char *name,
                                  const dg_tensor *param);

/* LARS (You et al. 2017, Algorithm 1), per parameter:
 *   local = trust_coef * ||w|| / (||g|| + weight_decay * ||w|| + eps)
 *           (1 when ||w|| or ||g|| is 0)
 *   buf = momentum * buf + lr * local * (g + weight_decay * w)
 *   w -= buf
 * Excluded parameters use local = 1 and no weight decay:
 *   buf = momentum * buf + lr * g; w -= buf.
 * Excluded are: parameters with ndim <= 1 (biases, norm weights) unless
 * adapt_1d is set; names ending in any of exclude_suffixes; parameters for
 * which exclude() returns nonzero. State "momentum_buffer". */
typedef struct {
  float lr;
  float momentum;     /* 0.9 is usual */
  float weight_decay;
  float trust_coef;   /* eta; 0 means 0.001 */
  float eps;          /* added to the denominator; 0 is the paper's */
  int adapt_1d;       /* 1: do not exclude ndim <= 1 parameters */
  const char *const *exclude_suffixes; /* n_exclude_suffixes strings */
  int n_exclude_suffixes;
  dg_param_filter_fn exclude; /* may be NULL */
  void *exclude_user;
} dg_lars_opts;

/* Defaults as in torch where torch has the optimizer (SGD: lr 0.01, the rest
 * 0; AdamW: 1e-3, 0.9, 0.999, 1e-8, 1e-2; LAMB: as AdamW with wd 0.01;
 * LARS: lr 0.1, momentum 0.9, wd 5e-4, trust 1e-3, eps 0). A NULL opts
 * pointer to a constructor means these. */
DG_API dg_sgd_opts dg_sgd_defaults(void);
DG_API dg_adamw_opts dg_adamw_defaults(void);
DG_API dg_lamb_opts dg_lamb_defaults(void);
DG_API dg_lars_opts dg_lars_defaults(void);

/* Constructors: DG_EINVAL on a NULL store/out or invalid hyperparameters
 * (negative lr, betas outside [0, 1), ...), DG_ENOMEM; err (cap bytes, may
 * be NULL) names the options. */
DG_API int dg_optim_new_sgd(dg_optim **out, dg_params *ps, const dg_sgd_opts *opts, char *err,
                            size_t cap);
DG_API int dg_optim_new_adamw(dg_optim **out, dg_params *ps, const dg_adamw_opts *opts,
                              char *err, size_t cap);
DG_API int dg_optim_new_lamb(dg_optim **out, dg_params *ps, const dg_lamb_opts *opts,
                             char *err, size_t cap);
DG_API int dg_optim_new_lars(dg_optim **out, dg_params *ps, const dg_lars_opts *opts,
                             char *err, size_t cap);
DG_API void dg_optim_free(dg_optim *o);
/* Detail of the last failing call on the optimizer ("" when none). */
DG_API const char *dg_optim_errmsg(const dg_optim *o);

/* One update from the current gradients; increments the step count first
 * (so the first step uses t = 1). No heap allocation. The step count is one
 * per optimizer, not per parameter as in torch: a parameter unfrozen after
 * some steps gets the global t in its bias corrections, and SGD's "first
 * step" (momentum buffer = d) is step 1 of the optimizer.
 * A step before any backward is refused: when no trainable parameter of the
 * store has a gradient since dg_params_zero_grad (or since it was added),
 * it returns DG_ESTATE ("step before any backward") and changes nothing
 * (no step counted, no weight decay). When some have one, the others read
 * as zero (torch 1.13's zero_grad() default). A gradient counts once
 * backward reached (or passed) its parameter, or once it was read or written
 * through dg_params_grad / dg_tensor_grad. */
DG_API int dg_optim_step(dg_optim *o);

/* ---- parameter groups (torch's param_groups) ----
 *
 * dg_optim_set_group gives the parameters `select` accepts their own weight
 * decay and a learning-rate multiplier: their lr is dg_optim_lr(o) *
 * lr_scale, so a schedule (dg_optim_set_lr) scales every group alike, as
 * torch's schedulers scale each group's lr. Every other hyperparameter
 * (momentum, betas, eps, trust_coef, LARS exclusions) stays the
 * optimizer's. Parameters no call selected keep the constructor's options
 * (the default group). Calls apply in order: a later call that selects a
 * parameter again moves it to the later group. `select` is called once per
 * parameter of the store (frozen ones too), now; NULL selects all. The
 * result equals torch with the corresponding param_groups, e.g. for AdamW
 *   dg_optim_set_group(o, dg_param_filter_1d, NULL, 0.0f, 1.0f);
 * is [{"params": <ndim >= 2>}, {"params": <ndim <= 1>, "weight_decay": 0}]
 * (no decay on biases and norm weights), and
 *   static const char *const bb[] = {"backbone.", NULL};
 *   dg_optim_set_group(o, dg_param_filter_prefix, (void *)bb, wd, 0.1f);
 * trains a backbone at a tenth of the lr. Per kind: SGD and AdamW use the
 * group's weight_decay and lr in torch's formulas (above); LAMB in r and the
 * update; LARS in the local trust ratio, the decay term and the update of
 * its non-excluded parameters (excluded ones take no decay, the group's lr).
 * Groups are configuration, not state: checkpoints do not save them (nor
 * does dg_optim_state_get show them); set them again when rebuilding the
 * optimizer, before or after dg_checkpoint_load. A pending DDP update lands
 * first (under the settings of its step).
 * Returns the number of parameters selected (0 is not an error: a model
 * without biases), DG_EINVAL for a negative or non-finite weight_decay or
 * lr_scale, DG_ESTATE when the store changed after the optimizer was
 * created, DG_ENOMEM. Not thread-safe; call it between steps. */
DG_API int dg_optim_set_group(dg_optim *o, dg_param_filter_fn select, void *user,
                              float weight_decay, float lr_scale);
/* The group of parameter i (0: the default group; k: the k-th
 * dg_optim_set_group call), and its lr and weight decay at the current
 * dg_optim_lr (either pointer may be NULL). DG_EINVAL for i out of range. */
DG_API int dg_optim_param_group(const dg_optim *o, int i, float *lr, float *weight_decay);

/* Ready-made selectors for dg_optim_set_group (and LARS's exclude):
 *   dg_param_filter_1d      ndim <= 1: biases, LayerNorm/BatchNorm weights;
 *                           user ignored
 *   dg_param_filter_prefix  the name starts with one of `user`, a
 *                           NULL-terminated array of strings
 *                           (const char *const[])
 *   dg_param_filter_suffix  the name ends with one of `user` (the same) */
DG_API int dg_param_filter_1d(void *user, int index, const char *name, const dg_tensor *param);
DG_API int dg_param_filter_prefix(void *user, int index, const char *name,
                                  const dg_tensor *param);
DG_API int dg_param_filter_suffix(void *user, int index, const char *name,
                                  const dg_tensor *param);

/* Fuses the step into backward on `ctx` (SGD and AdamW): each parameter is
 * updated from its grad-ready hook, the moment its gradient is final, with
 * the same arithmetic as dg_optim_step; do not call dg_optim_step as well.
 * Not for gradient clipping by global norm, accumulation over several
 * backwards, or DDP (whose reduced gradient arrives after the hook). Returns
 * DG_EUNSUPPORTED for LAMB/LARS, DG_ESTATE when already fused. The ctx must
 * outlive the fusion (dg_optim_unfuse_backward ends it). */
DG_API int dg_optim_fuse_backward(dg_optim *o, dg_ctx *ctx);
DG_API int dg_optim_unfuse_backward(dg_optim *o);

/* "sgd", "adamw", "lamb", "lars". */
DG_API const char *dg_optim_name(const dg_optim *o);
DG_API void dg_optim_set_lr(dg_optim *o, float lr);
DG_API float dg_optim_lr(const dg_optim *o);
/* Steps taken (restored by dg_optim_set_step). */
DG_API int64_t dg_optim_step_count(const dg_optim *o);
DG_API int dg_optim_set_step(dg_optim *o, int64_t step);

/* State for checkpoints: named flat buffers with the layout of the store's
 * flat value buffer (n floats, parameter i at dg_params_offset(ps, i)), plus
 * the scalar step count. dg_optim_state_get hands out the optimizer's own
 * buffer: read it to save, write into it to restore (owned by the optimizer,
 * valid until dg_optim_free). Returns DG_EINVAL for k out of range. */
DG_API int dg_optim_state_count(const dg_optim *o);
DG_API int dg_optim_state_get(dg_optim *o, int k, const char **name, float **buf, size_t *n);

/* Clips gradients by their global L2 norm (torch.nn.utils.clip_grad_norm_):
 * total = sqrt(sum over trainable parameters of ||g||^2) computed in double;
 * every trainable gradient is multiplied by min(1, max_norm / (total + 1e-6)).
 * total_norm (may be NULL) receives the norm before clipping. DG_EINVAL for a
 * negative max_norm, DG_ESTATE when a DDP owns the store's optimizer step
 * (dg_ddp_overlap_optimizer). A non-finite total is reported and nothing is
 * scaled when it is NaN. */
DG_API int dg_clip_grad_norm(dg_params *ps, double max_norm, double *total_norm);

/* Learning-rate schedules, a pure function of the step index (0-based: the
 * lr to use for the step-th update).
 *   CONSTANT        base_lr
 *   STEP            base_lr * gamma^floor(step / step_size)   (torch StepLR)
 *   COSINE          min_lr + (base_lr - min_lr) (1 + cos(pi s / T)) / 2,
 *                   s = min(step, T), T = total_steps (torch CosineAnnealingLR)
 *   WARMUP_CONSTANT base_lr * (step + 1) / warmup_steps while step <
 *                   warmup_steps, then base_lr
 *   WARMUP_COSINE   the same warmup, then COSINE over the remaining
 *                   total_steps - warmup_steps steps
 * Invalid parameters (step_size <= 0 for STEP, total_steps <= warmup_steps
 * for the cosine kinds) fall back to base_lr. */
typedef enum {
  DG_LR_CONSTANT = 0,
  DG_LR_STEP = 1,
  DG_LR_COSINE = 2,
  DG_LR_WARMUP_CONSTANT = 3,
  DG_LR_WARMUP_COSINE = 4
} dg_lr_kind;

typedef struct {
  dg_lr_kind kind;
  float base_lr;
  int64_t warmup_steps;
  int64_t total_steps;
  int64_t step_size;
  float gamma;
  float min_lr;
} dg_lr_schedule;

DG_API float dg_lr_at(const dg_lr_schedule *s, int64_t step);

/* Linear scaling rule (Goyal et al. 2017): base_lr * global_batch / base_batch
 * (base_lr when base_batch <= 0). */
DG_API float dg_lr_scale_linear(float base_lr, int base_batch, int global_batch);

#ifdef __cplusplus
}
#endif
#endif /* DGRAD_OPTIM_H */
