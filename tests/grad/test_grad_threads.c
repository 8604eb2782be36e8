/* Thread-count and ISA invariance of the element-wise and normalisation
 * kernels that split over the compute pool (and conv2d, split by images): for each op, forward output and
 * input gradients (first backward into fresh gradients, then a second one
 * accumulating) must be bit-identical with 1 and 2 threads, and the
 * baseline (SSE2) build of each kernel must agree with the wide one
 * (AVX2/AVX-512, whichever the CPU has) to rounding. Sizes are large enough
 * for every kernel to go parallel. */
#include <dgrad.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core_impl.h"
#include "backends/cpu/cpu_impl.h"
#include "test.h"

typedef dg_tensor *(*op_fn)(dg_ctx *ctx, dg_tensor **in);

typedef struct {
  const char *name;
  op_fn f;
  int nin;
  int ndim[3];
  int64_t shape[3][4];
  float lo, hi; /* input range */
} op_case;

static dg_tensor *f_relu(dg_ctx *c, dg_tensor **in) { return dg_relu(c, in[0]); }
static dg_tensor *f_gelu(dg_ctx *c, dg_tensor **in) { return dg_gelu(c, in[0]); }
static dg_tensor *f_tanh(dg_ctx *c, dg_tensor **in) { return dg_tanh(c, in[0]); }
static dg_tensor *f_sigmoid(dg_ctx *c, dg_tensor **in) { return dg_sigmoid(c, in[0]); }
static dg_tensor *f_exp(dg_ctx *c, dg_tensor **in) { return dg_exp(c, in[0]); }
static dg_tensor *f_log(dg_ctx *c, dg_tensor **in) { return dg_log(c, in[0]); }
static dg_tensor *f_add(dg_ctx *c, dg_tensor **in) { return dg_add(c, in[0], in[1]); }
static dg_tensor *f_sub(dg_ctx *c, dg_tensor **in) { return dg_sub(c, in[0], in[1]); }
static dg_tensor *f_mul(dg_ctx *c, dg_tensor **in) { return dg_mul(c, in[0], in[1]); }
static dg_tensor *f_div(dg_ctx *c, dg_tensor **in) { return dg_div(c, in[0], in[1]); }
static dg_tensor *f_scale(dg_ctx *c, dg_tensor **in) { return dg_scale(c, in[0], -1.5f); }
static dg_tensor *f_add_scalar(dg_ctx *c, dg_tensor **in) { return dg_add_scalar(c, in[0], 0.25f); }
static dg_tensor *f_layernorm(dg_ctx *c, dg_tensor **in) {
  return dg_layernorm(c, in[0], in[1], in[2], 1e-5f);
}
static dg_tensor *f_layernorm_t(dg_ctx *c, dg_tensor **in) { /* strided input */
  return dg_layernorm(c, dg_transpose(c, in[0], 0, 1), in[1], in[2], 1e-5f);
}
static dg_tensor *f_permute(dg_ctx *c, dg_tensor **in) { /* contiguous-row copy and add */
  int64_t s[4] = {16, 64, 8, 32};
  int perm[4] = {0, 2, 1, 3};
  dg_tensor *h = dg_contiguous(c, dg_permute(c, dg_reshape(c, in[0], 4, s), perm));
  return dg_gelu(c, h);
}
static dg_tensor *f_conv(dg_ctx *c, dg_tensor **in) {
  return dg_conv2d(c, in[0], in[1], in[2], 1, 1);
}
static dg_tensor *f_conv_pw(dg_ctx *c, dg_tensor **in) { /* 1x1: x[n] is its own columns */
  return dg_conv2d(c, in[0], in[1], in[2], 1, 0);
}
static dg_tensor *f_pool(dg_ctx *c, dg_tensor **in) { return dg_maxpool2d(c, in[0], 2, 2); }
static dg_tensor *f_avgpool(dg_ctx *c, dg_tensor **in) { return dg_avgpool2d(c, in[0], 3, 2); }
static dg_tensor *f_gap(dg_ctx *c, dg_tensor **in) { return dg_global_avgpool2d(c, in[0]); }
static dg_tensor *f_leaky(dg_ctx *c, dg_tensor **in) { return dg_leaky_relu(c, in[0], 0.1f); }
static dg_tensor *f_ce(dg_ctx *c, dg_tensor **in) {
  int64_t N = dg_tensor_shape(in[0])[0], C = dg_tensor_shape(in[0])[1];
  int64_t *t = malloc((size_t)N * sizeof *t);
  for (int64_t i = 0; i < N; i++) t[i] = (i * 7919) % C;
  dg_tensor *tt = dg_from_data(c, DG_I64, 1, &N, t);
  free(t);
  return dg_cross_entropy(c, in[0], tt);
}

