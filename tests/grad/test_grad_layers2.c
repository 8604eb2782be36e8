/* leaky_relu, avgpool2d and global_avgpool2d: forward against direct loops
 * in double and hand values, finite-difference checks of backward (slopes
 * of either sign, windows with k = s, k > s overlapping, k < s skipping
 * elements, odd sizes, strided input views), gradient accumulation, and
 * error paths naming the op and the shapes. */
#include "gradcheck.h"
#include "test.h"

/* ---- leaky_relu ---- */

static dg_tensor *f_leaky(dg_ctx *ctx, dg_tensor **in, void *u) {
  return dg_leaky_relu(ctx, in[0], *(float *)u);
}

/* x away from 0 by at least 0.05, so steps of 1e-2 never cross the kink. */
static dg_tensor *off_zero_input(int ndim, const int64_t *shape, uint64_t seed) {
  dg_tensor *t = gc_input(ndim, shape, -2, 2, seed);
  float *d = dg_tensor_data(t);
  for (int64_t i = 0, n = dg_tensor_numel(t); i < n; i++)
    if (fabsf(d[i]) < 0.05f) d[i] = d[i] < 0 ? -0.05f - d[i] : 0.05f + d[i];
  return t;
}

static void leaky_values(void) {
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == 0);
  float xv[6] = {-2, -0.5f, 0, 0.25f, 3, NAN};
  int64_t sh[1] = {6};
  dg_tensor *x = dg_from_data(ctx, DG_F32, 1, sh, xv);
  dg_tensor_set_requires_grad(x, 1);
  dg_tensor *y = dg_leaky_relu(ctx, x, 0.1f);
  REQUIRE(y != NULL);
  const float *yp = dg_tensor_data(y);
  float want[5] = {-0.2f, -0.05f, 0, 0.25f, 3};
  for (int i = 0; i < 5; i++) CHECK_NEAR(yp[i], want[i], 1e-7);
  CHECK(isnan(yp[5]));
  /* gradient: 1 above 0, the slope at and below 0 (torch), and at NaN */
  CHECK_OK(dg_backward(ctx, y));
  const float *g = dg_tensor_data(dg_tensor_grad(x));
  float wg[6] = {0.1f, 0.1f, 0.1f, 1, 1, 0.1f};
  for (int i = 0; i < 6; i++) CHECK_NEAR(g[i], wg[i], 0);
  /* slope 0 is relu; slope 1 the identity; a negative slope folds */
  dg_tensor *r0 = dg_leaky_relu(ctx, x, 0.0f), *r1 = dg_leaky_relu(ctx, x, 1.0f);
  dg_tensor *rn = dg_leaky_relu(ctx, x, -2.0f);
  REQUIRE(r0 && r1 && rn);
  for (int i = 0; i < 5; i++) {
    CHECK_NEAR(((const float *)dg_tensor_data(r0))[i], xv[i] > 0 ? xv[i] : 0, 0);
    CHECK_NEAR(((const float *)dg_tensor_data(r1))[i], xv[i], 0);
    CHECK_NEAR(((const float *)dg_tensor_data(rn))[i], xv[i] > 0 ? xv[i] : -2 * xv[i], 0);
  }
  /* a long input runs the split (pool) path: compare with the formula */
  int64_t big[2] = {300, 257};
  dg_tensor *xb = dg_randn(ctx, 2, big, 0, 1);
  dg_tensor *yb = dg_leaky_relu(ctx, xb, 0.02f);
  REQUIRE(yb != NULL);
  const float *xbp = dg_tensor_data(xb), *ybp = dg_tensor_data(yb);
  int bad = 0;
  for (int64_t i = 0; i < big[0] * big[1]; i++)
    bad += ybp[i] != (xbp[i] > 0 ? xbp[i] : xbp[i] * 0.02f);
  CHECK_EQ_INT(bad, 0);
  dg_ctx_free(ctx);
}

