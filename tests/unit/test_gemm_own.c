/* dgrad's own SGEMM (backends/cpu/gemm_own.c: AVX-512 and AVX2) against a double
 * reference, on every layout and on the edges of its tiles and passes:
 * M, N, K around MR = 8, the 16/32-column panels and the 16-deep transpose
 * blocks, K over one pass (512), strides past the matrix, alpha and beta.
 * Then what gemm.c's splits rely on: a block of rows or columns computed
 * alone gives the whole's bits (also where the block runs as its transpose
 * and the whole does not); beta 0 does not read C (NaN stays out);
 * nothing outside C's (M, N) is written. Last, dg__sgemm pinned to the own
 * kernel (DG_GEMM=own) gives 1 thread's bits on 2 threads, and
 * dg__sgemm_small (attention's unpacked products) against the reference,
 * and dg__sgemm_add's fused residual and bias against a fill of C.
 * All of it on each of the kernel's ISAs the CPU has (AVX-512 and AVX2),
 * and where it has both, the two compared bit for bit (test_isa_bits).
 * Skipped (77) on a CPU without AVX2 and FMA. */
#include <dgrad.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu_impl.h"
#include "test.h"

static uint32_t g_x = 2463534242u;

static float rnd(void) { /* xorshift32 in [-1, 1) */
  g_x ^= g_x << 13, g_x ^= g_x >> 17, g_x ^= g_x << 5;
  return (float)(g_x >> 8) * (2.0f / 16777216.0f) - 1.0f;
}

static float *rnd_buf(size_t n) {
  float *p = malloc(n * sizeof *p);
  REQUIRE(p);
  for (size_t i = 0; i < n; i++) p[i] = rnd();
  return p;
}

typedef struct {
  int ta, tb;
  int64_t M, N, K, lda, ldb, ldc;
  float alpha, beta;
} shape;

static float opa(const shape *s, const float *A, int64_t i, int64_t k) {
  return s->ta ? A[k * s->lda + i] : A[i * s->lda + k];
}

static float opb(const shape *s, const float *B, int64_t k, int64_t j) {
  return s->tb ? B[j * s->ldb + k] : B[k * s->ldb + j];
}

/* Checks the own kernel's C against the double reference to float rounding
 * of a K-term sum; the guard values past each row's N stay as they were. */
static void check_shape(const shape *s) {
  int64_t na = s->ta ? s->K * s->lda : s->M * s->lda, nb = s->tb ? s->N * s->ldb : s->K * s->ldb;
  float *A = rnd_buf((size_t)na), *B = rnd_buf((size_t)nb), *C = rnd_buf((size_t)(s->M * s->ldc));
  float *C0 = malloc((size_t)(s->M * s->ldc) * sizeof *C0);
  REQUIRE(C0);
  memcpy(C0, C, (size_t)(s->M * s->ldc) * sizeof *C);
  if (s->beta == 0.0f)
    for (int64_t i = 0; i < s->M * s->ldc; i++) C[i] = NAN; /* must not be read */
  CHECK_EQ_INT(dg__sgemm_own(s->ta, s->tb, s->M, s->N, s->K, s->alpha, A, s->lda, B, s->ldb,
                             s->beta, C, s->ldc), 0);
  int bad = 0;
  for (int64_t i = 0; i < s->M && bad < 3; i++)
    for (int64_t j = 0; j < s->ldc && bad < 3; j++) {
      float got = C[i * s->ldc + j];
      if (j >= s->N) { /* outside C: untouched */
        if (!(s->beta == 0.0f ? isnan(got) : got == C0[i * s->ldc + j])) bad++;
        continue;
      }
      double ref = 0, mag = 0;
      for (int64_t k = 0; k < s->K; k++) {
        double p = (double)opa(s, A, i, k) * opb(s, B, k, j);
        ref += p, mag += fabs(p);
      }
      ref *= s->alpha, mag *= fabs(s->alpha);
      if (s->beta != 0.0f) ref += (double)s->beta * C0[i * s->ldc + j];
      mag += fabs((double)s->beta * C0[i * s->ldc + j]);
      double tol = (double)(s->K + 4) * 1.2e-7 * mag + 1e-30;
      if (!(fabs(got - ref) <= tol)) {
        fprintf(stderr, "ta %d tb %d %lldx%lldx%lld: C[%lld][%lld] = %.9g, reference %.9g\n", s->ta,
                s->tb, (long long)s->M, (long long)s->N, (long long)s->K, (long long)i,
                (long long)j, got, ref);
        bad++;
      }
    }
  CHECK_EQ_INT(bad, 0);
  free(A), free(B), free(C), free(C0);
}

