/* Reductions: finite-difference checks of sum/mean (all) and sum_dim /
 * mean_dim over every dim (negative too), with and without keepdim, on
 * contiguous and permuted inputs; forward values and shapes; accuracy of
 * long sums; empty inputs; error paths. */
#include "gradcheck.h"
#include "test.h"

typedef struct {
  int kind; /* 0 sum, 1 mean, 2 sum_dim, 3 mean_dim */
  int dim, keepdim, view;
} red_case;

static dg_tensor *f_reduce(dg_ctx *ctx, dg_tensor **in, void *u) {
  const red_case *c = u;
  dg_tensor *x = c->view ? dg_permute(ctx, in[0], (const int[]){2, 0, 1}) : in[0];
  switch (c->kind) {
    case 0: return dg_sum(ctx, x);
    case 1: return dg_mean(ctx, x);
    case 2: return dg_sum_dim(ctx, x, c->dim, c->keepdim);
    default: return dg_mean_dim(ctx, x, c->dim, c->keepdim);
  }
}

static void check_grads(void) {
  int64_t s3[3] = {2, 3, 4}, s1[1] = {37}, s2[2] = {5, 33};
  const char *names[4] = {"sum", "mean", "sum_dim", "mean_dim"};
  for (int view = 0; view < 2; view++) {
    dg_tensor *in[1] = {gc_input(3, s3, -1, 1, 1 + view)};
    REQUIRE(in[0]);
    char nm[96];
    for (int k = 0; k < 2; k++) {
      red_case c = {k, 0, 0, view};
      snprintf(nm, sizeof nm, "%s (2,3,4)%s", names[k], view ? " permuted" : "");
      CHECK_EQ_INT(gc_check(nm, f_reduce, &c, 1, in, 1e-3, 1e-2), 0);
    }
    for (int k = 2; k < 4; k++)
      for (int dim = -3; dim < 3; dim++)
        for (int keep = 0; keep < 2; keep++) {
          red_case c = {k, dim, keep, view};
          snprintf(nm, sizeof nm, "%s dim=%d keepdim=%d%s", names[k], dim, keep,
                   view ? " permuted" : "");
          CHECK_EQ_INT(gc_check(nm, f_reduce, &c, 1, in, 1e-3, 1e-2), 0);
        }
    dg_tensor_free(in[0]);
  }
  /* lengths that are not multiples of the vector blocks */
  dg_tensor *v[1] = {gc_input(1, s1, -1, 1, 9)};
  red_case cs = {0, 0, 0, 0}, cm = {3, 0, 0, 0};
  CHECK_EQ_INT(gc_check("sum (37)", f_reduce, &cs, 1, v, 1e-3, 1e-2), 0);
  CHECK_EQ_INT(gc_check("mean_dim (37) dim 0", f_reduce, &cm, 1, v, 1e-3, 1e-2), 0);
  dg_tensor_free(v[0]);
  dg_tensor *m[1] = {gc_input(2, s2, -1, 1, 10)};
  red_case r0 = {2, 0, 1, 0}, r1 = {3, -1, 0, 0};
  CHECK_EQ_INT(gc_check("sum_dim (5,33) dim 0", f_reduce, &r0, 1, m, 1e-3, 1e-2), 0);
  CHECK_EQ_INT(gc_check("mean_dim (5,33) dim -1", f_reduce, &r1, 1, m, 1e-3, 1e-2), 0);
  dg_tensor_free(m[0]);
}

static void check_values(dg_ctx *ctx) {
  int64_t s[3] = {2, 3, 4};
  float xv[24];
  for (int i = 0; i < 24; i++) xv[i] = (float)(i + 1);
  dg_tensor *x = dg_from_data(ctx, DG_F32, 3, s, xv);
  REQUIRE(x);
  dg_tensor *su = dg_sum(ctx, x), *me = dg_mean(ctx, x);
  REQUIRE(su && me);
  CHECK_EQ_INT(dg_tensor_ndim(su), 0);
  CHECK_EQ_INT(dg_tensor_numel(su), 1);
  CHECK_EQ_INT(dg_tensor_ndim(me), 0);
  CHECK_NEAR(dg_tensor_item(su), 300, 0);
  CHECK_NEAR(dg_tensor_item(me), 12.5, 1e-6);
  /* dim 1 of (2,3,4): out[o][j] = sum_d x[o][d][j] */
  dg_tensor *d1 = dg_sum_dim(ctx, x, 1, 0), *d1k = dg_sum_dim(ctx, x, -2, 1);
  REQUIRE(d1 && d1k);
  CHECK_EQ_INT(dg_tensor_ndim(d1), 2);
  CHECK_EQ_INT(dg_tensor_dim(d1, 0), 2);
  CHECK_EQ_INT(dg_tensor_dim(d1, 1), 4);
  CHECK_EQ_INT(dg_tensor_ndim(d1k), 3);
  CHECK_EQ_INT(dg_tensor_dim(d1k, 1), 1);
  CHECK_NEAR(dg_tensor_get(d1, 0), 1 + 5 + 9, 0);
  CHECK_NEAR(dg_tensor_get(d1, 7), 16 + 20 + 24, 0);
  CHECK_NEAR(dg_tensor_get(d1k, 7), 16 + 20 + 24, 0);
  dg_tensor *m2 = dg_mean_dim(ctx, x, -1, 0); /* (2, 3) */
  REQUIRE(m2);
  CHECK_EQ_INT(dg_tensor_ndim(m2), 2);
  CHECK_NEAR(dg_tensor_get(m2, 0), 2.5, 1e-6);
  CHECK_NEAR(dg_tensor_get(m2, 5), 22.5, 1e-6);
  dg_tensor *m0 = dg_mean_dim(ctx, x, 0, 1); /* (1, 3, 4) */
  REQUIRE(m0);
  CHECK_EQ_INT(dg_tensor_dim(m0, 0), 1);
  CHECK_NEAR(dg_tensor_get(m0, 0), 7, 1e-6);
  /* a permuted view is reduced in its logical order */
  dg_tensor *t = dg_sum_dim(ctx, dg_transpose(ctx, x, 0, 2), 0, 0); /* (3, 2) */
  REQUIRE(t);
  CHECK_EQ_INT(dg_tensor_dim(t, 0), 3);
  CHECK_EQ_INT(dg_tensor_dim(t, 1), 2);
  CHECK_NEAR(dg_tensor_get(t, 1), 13 + 14 + 15 + 16, 0);
  /* 0-dim input */
  float one = 4;
  dg_tensor *sc = dg_from_data(ctx, DG_F32, 0, NULL, &one);
  dg_tensor *ss = dg_sum(ctx, sc), *sd = dg_sum_dim(ctx, sc, -1, 0);
  REQUIRE(ss && sd);
  CHECK_NEAR(dg_tensor_item(ss), 4, 0);
  CHECK_EQ_INT(dg_tensor_ndim(sd), 0);
  CHECK_NEAR(dg_tensor_item(sd), 4, 0);
}