#define R1(a) 1, {a}
static const op_case cases[] = {
    {"relu", f_relu, 1, {2}, {{512, 400}}, -2, 2},
    {"gelu", f_gelu, 1, {2}, {{512, 400}}, -4, 4},
    {"tanh", f_tanh, 1, {2}, {{512, 400}}, -4, 4},
    {"sigmoid", f_sigmoid, 1, {2}, {{512, 400}}, -8, 8},
    {"exp", f_exp, 1, {2}, {{512, 400}}, -10, 10},
    {"log", f_log, 1, {2}, {{512, 400}}, 0.1f, 4},
    {"add same shape", f_add, 2, {2, 2}, {{512, 400}, {512, 400}}, -2, 2},
    {"add bias", f_add, 2, {2, 1}, {{1024, 200}, {200}}, -2, 2},
    {"sub (B,T,C)-(T,C)", f_sub, 2, {3, 2}, {{8, 64, 256}, {64, 256}}, -2, 2},
    {"mul same shape", f_mul, 2, {2, 2}, {{512, 400}, {512, 400}}, -2, 2},
    {"mul column", f_mul, 2, {2, 2}, {{1024, 200}, {1024, 1}}, -2, 2},
    {"div", f_div, 2, {2, 2}, {{512, 400}, {512, 400}}, 0.5f, 2},
    {"scale", f_scale, 1, {2}, {{512, 400}}, -2, 2},
    {"add_scalar", f_add_scalar, 1, {2}, {{512, 400}}, -2, 2},
    {"layernorm", f_layernorm, 3, {2, 1, 1}, {{1024, 128}, {128}, {128}}, -3, 3},
    {"layernorm strided", f_layernorm_t, 3, {2, 1, 1}, {{300, 700}, {300}, {300}}, -3, 3},
    {"permute+gelu", f_permute, 1, {3}, {{16, 64, 256}}, -2, 2},
    {"conv2d 3x3", f_conv, 3, {4, 4, 1}, {{8, 16, 20, 20}, {32, 16, 3, 3}, {32}}, -1, 1},
    /* 7 images: the weight gradient's last group of columns is partial */
    {"conv2d 3x3 N7", f_conv, 3, {4, 4, 1}, {{7, 16, 20, 20}, {32, 16, 3, 3}, {32}}, -1, 1},
    {"conv2d 1x1", f_conv_pw, 3, {4, 4, 1}, {{6, 16, 20, 20}, {24, 16, 1, 1}, {24}}, -1, 1},
    {"maxpool2d", f_pool, 1, {4}, {{8, 32, 28, 28}}, -1, 1},
    {"avgpool2d 3/2", f_avgpool, 1, {4}, {{8, 32, 28, 28}}, -1, 1},
    {"global_avgpool2d", f_gap, 1, {4}, {{8, 32, 28, 28}}, -1, 1},
    {"leaky_relu", f_leaky, 1, {2}, {{512, 400}}, -2, 2},
    {"cross_entropy", f_ce, 1, {2}, {{2048, 114}}, -5, 5},
};

/* Output, then each input's gradient after one backward (fresh gradients:
 * stored) and after a second (accumulated), concatenated (*n floats). */