static void test_reference(void) {
  static const int64_t Ms[] = {1, 7, 8, 9, 23, 64};
  static const int64_t Ns[] = {1, 15, 16, 17, 31, 32, 33, 70};
  static const int64_t Ks[] = {1, 5, 16, 17, 40, 513, 1100};
  static const float ab[][2] = {{1.0f, 0.0f}, {1.0f, 1.0f}, {-0.5f, 0.75f}, {2.0f, 0.0f}};
  int n = 0;
  for (int t = 0; t < 4; t++)
    for (size_t mi = 0; mi < sizeof Ms / sizeof *Ms; mi++)
      for (size_t ni = 0; ni < sizeof Ns / sizeof *Ns; ni++)
        for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki++) {
          int64_t M = Ms[mi], N = Ns[ni], K = Ks[ki], pad = (mi + ni + ki) % 3;
          const float *p = ab[(mi + 2 * ni + ki) % 4];
          shape s = {t & 1, t >> 1, M, N, K, 0, 0, N + pad, p[0], p[1]};
          s.lda = (s.ta ? M : K) + pad, s.ldb = (s.tb ? K : N) + 2 * pad;
          check_shape(&s);
          n++;
        }
  fprintf(stderr, "reference: %d shapes\n", n);
}

/* Rows i0..i1 and columns j0..j1 of the product alone, into C. */
static void block(const shape *s, const float *A, const float *B, float *C, int64_t i0, int64_t i1,
                  int64_t j0, int64_t j1) {
  const float *a = s->ta ? A + i0 : A + i0 * s->lda;
  const float *b = s->tb ? B + j0 * s->ldb : B + j0;
  CHECK_EQ_INT(dg__sgemm_own(s->ta, s->tb, i1 - i0, j1 - j0, s->K, s->alpha, a, s->lda, b, s->ldb,
                             s->beta, C + i0 * s->ldc + j0, s->ldc), 0);
}

/* K 700: x W^T runs as its transpose whole and in blocks; K 200: the whole
 * as it stands, the 13-row blocks as their transpose (gemm_own.c,
 * transposed_pays), which must not change a bit either. */
static void test_blocks(void) {
  for (int t = 0; t < 8; t++) {
    shape s = {t & 1, (t >> 1) & 1, 70, 100, t < 4 ? 700 : 200, 0, 0, 100, 1.0f, 0.7f};
    s.lda = s.ta ? s.M : s.K, s.ldb = s.tb ? s.K : s.N;
    float *A = rnd_buf((size_t)(s.M * s.K)), *B = rnd_buf((size_t)(s.K * s.N));
    float *C0 = rnd_buf((size_t)(s.M * s.N)), *C1 = malloc((size_t)(s.M * s.N) * sizeof *C1);
    float *C2 = malloc((size_t)(s.M * s.N) * sizeof *C2);
    REQUIRE(C1 && C2);
    memcpy(C1, C0, (size_t)(s.M * s.N) * sizeof *C0);
    memcpy(C2, C0, (size_t)(s.M * s.N) * sizeof *C0);
    block(&s, A, B, C0, 0, s.M, 0, s.N);
    for (int64_t i = 0; i < s.M; i += 13)
      block(&s, A, B, C1, i, i + 13 < s.M ? i + 13 : s.M, 0, s.N);
    for (int64_t j = 0; j < s.N; j += 37)
      block(&s, A, B, C2, 0, s.M, j, j + 37 < s.N ? j + 37 : s.N);
    CHECK(!memcmp(C0, C1, (size_t)(s.M * s.N) * sizeof *C0));
    CHECK(!memcmp(C0, C2, (size_t)(s.M * s.N) * sizeof *C0));
    free(A), free(B), free(C0), free(C1), free(C2);
  }
}