static void leaky_grads(void) {
  static const float slopes[] = {0.01f, 0.2f, -0.5f, 0.0f, 1.5f};
  for (size_t i = 0; i < sizeof slopes / sizeof slopes[0]; i++) {
    int64_t sh[3] = {3, 4, 5};
    dg_tensor *in[1] = {off_zero_input(3, sh, 100 + i)};
    REQUIRE(in[0]);
    char name[64];
    snprintf(name, sizeof name, "leaky_relu slope %g", (double)slopes[i]);
    float s = slopes[i];
    CHECK_EQ_INT(gc_check(name, f_leaky, &s, 1, in, 1e-3, 1e-2), 0);
    dg_tensor_free(in[0]);
  }
}

/* ---- average pooling ---- */

typedef struct {
  int k, s, tview, global; /* tview: x fed as an (H <-> W) transposed view */
} avg_cfg;

static dg_tensor *f_avg(dg_ctx *ctx, dg_tensor **in, void *u) {
  avg_cfg *c = u;
  dg_tensor *x = c->tview ? dg_transpose(ctx, in[0], 2, 3) : in[0];
  return c->global ? dg_global_avgpool2d(ctx, x) : dg_avgpool2d(ctx, x, c->k, c->s);
}

/* The mean of window (oh, ow) of plane p of x (planes, H, W), in double. */
static double avg_direct(const float *x, int64_t H, int64_t W, int64_t p, int64_t oh, int64_t ow,
                         int64_t kh, int64_t kw, int64_t s) {
  double acc = 0;
  for (int64_t i = 0; i < kh; i++)
    for (int64_t j = 0; j < kw; j++) acc += x[(p * H + oh * s + i) * W + ow * s + j];
  return acc / (double)(kh * kw);
}

static void avg_forward(int64_t N, int64_t C, int64_t H, int64_t W, int k, int s) {
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == 0);
  int64_t sh[4] = {N, C, H, W};
  dg_tensor *x = dg_randn(ctx, 4, sh, 0, 1);
  dg_tensor *y = dg_avgpool2d(ctx, x, k, s), *g = dg_global_avgpool2d(ctx, x);
  REQUIRE(y && g);
  int64_t OH = (H - k) / s + 1, OW = (W - k) / s + 1;
  CHECK_EQ_INT(dg_tensor_ndim(y), 4);
  CHECK_EQ_INT(dg_tensor_dim(y, 0), N);
  CHECK_EQ_INT(dg_tensor_dim(y, 1), C);
  CHECK_EQ_INT(dg_tensor_dim(y, 2), OH);
  CHECK_EQ_INT(dg_tensor_dim(y, 3), OW);
  CHECK_EQ_INT(dg_tensor_ndim(g), 2);
  CHECK_EQ_INT(dg_tensor_dim(g, 0), N);
  CHECK_EQ_INT(dg_tensor_dim(g, 1), C);
  const float *xp = dg_tensor_data(x), *yp = dg_tensor_data(y), *gp = dg_tensor_data(g);
  int bad = 0;
  for (int64_t p = 0; p < N * C; p++) {
    for (int64_t oh = 0; oh < OH; oh++)
      for (int64_t ow = 0; ow < OW; ow++) {
        double want = avg_direct(xp, H, W, p, oh, ow, k, k, s);
        if (fabs(yp[(p * OH + oh) * OW + ow] - want) > 1e-6 * (1 + fabs(want)) && bad++ < 4)
          CHECK_NEAR(yp[(p * OH + oh) * OW + ow], want, 1e-6 * (1 + fabs(want)));
      }
    double want = avg_direct(xp, H, W, p, 0, 0, H, W, 1);
    if (fabs(gp[p] - want) > 1e-6 * (1 + fabs(want)) && bad++ < 4)
      CHECK_NEAR(gp[p], want, 1e-6 * (1 + fabs(want)));
  }
  CHECK_EQ_INT(bad, 0);
  dg_ctx_free(ctx);
}

