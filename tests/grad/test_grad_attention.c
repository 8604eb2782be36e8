/* dg_attention (fused multi-head self-attention): finite-difference checks
 * of backward, equality with the unfused composition (split, permute,
 * matmul, scale, causal mask, softmax, matmul, merge) forward and backward
 * on 1 and 2 threads, gradient accumulation, eval mode and error paths.
 * Also the strided-operand paths of dg_linear / dg_matmul that the
 * attention path relies on (views used in place, shared b as one GEMM). */
#include "gradcheck.h"
#include "test.h"

typedef struct {
  int64_t B, T, C;
  int H, causal;
} att_case;

static float att_scale(const att_case *c) { return 1.0f / sqrtf((float)(c->C / c->H)); }

static dg_tensor *f_fused(dg_ctx *ctx, dg_tensor **in, void *u) {
  att_case *c = u;
  return dg_attention(ctx, in[0], c->H, c->causal, att_scale(c));
}

/* Both masks on one input: the second node accumulates into the gradient
 * the first one wrote. */
static dg_tensor *f_fused_twice(dg_ctx *ctx, dg_tensor **in, void *u) {
  att_case *c = u;
  return dg_add(ctx, dg_attention(ctx, in[0], c->H, 1, att_scale(c)),
                dg_attention(ctx, in[0], c->H, 0, 0.5f));
}

/* (B, T, C) -> (B*H, T, hd) */
static dg_tensor *to_heads(dg_ctx *ctx, dg_tensor *x, const att_case *c) {
  int64_t hd = c->C / c->H, s4[4] = {c->B, c->T, c->H, hd}, s3[3] = {c->B * c->H, c->T, hd};
  int perm[4] = {0, 2, 1, 3};
  dg_tensor *p = dg_permute(ctx, dg_reshape(ctx, dg_contiguous(ctx, x), 4, s4), perm);
  return dg_reshape(ctx, dg_contiguous(ctx, p), 3, s3);
}

static dg_tensor *f_unfused(dg_ctx *ctx, dg_tensor **in, void *u) {
  att_case *c = u;
  int64_t sizes[3] = {c->C, c->C, c->C}, hd = c->C / c->H;
  dg_tensor *p[3] = {NULL, NULL, NULL};
  if (dg_split(ctx, in[0], 2, 3, sizes, p)) return NULL;
  dg_tensor *q = to_heads(ctx, p[0], c), *k = to_heads(ctx, p[1], c), *v = to_heads(ctx, p[2], c);
  dg_tensor *att = dg_scale(ctx, dg_matmul_t(ctx, q, k, 0, 1), att_scale(c));
  if (c->causal) att = dg_causal_mask(ctx, att);
  dg_tensor *y = dg_matmul(ctx, dg_softmax(ctx, att), v); /* (B*H, T, hd) */
  int64_t s4[4] = {c->B, c->H, c->T, hd}, s3[3] = {c->B, c->T, c->C};
  int perm[4] = {0, 2, 1, 3};
  y = dg_permute(ctx, dg_reshape(ctx, y, 4, s4), perm);
  return dg_reshape(ctx, dg_contiguous(ctx, y), 3, s3);
}

static void grad_fused(void) {
  static const att_case cases[] = {
      {1, 1, 4, 1, 1}, {2, 3, 8, 2, 1}, {2, 5, 12, 3, 0}, {1, 4, 8, 4, 1},
      {3, 6, 6, 1, 0}, {1, 70, 2, 1, 1}, /* T > 64: the causal block path */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    att_case c = cases[i];
    int64_t s[3] = {c.B, c.T, 3 * c.C};
    dg_tensor *in[1] = {gc_input(3, s, -1.5f, 1.5f, 300 + i)};
    char nm[96];
    snprintf(nm, sizeof nm, "attention B=%lld T=%lld C=%lld H=%d causal=%d", (long long)c.B,
             (long long)c.T, (long long)c.C, c.H, c.causal);
    CHECK_EQ_INT(gc_check(nm, f_fused, &c, 1, in, 1e-3, 1e-2), 0);
    if (i == 1) CHECK_EQ_INT(gc_check("attention causal + full, accumulated", f_fused_twice, &c,
                                      1, in, 1e-3, 1e-2), 0);
    dg_tensor_free(in[0]);
  }
}

/* Forward y and d(sum(y * w))/dqkv of f; the caller frees nothing (arena)
 * except the returned gradient copy. */
