/* conv2d and maxpool2d: forward against a direct loop / hand values,
 * finite-difference checks of backward over strides, paddings, non-square
 * shapes, bias or none, and error paths. */
#include "gradcheck.h"
#include "test.h"

typedef struct {
  int64_t N, C, H, W, O, KH, KW;
  int stride, pad, bias, tview; /* tview: feed x as a transposed (H<->W) view */
} conv_cfg;

static dg_tensor *f_conv(dg_ctx *ctx, dg_tensor **in, void *u) {
  conv_cfg *c = u;
  dg_tensor *x = c->tview ? dg_transpose(ctx, in[0], 2, 3) : in[0];
  return dg_conv2d(ctx, x, in[1], c->bias ? in[2] : NULL, c->stride, c->pad);
}

typedef struct { int k, s; } pool_cfg;

static dg_tensor *f_pool(dg_ctx *ctx, dg_tensor **in, void *u) {
  pool_cfg *p = u;
  return dg_maxpool2d(ctx, in[0], p->k, p->s);
}

static dg_tensor *f_conv_pool(dg_ctx *ctx, dg_tensor **in, void *u) {
  (void)u;
  return dg_maxpool2d(ctx, dg_conv2d(ctx, in[0], in[1], in[2], 1, 1), 2, 2);
}

/* Direct convolution in double: y (N, O, OH, OW). x given in (N, C, H, W). */
static double direct(const conv_cfg *c, const float *x, const float *w, const float *b,
                     int64_t n, int64_t o, int64_t oh, int64_t ow) {
  double acc = b ? b[o] : 0.0;
  for (int64_t ci = 0; ci < c->C; ci++)
    for (int64_t kh = 0; kh < c->KH; kh++)
      for (int64_t kw = 0; kw < c->KW; kw++) {
        int64_t ih = oh * c->stride - c->pad + kh, iw = ow * c->stride - c->pad + kw;
        if (ih < 0 || ih >= c->H || iw < 0 || iw >= c->W) continue;
        acc += (double)x[((n * c->C + ci) * c->H + ih) * c->W + iw] *
               w[((o * c->C + ci) * c->KH + kh) * c->KW + kw];
      }
  return acc;
}

static void check_forward(const conv_cfg *c) {
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == 0);
  int64_t xs[4] = {c->N, c->C, c->H, c->W}, ws[4] = {c->O, c->C, c->KH, c->KW}, bs[1] = {c->O};
  dg_tensor *x = dg_rand(ctx, 4, xs, -1, 1), *w = dg_rand(ctx, 4, ws, -1, 1);
  dg_tensor *b = c->bias ? dg_rand(ctx, 1, bs, -1, 1) : NULL;
  dg_tensor *y = dg_conv2d(ctx, x, w, b, c->stride, c->pad);
  REQUIRE(y != NULL);
  int64_t OH = (c->H + 2 * c->pad - c->KH) / c->stride + 1;
  int64_t OW = (c->W + 2 * c->pad - c->KW) / c->stride + 1;
  CHECK_EQ_INT(dg_tensor_dim(y, 0), c->N);
  CHECK_EQ_INT(dg_tensor_dim(y, 1), c->O);
  CHECK_EQ_INT(dg_tensor_dim(y, 2), OH);
  CHECK_EQ_INT(dg_tensor_dim(y, 3), OW);
  const float *xp = dg_tensor_data(x), *wp = dg_tensor_data(w);
  const float *bp = b ? dg_tensor_data(b) : NULL, *yp = dg_tensor_data(y);
  int bad = 0;
  for (int64_t n = 0; n < c->N; n++)
    for (int64_t o = 0; o < c->O; o++)
      for (int64_t oh = 0; oh < OH; oh++)
        for (int64_t ow = 0; ow < OW; ow++) {
          double want = direct(c, xp, wp, bp, n, o, oh, ow);
          float got = yp[((n * c->O + o) * OH + oh) * OW + ow];
          if (fabs(got - want) > 1e-4 * (1 + fabs(want)) && bad++ < 4)
            CHECK_NEAR(got, want, 1e-4 * (1 + fabs(want)));
        }
  CHECK_EQ_INT(bad, 0);
  dg_ctx_free(ctx);
}