static void avg_values(void) {
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == 0);
  /* torch: avg_pool2d(arange(20).reshape(1, 1, 4, 5), 2, 3) = [[3, 6]] */
  float xv[20];
  for (int i = 0; i < 20; i++) xv[i] = (float)i;
  int64_t sh[4] = {1, 1, 4, 5};
  dg_tensor *x = dg_from_data(ctx, DG_F32, 4, sh, xv);
  dg_tensor_set_requires_grad(x, 1);
  dg_tensor *y = dg_avgpool2d(ctx, x, 2, 3);
  REQUIRE(y != NULL);
  CHECK_EQ_INT(dg_tensor_dim(y, 2), 1);
  CHECK_EQ_INT(dg_tensor_dim(y, 3), 2);
  CHECK_NEAR(((const float *)dg_tensor_data(y))[0], 3, 0);
  CHECK_NEAR(((const float *)dg_tensor_data(y))[1], 6, 0);
  /* backward: 1/4 in both windows, 0 in the rows and columns no window covers */
  CHECK_OK(dg_backward(ctx, y));
  const float *gx = dg_tensor_data(dg_tensor_grad(x));
  for (int i = 0; i < 20; i++) {
    int r = i / 5, c = i % 5, in = r < 2 && (c < 2 || (c >= 3 && c < 5));
    CHECK_NEAR(gx[i], in ? 0.25f : 0.0f, 0);
  }
  /* k 3 s 1 overlaps: element (1, 2) lies in 2 x 3 windows of (2, 3) */
  dg_tensor *x2 = dg_from_data(ctx, DG_F32, 4, sh, xv);
  dg_tensor_set_requires_grad(x2, 1);
  dg_tensor *y2 = dg_avgpool2d(ctx, x2, 3, 1);
  REQUIRE(y2 != NULL);
  CHECK_OK(dg_backward(ctx, y2));
  CHECK_NEAR(((const float *)dg_tensor_data(dg_tensor_grad(x2)))[1 * 5 + 2], 6.0f / 9.0f, 1e-7);
  CHECK_NEAR(((const float *)dg_tensor_data(dg_tensor_grad(x2)))[0], 1.0f / 9.0f, 1e-7);
  /* global: the plane mean, 9.5; gradient 1/20 everywhere */
  dg_tensor *x3 = dg_from_data(ctx, DG_F32, 4, sh, xv);
  dg_tensor_set_requires_grad(x3, 1);
  dg_tensor *g = dg_global_avgpool2d(ctx, x3);
  REQUIRE(g != NULL);
  CHECK_NEAR(((const float *)dg_tensor_data(g))[0], 9.5f, 0);
  CHECK_OK(dg_backward(ctx, g));
  for (int i = 0; i < 20; i++)
    CHECK_NEAR(((const float *)dg_tensor_data(dg_tensor_grad(x3)))[i], 0.05f, 1e-8);
  dg_ctx_free(ctx);
}

/* A second backward into the same leaf adds (the acc path of the kernels). */
static void avg_accumulate(void) {
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == 0);
  int64_t sh[4] = {2, 3, 5, 7};
  dg_tensor *x = gc_input(4, sh, -1, 1, 7);
  REQUIRE(x);
  float first[210];
  for (int pass = 0; pass < 2; pass++) {
    dg_ctx_reset(ctx);
    dg_tensor *a = dg_sum(ctx, dg_avgpool2d(ctx, x, 3, 2));
    dg_tensor *b = dg_sum(ctx, dg_global_avgpool2d(ctx, x));
    dg_tensor *c = dg_sum(ctx, dg_leaky_relu(ctx, x, 0.3f));
    REQUIRE(a && b && c);
    CHECK_OK(dg_backward(ctx, dg_add(ctx, dg_add(ctx, a, b), c)));
    const float *g = dg_tensor_data(dg_tensor_grad(x));
    if (pass == 0) memcpy(first, g, sizeof first);
    else
      for (int i = 0; i < 210; i++) CHECK_NEAR(g[i], 2 * first[i], 1e-6);
  }
  dg_tensor_free(x);
  dg_ctx_free(ctx);
}

static void avg_grad(const char *name, int64_t N, int64_t C, int64_t H, int64_t W, avg_cfg c,
                     uint64_t seed) {
  int64_t sh[4] = {N, C, c.tview ? W : H, c.tview ? H : W};
  dg_tensor *in[1] = {gc_input(4, sh, -1, 1, seed)};
  REQUIRE(in[0]);
  CHECK_EQ_INT(gc_check(name, f_avg, &c, 1, in, 1e-3, 1e-2), 0);
  dg_tensor_free(in[0]);
}

