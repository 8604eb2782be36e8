/* Finite-difference gradient check shared by the grad suite.
 *
 * gc_check(name, f, user, nin, in, atol, rtol): builds out = f(ctx, in),
 * backpropagates a fixed random weighting w (so L = sum(out * w), summed in
 * double), and compares every input element's analytic gradient with the
 * central difference (L(x+h) - L(x-h)) / 2h. Elements where the two one-sided
 * differences disagree sharply sit on a kink (relu at 0, max-pool ties) and
 * are skipped, counted and reported. Returns the number of mismatches. */
#ifndef DG_GRADCHECK_H
#define DG_GRADCHECK_H

#include <dgrad.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef dg_tensor *(*gc_fn)(dg_ctx *ctx, dg_tensor **in, void *user);

/* Persistent f32 tensor filled with uniform values in [lo, hi), grad on. */
static inline dg_tensor *gc_input(int ndim, const int64_t *shape, float lo, float hi,
                                  uint64_t seed) {
  dg_tensor *t = NULL;
  if (dg_tensor_new(&t, DG_F32, ndim, shape, NULL, 0)) return NULL;
  float *d = dg_tensor_data(t);
  size_t n = (size_t)dg_tensor_numel(t);
  dg_rng_uniform(seed, 0, d, n);
  for (size_t i = 0; i < n; i++) d[i] = lo + (hi - lo) * d[i];
  dg_tensor_set_requires_grad(t, 1);
  return t;
}

static inline double gc_loss(dg_ctx *ctx, gc_fn f, void *user, dg_tensor **in,
                             const float *w, int *ok) {
  dg_ctx_reset(ctx);
  int prev = dg_ctx_set_grad_enabled(ctx, 0);
  dg_tensor *out = f(ctx, in, user);
  dg_ctx_set_grad_enabled(ctx, prev);
  if (!out) {
    fprintf(stderr, "gradcheck: forward failed: %s\n", dg_ctx_errmsg(ctx));
    *ok = 0;
    return 0;
  }
  double L = 0;
  for (int64_t i = 0, n = dg_tensor_numel(out); i < n; i++) L += dg_tensor_get(out, i) * w[i];
  return L;
}

static inline int gc_check(const char *name, gc_fn f, void *user, int nin, dg_tensor **in,
                           double atol, double rtol) {
  dg_ctx *ctx = NULL;
  if (dg_ctx_new(&ctx, NULL)) return 1;
  dg_ctx_seed(ctx, 1234);
  dg_tensor *out = f(ctx, in, user);
  if (!out) {
    fprintf(stderr, "FAIL %s: forward failed: %s\n", name, dg_ctx_errmsg(ctx));
    dg_ctx_free(ctx);
    return 1;
  }
  int64_t nout = dg_tensor_numel(out);
  float *w = malloc((size_t)(nout ? nout : 1) * sizeof *w);
  dg_rng_uniform(777, 0, w, (size_t)nout);
  for (int64_t i = 0; i < nout; i++) w[i] = 2.0f * w[i] - 1.0f;
  for (int k = 0; k < nin; k++) {
    dg_tensor *g = dg_tensor_grad(in[k]);
    if (g) memset(dg_tensor_data(g), 0, (size_t)dg_tensor_numel(g) * sizeof(float));
  }
  int bad = 0, kinks = 0, ok = 1;
  dg_tensor *wt = dg_from_data(ctx, DG_F32, dg_tensor_ndim(out), dg_tensor_shape(out), w);
  if (!wt || dg_backward_with(ctx, out, wt)) {
    fprintf(stderr, "FAIL %s: backward failed: %s\n", name, dg_ctx_errmsg(ctx));
    bad = 1;
  }
  for (int k = 0; k < nin && !bad; k++) {
    if (!dg_tensor_requires_grad(in[k])) continue;
    dg_tensor *g = dg_tensor_grad(in[k]);
    float *x = dg_tensor_data(in[k]);
    int64_t n = dg_tensor_numel(in[k]);
    if (!g && n) {
      fprintf(stderr, "FAIL %s: input %d got no gradient\n", name, k);
      bad++;
      continue;
    }
    const float *ga = g ? dg_tensor_data(g) : NULL;
    for (int64_t j = 0; j < n; j++) {
      float x0 = x[j];
      double h = 1e-2 * (fabs(x0) > 1 ? fabs(x0) : 1.0);
      double L0 = gc_loss(ctx, f, user, in, w, &ok);
      x[j] = (float)(x0 + h);
      double hp = (double)x[j] - x0;
      double Lp = gc_loss(ctx, f, user, in, w, &ok);
      x[j] = (float)(x0 - h);
      double hm = x0 - (double)x[j];
      double Lm = gc_loss(ctx, f, user, in, w, &ok);
      x[j] = x0;
      double fd = (Lp - Lm) / (hp + hm);
      double dp = (Lp - L0) / hp, dm = (L0 - Lm) / hm;
      double tol = atol + rtol * fabs(fd);
      if (fabs(dp - dm) > 10 * tol + 0.5 * (fabs(dp) + fabs(dm))) { kinks++; continue; }
      if (!(fabs(ga[j] - fd) <= tol)) {
        if (bad < 8)
          fprintf(stderr, "FAIL %s: input %d elem %lld: analytic %.6g vs numeric %.6g\n",
                  name, k, (long long)j, ga[j], fd);
        bad++;
      }
    }
  }
  if (!ok) bad++;
  if (kinks * 4 > 1 + nout) { /* more than a few skips means the check proved little */
    fprintf(stderr, "FAIL %s: %d elements skipped as kinks\n", name, kinks);
    bad++;
  }
  fprintf(stderr, "%s %s (%d kink(s) skipped)\n", bad ? "FAIL" : "ok  ", name, kinks);
  free(w);
  dg_ctx_free(ctx);
  return bad;
}

#endif