static void test_declines(void) {
  float a[64] = {0}, c[64] = {0};
  CHECK_EQ_INT(dg__sgemm_own(0, 0, 4, 4, 4, 0.0f, a, 4, a, 4, 1.0f, c, 4), -1); /* alpha 0 */
  CHECK_EQ_INT(dg__sgemm_own(0, 0, 4, 4, 0, 1.0f, a, 4, a, 4, 1.0f, c, 4), -1); /* K 0 */
  CHECK_EQ_INT(dg__sgemm_own(0, 0, 0, 4, 4, 1.0f, a, 4, a, 4, 1.0f, c, 4), -1);
}

/* dg__sgemm with the own kernel pinned: 2 threads split the product and
 * must give 1 thread's bits. */
static void test_threads(void) {
  int64_t M = 96, N = 320, K = 200;
  CHECK(dg__sgemm_own_fits(M, N, K));
  CHECK(!dg__sgemm_own_fits(M, 10, K)); /* 10 of a 16-column panel */
  CHECK(!dg__sgemm_own_fits(32, 32, 32)); /* OpenBLAS's small paths */
  for (int t = 0; t < 4; t++) {
    int ta = t & 1, tb = t >> 1;
    float *A = rnd_buf((size_t)(M * K)), *B = rnd_buf((size_t)(K * N));
    float *C1 = calloc((size_t)(M * N), sizeof *C1), *C2 = calloc((size_t)(M * N), sizeof *C2);
    REQUIRE(C1 && C2);
    for (int th = 1; th <= 2; th++) {
      dg_set_num_threads(th);
      for (int rep = 0; rep < 8; rep++) /* past the split's timed tries */
        dg__sgemm(ta, tb, M, N, K, 1.0f, A, ta ? M : K, B, tb ? K : N, 0.0f, th == 1 ? C1 : C2, N);
    }
    CHECK(!memcmp(C1, C2, (size_t)(M * N) * sizeof *C1));
    free(A), free(B), free(C1), free(C2);
  }
  dg_set_num_threads(1);
}

/* dg__sgemm_small (attention's per-head products): A read either way
 * (rows along k, or columns: ars 1), B's rows in place, strides past the
 * matrices, K 0, beta 0 over NaN; the double reference to float rounding,
 * and nothing past C's N columns written. */