static void errors(void) {
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == 0);
  int64_t xs[4] = {2, 3, 5, 6}, s3[3] = {3, 5, 6};
  dg_tensor *x = dg_zeros(ctx, DG_F32, 4, xs), *x3 = dg_zeros(ctx, DG_F32, 3, s3);
  CHECK(dg_avgpool2d(ctx, x, 6, 1) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_ESHAPE);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "avgpool2d");
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "(2, 3, 5, 6)");
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "window 6");
  dg_ctx_clear_error(ctx);
  CHECK(dg_avgpool2d(ctx, x, 2, 0) == NULL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "stride 0");
  dg_ctx_clear_error(ctx);
  CHECK(dg_avgpool2d(ctx, x, 0, 1) == NULL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "window 0");
  dg_ctx_clear_error(ctx);
  CHECK(dg_avgpool2d(ctx, x3, 2, 2) == NULL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "avgpool2d: x (3, 5, 6)");
  dg_ctx_clear_error(ctx);
  CHECK(dg_global_avgpool2d(ctx, x3) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_ESHAPE);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "global_avgpool2d: x (3, 5, 6)");
  dg_ctx_clear_error(ctx);
  CHECK(dg_global_avgpool2d(ctx, NULL) == NULL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "global_avgpool2d");
  dg_ctx_clear_error(ctx);
  CHECK(dg_leaky_relu(ctx, NULL, 0.1f) == NULL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "leaky_relu");
  dg_ctx_clear_error(ctx);
  dg_tensor *xi = dg_zeros(ctx, DG_I64, 4, xs);
  CHECK(dg_leaky_relu(ctx, xi, 0.1f) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_EDTYPE);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "leaky_relu");
  dg_ctx_clear_error(ctx);
  CHECK(dg_avgpool2d(ctx, xi, 2, 2) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_EDTYPE);
  dg_ctx_clear_error(ctx);
  CHECK(dg_global_avgpool2d(ctx, xi) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_EDTYPE);
  dg_ctx_free(ctx);
}

int main(void) {
  leaky_values();
  avg_values();
  errors();
  avg_accumulate();
  avg_forward(2, 3, 5, 6, 2, 2);
  avg_forward(3, 2, 7, 9, 3, 2);
  avg_forward(1, 4, 8, 5, 3, 1);
  avg_forward(2, 2, 9, 11, 2, 3);
  avg_forward(1, 1, 1, 1, 1, 1);
  avg_forward(4, 64, 14, 14, 2, 2); /* enough planes for the pool split */
  leaky_grads();
  /* N, C, H, W, {k, s, tview, global} */
  avg_grad("avgpool k2 s2", 2, 3, 4, 6, (avg_cfg){2, 2, 0, 0}, 10);
  avg_grad("avgpool k2 s2 odd", 1, 2, 5, 7, (avg_cfg){2, 2, 0, 0}, 11);
  avg_grad("avgpool k3 s1 overlap", 2, 2, 5, 6, (avg_cfg){3, 1, 0, 0}, 12);
  avg_grad("avgpool k3 s2 overlap", 1, 3, 7, 5, (avg_cfg){3, 2, 0, 0}, 13);
  avg_grad("avgpool k2 s3 skips", 2, 1, 7, 8, (avg_cfg){2, 3, 0, 0}, 14);
  avg_grad("avgpool k1 s2", 1, 2, 5, 5, (avg_cfg){1, 2, 0, 0}, 15);
  avg_grad("avgpool k = H = W", 2, 2, 3, 3, (avg_cfg){3, 3, 0, 0}, 16);
  avg_grad("avgpool transposed view", 2, 2, 5, 6, (avg_cfg){3, 2, 1, 0}, 17);
  avg_grad("global_avgpool", 2, 3, 4, 5, (avg_cfg){0, 0, 0, 1}, 20);
  avg_grad("global_avgpool odd", 3, 1, 7, 3, (avg_cfg){0, 0, 0, 1}, 21);
  avg_grad("global_avgpool 1x1", 2, 4, 1, 1, (avg_cfg){0, 0, 0, 1}, 22);
  avg_grad("global_avgpool transposed view", 2, 2, 3, 5, (avg_cfg){0, 0, 1, 1}, 23);
  return TEST_DONE();
}
