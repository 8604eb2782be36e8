/* Tensors: dtypes and half-precision conversion, persistent tensors and
 * views, allocator statistics, arena reuse, errors that name the op. */
#include <dgrad.h>

#include "test.h"

static void test_nan_rule(void);

static void test_dtypes(void) {
  CHECK_EQ_INT(dg_dtype_size(DG_F32), 4);
  CHECK_EQ_INT(dg_dtype_size(DG_BF16), 2);
  CHECK_EQ_INT(dg_dtype_size(DG_I64), 8);
  CHECK(!strcmp(dg_dtype_name(DG_F16), "f16"));
  CHECK(!strcmp(dg_err_name(DG_ESHAPE), "DG_ESHAPE"));
  CHECK(!strcmp(dg_strerror(DG_ENOMEM), "out of memory"));
  CHECK(!strcmp(dg_strerror(12345), "unknown error"));
  /* exact values */
  CHECK_EQ_INT(dg_f32_to_f16(1.0f), 0x3c00);
  CHECK_EQ_INT(dg_f32_to_f16(-2.0f), 0xc000);
  CHECK_EQ_INT(dg_f32_to_f16(65504.0f), 0x7bff);
  CHECK_EQ_INT(dg_f32_to_f16(1e6f), 0x7c00);      /* overflow -> inf */
  CHECK_EQ_INT(dg_f32_to_f16(5.960464477539063e-08f), 0x0001); /* smallest subnormal */
  CHECK_EQ_INT(dg_f32_to_bf16(1.0f), 0x3f80);
  CHECK_NEAR(dg_f16_to_f32(0x3555), 0.333251953125, 0);
  CHECK_NEAR(dg_bf16_to_f32(0x4049), 3.140625, 0);
  /* round to nearest even: 1 + 2^-11 is halfway between two f16 values */
  CHECK_EQ_INT(dg_f32_to_f16(1.0f + 1.0f / 2048), 0x3c00);
  CHECK_EQ_INT(dg_f32_to_f16(1.0f + 3.0f / 2048), 0x3c02);
  /* round trip of every finite f16 */
  int bad = 0;
  for (uint32_t h = 0; h < 0x10000; h++) {
    if ((h & 0x7c00) == 0x7c00) continue;
    if (dg_f32_to_f16(dg_f16_to_f32((uint16_t)h)) != h) bad++;
  }
  CHECK_EQ_INT(bad, 0);
  CHECK(isnan(dg_bf16_to_f32(dg_f32_to_bf16(NAN))));
  test_nan_rule();
}

static float f32_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* One NaN rule for the scalar and the tensor paths (contiguous and strided):
 * the canonical quiet NaN with the sign kept, payload dropped. */
static void test_nan_rule(void) {
  const uint32_t nans[4] = {0x7fc00000u, 0x7f800001u /* signalling */, 0xffc12345u,
                            0xff800101u /* negative signalling */};
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  float v[4];
  for (int i = 0; i < 4; i++) v[i] = f32_bits(nans[i]);
  dg_tensor *x = dg_from_data(ctx, DG_F32, 2, (int64_t[]){2, 2}, v);
  dg_tensor *xt = dg_transpose(ctx, x, 0, 1); /* strided: the element-wise path */
  REQUIRE(x && xt);
  for (int k = 0; k < 2; k++) {
    dg_dtype dt = k ? DG_BF16 : DG_F16;
    uint16_t q = k ? 0x7fc0 : 0x7e00;
    dg_tensor *c = dg_to_dtype(ctx, x, dt), *ct = dg_to_dtype(ctx, xt, dt);
    REQUIRE(c && ct);
    const uint16_t *cd = dg_tensor_data(c), *ctd = dg_tensor_data(ct);
    for (int i = 0; i < 4; i++) {
      uint16_t want = (uint16_t)(q | (nans[i] >> 31 ? 0x8000 : 0));
      uint16_t s = k ? dg_f32_to_bf16(v[i]) : dg_f32_to_f16(v[i]);
      CHECK_EQ_INT(s, want);
      CHECK_EQ_INT(cd[i], want);
      CHECK_EQ_INT(ctd[(i % 2) * 2 + i / 2], want); /* xt[j][i] = x[i][j] */
    }
  }
  dg_ctx_free(ctx);
}