static void test_small(void) {
  static const int64_t Ms[] = {1, 7, 8, 9, 17};
  static const int64_t Ns[] = {1, 15, 16, 17, 32, 33, 70};
  static const int64_t Ks[] = {0, 1, 5, 33, 64};
  int n = 0;
  for (int ta = 0; ta < 2; ta++)
    for (size_t mi = 0; mi < sizeof Ms / sizeof *Ms; mi++)
      for (size_t ni = 0; ni < sizeof Ns / sizeof *Ns; ni++)
        for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki++) {
          int64_t M = Ms[mi], N = Ns[ni], K = Ks[ki], pad = (mi + ni + ki) % 3 + 1;
          int64_t lda = (ta ? M : K) + pad, ldb = N + 2 * pad, ldc = N + pad;
          int64_t ars = ta ? 1 : lda, aks = ta ? lda : 1;
          float alpha = ki % 2 ? 0.5f : 1.0f, beta = (mi + ni) % 2 ? 0.75f : 0.0f;
          float *A = rnd_buf((size_t)(lda * (ta ? K : M) + 1));
          float *B = rnd_buf((size_t)(ldb * K + 1)), *C = rnd_buf((size_t)(M * ldc));
          float *C0 = malloc((size_t)(M * ldc) * sizeof *C0);
          REQUIRE(C0);
          if (beta == 0.0f)
            for (int64_t i = 0; i < M * ldc; i++) C[i] = NAN; /* must not be read */
          memcpy(C0, C, (size_t)(M * ldc) * sizeof *C);
          dg__sgemm_small(M, N, K, alpha, A, ars, aks, B, ldb, beta, C, ldc);
          int bad = 0;
          for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < ldc; j++) {
              float got = C[i * ldc + j], old = C0[i * ldc + j];
              if (j >= N) { /* outside C: untouched */
                bad += !(isnan(old) ? isnan(got) : got == old);
                continue;
              }
              double ref = 0, mag = 0;
              for (int64_t k = 0; k < K; k++) {
                double p = (double)A[i * ars + k * aks] * B[k * ldb + j];
                ref += p, mag += fabs(p);
              }
              ref *= alpha, mag *= alpha;
              if (beta != 0.0f) ref += (double)beta * old, mag += fabs((double)beta * old);
              bad += !(fabs(got - ref) <= (double)(K + 4) * 1.2e-7 * mag + 1e-30);
            }
          if (bad)
            fprintf(stderr, "small: ta %d %lldx%lldx%lld: %d bad\n", ta, (long long)M,
                    (long long)N, (long long)K, bad);
          CHECK_EQ_INT(bad, 0);
          free(A), free(B), free(C), free(C0);
          n++;
        }
  fprintf(stderr, "small: %d shapes\n", n);
}

/* dg__sgemm_add: res + bias go in with the own kernel's first pass, the
 * ReLU and mask selects with the last, and must give the bits of a fill of
 * C, beta 1 and the select passes (what OpenBLAS's path does), on every
 * layout, as the transposed product (64 x 96 x 300, x W^T), split over 2
 * threads, and with K over one pass (40 x 72 x 700: selects on the second
 * pass only). A NaN in res stays NaN through ReLU, as the relu op keeps
 * it; a NaN mask is not > 0. */
static void test_add(void) {
  static const int64_t shapes[][3] = {{96, 320, 200}, {64, 96, 300}, {40, 72, 700}};
  int n = 0;
  for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
    for (int t = 0; t < 4; t++)
      for (int what = 1; what < 16; what++) /* 1 res, 2 bias, 3 both; | 4 relu, | 8 mask */
        for (int th = 1; th <= 2; th++) {
          int64_t M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
          int ta = t & 1, tb = t >> 1;
          CHECK(dg__sgemm_own_fits(M, N, K));
          float *A = rnd_buf((size_t)(M * K)), *B = rnd_buf((size_t)(K * N));
          int relu = what >> 2 & 1;
          float *mask = what & 8 ? rnd_buf((size_t)(M * N)) : NULL;
          if (mask) mask[2 * N + 5] = NAN; /* not > 0: C 0 there */
          float *res = what & 1 ? rnd_buf((size_t)(M * N)) : NULL;
          if (res) res[N + 3] = NAN;
          float *bias = what & 2 ? rnd_buf((size_t)N) : NULL;
          float *C1 = malloc((size_t)(M * N) * sizeof *C1), *C2 = malloc((size_t)(M * N) * 4);
          REQUIRE(C1 && C2);
          dg_set_num_threads(th);
          for (int64_t i = 0; i < M * N; i++) {
            C1[i] = res && bias ? res[i] + bias[i % N] : res ? res[i] : bias ? bias[i % N] : 0;
            C2[i] = NAN; /* not read */
          }
          dg__sgemm(ta, tb, M, N, K, 1.0f, A, ta ? M : K, B, tb ? K : N, 1.0f, C1, N);
          for (int64_t i = 0; i < M * N; i++) {
            if (relu) C1[i] = C1[i] < 0.0f ? 0.0f : C1[i];
            if (mask) C1[i] = mask[i] > 0.0f ? C1[i] : 0.0f;
          }
          dg__sgemm_add(ta, tb, M, N, K, A, ta ? M : K, B, tb ? K : N,
                        &(dg__gemm_epi){res, bias, mask, relu}, C2, N);
          if (res && !mask) CHECK(isnan(C2[N + 3]));
          if (memcmp(C1, C2, (size_t)(M * N) * sizeof *C1))
            fprintf(stderr, "add: ta %d tb %d %lldx%lldx%lld what %d threads %d differs\n", ta,
                    tb, (long long)M, (long long)N, (long long)K, what, th);
          CHECK(!memcmp(C1, C2, (size_t)(M * N) * sizeof *C1));
          free(A), free(B), free(res), free(bias), free(mask), free(C1), free(C2);
          n++;
        }
  dg_set_num_threads(1);
  fprintf(stderr, "add: %d cases\n", n);
}

