/* dg_maxpool2d with a 2x2 window and stride 2 (the CPU backend's AVX2
 * kernel where the CPU has AVX2, else the scalar one) against a reference
 * loop with PyTorch's rules, on every SIMD level the CPU has: values bit
 * for bit, and through backward the index each output took (ties go to the
 * first maximum in row-major window order, a NaN wins and a later NaN
 * wins over an earlier one), into a fresh dx and, with x pooled twice,
 * added into one. Data: random values on a coarse grid (many
 * ties), NaNs, infinities, -0 and +0; widths that leave every count of
 * outputs, 0 to 7, past a row's last whole 8 (OW 1 to 17) and odd sizes
 * (the last row or column dropped). */
#include <dgrad.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu_impl.h"
#include "test.h"

static uint32_t g_x = 2463534242u;

static uint32_t next(void) { /* xorshift32 */
  g_x ^= g_x << 13, g_x ^= g_x >> 17, g_x ^= g_x << 5;
  return g_x;
}

/* Mostly small integers (ties), some NaN, +-inf, -0 and +0. */
static float pick(void) {
  uint32_t r = next() % 64;
  if (r == 0) return NAN;
  if (r == 1) return -NAN;
  if (r == 2) return INFINITY;
  if (r == 3) return -INFINITY;
  if (r == 4) return -0.0f;
  if (r == 5) return 0.0f;
  return (float)((int)(next() % 7) - 3);
}

/* The flat input index each output takes: PyTorch's CPU rule. */
static void ref_pool(const float *x, int64_t planes, int64_t H, int64_t W, float *y,
                     int64_t *arg) {
  int64_t OH = H / 2, OW = W / 2;
  for (int64_t p = 0; p < planes; p++)
    for (int64_t oh = 0; oh < OH; oh++)
      for (int64_t ow = 0; ow < OW; ow++) {
        int64_t base = p * H * W + 2 * oh * W + 2 * ow, mi = base;
        float m = x[base];
        for (int i = 0; i < 2; i++)
          for (int j = 0; j < 2; j++) {
            float v = x[base + i * W + j];
            if (v > m || isnan(v)) m = v, mi = base + i * W + j;
          }
        int64_t o = (p * OH + oh) * OW + ow;
        y[o] = m, arg[o] = mi;
      }
}

static int same_bits(float a, float b) {
  uint32_t x, y;
  memcpy(&x, &a, 4), memcpy(&y, &b, 4);
  return x == y;
}

/* One shape on the current SIMD level: y and dx = dy scattered through the
 * argmax, both exact. Returns the number of mismatches. */