static float *run(dg_ctx *ctx, gc_fn f, att_case *c, dg_tensor *x, const float *w,
                  dg_tensor **y) {
  dg_ctx_reset(ctx);
  dg_tensor *g = dg_tensor_grad(x);
  if (g) memset(dg_tensor_data(g), 0, (size_t)dg_tensor_numel(g) * sizeof(float));
  dg_tensor *in[1] = {x};
  *y = f(ctx, in, c);
  REQUIRE(*y);
  dg_tensor *wt = dg_from_data(ctx, DG_F32, 3, dg_tensor_shape(*y), w);
  REQUIRE(wt && dg_backward_with(ctx, *y, wt) == DG_OK);
  g = dg_tensor_grad(x);
  REQUIRE(g);
  size_t n = (size_t)dg_tensor_numel(g);
  float *out = malloc(n * sizeof *out);
  memcpy(out, dg_tensor_data(g), n * sizeof *out);
  return out;
}

static double max_abs_diff(const float *a, const float *b, int64_t n, double *scale) {
  double m = 0, s = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - b[i]);
    m = d > m ? d : m;
    s = fabs(b[i]) > s ? fabs(b[i]) : s;
  }
  *scale = s;
  return m;
}

static void vs_unfused(int threads) {
  static const att_case cases[] = {
      {16, 64, 128, 4, 1}, {2, 130, 64, 2, 1}, {3, 17, 24, 3, 0}, {1, 1, 8, 2, 1}, {5, 9, 40, 5, 1},
      {2, 40, 128, 2, 1}, {2, 33, 96, 2, 0}, /* heads of 64 and 48: two column blocks */
  };
  dg_set_num_threads(threads);
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    att_case c = cases[i];
    int64_t s[3] = {c.B, c.T, 3 * c.C}, ny = c.B * c.T * c.C, nx = 3 * ny;
    dg_tensor *x = gc_input(3, s, -2, 2, 400 + i);
    float *w = malloc((size_t)ny * sizeof *w);
    dg_rng_uniform(500 + i, 0, w, (size_t)ny);
    for (int64_t e = 0; e < ny; e++) w[e] = 2 * w[e] - 1;
    dg_tensor *yf, *yu;
    float *gf = run(ctx, f_fused, &c, x, w, &yf);
    float *yfc = malloc((size_t)ny * sizeof *yfc);
    memcpy(yfc, dg_tensor_data(yf), (size_t)ny * sizeof *yfc);
    float *gu = run(ctx, f_unfused, &c, x, w, &yu);
    double sy, sg;
    double dy = max_abs_diff(yfc, dg_tensor_data(yu), ny, &sy);
    double dgr = max_abs_diff(gf, gu, nx, &sg);
    fprintf(stderr, "fused vs unfused B=%lld T=%lld C=%lld H=%d causal=%d threads=%d: "
            "|dy| %.3g (max %.3g), |dgrad| %.3g (max %.3g)\n", (long long)c.B, (long long)c.T,
            (long long)c.C, c.H, c.causal, threads, dy, sy, dgr, sg);
    CHECK(dy <= 1e-6 * (1 + sy));
    CHECK(dgr <= 2e-6 * (1 + sg));
    /* eval: same output, no node */
    dg_ctx_reset(ctx);
    int prev = dg_ctx_set_grad_enabled(ctx, 0);
    dg_tensor *in[1] = {x};
    dg_tensor *ye = f_fused(ctx, in, &c);
    dg_ctx_set_grad_enabled(ctx, prev);
    REQUIRE(ye);
    CHECK(!dg_tensor_requires_grad(ye));
    double se;
    CHECK_NEAR(max_abs_diff(dg_tensor_data(ye), yfc, ny, &se), 0, 0);
    free(w), free(gf), free(gu), free(yfc);
    dg_tensor_free(x);
  }
  dg_ctx_free(ctx);
  dg_set_num_threads(1);
}

/* Hand-computed: T = 2, one head, hd = 1, causal. Row 0 attends to itself
 * only; row 1 mixes v0, v1 with weights softmax(q1 k0, q1 k1) * scale. */