static void grad_conv(const char *name, conv_cfg c, uint64_t seed, int x_grad) {
  int64_t xs[4] = {c.N, c.C, c.tview ? c.W : c.H, c.tview ? c.H : c.W};
  int64_t ws[4] = {c.O, c.C, c.KH, c.KW}, bs[1] = {c.O};
  dg_tensor *in[3] = {gc_input(4, xs, -1, 1, seed), gc_input(4, ws, -1, 1, seed + 1),
                      gc_input(1, bs, -1, 1, seed + 2)};
  REQUIRE(in[0] && in[1] && in[2]);
  dg_tensor_set_requires_grad(in[0], x_grad);
  CHECK_EQ_INT(gc_check(name, f_conv, &c, c.bias ? 3 : 2, in, 1e-3, 1e-2), 0);
  for (int i = 0; i < 3; i++) dg_tensor_free(in[i]);
}

/* x (N, C, H, W) whose every plane is a shuffled ramp of distinct values
 * 0.05 apart: no ties, and finite-difference steps never reorder a window. */
static dg_tensor *distinct_input(const int64_t *shape, uint64_t seed) {
  dg_tensor *t = NULL;
  if (dg_tensor_new(&t, DG_F32, 4, shape, NULL, 0)) return NULL;
  float *d = dg_tensor_data(t);
  int64_t P = shape[2] * shape[3], planes = shape[0] * shape[1];
  float u[1];
  for (int64_t p = 0; p < planes; p++) {
    float *x = d + p * P;
    for (int64_t i = 0; i < P; i++) x[i] = 0.05f * (float)(i - P / 2);
    for (int64_t i = P - 1; i > 0; i--) { /* Fisher-Yates */
      dg_rng_uniform(seed, (uint64_t)(p * P + i), u, 1);
      int64_t j = (int64_t)(u[0] * (float)(i + 1));
      if (j > i) j = i;
      float tmp = x[i];
      x[i] = x[j], x[j] = tmp;
    }
  }
  dg_tensor_set_requires_grad(t, 1);
  return t;
}

static void grad_pool(const char *name, int64_t N, int64_t C, int64_t H, int64_t W, int k,
                      int s) {
  int64_t sh[4] = {N, C, H, W};
  pool_cfg p = {k, s};
  dg_tensor *in[1] = {distinct_input(sh, 42 + (uint64_t)k)};
  REQUIRE(in[0]);
  CHECK_EQ_INT(gc_check(name, f_pool, &p, 1, in, 1e-3, 1e-2), 0);
  dg_tensor_free(in[0]);
}

static void pool_values(void) {
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == 0);
  /* (1, 1, 4, 5), k 2, s 2 -> (1, 1, 2, 2); the last column is dropped */
  float xv[20] = {1, 5, 2, 0, 9,  3, 4, 8, 7, 9,  -1, -2, -3, -4, 9,  -5, -6, -0.5f, -7, 9};
  int64_t sh[4] = {1, 1, 4, 5};
  dg_tensor *x = dg_from_data(ctx, DG_F32, 4, sh, xv);
  dg_tensor_set_requires_grad(x, 1);
  dg_tensor *y = dg_maxpool2d(ctx, x, 2, 2);
  REQUIRE(y != NULL);
  CHECK_EQ_INT(dg_tensor_dim(y, 2), 2);
  CHECK_EQ_INT(dg_tensor_dim(y, 3), 2);
  const float *yp = dg_tensor_data(y);
  CHECK_NEAR(yp[0], 5, 0);
  CHECK_NEAR(yp[1], 8, 0);
  CHECK_NEAR(yp[2], -1, 0);
  CHECK_NEAR(yp[3], -0.5f, 0);
  /* k 3, s 1 over the same input -> (1, 1, 2, 3) */
  dg_tensor *y3 = dg_maxpool2d(ctx, x, 3, 1);
  REQUIRE(y3 != NULL);
  const float *y3p = dg_tensor_data(y3);
  float want3[6] = {8, 8, 9, 8, 8, 9};
  for (int i = 0; i < 6; i++) CHECK_NEAR(y3p[i], want3[i], 0);
  /* ties: every window is constant, so the gradient goes to its first element */
  float zv[16] = {0};
  int64_t zs[4] = {1, 1, 4, 4};
  dg_tensor *z = dg_from_data(ctx, DG_F32, 4, zs, zv);
  dg_tensor_set_requires_grad(z, 1);
  dg_tensor *yz = dg_maxpool2d(ctx, z, 2, 2);
  REQUIRE(yz != NULL);
  CHECK_OK(dg_backward(ctx, yz));
  REQUIRE(dg_tensor_grad(z) != NULL);
  const float *gz = dg_tensor_data(dg_tensor_grad(z));
  for (int i = 0; i < 16; i++) {
    int first = (i / 4) % 2 == 0 && (i % 4) % 2 == 0;
    CHECK_NEAR(gz[i], first ? 1.0f : 0.0f, 0);
  }
  /* the same through the general kernel: k 3, s 1 windows start at 0, 1, 4, 5 */
  dg_tensor *z3 = dg_from_data(ctx, DG_F32, 4, zs, zv);
  dg_tensor_set_requires_grad(z3, 1);
  dg_tensor *yz3 = dg_maxpool2d(ctx, z3, 3, 1);
  REQUIRE(yz3 != NULL);
  CHECK_OK(dg_backward(ctx, yz3));
  REQUIRE(dg_tensor_grad(z3) != NULL);
  const float *gz3 = dg_tensor_data(dg_tensor_grad(z3));
  for (int i = 0; i < 16; i++)
    CHECK_NEAR(gz3[i], (i == 0 || i == 1 || i == 4 || i == 5) ? 1.0f : 0.0f, 0);
  dg_ctx_free(ctx);
}

