/* batchnorm: finite-difference checks of backward in training mode (batch
 * statistics) and eval mode (running statistics), forward values and the
 * running-statistics update against double, a channel with a large mean
 * and a tiny spread, thread counts, and the errors. */
#include "gradcheck.h"
#include "test.h"

typedef struct {
  int use_w, use_b, train, transpose;
  dg_tensor *rm, *rv; /* running statistics (persistent) or NULL */
} bn_case;

/* in: x, w, b */
static dg_tensor *f_bn(dg_ctx *ctx, dg_tensor **in, void *u) {
  bn_case *c = u;
  dg_tensor *x = c->transpose ? dg_transpose(ctx, in[0], 0, 1) : in[0];
  return dg_batchnorm(ctx, x, c->use_w ? in[1] : NULL, c->use_b ? in[2] : NULL, c->rm, c->rv,
                      c->train, 0.1f, 1e-5f);
}

static dg_tensor *persistent(int64_t C, float lo, float hi, uint64_t seed) {
  dg_tensor *t = gc_input(1, &C, lo, hi, seed);
  dg_tensor_set_requires_grad(t, 0);
  return t;
}

static void grad_cases(void) {
  int64_t s2[2] = {5, 3}, s3[3] = {3, 4, 5}, s4[4] = {2, 3, 3, 4};
  const int64_t *shapes[3] = {s2, s3, s4};
  int nds[3] = {2, 3, 4};
  for (int k = 0; k < 3; k++) {
    int64_t C = shapes[k][1];
    dg_tensor *in[3] = {gc_input(nds[k], shapes[k], -2, 2, 150 + k),
                        gc_input(1, &C, 0.5f, 1.5f, 160 + k), gc_input(1, &C, -1, 1, 170 + k)};
    dg_tensor *rm = persistent(C, -0.5f, 0.5f, 180 + k), *rv = persistent(C, 0.5f, 2.0f, 190 + k);
    for (int m = 0; m < 8; m++) {
      bn_case c = {m & 1, (m >> 1) & 1, (m >> 2) & 1, 0, NULL, NULL};
      if (!c.train || (m & 1)) c.rm = rm, c.rv = rv; /* eval needs them; train with and without */
      dg_tensor_set_requires_grad(in[1], c.use_w);
      dg_tensor_set_requires_grad(in[2], c.use_b);
      char nm[96];
      snprintf(nm, sizeof nm, "batchnorm %dd %s w=%d b=%d running=%d", nds[k],
               c.train ? "train" : "eval", c.use_w, c.use_b, c.rm != NULL);
      CHECK_EQ_INT(gc_check(nm, f_bn, &c, 3, in, 2e-3, 2e-2), 0);
    }
    for (int i = 0; i < 3; i++) dg_tensor_free(in[i]);
    dg_tensor_free(rm);
    dg_tensor_free(rv);
  }
  int64_t st[2] = {3, 6}, C = 3; /* (3, 6) transposed to (6, 3): a strided x */
  dg_tensor *in[3] = {gc_input(2, st, -2, 2, 200), gc_input(1, &C, 0.5f, 1.5f, 201),
                      gc_input(1, &C, -1, 1, 202)};
  bn_case c = {1, 1, 1, 1, NULL, NULL};
  CHECK_EQ_INT(gc_check("batchnorm of a transposed view", f_bn, &c, 3, in, 2e-3, 2e-2), 0);
  for (int i = 0; i < 3; i++) dg_tensor_free(in[i]);
}