static int check_shape(int64_t N, int64_t C, int64_t H, int64_t W) {
  int64_t OH = H / 2, OW = W / 2, nx = N * C * H * W, ny = N * C * OH * OW;
  float *x = malloc((size_t)nx * sizeof *x), *dy = malloc((size_t)ny * sizeof *dy);
  float *yr = malloc((size_t)ny * sizeof *yr), *dxr = calloc((size_t)nx, sizeof *dxr);
  int64_t *arg = malloc((size_t)ny * sizeof *arg);
  REQUIRE(x && dy && yr && dxr && arg);
  for (int64_t i = 0; i < nx; i++) x[i] = pick();
  for (int64_t i = 0; i < ny; i++) dy[i] = (float)(i % 97 + 1); /* distinct per window */
  ref_pool(x, N * C, H, W, yr, arg);
  for (int64_t o = 0; o < ny; o++) dxr[arg[o]] += dy[o];

  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == 0);
  int64_t xs[4] = {N, C, H, W}, ys[4] = {N, C, OH, OW};
  dg_tensor *xt = dg_from_data(ctx, DG_F32, 4, xs, x);
  REQUIRE(xt);
  dg_tensor_set_requires_grad(xt, 1);
  dg_tensor *y = dg_maxpool2d(ctx, xt, 2, 2);
  REQUIRE(y);
  CHECK_OK(dg_backward_with(ctx, y, dg_from_data(ctx, DG_F32, 4, ys, dy)));
  REQUIRE(dg_tensor_grad(xt));
  const float *yp = dg_tensor_data(y), *dx = dg_tensor_data(dg_tensor_grad(xt));
  int bad = 0;
  for (int64_t o = 0; o < ny; o++)
    if (!same_bits(yp[o], yr[o])) {
      if (bad++ < 3)
        fprintf(stderr, "  (%lld, %lld, %lld, %lld) y[%lld] = %g, want %g\n", (long long)N,
                (long long)C, (long long)H, (long long)W, (long long)o, yp[o], yr[o]);
    }
  for (int64_t i = 0; i < nx; i++)
    if (!same_bits(dx[i], dxr[i])) {
      if (bad++ < 3)
        fprintf(stderr, "  (%lld, %lld, %lld, %lld) dx[%lld] = %g, want %g\n", (long long)N,
                (long long)C, (long long)H, (long long)W, (long long)i, dx[i], dxr[i]);
    }
  /* x pooled twice: the second backward adds into dx */
  dg_ctx_reset(ctx);
  for (int64_t o = 0; o < ny; o++) dxr[arg[o]] += dy[o];
  xt = dg_from_data(ctx, DG_F32, 4, xs, x);
  REQUIRE(xt);
  dg_tensor_set_requires_grad(xt, 1);
  dg_tensor *y2 = dg_add(ctx, dg_maxpool2d(ctx, xt, 2, 2), dg_maxpool2d(ctx, xt, 2, 2));
  REQUIRE(y2);
  CHECK_OK(dg_backward_with(ctx, y2, dg_from_data(ctx, DG_F32, 4, ys, dy)));
  REQUIRE(dg_tensor_grad(xt));
  dx = dg_tensor_data(dg_tensor_grad(xt));
  for (int64_t i = 0; i < nx; i++)
    if (!same_bits(dx[i], dxr[i])) {
      if (bad++ < 3)
        fprintf(stderr, "  twice (%lld, %lld, %lld, %lld) dx[%lld] = %g, want %g\n",
                (long long)N, (long long)C, (long long)H, (long long)W, (long long)i, dx[i],
                dxr[i]);
    }
  dg_ctx_free(ctx);
  free(x), free(dy), free(yr), free(dxr), free(arg);
  return bad;
}

int main(void) {
  static const int64_t shapes[][4] = {
      {2, 3, 28, 28}, {2, 3, 14, 14}, {1, 2, 4, 4},  {1, 1, 2, 2},  {1, 2, 5, 7},
      {1, 1, 3, 34},  {2, 1, 6, 17},  {1, 3, 8, 33}, {1, 1, 7, 18}, {3, 2, 10, 32},
      {1, 1, 2, 31},  {1, 1, 4, 30},  {64, 4, 6, 9},  {1, 1, 2, 10}, {1, 2, 3, 27},
      {8, 32, 28, 28}}; /* the last: enough planes for 2 threads to split them */
  const int ns = (int)(sizeof shapes / sizeof *shapes);
  int top = dg__simd_isa();
  for (int isa = DG_ISA_BASE; isa <= top; isa++) {
    dg__simd_force(isa);
    REQUIRE(dg__simd_isa() == isa);
    for (int threads = 1; threads <= 2; threads++) {
      dg_set_num_threads(threads);
      for (int s = 0; s < ns; s++) {
        int bad = check_shape(shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3]);
        if (bad)
          fprintf(stderr, "isa %d, %d threads, shape %d: %d mismatches\n", isa, threads, s, bad);
        CHECK_EQ_INT(bad, 0);
      }
    }
  }
  dg__simd_force(-1);
  printf("maxpool 2x2: %d shapes on SIMD levels 0..%d, 1 and 2 threads\n", ns, top);
  return TEST_DONE();
}