static void test_persistent(void) {
  dg_mem_stats s0, s1, s2;
  CHECK_OK(dg_mem_get_stats(DG_CPU, &s0));
  dg_tensor *t = NULL, *v = NULL;
  int64_t sh[2] = {100, 10};
  CHECK_OK(dg_tensor_new(&t, DG_F32, 2, sh, NULL, 0));
  REQUIRE(t);
  CHECK_OK(dg_mem_get_stats(DG_CPU, &s1));
  CHECK(s1.current_bytes >= s0.current_bytes + 4000);
  CHECK(s1.peak_bytes >= s1.current_bytes);
  CHECK_EQ_INT(s1.alloc_count, s0.alloc_count + 1);
  float *d = dg_tensor_data(t);
  for (int i = 0; i < 1000; i++) d[i] = (float)i;
  int64_t vs[1] = {10};
  CHECK_OK(dg_tensor_view(&v, t, 20, 1, vs, NULL, 0)); /* row 2 */
  CHECK_NEAR(((float *)dg_tensor_data(v))[3], 23, 0);
  int64_t big[1] = {1000};
  dg_tensor *bad = NULL;
  CHECK_EQ_INT(dg_tensor_view(&bad, t, 20, 1, big, NULL, 0), DG_ESHAPE);
  CHECK(bad == NULL);
  dg_tensor_free(t); /* the view keeps the storage alive */
  CHECK_NEAR(((float *)dg_tensor_data(v))[9], 29, 0);
  dg_tensor_free(v);
  CHECK_OK(dg_mem_get_stats(DG_CPU, &s2));
  CHECK_EQ_INT(s2.current_bytes, s0.current_bytes);
  CHECK(s2.cached_bytes > 0); /* kept for reuse */
  /* reuse comes from the cache, not the system */
  CHECK_OK(dg_tensor_new(&t, DG_F32, 2, sh, NULL, 0));
  dg_mem_stats s3;
  CHECK_OK(dg_mem_get_stats(DG_CPU, &s3));
  CHECK_EQ_INT(s3.system_allocs, s2.system_allocs);
  dg_tensor_free(t);
  int64_t neg[1] = {-1};
  char err[256] = "";
  CHECK_EQ_INT(dg_tensor_new(&t, DG_F32, 1, neg, err, sizeof err), DG_EINVAL);
  CHECK(strstr(err, "tensor_new") && strstr(err, "-1")); /* detail in err, not on stderr */
  CHECK_EQ_INT(dg_tensor_new(&t, DG_F32, 5, sh, NULL, 0), DG_EINVAL);
  dg_tensor *a, *b;
  CHECK_OK(dg_tensor_new(&a, DG_F32, 2, sh, NULL, 0));
  CHECK_OK(dg_tensor_new(&b, DG_F32, 1, sh, NULL, 0));
  CHECK_EQ_INT(dg_tensor_copy(a, b, err, sizeof err), DG_ESHAPE);
  CHECK(strstr(err, "tensor_copy") != NULL);
  CHECK_EQ_INT(dg_tensor_view(&t, a, 1000, 1, sh, err, sizeof err), DG_ESHAPE);
  CHECK(strstr(err, "offset 1000") != NULL);
  dg_tensor_free(a);
  dg_tensor_free(b);
  dg_tensor_free(NULL);
  dg_ctx_free(NULL);
  dg_params_free(NULL);
}