/* Forward and the running statistics against double, for x (N, C, L). */
static void forward_values(dg_ctx *ctx) {
  enum { N = 3, C = 2, L = 4 };
  float x[N * C * L], w[C] = {1.5f, -0.5f}, b[C] = {0.25f, 2.0f};
  float rm0[C] = {0.5f, -1.0f}, rv0[C] = {2.0f, 0.5f};
  for (int i = 0; i < N * C * L; i++) x[i] = (float)((i * 7) % 13) * 0.3f - 1.0f;
  dg_tensor *xt = dg_from_data(ctx, DG_F32, 3, (int64_t[]){N, C, L}, x);
  dg_tensor *wt = dg_from_data(ctx, DG_F32, 1, (int64_t[]){C}, w);
  dg_tensor *bt = dg_from_data(ctx, DG_F32, 1, (int64_t[]){C}, b);
  dg_tensor *rm = dg_from_data(ctx, DG_F32, 1, (int64_t[]){C}, rm0);
  dg_tensor *rv = dg_from_data(ctx, DG_F32, 1, (int64_t[]){C}, rv0);
  dg_tensor *y = dg_batchnorm(ctx, xt, wt, bt, rm, rv, 1, 0.25f, 1e-5f);
  REQUIRE(y);
  double mean[C], var[C];
  for (int c = 0; c < C; c++) {
    double s = 0, q = 0;
    for (int n = 0; n < N; n++)
      for (int l = 0; l < L; l++) s += x[(n * C + c) * L + l];
    mean[c] = s / (N * L);
    for (int n = 0; n < N; n++)
      for (int l = 0; l < L; l++) q += pow(x[(n * C + c) * L + l] - mean[c], 2);
    var[c] = q / (N * L);
    for (int n = 0; n < N; n++)
      for (int l = 0; l < L; l++) {
        int i = (n * C + c) * L + l;
        CHECK_NEAR(dg_tensor_get(y, i), (x[i] - mean[c]) / sqrt(var[c] + 1e-5) * w[c] + b[c], 1e-5);
      }
    CHECK_NEAR(dg_tensor_get(rm, c), 0.75 * rm0[c] + 0.25 * mean[c], 1e-6);
    CHECK_NEAR(dg_tensor_get(rv, c), 0.75 * rv0[c] + 0.25 * var[c] * (N * L) / (N * L - 1), 1e-6);
  }
  /* eval: the running statistics, unchanged */
  float rm1[C] = {(float)dg_tensor_get(rm, 0), (float)dg_tensor_get(rm, 1)};
  float rv1[C] = {(float)dg_tensor_get(rv, 0), (float)dg_tensor_get(rv, 1)};
  y = dg_batchnorm(ctx, xt, wt, NULL, rm, rv, 0, 0.25f, 1e-5f);
  REQUIRE(y);
  for (int i = 0; i < N * C * L; i++) {
    int c = (i / L) % C;
    CHECK_NEAR(dg_tensor_get(y, i), (x[i] - rm1[c]) / sqrt(rv1[c] + 1e-5) * w[c], 1e-5);
  }
  CHECK(dg_tensor_get(rm, 1) == rm1[1] && dg_tensor_get(rv, 1) == rv1[1]);
  /* training without running statistics; an empty batch changes nothing */
  CHECK(dg_batchnorm(ctx, xt, NULL, NULL, NULL, NULL, 1, 0.1f, 1e-5f) != NULL);
  dg_tensor *e = dg_zeros(ctx, DG_F32, 4, (int64_t[]){0, C, 3, 3});
  CHECK(dg_batchnorm(ctx, e, wt, bt, rm, rv, 1, 0.1f, 1e-5f) != NULL);
  CHECK(dg_tensor_get(rm, 0) == rm1[0] && dg_tensor_get(rv, 0) == rv1[0]);
}

/* A channel of 1000 + 1e-3 k: x - float(mean) alone would shift xhat. */
static void large_mean(dg_ctx *ctx) {
  enum { N = 37, C = 2 };
  float x[N * C], dy[N * C];
  for (int i = 0; i < N * C; i++) {
    x[i] = (i % C ? 0.0f : 1000.0f) + 1e-3f * (float)((i * 7) % 11);
    dy[i] = (float)((i * 5) % 9) * 0.25f - 1.0f;
  }
  dg_tensor *xt = dg_from_data(ctx, DG_F32, 2, (int64_t[]){N, C}, x);
  dg_tensor_set_requires_grad(xt, 1);
  dg_tensor *y = dg_batchnorm(ctx, xt, NULL, NULL, NULL, NULL, 1, 0.1f, 0.0f);
  dg_tensor *g = dg_from_data(ctx, DG_F32, 2, (int64_t[]){N, C}, dy);
  REQUIRE(y && g && dg_backward_with(ctx, y, g) == DG_OK);
  double worst_y = 0, worst_dx = 0;
  for (int c = 0; c < C; c++) {
    double mu = 0, var = 0, mg = 0, mgx = 0, xh[N];
    for (int n = 0; n < N; n++) mu += x[n * C + c];
    mu /= N;
    for (int n = 0; n < N; n++) var += pow(x[n * C + c] - mu, 2);
    double rs = 1 / sqrt(var / N);
    for (int n = 0; n < N; n++) {
      xh[n] = (x[n * C + c] - mu) * rs;
      mg += dy[n * C + c] / N, mgx += dy[n * C + c] * xh[n] / N;
    }
    for (int n = 0; n < N; n++) {
      double dx = rs * (dy[n * C + c] - mg - xh[n] * mgx);
      worst_y = fmax(worst_y, fabs(dg_tensor_get(y, n * C + c) - xh[n]));
      worst_dx = fmax(worst_dx, fabs(dg_tensor_get(dg_tensor_grad(xt), n * C + c) - dx) / rs);
    }
  }
  fprintf(stderr, "large-mean channel: max error y %.3g, dx / rstd %.3g\n", worst_y, worst_dx);
  CHECK(worst_y < 1e-4);
  CHECK(worst_dx < 1e-4);
}

