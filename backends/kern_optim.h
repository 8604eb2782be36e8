/* Kernels of the optimizer updates (optim/): each runs over a range [lo, hi)
 * of the parameter store's flat buffers (value w, gradient g, state laid out
 * like them), with the step's scalars worked out by the optimizer. Not API. */
#ifndef DG_KERN_OPTIM_H
#define DG_KERN_OPTIM_H

#include <stddef.h>

/* torch.optim.SGD over [lo, hi). */
typedef struct {
  float *w;
  const float *g;
  float *buf; /* momentum buffer; unused (may be NULL) when momentum is 0 */
  size_t lo, hi;
  float lr, weight_decay, momentum, dampening;
  int first, nesterov; /* first: the first step (the buffer starts as d) */
} dg__sgd_args;

/* torch.optim.AdamW over [lo, hi), from the step's constants:
 * w = w * decay - step_size * m / (sqrt(v) / bc2_sqrt + eps), with
 * m = b1 m + c1 g and v = b2 v + c2 g^2 first. */
typedef struct {
  float *w;
  const float *g;
  float *m, *v;
  size_t lo, hi;
  float decay, step_size, bc2_sqrt, b1, b2, c1, c2, eps;
} dg__adamw_args;

/* LAMB over one parameter [lo, hi): Adam moments, then the trust ratio
 * ||w|| / ||r|| of the update direction r (bias corrections bc1, bc2). */
typedef struct {
  float *w;
  const float *g;
  float *m, *v;
  size_t lo, hi;
  float lr, b1, b2, eps, weight_decay, bc1, bc2;
} dg__lamb_args;

/* LARS over one parameter [lo, hi): momentum SGD scaled by the local
 * trust_coef ||w|| / (||g|| + wd ||w|| + eps); excluded: plain momentum
 * SGD without decay. */
typedef struct {
  float *w;
  const float *g;
  float *buf;
  size_t lo, hi;
  float lr, momentum, weight_decay, trust_coef, eps;
  int excluded;
} dg__lars_args;

struct dg__kern_optim {
  /* element-wise: any range (split over the device as the backend likes) */
  void (*sgd)(const dg__sgd_args *a);
  void (*adamw)(const dg__adamw_args *a);
  /* per parameter (norms over the whole range first) */
  void (*lamb)(const dg__lamb_args *a);
  void (*lars)(const dg__lars_args *a);
};

#endif