static void test_arena_and_views(void) {
  dg_ctx *ctx = NULL;
  CHECK_OK(dg_ctx_new(&ctx, NULL));
  REQUIRE(ctx);
  int64_t sh[3] = {2, 3, 4};
  float buf[24];
  for (int i = 0; i < 24; i++) buf[i] = (float)i;
  dg_tensor *x = dg_from_data(ctx, DG_F32, 3, sh, buf);
  REQUIRE(x);
  dg_tensor *t = dg_transpose(ctx, x, 1, 2); /* (2, 4, 3) */
  REQUIRE(t);
  CHECK(!dg_tensor_is_contiguous(t));
  CHECK(dg_tensor_data(t) == dg_tensor_data(x)); /* shares storage */
  CHECK_EQ_INT(dg_tensor_dim(t, 1), 4);
  CHECK_NEAR(dg_tensor_get(t, 1), 4, 0); /* t[0,0,1] = x[0,1,0] */
  dg_tensor *s = dg_slice(ctx, x, 1, 2);
  REQUIRE(s);
  CHECK(dg_tensor_data(s) == (float *)dg_tensor_data(x) + 12);
  int64_t r[2] = {-1, 6};
  dg_tensor *rs = dg_reshape(ctx, x, 2, r);
  REQUIRE(rs);
  CHECK_EQ_INT(dg_tensor_dim(rs, 0), 4);
  /* contiguous packs a strided view of any dtype (a pipe stage's i64 ids) */
  const dg_dtype dts[3] = {DG_I64, DG_I32, DG_BF16};
  for (int d = 0; d < 3; d++) {
    dg_tensor *xi = dg_to_dtype(ctx, x, dts[d]);
    dg_tensor *ti = xi ? dg_transpose(ctx, xi, 1, 2) : NULL; /* (2, 4, 3) */
    dg_tensor *ci = ti ? dg_contiguous(ctx, ti) : NULL;
    REQUIRE(ci);
    CHECK(dg_tensor_is_contiguous(ci) && dg_tensor_dtype(ci) == dts[d]);
    CHECK(dg_tensor_data(ci) != dg_tensor_data(xi));
    for (int i = 0; i < 24; i++) /* ci[a, b, c] = x[a, c, b] */
      CHECK_NEAR(dg_tensor_get(ci, i), (float)(i / 12 * 12 + i % 3 * 4 + i % 12 / 3), 0);
  }
  dg_tensor *h = dg_to_dtype(ctx, x, DG_BF16);
  REQUIRE(h);
  CHECK_NEAR(dg_tensor_get(h, 23), 23, 0);
  /* errors name the op and the shapes, and the first error is kept */
  int64_t r7[1] = {7};
  CHECK(dg_reshape(ctx, x, 1, r7) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_ESHAPE);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "reshape");
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "(2, 3, 4)");
  CHECK(dg_slice(ctx, NULL, 0, 1) == NULL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "reshape"); /* still the first error */
  dg_ctx_clear_error(ctx);
  int64_t m1[2] = {3, 4}, m2[2] = {5, 6};
  CHECK(dg_matmul(ctx, dg_zeros(ctx, DG_F32, 2, m1), dg_zeros(ctx, DG_F32, 2, m2)) == NULL);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "matmul");
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "(3, 4)");
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "(5, 6)");
  dg_ctx_clear_error(ctx);
  CHECK(dg_matmul(ctx, dg_zeros(ctx, DG_I32, 2, m1), dg_zeros(ctx, DG_F32, 2, m2)) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_EDTYPE);
  /* the arena is reused after reset */
  size_t used = dg_ctx_arena_used(ctx);
  CHECK(used > 0);
  dg_ctx_reset(ctx);
  CHECK_EQ_INT(dg_ctx_arena_used(ctx), 0);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_OK);
  /* a step bigger than the first chunk grows once, then fits in one chunk */
  int64_t big[1] = {1 << 19};
  for (int step = 0; step < 3; step++) {
    for (int k = 0; k < 6; k++) CHECK(dg_empty(ctx, DG_F32, 1, big) != NULL);
    dg_ctx_reset(ctx);
  }
  dg_mem_stats a, b;
  dg_mem_get_stats(DG_CPU, &a);
  for (int k = 0; k < 6; k++) CHECK(dg_empty(ctx, DG_F32, 1, big) != NULL);
  dg_ctx_reset(ctx);
  dg_mem_get_stats(DG_CPU, &b);
  CHECK_EQ_INT(b.alloc_count, a.alloc_count);
  CHECK(dg_ctx_arena_reserved(ctx) >= (size_t)6 * 4 * (1 << 19));
  dg_ctx_free(ctx);
}