/* One and two threads give the same bits (channels and rows split). */
static void threads(void) {
  enum { N = 16, C = 64, L = 300 }; /* big enough to split channels and rows */
  static float x[N * C * L], dy[N * C * L], out[2][2][N * C * L];
  for (int i = 0; i < N * C * L; i++) x[i] = sinf((float)i), dy[i] = cosf(0.7f * (float)i);
  for (int t = 0; t < 2; t++) {
    dg_set_num_threads(t + 1);
    dg_ctx *ctx = NULL;
    REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
    dg_tensor *xt = dg_from_data(ctx, DG_F32, 3, (int64_t[]){N, C, L}, x);
    dg_tensor_set_requires_grad(xt, 1);
    dg_tensor *y = dg_batchnorm(ctx, xt, NULL, NULL, NULL, NULL, 1, 0.1f, 1e-5f);
    dg_tensor *g = dg_from_data(ctx, DG_F32, 3, (int64_t[]){N, C, L}, dy);
    REQUIRE(y && g && dg_backward_with(ctx, y, g) == DG_OK);
    memcpy(out[t][0], dg_tensor_data(y), sizeof out[t][0]);
    memcpy(out[t][1], dg_tensor_data(dg_tensor_grad(xt)), sizeof out[t][1]);
    dg_ctx_free(ctx);
  }
  dg_set_num_threads(0);
  CHECK(!memcmp(out[0], out[1], sizeof out[0]));
}

/* dg_batchnorm(x, w, b, rm, rv, train, 0.1, 1e-5) */
static dg_tensor *bn(dg_ctx *ctx, dg_tensor *x, dg_tensor *w, dg_tensor *rm, dg_tensor *rv,
                     int train) {
  return dg_batchnorm(ctx, x, w, NULL, rm, rv, train, 0.1f, 1e-5f);
}

static void errors(dg_ctx *ctx) {
  int64_t s[2] = {4, 3}, c3[1] = {3}, c4[1] = {4};
  dg_tensor *x = dg_zeros(ctx, DG_F32, 2, s), *r3 = dg_zeros(ctx, DG_F32, 1, c3);
  CHECK(bn(ctx, x, dg_zeros(ctx, DG_F32, 1, c4), NULL, NULL, 1) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_ESHAPE);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "batchnorm: x (4, 3) has 3 channels");
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "w (4)");
  dg_ctx_clear_error(ctx);
  CHECK(dg_batchnorm(ctx, x, NULL, NULL, NULL, NULL, 0, 0.1f, 1e-5f) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_EINVAL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "eval mode");
  dg_ctx_clear_error(ctx);
  CHECK(dg_batchnorm(ctx, x, NULL, NULL, r3, NULL, 1, 0.1f, 1e-5f) == NULL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "go together");
  dg_ctx_clear_error(ctx);
  CHECK(dg_batchnorm(ctx, x, NULL, NULL, r3, r3, 1, 1.5f, 1e-5f) == NULL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "momentum 1.5");
  dg_ctx_clear_error(ctx);
  CHECK(dg_batchnorm(ctx, x, NULL, NULL, NULL, NULL, 1, 0.1f, -1.0f) == NULL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "eps");
  dg_ctx_clear_error(ctx);
  CHECK(bn(ctx, dg_zeros(ctx, DG_F32, 1, c3), NULL, NULL, NULL, 1) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_ESHAPE);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "(N, C, H, W)");
  dg_ctx_clear_error(ctx);
  int64_t one[4] = {1, 3, 1, 1}; /* one value per channel: no variance */
  CHECK(bn(ctx, dg_zeros(ctx, DG_F32, 4, one), NULL, NULL, NULL, 1) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_ESHAPE);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "more than 1 value per channel; got x (1, 3, 1, 1)");
  dg_ctx_clear_error(ctx);
  CHECK(bn(ctx, dg_zeros(ctx, DG_F32, 4, one), NULL, r3, r3, 0) != NULL);
  CHECK(dg_batchnorm(ctx, x, NULL, NULL, dg_zeros(ctx, DG_I32, 1, c3), r3, 1, 0.1f, 1e-5f) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_EDTYPE);
  dg_ctx_clear_error(ctx);
  CHECK(dg_batchnorm(ctx, NULL, NULL, NULL, NULL, NULL, 1, 0.1f, 1e-5f) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_EINVAL);
  dg_ctx_clear_error(ctx);
}

int main(void) {
  grad_cases();
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  forward_values(ctx);
  dg_ctx_reset(ctx);
  large_mean(ctx);
  dg_ctx_reset(ctx);
  errors(ctx);
  dg_ctx_free(ctx);
  threads();
  return TEST_DONE();
}
