/* softmax, log_softmax, cross_entropy, mse: finite-difference checks of
 * backward, hand-computed forward values, numerical stability and error
 * paths. */
#include "gradcheck.h"
#include "test.h"

static dg_tensor *f_softmax(dg_ctx *ctx, dg_tensor **in, void *u) {
  (void)u;
  return dg_softmax(ctx, in[0]);
}
static dg_tensor *f_log_softmax(dg_ctx *ctx, dg_tensor **in, void *u) {
  (void)u;
  return dg_log_softmax(ctx, in[0]);
}
/* Over a transposed (non-contiguous) view. */
static dg_tensor *f_softmax_t(dg_ctx *ctx, dg_tensor **in, void *u) {
  dg_tensor *t = dg_transpose(ctx, in[0], 0, 1);
  return u ? dg_log_softmax(ctx, t) : dg_softmax(ctx, t);
}

typedef struct {
  dg_dtype dt;
  int ndim;
  int64_t shape[3];
  const int64_t *t; /* targets */
} ce_case;

static dg_tensor *f_ce(dg_ctx *ctx, dg_tensor **in, void *u) {
  ce_case *c = u;
  int32_t t32[64];
  int64_t n = 1;
  for (int i = 0; i < c->ndim; i++) n *= c->shape[i];
  for (int64_t i = 0; i < n; i++) t32[i] = (int32_t)c->t[i];
  dg_tensor *tg = dg_from_data(ctx, c->dt, c->ndim, c->shape,
                               c->dt == DG_I32 ? (const void *)t32 : (const void *)c->t);
  return dg_cross_entropy(ctx, in[0], tg);
}

static dg_tensor *f_mse(dg_ctx *ctx, dg_tensor **in, void *u) {
  (void)u;
  return dg_mse(ctx, in[0], in[1]);
}

static void grad_softmax(void) {
  int64_t s1[1] = {5}, s2[2] = {3, 4}, s3[3] = {2, 3, 5}, s4[2] = {4, 1};
  const int64_t *shapes[4] = {s1, s2, s3, s4};
  int nds[4] = {1, 2, 3, 2};
  for (int k = 0; k < 4; k++) {
    dg_tensor *in[1] = {gc_input(nds[k], shapes[k], -2, 2, 20 + k)};
    char nm[64];
    snprintf(nm, sizeof nm, "softmax case %d", k);
    CHECK_EQ_INT(gc_check(nm, f_softmax, NULL, 1, in, 1e-3, 1e-2), 0);
    snprintf(nm, sizeof nm, "log_softmax case %d", k);
    CHECK_EQ_INT(gc_check(nm, f_log_softmax, NULL, 1, in, 1e-3, 1e-2), 0);
    dg_tensor_free(in[0]);
  }
  dg_tensor *in[1] = {gc_input(2, s2, -3, 3, 30)};
  CHECK_EQ_INT(gc_check("softmax of transposed view", f_softmax_t, NULL, 1, in, 1e-3, 1e-2), 0);
  CHECK_EQ_INT(gc_check("log_softmax of transposed view", f_softmax_t, (void *)1, 1, in, 1e-3, 1e-2), 0);
  dg_tensor_free(in[0]);
}

static void grad_losses(void) {
  int64_t t1[4] = {0, 4, 2, 2}, t2[6] = {3, 0, 1, 2, 3, 3};
  ce_case c1 = {DG_I64, 1, {4}, t1}, c2 = {DG_I32, 2, {2, 3}, t2};
  int64_t l1[2] = {4, 5}, l2[3] = {2, 3, 4};
  dg_tensor *in[1] = {gc_input(2, l1, -2, 2, 40)};
  CHECK_EQ_INT(gc_check("cross_entropy (4, 5) i64", f_ce, &c1, 1, in, 1e-3, 1e-2), 0);
  dg_tensor_free(in[0]);
  in[0] = gc_input(3, l2, -2, 2, 41);
  CHECK_EQ_INT(gc_check("cross_entropy (2, 3, 4) i32", f_ce, &c2, 1, in, 1e-3, 1e-2), 0);
  dg_tensor_free(in[0]);

  int64_t m[3] = {2, 3, 4};
  dg_tensor *in2[2] = {gc_input(3, m, -1, 1, 42), gc_input(3, m, -1, 1, 43)};
  CHECK_EQ_INT(gc_check("mse", f_mse, NULL, 2, in2, 1e-3, 1e-2), 0);
  dg_tensor_set_requires_grad(in2[1], 0);
  CHECK_EQ_INT(gc_check("mse, constant target", f_mse, NULL, 2, in2, 1e-3, 1e-2), 0);
  dg_tensor_free(in2[0]);
  dg_tensor_free(in2[1]);
}