static float *run(const op_case *c, int threads, int isa, int64_t *n) {
  dg_set_num_threads(threads);
  dg__simd_force(isa);
  dg_ctx *ctx = NULL;
  if (dg_ctx_new(&ctx, NULL)) return NULL;
  dg_tensor *in[3] = {0};
  for (int k = 0; k < c->nin; k++) {
    REQUIRE(dg_tensor_new(&in[k], DG_F32, c->ndim[k], c->shape[k], NULL, 0) == DG_OK);
    float *d = dg_tensor_data(in[k]);
    int64_t m = dg_tensor_numel(in[k]);
    dg_rng_uniform(100 + (uint64_t)k, 0, d, (size_t)m);
    for (int64_t i = 0; i < m; i++) d[i] = c->lo + (c->hi - c->lo) * d[i];
    dg_tensor_set_requires_grad(in[k], 1);
  }
  float *buf = NULL;
  int64_t total = 0;
  for (int pass = 0; pass < 2; pass++) {
    dg_ctx_reset(ctx);
    dg_tensor *y = c->f(ctx, in);
    REQUIRE(y != NULL);
    int64_t ny = dg_tensor_numel(y);
    dg_tensor *w = dg_empty(ctx, DG_F32, dg_tensor_ndim(y), dg_tensor_shape(y));
    REQUIRE(w != NULL);
    float *wd = dg_tensor_data(w);
    dg_rng_uniform(7, 0, wd, (size_t)ny);
    for (int64_t i = 0; i < ny; i++) wd[i] = 2 * wd[i] - 1;
    int64_t need = ny;
    for (int k = 0; k < c->nin; k++) need += dg_tensor_numel(in[k]);
    buf = realloc(buf, (size_t)(total + need) * sizeof *buf);
    memcpy(buf + total, dg_tensor_data(y), (size_t)ny * sizeof *buf);
    total += ny;
    CHECK_OK(dg_backward_with(ctx, y, w));
    for (int k = 0; k < c->nin; k++) {
      dg_tensor *g = dg_tensor_grad(in[k]);
      REQUIRE(g != NULL);
      int64_t m = dg_tensor_numel(in[k]);
      memcpy(buf + total, dg_tensor_data(g), (size_t)m * sizeof *buf);
      total += m;
    }
  }
  for (int k = 0; k < c->nin; k++) dg_tensor_free(in[k]);
  dg_ctx_free(ctx);
  *n = total;
  return buf;
}

/* Largest |a - b| / (1 + |b|) over n floats (0 when both are the same nan/inf). */
static double max_rel(const float *a, const float *b, int64_t n) {
  double worst = 0;
  for (int64_t i = 0; i < n; i++) {
    if (a[i] == b[i] || (isnan(a[i]) && isnan(b[i]))) continue;
    double d = fabs((double)a[i] - b[i]) / (1 + fabs((double)b[i]));
    if (!(d <= worst)) worst = d;
  }
  return worst;
}

int main(void) {
  int wide = dg__simd_isa();
  fprintf(stderr, "kernels' ISA level: %d (0 = baseline, 1 = AVX2, 2 = AVX-512)\n", wide);
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    const op_case *c = &cases[k];
    int64_t n1 = 0, n2 = 0, nb = 0, nb2 = 0;
    float *a = run(c, 1, wide, &n1), *b = run(c, 2, wide, &n2);
    float *base = run(c, 1, DG_ISA_BASE, &nb), *base2 = run(c, 2, DG_ISA_BASE, &nb2);
    REQUIRE(a && b && base && base2);
    CHECK_EQ_INT(n1, n2);
    CHECK_EQ_INT(n1, nb);
    int same = n1 == n2 && !memcmp(a, b, (size_t)n1 * sizeof *a);
    int same_base = nb == nb2 && !memcmp(base, base2, (size_t)nb * sizeof *a);
    double rel = n1 == nb ? max_rel(base, a, n1) : INFINITY;
    fprintf(stderr, "%s %-20s %lld floats: 1 vs 2 threads %s (baseline ISA %s), wide vs baseline %.2e\n",
            same && same_base && rel < 1e-4 ? "ok  " : "FAIL", c->name, (long long)n1,
            same ? "identical" : "DIFFER", same_base ? "identical" : "DIFFER", rel);
    CHECK(same);
    CHECK(same_base);
    CHECK(rel < 1e-4);
    free(a), free(b), free(base), free(base2);
  }
  dg__simd_force(-1);
  dg_set_num_threads(1);
  return TEST_DONE();
}