static void values(dg_ctx *ctx) {
  int64_t s[3] = {1, 2, 3};
  float x[6] = {/* t0: q k v */ 0.5f, 1.0f, 3.0f, /* t1 */ 2.0f, -1.0f, 7.0f};
  dg_tensor *y = dg_attention(ctx, dg_from_data(ctx, DG_F32, 3, s, x), 1, 1, 0.5f);
  REQUIRE(y);
  CHECK_EQ_INT(dg_tensor_ndim(y), 3);
  CHECK_EQ_INT(dg_tensor_shape(y)[2], 1);
  double a0 = 0.5 * 2.0 * 1.0, a1 = 0.5 * 2.0 * -1.0;
  double p0 = exp(a0) / (exp(a0) + exp(a1));
  CHECK_NEAR(dg_tensor_get(y, 0), 3.0, 1e-6);
  CHECK_NEAR(dg_tensor_get(y, 1), p0 * 3.0 + (1 - p0) * 7.0, 1e-6);
  /* not causal: row 0 sees v1 too */
  y = dg_attention(ctx, dg_from_data(ctx, DG_F32, 3, s, x), 1, 0, 0.5f);
  REQUIRE(y);
  double b0 = 0.5 * 0.5 * 1.0, b1 = 0.5 * 0.5 * -1.0, r0 = exp(b0) / (exp(b0) + exp(b1));
  CHECK_NEAR(dg_tensor_get(y, 0), r0 * 3.0 + (1 - r0) * 7.0, 1e-6);
  /* large scores: no overflow */
  float big[6] = {100.0f, 100.0f, 1.0f, 100.0f, -100.0f, 2.0f};
  y = dg_attention(ctx, dg_from_data(ctx, DG_F32, 3, s, big), 1, 0, 1.0f);
  REQUIRE(y);
  CHECK_NEAR(dg_tensor_get(y, 0), 1.0, 1e-6);
  CHECK_NEAR(dg_tensor_get(y, 1), 1.0, 1e-6);
}

static void errors(dg_ctx *ctx) {
  int64_t s3[3] = {2, 4, 12}, s2[2] = {4, 12};
  dg_tensor *x = dg_zeros(ctx, DG_F32, 3, s3);
  CHECK(dg_attention(ctx, x, 3, 1, 1.0f) == NULL); /* 12 = 3C, C = 4: 4 % 3 != 0 */
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_ESHAPE);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "attention");
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "(2, 4, 12)");
  dg_ctx_clear_error(ctx);
  CHECK(dg_attention(ctx, dg_zeros(ctx, DG_F32, 2, s2), 1, 1, 1.0f) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_ESHAPE);
  dg_ctx_clear_error(ctx);
  CHECK(dg_attention(ctx, x, 0, 1, 1.0f) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_ESHAPE);
  dg_ctx_clear_error(ctx);
  CHECK(dg_attention(ctx, x, 2, 1, INFINITY) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_EINVAL);
  dg_ctx_clear_error(ctx);
  CHECK(dg_attention(ctx, NULL, 2, 1, 1.0f) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_EINVAL);
  dg_ctx_clear_error(ctx);
  CHECK(dg_attention(ctx, dg_zeros(ctx, DG_I32, 3, s3), 2, 1, 1.0f) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_EDTYPE);
  dg_ctx_clear_error(ctx);
  CHECK(dg_attention(ctx, x, 2, 1, 1.0f) != NULL);
  /* empty: T = 0 and B = 0, with and without grad */
  int64_t e1[3] = {2, 0, 12}, e2[3] = {0, 3, 12};
  for (int k = 0; k < 2; k++) {
    dg_tensor *e = NULL;
    REQUIRE(dg_tensor_new(&e, DG_F32, 3, k ? e2 : e1, NULL, 0) == DG_OK);
    dg_tensor_set_requires_grad(e, 1);
    dg_tensor *y = dg_attention(ctx, e, 2, 1, 1.0f);
    REQUIRE(y);
    CHECK_EQ_INT(dg_tensor_numel(y), 0);
    CHECK_OK(dg_backward(ctx, dg_sum(ctx, y)));
    int prev = dg_ctx_set_grad_enabled(ctx, 0);
    CHECK(dg_attention(ctx, e, 2, 0, 1.0f) != NULL);
    dg_ctx_set_grad_enabled(ctx, prev);
    dg_tensor_free(e);
  }
}

/* ---- linear / matmul on strided views ---- */