static void conv_values(void) {
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == 0);
  /* 3x3 ramp, 2x2 kernel of ones, pad 1, stride 2 -> (1, 1, 2, 2) */
  float xv[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, wv[4] = {1, 1, 1, 1}, bv[1] = {0.5f};
  int64_t xs[4] = {1, 1, 3, 3}, ws[4] = {1, 1, 2, 2}, bs[1] = {1};
  dg_tensor *x = dg_from_data(ctx, DG_F32, 4, xs, xv), *w = dg_from_data(ctx, DG_F32, 4, ws, wv);
  dg_tensor *b = dg_from_data(ctx, DG_F32, 1, bs, bv);
  dg_tensor *y = dg_conv2d(ctx, x, w, b, 2, 1);
  REQUIRE(y != NULL);
  const float *yp = dg_tensor_data(y);
  float want[4] = {1.5f, 2 + 3 + 0.5f, 4 + 7 + 0.5f, 5 + 6 + 8 + 9 + 0.5f};
  for (int i = 0; i < 4; i++) CHECK_NEAR(yp[i], want[i], 1e-6);
  dg_ctx_free(ctx);
}

static void errors(void) {
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == 0);
  int64_t xs[4] = {2, 3, 5, 6}, ws[4] = {4, 2, 3, 3}, bs[1] = {5}, w2s[4] = {4, 3, 7, 3};
  dg_tensor *x = dg_zeros(ctx, DG_F32, 4, xs), *w = dg_zeros(ctx, DG_F32, 4, ws);
  CHECK(dg_conv2d(ctx, x, w, NULL, 1, 0) == NULL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "conv2d");
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "(2, 3, 5, 6)");
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "(4, 2, 3, 3)");
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "stride 1, pad 0");
  dg_ctx_clear_error(ctx);
  ws[1] = 3;
  w = dg_zeros(ctx, DG_F32, 4, ws);
  dg_tensor *b = dg_zeros(ctx, DG_F32, 1, bs);
  CHECK(dg_conv2d(ctx, x, w, b, 1, 0) == NULL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "(5)");
  dg_ctx_clear_error(ctx);
  dg_tensor *w2 = dg_zeros(ctx, DG_F32, 4, w2s); /* kernel 7 > 5 + 2*0 */
  CHECK(dg_conv2d(ctx, x, w2, NULL, 2, 0) == NULL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "(4, 3, 7, 3)");
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "stride 2, pad 0");
  dg_ctx_clear_error(ctx);
  CHECK(dg_conv2d(ctx, x, w2, NULL, 1, 1) != NULL); /* 5 + 2 >= 7 fits */
  CHECK(dg_conv2d(ctx, x, w, NULL, 0, 0) == NULL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "stride 0");
  dg_ctx_clear_error(ctx);
  CHECK(dg_conv2d(ctx, NULL, w, NULL, 1, 0) == NULL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "conv2d");
  dg_ctx_clear_error(ctx);
  CHECK(dg_maxpool2d(ctx, x, 6, 1) == NULL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "maxpool2d");
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "(2, 3, 5, 6)");
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "window 6");
  dg_ctx_clear_error(ctx);
  int64_t s3[3] = {3, 5, 6};
  CHECK(dg_maxpool2d(ctx, dg_zeros(ctx, DG_F32, 3, s3), 2, 2) == NULL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "(3, 5, 6)");
  dg_ctx_free(ctx);
}

