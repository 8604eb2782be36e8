/* Optimizer update kernels of the CPU backend (the optimizers: optim/).
 * Element-wise updates (SGD, AdamW) are independent per element: ranges of
 * at least 2 * 32768 floats are split over the compute pool. LAMB and LARS
 * walk one parameter, norms accumulated in double; no scratch memory (LAMB
 * makes two passes and recomputes its update direction). */
#include <math.h>

#include "backends/cpu/cpu_impl.h"
#include "backends/kern_optim.h"

#define OPTIM_GRAIN 32768

/* ---- SGD ---- */

static void sgd_range(const dg__sgd_args *a, size_t lo, size_t hi) {
  float *w = a->w, *buf = a->buf;
  const float *g = a->g;
  const float lr = a->lr, wd = a->weight_decay, mom = a->momentum;
  const float damp = 1.0f - a->dampening;
  const int first = a->first, nest = a->nesterov;
  if (mom == 0.0f) {
    for (size_t j = lo; j < hi; j++) w[j] -= lr * (g[j] + wd * w[j]);
    return;
  }
  for (size_t j = lo; j < hi; j++) {
    float d = g[j] + wd * w[j];
    float b = first ? d : buf[j] * mom + damp * d;
    buf[j] = b;
    w[j] -= lr * (nest ? d + mom * b : b);
  }
}

static void sgd_chunk(void *arg, int64_t lo, int64_t hi) {
  const dg__sgd_args *a = arg;
  sgd_range(a, a->lo + (size_t)lo, a->lo + (size_t)hi);
}

static void cpu_sgd(const dg__sgd_args *a) {
  dg__parallel_range((int64_t)(a->hi - a->lo), OPTIM_GRAIN, sgd_chunk, (void *)a);
}

/* ---- AdamW ---- */

/* torch.optim.AdamW's update, operation for operation (sqrt and divisions
 * kept: the vector forms round exactly like the scalar ones). */
DG_INLINE void adamw_kernel_body(const dg__adamw_args *k, float *restrict w,
                                 const float *restrict g, float *restrict m, float *restrict v,
                                 size_t n) {
  for (size_t j = 0; j < n; j++) {
    float gj = g[j];
    float mj = m[j] * k->b1 + k->c1 * gj;
    float vj = v[j] * k->b2 + k->c2 * gj * gj;
    m[j] = mj;
    v[j] = vj;
    float wj = w[j] * k->decay;
    w[j] = wj - k->step_size * (mj / (sqrtf(vj) / k->bc2_sqrt + k->eps));
  }
}
DG_SIMD_FN(adamw_kernel,
           (const dg__adamw_args *k, float *restrict w, const float *restrict g,
            float *restrict m, float *restrict v, size_t n),
           (k, w, g, m, v, n))

static void adamw_chunk(void *arg, int64_t clo, int64_t chi) {
  const dg__adamw_args *a = arg;
  size_t lo = a->lo + (size_t)clo, hi = a->lo + (size_t)chi;
  if (hi > lo) adamw_kernel(a, a->w + lo, a->g + lo, a->m + lo, a->v + lo, hi - lo);
}

static void cpu_adamw(const dg__adamw_args *a) {
  dg__parallel_range((int64_t)(a->hi - a->lo), OPTIM_GRAIN, adamw_chunk, (void *)a);
}

/* ---- LAMB ---- */

static void cpu_lamb(const dg__lamb_args *a) {
  const float bc1 = a->bc1, bc2 = a->bc2;
  const float b1 = a->b1, b2 = a->b2, eps = a->eps, wd = a->weight_decay;
  float *w = a->w, *m = a->m, *v = a->v;
  const float *g = a->g;
  const size_t lo = a->lo, hi = a->hi;
  double wn = 0, rn = 0;
  for (size_t j = lo; j < hi; j++) {
    float gj = g[j];
    float mj = m[j] * b1 + (1.0f - b1) * gj;
    float vj = v[j] * b2 + (1.0f - b2) * gj * gj;
    m[j] = mj;
    v[j] = vj;
    float r = (mj / bc1) / (sqrtf(vj / bc2) + eps) + wd * w[j];
    wn += (double)w[j] * w[j];
    rn += (double)r * r;
  }
  double ratio = (wn > 0 && rn > 0) ? sqrt(wn) / sqrt(rn) : 1.0;
  const float step = (float)(a->lr * ratio);
  for (size_t j = lo; j < hi; j++) {
    float r = (m[j] / bc1) / (sqrtf(v[j] / bc2) + eps) + wd * w[j];
    w[j] -= step * r;
  }
}

/* ---- LARS ---- */

static void cpu_lars(const dg__lars_args *a) {
  const float mom = a->momentum;
  float *w = a->w, *buf = a->buf;
  const float *g = a->g;
  const size_t lo = a->lo, hi = a->hi;
  if (a->excluded) {
    const float lr = a->lr;
    for (size_t j = lo; j < hi; j++) {
      buf[j] = mom * buf[j] + lr * g[j];
      w[j] -= buf[j];
    }
    return;
  }
  const float wd = a->weight_decay;
  double wn = 0, gn = 0;
  for (size_t j = lo; j < hi; j++) {
    wn += (double)w[j] * w[j];
    gn += (double)g[j] * g[j];
  }
  wn = sqrt(wn);
  gn = sqrt(gn);
  double local = 1.0;
  if (wn > 0 && gn > 0) local = a->trust_coef * wn / (gn + wd * wn + a->eps);
  const float scale = (float)(a->lr * local);
  for (size_t j = lo; j < hi; j++) {
    buf[j] = mom * buf[j] + scale * (g[j] + wd * w[j]);
    w[j] -= buf[j];
  }
}

const struct dg__kern_optim dg__cpu_kern_optim = {cpu_sgd, cpu_adamw, cpu_lamb, cpu_lars};