static void test_params(void) {
  dg_params *ps = NULL;
  CHECK_OK(dg_params_new(&ps));
  REQUIRE(ps);
  dg_tensor *w = NULL, *b = NULL, *dup = NULL;
  int64_t ws[2] = {3, 5}, bs[1] = {3};
  CHECK_OK(dg_params_add(ps, "layers.0.weight", 2, ws, &w));
  CHECK_OK(dg_params_add(ps, "layers.0.bias", 1, bs, &b));
  CHECK_EQ_INT(dg_params_add(ps, "layers.0.bias", 1, bs, &dup), DG_EINVAL);
  CHECK(strstr(dg_params_errmsg(ps), "duplicate parameter name \"layers.0.bias\"") != NULL);
  CHECK(dup == NULL);
  CHECK_EQ_INT(dg_params_count(ps), 2);
  CHECK(dg_params_get(ps, 1) == b);
  CHECK(dg_params_find(ps, "layers.0.weight") == w);
  CHECK(!strcmp(dg_tensor_name(b), "layers.0.bias"));
  CHECK_EQ_INT(dg_tensor_param_index(b), 1);
  size_t n = 0;
  float *flat = dg_params_data(ps, &n);
  CHECK(n >= 18);
  CHECK(dg_tensor_data(w) == flat + dg_params_offset(ps, 0));
  CHECK(dg_tensor_data(b) == flat + dg_params_offset(ps, 1));
  CHECK(dg_params_offset(ps, 1) >= 15);
  /* values survive growth of the flat buffer */
  ((float *)dg_tensor_data(w))[7] = 42;
  for (int i = 0; i < 50; i++) {
    char nm[32];
    snprintf(nm, sizeof nm, "extra.%d", i);
    int64_t s[1] = {100};
    CHECK_OK(dg_params_add(ps, nm, 1, s, NULL));
  }
  CHECK_NEAR(((float *)dg_tensor_data(w))[7], 42, 0);
  flat = dg_params_data(ps, &n);
  CHECK(dg_tensor_data(w) == flat + dg_params_offset(ps, 0));
  float *g = dg_params_grad(ps, &n);
  CHECK(dg_tensor_data(dg_tensor_grad(b)) == g + dg_params_offset(ps, 1));
  for (size_t i = 0; i < n; i++) g[i] = 1;
  dg_params_zero_grad(ps); /* lazy: readers go through the accessors */
  CHECK_NEAR(((float *)dg_tensor_data(dg_tensor_grad(b)))[2], 0, 0);
  g = dg_params_grad(ps, &n);
  double sum = 0; /* over the parameters (padding is never read) */
  for (int i = 0; i < dg_params_count(ps); i++)
    for (int64_t k = 0; k < dg_tensor_numel(dg_params_get(ps, i)); k++)
      sum += g[dg_params_offset(ps, i) + (size_t)k];
  CHECK_NEAR(sum, 0, 0);
  dg_params_free(ps);
}