/* (N, I') -> columns [1, 1 + I) as a (N, I) view with row stride I' */
static dg_tensor *narrow_cols(dg_ctx *ctx, dg_tensor *x, int64_t I) {
  return dg_transpose(ctx, dg_slice(ctx, dg_transpose(ctx, x, 0, 1), 1, 1 + I), 0, 1);
}
static dg_tensor *f_linear_narrow(dg_ctx *ctx, dg_tensor **in, void *u) {
  (void)u;
  return dg_linear(ctx, narrow_cols(ctx, in[0], 4), in[1], in[2]);
}
/* w given transposed: (I, O) stored, used as (O, I) column-major */
static dg_tensor *f_linear_wt(dg_ctx *ctx, dg_tensor **in, void *u) {
  (void)u;
  return dg_linear(ctx, narrow_cols(ctx, in[0], 4), dg_transpose(ctx, in[1], 0, 1), in[2]);
}
/* a (M, B, K) -> (B, M, K) with batch stride K and row stride B*K; b shared */
static dg_tensor *f_bmm_strided_a(dg_ctx *ctx, dg_tensor **in, void *u) {
  int tb = u != NULL;
  return dg_matmul_t(ctx, dg_transpose(ctx, in[0], 0, 1), in[1], 0, tb);
}
/* both batched through transposed views */
static dg_tensor *f_bmm_strided_ab(dg_ctx *ctx, dg_tensor **in, void *u) {
  (void)u;
  return dg_matmul(ctx, dg_transpose(ctx, in[0], 0, 1), dg_transpose(ctx, in[1], 0, 1));
}
/* shared b, a contiguous: one GEMM over B*M rows (tb from u) */
static dg_tensor *f_bmm_shared(dg_ctx *ctx, dg_tensor **in, void *u) {
  return dg_matmul_t(ctx, in[0], in[1], 0, u != NULL);
}
/* a given as (B, K, M) used transposed: op(a) row-major, flat forward */
static dg_tensor *f_bmm_shared_ta(dg_ctx *ctx, dg_tensor **in, void *u) {
  (void)u;
  return dg_matmul_t(ctx, in[0], in[1], 1, 0);
}

static void grad_strided(void) {
  int64_t sx[2] = {6, 7}, sw[2] = {5, 4}, swt[2] = {4, 5}, sb[1] = {5};
  dg_tensor *in[3] = {gc_input(2, sx, -1, 1, 600), gc_input(2, sw, -1, 1, 601),
                      gc_input(1, sb, -1, 1, 602)};
  CHECK_EQ_INT(gc_check("linear, x narrowed view", f_linear_narrow, NULL, 3, in, 1e-3, 1e-2), 0);
  dg_tensor_free(in[1]);
  in[1] = gc_input(2, swt, -1, 1, 603);
  CHECK_EQ_INT(gc_check("linear, w transposed", f_linear_wt, NULL, 3, in, 1e-3, 1e-2), 0);
  for (int k = 0; k < 3; k++) dg_tensor_free(in[k]);

  int64_t sa[3] = {3, 2, 4}, sbk[2] = {4, 5}, sbn[2] = {5, 4}, sb3[3] = {4, 2, 5};
  dg_tensor *ab[2] = {gc_input(3, sa, -1, 1, 610), gc_input(2, sbk, -1, 1, 611)};
  CHECK_EQ_INT(gc_check("bmm strided a, shared b", f_bmm_strided_a, NULL, 2, ab, 1e-3, 1e-2), 0);
  dg_tensor_free(ab[1]);
  ab[1] = gc_input(2, sbn, -1, 1, 612);
  CHECK_EQ_INT(gc_check("bmm strided a, shared b^T", f_bmm_strided_a, (void *)1, 2, ab, 1e-3, 1e-2), 0);
  dg_tensor_free(ab[1]);
  ab[1] = gc_input(3, sb3, -1, 1, 613);
  CHECK_EQ_INT(gc_check("bmm strided a and b", f_bmm_strided_ab, NULL, 2, ab, 1e-3, 1e-2), 0);
  dg_tensor_free(ab[0]), dg_tensor_free(ab[1]);

  int64_t sc[3] = {3, 2, 4}, sct[3] = {3, 4, 2};
  dg_tensor *cd[2] = {gc_input(3, sc, -1, 1, 620), gc_input(2, sbk, -1, 1, 621)};
  CHECK_EQ_INT(gc_check("bmm shared b (one GEMM)", f_bmm_shared, NULL, 2, cd, 1e-3, 1e-2), 0);
  dg_tensor_free(cd[1]);
  cd[1] = gc_input(2, sbn, -1, 1, 622);
  CHECK_EQ_INT(gc_check("bmm shared b^T (one GEMM)", f_bmm_shared, (void *)1, 2, cd, 1e-3, 1e-2), 0);
  dg_tensor_free(cd[0]), dg_tensor_free(cd[1]);
  cd[0] = gc_input(3, sct, -1, 1, 623);
  cd[1] = gc_input(2, sbk, -1, 1, 624);
  CHECK_EQ_INT(gc_check("bmm a^T, shared b", f_bmm_shared_ta, NULL, 2, cd, 1e-3, 1e-2), 0);
  dg_tensor_free(cd[0]), dg_tensor_free(cd[1]);
}

/* ---- the module: CausalSelfAttention uses the fused op ---- */