static void forward_values(dg_ctx *ctx) {
  int64_t s[2] = {2, 3};
  float x[6] = {1, 2, 3, 1000, 1001, 1002}; /* row 2: overflow without max-subtraction */
  dg_tensor *t = dg_from_data(ctx, DG_F32, 2, s, x);
  dg_tensor *y = dg_softmax(ctx, t), *ly = dg_log_softmax(ctx, t);
  REQUIRE(y && ly);
  double z = exp(1.0) + exp(2.0) + exp(3.0);
  for (int r = 0; r < 2; r++)
    for (int j = 0; j < 3; j++) {
      CHECK_NEAR(dg_tensor_get(y, r * 3 + j), exp(j + 1.0) / z, 1e-6);
      CHECK_NEAR(dg_tensor_get(ly, r * 3 + j), (j + 1.0) - log(z), 1e-5);
    }
  /* cross-entropy: row [1, 2, 3] target 2 and row [0, 0, 0] target 1 */
  float lx[6] = {1, 2, 3, 0, 0, 0};
  int64_t tg[2] = {2, 1};
  dg_tensor *lt = dg_from_data(ctx, DG_F32, 2, s, lx);
  dg_tensor *tt = dg_from_data(ctx, DG_I64, 1, s, tg);
  dg_tensor *ce = dg_cross_entropy(ctx, lt, tt);
  REQUIRE(ce);
  CHECK_EQ_INT(dg_tensor_ndim(ce), 0);
  CHECK_NEAR(dg_tensor_item(ce), ((log(z) - 3.0) + log(3.0)) / 2, 1e-6);
  float big[6] = {1e4f, 0, -1e4f, 0, 0, 0}; /* finite loss, no overflow: row 0 costs 2e4 */
  ce = dg_cross_entropy(ctx, dg_from_data(ctx, DG_F32, 2, s, big), tt);
  REQUIRE(ce);
  CHECK_NEAR(dg_tensor_item(ce), (2e4 + log(3.0)) / 2, 1e-2);
  /* mse: (1 - 0)^2, (2 - 4)^2, (3 - 3)^2 ... */
  float p[6] = {1, 2, 3, 4, 5, 6}, q[6] = {0, 4, 3, 4, 5, 9};
  dg_tensor *mse = dg_mse(ctx, dg_from_data(ctx, DG_F32, 2, s, p), dg_from_data(ctx, DG_F32, 2, s, q));
  REQUIRE(mse);
  CHECK_NEAR(dg_tensor_item(mse), (1 + 4 + 0 + 0 + 0 + 9) / 6.0, 1e-6);
}

/* Cross-entropy gradient by hand: (softmax - onehot) / N. */
static void ce_grad_value(dg_ctx *ctx) {
  int64_t s[2] = {1, 3};
  dg_tensor *x = NULL;
  REQUIRE(dg_tensor_new(&x, DG_F32, 2, s, NULL, 0) == DG_OK);
  float *xd = dg_tensor_data(x);
  xd[0] = 1, xd[1] = 2, xd[2] = 3;
  dg_tensor_set_requires_grad(x, 1);
  int32_t tg[1] = {0};
  dg_tensor *l = dg_cross_entropy(ctx, x, dg_from_data(ctx, DG_I32, 1, s, tg));
  REQUIRE(l);
  CHECK_OK(dg_backward(ctx, l));
  dg_tensor *g = dg_tensor_grad(x);
  REQUIRE(g);
  double z = exp(1.0) + exp(2.0) + exp(3.0);
  for (int j = 0; j < 3; j++) CHECK_NEAR(dg_tensor_get(g, j), exp(j + 1.0) / z - (j == 0), 1e-6);
  dg_tensor_free(x);
}

static void errors(dg_ctx *ctx) {
  int64_t s[2] = {4, 5}, s3[1] = {3}, s4[1] = {4};
  dg_tensor *x = dg_zeros(ctx, DG_F32, 2, s);
  dg_tensor *bad_t = dg_zeros(ctx, DG_I64, 1, s3);
  CHECK(dg_cross_entropy(ctx, x, bad_t) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_ESHAPE);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "cross_entropy");
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "(4, 5)");
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "(3)");
  dg_ctx_clear_error(ctx);

  int64_t tv[4] = {0, 1, 7, 2};
  CHECK(dg_cross_entropy(ctx, x, dg_from_data(ctx, DG_I64, 1, s4, tv)) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_EINVAL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "row 2");
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "7");
  dg_ctx_clear_error(ctx);
  int32_t tn[4] = {0, -1, 0, 0};
  CHECK(dg_cross_entropy(ctx, x, dg_from_data(ctx, DG_I32, 1, s4, tn)) == NULL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "target -1 in row 1");
  dg_ctx_clear_error(ctx);

  CHECK(dg_cross_entropy(ctx, x, dg_zeros(ctx, DG_F32, 1, s4)) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_EDTYPE);
  dg_ctx_clear_error(ctx);
  CHECK(dg_cross_entropy(ctx, NULL, bad_t) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_EINVAL);
  dg_ctx_clear_error(ctx);

  CHECK(dg_mse(ctx, x, dg_zeros(ctx, DG_F32, 1, s4)) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_ESHAPE);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "mse");
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "(4, 5)");
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "(4)");
  dg_ctx_clear_error(ctx);

  CHECK(dg_softmax(ctx, dg_zeros(ctx, DG_I32, 2, s)) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_EDTYPE);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "softmax");
  dg_ctx_clear_error(ctx);
  CHECK(dg_log_softmax(ctx, dg_zeros(ctx, DG_F32, 0, NULL)) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_ESHAPE);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "log_softmax");
  dg_ctx_clear_error(ctx);
}

int main(void) {
  grad_softmax();
  grad_losses();
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  forward_values(ctx);
  dg_ctx_reset(ctx);
  ce_grad_value(ctx);
  dg_ctx_reset(ctx);
  errors(ctx);
  dg_ctx_free(ctx);
  return TEST_DONE();
}