static void test_relayout(void) {
  dg_params *ps = NULL;
  REQUIRE(dg_params_new(&ps) == DG_OK);
  int64_t s0[1] = {15}, s1[2] = {4, 5}, s2[1] = {3};
  CHECK_OK(dg_params_add(ps, "a", 1, s0, NULL));
  CHECK_OK(dg_params_add(ps, "b", 2, s1, NULL));
  CHECK_OK(dg_params_add(ps, "c", 1, s2, NULL));
  size_t n;
  float *d = dg_params_data(ps, &n), *g = dg_params_grad(ps, &n);
  float *comp = calloc(n, sizeof(float));
  CHECK_OK(dg_params_add_companion(ps, comp));
  for (int i = 0; i < 3; i++) {
    dg_tensor *t = dg_params_get(ps, i);
    float *v = dg_tensor_data(t), *gv = dg_tensor_data(dg_tensor_grad(t));
    for (int64_t k = 0; k < dg_tensor_numel(t); k++) {
      v[k] = (float)(100 * i + k);
      gv[k] = (float)(-100 * i - k);
      comp[dg_params_offset(ps, i) + (size_t)k] = (float)(1000 + 100 * i + k);
    }
  }
  int order[3] = {2, 0, 1}, bad[3] = {0, 0, 1};
  CHECK_EQ_INT(dg_params_relayout(ps, bad), DG_EINVAL);
  CHECK_OK(dg_params_relayout(ps, order));
  CHECK_EQ_INT(dg_params_offset(ps, 2), 0);
  CHECK(dg_params_offset(ps, 0) < dg_params_offset(ps, 1));
  size_t n2;
  CHECK(dg_params_data(ps, &n2) == d && n2 == n);
  CHECK(dg_params_grad(ps, &n2) == g);
  for (int i = 0; i < 3; i++) {
    dg_tensor *t = dg_params_get(ps, i);
    float *v = dg_tensor_data(t), *gv = dg_tensor_data(dg_tensor_grad(t));
    CHECK(v == d + dg_params_offset(ps, i));
    for (int64_t k = 0; k < dg_tensor_numel(t); k++) {
      CHECK_NEAR(v[k], 100 * i + k, 0);
      CHECK_NEAR(gv[k], -100 * i - k, 0);
      CHECK_NEAR(comp[dg_params_offset(ps, i) + (size_t)k], 1000 + 100 * i + k, 0);
    }
  }
  CHECK_OK(dg_params_remove_companion(ps, comp));
  free(comp);
  dg_params_free(ps);
}

static void test_rng(void) {
  float a[1000], b[1000], c[1000];
  dg_rng_uniform(42, 0, a, 1000);
  dg_rng_uniform(42, 0, b, 1000);
  CHECK(!memcmp(a, b, sizeof a));
  /* chunking does not change the stream: element i depends on (seed, i) */
  dg_rng_uniform(42, 0, c, 333);
  dg_rng_uniform(42, 333, c + 333, 667);
  CHECK(!memcmp(a, c, sizeof a));
  dg_rng_uniform(43, 0, b, 1000);
  CHECK(memcmp(a, b, sizeof a) != 0);
  double mean = 0;
  for (int i = 0; i < 1000; i++) {
    CHECK(a[i] >= 0 && a[i] < 1);
    mean += a[i] / 1000;
  }
  CHECK_NEAR(mean, 0.5, 0.05);
  float nrm[4000];
  dg_rng_normal(7, 0, nrm, 4000);
  double m = 0, v = 0;
  for (int i = 0; i < 4000; i++) m += nrm[i] / 4000;
  for (int i = 0; i < 4000; i++) v += (nrm[i] - m) * (nrm[i] - m) / 4000;
  CHECK_NEAR(m, 0, 0.06);
  CHECK_NEAR(v, 1, 0.08);
  dg_rng_normal(7, 1001, c, 10);
  CHECK(!memcmp(c, nrm + 1001, 10 * sizeof(float)));
}

int main(void) {
  test_dtypes();
  test_persistent();
  test_arena_and_views();
  test_params();
  test_relayout();
  test_rng();
  return TEST_DONE();
}