static void module_path(void) {
  enum { B = 2, T = 5, C = 16, H = 4 };
  dg_module *m = NULL, *md = NULL;
  dg_params *ps = NULL;
  dg_ctx *ctx = NULL;
  REQUIRE(dg_params_new(&ps) == DG_OK && dg_ctx_new(&ctx, NULL) == DG_OK);
  REQUIRE(dg_nn_causal_attention(&m, C, H, 0.0f) == DG_OK);
  REQUIRE(dg_nn_causal_attention(&md, C, H, 0.5f) == DG_OK);
  REQUIRE(dg_module_bind(m, ps, "attn", 5) == DG_OK);
  REQUIRE(dg_module_bind(md, ps, "drop", 5) == DG_OK);
  dg_tensor *wa = dg_params_find(ps, "attn.c_attn.weight"), *ba = dg_params_find(ps, "attn.c_attn.bias");
  dg_tensor *wp = dg_params_find(ps, "attn.c_proj.weight"), *bp = dg_params_find(ps, "attn.c_proj.bias");
  REQUIRE(wa && ba && wp && bp);
  int64_t xs[3] = {B, T, C};
  dg_tensor *x = dg_randn(ctx, 3, xs, 0, 1);
  dg_tensor *y = dg_module_forward(m, ctx, x);
  REQUIRE(y);
  att_case c = {B, T, C, H, 1};
  dg_tensor *in[1] = {dg_linear(ctx, x, wa, ba)};
  dg_tensor *yr = dg_linear(ctx, f_unfused(ctx, in, &c), wp, bp);
  REQUIRE(yr);
  double sc;
  double d = max_abs_diff(dg_tensor_data(y), dg_tensor_data(yr), B * T * C, &sc);
  CHECK(d <= 1e-6 * (1 + sc));
  CHECK_OK(dg_backward(ctx, dg_sum(ctx, y)));
  /* attention dropout (train): the unfused path; it runs forward and
   * backward and differs from eval, where the fused path gives the
   * dropout-free output */
  dg_ctx_reset(ctx);
  x = dg_randn(ctx, 3, xs, 0, 1);
  dg_ctx_seed(ctx, 11);
  dg_tensor *yd = dg_module_forward(md, ctx, x);
  REQUIRE(yd);
  CHECK_OK(dg_backward(ctx, dg_sum(ctx, yd)));
  CHECK(dg_tensor_grad(dg_params_find(ps, "drop.c_attn.weight")) != NULL);
  dg_ctx_set_train(ctx, 0);
  dg_tensor *ye = dg_module_forward(md, ctx, x);
  REQUIRE(ye);
  CHECK(max_abs_diff(dg_tensor_data(yd), dg_tensor_data(ye), B * T * C, &sc) > 1e-3);
  dg_ctx_set_train(ctx, 1);
  dg_module_set_train(md, 0);
  dg_tensor *ym = dg_module_forward(md, ctx, x);
  REQUIRE(ym);
  CHECK_NEAR(max_abs_diff(dg_tensor_data(ym), dg_tensor_data(ye), B * T * C, &sc), 0, 0);
  dg_module_free(m);
  dg_module_free(md);
  dg_ctx_free(ctx);
  dg_params_free(ps);
}

/* 1 and 2 threads give the same bits (each (b, h) pair is computed alone,
 * whichever task runs it). */
static void thread_invariance(void) {
  att_case c = {4, 33, 48, 3, 1};
  int64_t s[3] = {c.B, c.T, 3 * c.C}, ny = c.B * c.T * c.C, nx = 3 * ny;
  dg_tensor *x = gc_input(3, s, -2, 2, 700);
  float *w = malloc((size_t)ny * sizeof *w), *y1 = malloc((size_t)ny * sizeof *y1);
  dg_rng_uniform(701, 0, w, (size_t)ny);
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  dg_tensor *y;
  dg_set_num_threads(1);
  float *g1 = run(ctx, f_fused, &c, x, w, &y);
  memcpy(y1, dg_tensor_data(y), (size_t)ny * sizeof *y1);
  dg_set_num_threads(2);
  float *g2 = run(ctx, f_fused, &c, x, w, &y);
  CHECK(memcmp(y1, dg_tensor_data(y), (size_t)ny * sizeof *y1) == 0);
  CHECK(memcmp(g1, g2, (size_t)nx * sizeof *g1) == 0);
  dg_set_num_threads(1);
  free(w), free(y1), free(g1), free(g2);
  dg_tensor_free(x);
  dg_ctx_free(ctx);
}

int main(void) {
  thread_invariance();
  module_path();
  grad_strided();
  grad_fused();
  vs_unfused(1);
  vs_unfused(2);
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  values(ctx);
  dg_ctx_reset(ctx);
  errors(ctx);
  dg_ctx_free(ctx);
  return TEST_DONE();
}