int main(void) {
  conv_values();
  pool_values();
  errors();
  conv_cfg fwd[] = {
      {2, 3, 5, 6, 4, 3, 3, 1, 0, 1, 0}, {2, 3, 7, 6, 4, 3, 2, 2, 1, 0, 0},
      {3, 1, 9, 8, 5, 3, 3, 3, 2, 1, 0}, {1, 4, 6, 5, 3, 1, 1, 1, 0, 1, 0},
      {2, 8, 11, 10, 6, 5, 3, 2, 2, 1, 0}, {4, 32, 14, 14, 16, 3, 3, 1, 1, 1, 0},
      /* stride 1 with OW == W (im2col's flat copy): 5x5 pad 2 on a wide
       * plane, 1x3 and 5x3 pad 1 (rows of padding above and below) */
      {2, 2, 5, 9, 3, 5, 5, 1, 2, 1, 0}, {1, 2, 4, 6, 2, 1, 3, 1, 1, 1, 0},
      {2, 3, 7, 5, 2, 5, 3, 1, 1, 0, 0}, {1, 1, 1, 3, 2, 3, 3, 1, 1, 1, 0},
  };
  for (size_t i = 0; i < sizeof fwd / sizeof fwd[0]; i++) check_forward(&fwd[i]);
  /* N, C, H, W, O, KH, KW, stride, pad, bias, tview */
  grad_conv("conv s1 p0 bias", (conv_cfg){2, 3, 5, 6, 4, 3, 3, 1, 0, 1, 0}, 10, 1);
  grad_conv("conv s1 p1 bias C1", (conv_cfg){2, 1, 5, 4, 3, 3, 3, 1, 1, 1, 0}, 20, 1);
  grad_conv("conv s2 p1 nobias 3x2", (conv_cfg){2, 2, 7, 6, 3, 3, 2, 2, 1, 0, 0}, 30, 1);
  grad_conv("conv s2 p0 2x2", (conv_cfg){1, 3, 6, 7, 2, 2, 2, 2, 0, 1, 0}, 40, 1);
  grad_conv("conv s3 p2 5x3", (conv_cfg){2, 2, 7, 8, 2, 5, 3, 3, 2, 1, 0}, 50, 1);
  grad_conv("conv 1x1", (conv_cfg){2, 3, 4, 3, 2, 1, 1, 1, 0, 1, 0}, 60, 1);
  /* stride 1 with OW == W: im2col's flat copy and col2im's flat add */
  grad_conv("conv same 5x5 p2", (conv_cfg){1, 2, 5, 9, 2, 5, 5, 1, 2, 1, 0}, 62, 1);
  grad_conv("conv same 1x3 p1", (conv_cfg){1, 2, 4, 6, 2, 1, 3, 1, 1, 1, 0}, 64, 1);
  grad_conv("conv same 5x3 p1", (conv_cfg){2, 2, 7, 5, 2, 5, 3, 1, 1, 0, 0}, 66, 1);
  grad_conv("conv transposed-view x", (conv_cfg){2, 2, 5, 4, 3, 3, 3, 1, 1, 1, 1}, 70, 1);
  grad_conv("conv w,b only", (conv_cfg){2, 3, 5, 5, 2, 3, 3, 2, 1, 1, 0}, 80, 0);
  grad_pool("maxpool k2 s2", 2, 3, 4, 6, 2, 2);
  grad_pool("maxpool k2 s2 odd", 1, 2, 5, 7, 2, 2);
  grad_pool("maxpool k3 s1 overlap", 2, 2, 5, 6, 3, 1);
  grad_pool("maxpool k3 s2", 1, 3, 7, 5, 3, 2);
  grad_pool("maxpool k2 s1", 1, 1, 4, 5, 2, 1);
  {
    int64_t xs[4] = {2, 2, 4, 6}, ws[4] = {3, 2, 3, 3}, bs[1] = {3};
    dg_tensor *in[3] = {gc_input(4, xs, -1, 1, 90), gc_input(4, ws, -1, 1, 91),
                        gc_input(1, bs, -1, 1, 92)};
    CHECK_EQ_INT(gc_check("conv -> maxpool", f_conv_pool, NULL, 3, in, 1e-3, 1e-2), 0);
    for (int i = 0; i < 3; i++) dg_tensor_free(in[i]);
  }
  return TEST_DONE();
}