static void check_accuracy_and_empty(dg_ctx *ctx) {
  enum { N = 1000000 };
  int64_t n[1] = {N}, s2[2] = {1, N};
  dg_tensor *x = dg_full(ctx, 1, n, 0.1f);
  REQUIRE(x);
  double expect = (double)N * (double)0.1f;
  dg_tensor *s = dg_sum(ctx, x), *m = dg_mean(ctx, x);
  REQUIRE(s && m);
  CHECK_NEAR(dg_tensor_item(s), expect, 1e-2);
  CHECK_NEAR(dg_tensor_item(m), 0.1f, 1e-8);
  dg_tensor *r = dg_sum_dim(ctx, dg_reshape(ctx, x, 2, s2), 1, 0);
  dg_tensor *c = dg_sum_dim(ctx, dg_reshape(ctx, x, 2, (int64_t[]){N, 1}), 0, 0);
  REQUIRE(r && c);
  CHECK_NEAR(dg_tensor_get(r, 0), expect, 1e-2);
  CHECK_NEAR(dg_tensor_get(c, 0), expect, 1e-2);
  int64_t e[2] = {0, 3};
  dg_tensor *z = dg_zeros(ctx, DG_F32, 2, e);
  dg_tensor *zs = dg_sum(ctx, z), *zm = dg_mean(ctx, z), *zd = dg_mean_dim(ctx, z, 0, 0);
  REQUIRE(zs && zm && zd);
  CHECK_NEAR(dg_tensor_item(zs), 0, 0);
  CHECK(isnan(dg_tensor_item(zm)));
  CHECK_EQ_INT(dg_tensor_numel(zd), 3);
  CHECK(isnan(dg_tensor_get(zd, 0)));
  dg_tensor *zd1 = dg_sum_dim(ctx, z, 1, 0);
  REQUIRE(zd1);
  CHECK_EQ_INT(dg_tensor_numel(zd1), 0);
}

static void check_errors(dg_ctx *ctx) {
  int64_t s[2] = {2, 3};
  dg_tensor *x = dg_zeros(ctx, DG_F32, 2, s);
  CHECK(dg_sum_dim(ctx, x, 2, 0) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_EINVAL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "sum_dim");
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "(2, 3)");
  dg_ctx_clear_error(ctx);
  CHECK(dg_mean_dim(ctx, x, -3, 1) == NULL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "mean_dim");
  dg_ctx_clear_error(ctx);
  CHECK(dg_sum(ctx, dg_zeros(ctx, DG_I64, 2, s)) == NULL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "sum");
  dg_ctx_clear_error(ctx);
  CHECK(dg_mean(ctx, NULL) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_EINVAL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "mean");
  dg_ctx_clear_error(ctx);
}

/* The loss pattern: mean of a sum_dim seeds every element with 1/(rows). */
static void check_backward_values(void) {
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  int64_t s[2] = {4, 3};
  dg_tensor *x = gc_input(2, s, -1, 1, 3);
  REQUIRE(x);
  dg_tensor *l = dg_mean(ctx, dg_sum_dim(ctx, x, 1, 0));
  REQUIRE(l && dg_backward(ctx, l) == DG_OK);
  const float *g = dg_tensor_data(dg_tensor_grad(x));
  for (int i = 0; i < 12; i++) CHECK_NEAR(g[i], 0.25, 1e-7);
  dg_tensor_free(x);
  dg_ctx_free(ctx);
}

int main(void) {
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  check_values(ctx);
  check_accuracy_and_empty(ctx);
  check_errors(ctx);
  dg_ctx_free(ctx);
  check_backward_values();
  check_grads();
  return TEST_DONE();
}