/* The AVX2 kernel must give the AVX-512 kernel's bits (gemm_own.c): the
 * same products, small products and transposes on each ISA, compared bit
 * for bit: every layout, tile and panel edges, K over one and two passes,
 * alpha and beta, the fused epilogue with NaNs in it, and x W^T shapes the
 * AVX-512 kernel runs as their transpose. */
static void test_isa_bits(void) {
  static const int64_t shapes[][3] = {{70, 100, 700}, {13, 47, 1100}, {64, 96, 300},
                                      {6, 16, 16},    {97, 33, 513},  {8, 200, 40}};
  int n = 0;
  for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
    for (int t = 0; t < 4; t++)
      for (int what = 0; what < 20; what++) { /* 0..15 as test_add; 16..19 alpha, beta */
        int64_t M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
        int ta = t & 1, tb = t >> 1, relu = what >> 2 & 1;
        float alpha = what < 16 ? 1.0f : what & 1 ? -0.75f : 1.5f;
        float beta = what < 18 ? 0.0f : 0.5f;
        float *A = rnd_buf((size_t)(M * K)), *B = rnd_buf((size_t)(K * N));
        float *C0 = rnd_buf((size_t)(M * N)), *C[2];
        float *res = what < 16 && what & 1 ? rnd_buf((size_t)(M * N)) : NULL;
        float *bias = what < 16 && what & 2 ? rnd_buf((size_t)N) : NULL;
        float *mask = what < 16 && what & 8 ? rnd_buf((size_t)(M * N)) : NULL;
        if (res) res[N + 3] = NAN;
        if (mask) mask[M * N / 2] = NAN;
        dg__gemm_epi e = {res, bias, mask, what < 16 && relu};
        for (int isa = 0; isa < 2; isa++) {
          dg__simd_force(isa ? DG_ISA_AVX512 : DG_ISA_AVX2);
          C[isa] = malloc((size_t)(M * N) * sizeof(float));
          REQUIRE(C[isa]);
          memcpy(C[isa], C0, (size_t)(M * N) * sizeof(float));
          CHECK_EQ_INT(dg__sgemm_own_add(ta, tb, M, N, K, alpha, A, ta ? M : K, B, tb ? K : N,
                                         beta, what < 16 ? &e : NULL, C[isa], N), 0);
        }
        if (memcmp(C[0], C[1], (size_t)(M * N) * sizeof(float)))
          fprintf(stderr, "isa bits: ta %d tb %d %lldx%lldx%lld case %d differ\n", ta, tb,
                  (long long)M, (long long)N, (long long)K, what);
        CHECK(!memcmp(C[0], C[1], (size_t)(M * N) * sizeof(float)));
        free(A), free(B), free(C0), free(C[0]), free(C[1]), free(res), free(bias), free(mask);
        n++;
      }
  for (int ta = 0; ta < 2; ta++) /* attention's small products and transposes */
    for (int64_t M = 1; M <= 17; M += 8)
      for (int64_t N = 7; N <= 40; N += 11) {
        int64_t K = 33, lda = ta ? M : K;
        float *A = rnd_buf((size_t)(M * K)), *B = rnd_buf((size_t)(K * N)), *C[2], *D[2];
        for (int isa = 0; isa < 2; isa++) {
          dg__simd_force(isa ? DG_ISA_AVX512 : DG_ISA_AVX2);
          C[isa] = rnd_buf((size_t)(M * N)), D[isa] = malloc((size_t)(K * N) * sizeof(float));
          REQUIRE(D[isa]);
          dg__sgemm_small(M, N, K, 0.5f, A, ta ? 1 : lda, ta ? lda : 1, B, N, ta ? 0.75f : 0.0f,
                          C[isa], N);
          dg__transpose(B, N, K, N, D[isa], K);
        }
        CHECK(!memcmp(C[0], C[1], (size_t)(M * N) * sizeof(float)));
        CHECK(!memcmp(D[0], D[1], (size_t)(K * N) * sizeof(float)));
        for (int64_t i = 0; i < K * N; i++) CHECK(D[0][(i % N) * K + i / N] == B[i]);
        free(A), free(B), free(C[0]), free(C[1]), free(D[0]), free(D[1]);
        n++;
      }
  dg__simd_force(-1);
  fprintf(stderr, "isa bits: %d cases\n", n);
}

/* dg__transpose on every edge: whole 8x8 blocks (plain loads and stores)
 * and partial ones on either side (masked), at padded strides; nothing
 * past the columns of D is written. */
static void test_transpose(void) {
  static const int64_t dims[] = {1, 7, 8, 9, 16, 33};
  int n = 0;
  for (size_t ri = 0; ri < sizeof dims / sizeof *dims; ri++)
    for (size_t ci = 0; ci < sizeof dims / sizeof *dims; ci++) {
      int64_t rows = dims[ri], cols = dims[ci], lds = cols + 3, ldd = rows + 5;
      float *S = rnd_buf((size_t)(rows * lds)), *D = malloc((size_t)(cols * ldd) * sizeof *D);
      REQUIRE(D);
      for (int64_t i = 0; i < cols * ldd; i++) D[i] = -7.0f;
      dg__transpose(S, lds, rows, cols, D, ldd);
      int bad = 0;
      for (int64_t c = 0; c < cols; c++)
        for (int64_t r = 0; r < ldd; r++)
          bad += D[c * ldd + r] != (r < rows ? S[r * lds + c] : -7.0f);
      if (bad) fprintf(stderr, "transpose %lldx%lld: %d bad\n", (long long)rows,
                       (long long)cols, bad);
      CHECK_EQ_INT(bad, 0);
      free(S), free(D);
      n++;
    }
  fprintf(stderr, "transpose: %d shapes\n", n);
}

/* The suite on the CPU's own ISA, and where that is AVX-512 also with the
 * kernel capped at AVX2 (DG_SIMD=avx2 does the same for a process). */
int main(void) {
  if (!dg__sgemm_own_cpu()) TEST_SKIP("no AVX2 and FMA on this CPU");
  setenv("DG_GEMM", "own", 1); /* before dg__sgemm's first call decides */
  int top = dg__simd_isa();
  for (int isa = top; isa >= DG_ISA_AVX2; isa--) {
    dg__simd_force(isa);
    fprintf(stderr, "%s kernel\n", isa == DG_ISA_AVX512 ? "AVX-512" : "AVX2");
    test_declines();
    test_reference();
    test_blocks();
    test_threads();
    test_small();
    test_transpose();
    test_add();
  }
  if (top == DG_ISA_AVX512)
    test_isa_bits();
  else
    fprintf(stderr, "isa bits: not run (no AVX-512 to compare with)\n");
  return TEST_DONE();
}
