/* dgrad's own SGEMM for AVX-512 CPUs (row-major, as dg__sgemm): an 8x32
 * micro-tile of FMAs over packed panels, BLIS-style.
 *
 * Why not OpenBLAS everywhere: on a Zen 4 core (AVX-512 on 256-bit units)
 * OpenBLAS's kernel runs the training steps' shapes at 82-91% of the FMA
 * peak; its packing (a scalar-ish transpose for x W^T) and its beta = 0
 * clearing pass are most of the gap. This kernel reaches 97% of peak on hot
 * panels and transposes with 16x16 in-register shuffles, and the end to end
 * product is 3-11% faster there. Other CPUs keep OpenBLAS (the choice is the
 * CPU's, not a timing: see own_decide) and DG_GEMM=own|blas pins it.
 *
 * Rounding: each C element is the sequential FMA chain over its k in passes
 * of at most KC_MAX (the pass length depends on K only), added to C per
 * pass. So an element's bits do not depend on where it sits in a tile or on
 * how a split cuts C (gemm.c's splits rely on it), only on K. */
#include <pthread.h>
#include <string.h>

#include "dgrad_config.h"
#include "backends/cpu/cpu_impl.h"
#include "base/common_impl.h"
#include "base/trace_impl.h"

#if DG_HAVE_BLAS
#include <cblas.h>
#endif

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>

#define MR 8                  /* rows of a micro-tile: 8 broadcasts per k */
#define NR 32                 /* columns: two 16-lane vectors */
#define KC_MAX 512            /* a pass: the A sliver (MR x KC) is 16 KiB, L1 */
#define B_BYTES (512 << 10)   /* a packed B block, streamed from L2 per sliver */
#define B_FLOATS (B_BYTES / 4 + KC_MAX * NR)

typedef struct {
  float *a, *b; /* 64-byte aligned inside raw */
  void *raw;
} own_buf;

static pthread_key_t g_buf_key;
static pthread_once_t g_key_once = PTHREAD_ONCE_INIT;
static int g_key_ok;

static void buf_free(void *p) {
  own_buf *b = p;
  if (b) dg__free(b->raw);
  dg__free(b);
}

static void key_init(void) { g_key_ok = !pthread_key_create(&g_buf_key, buf_free); }

/* The calling thread's packing buffers, made on its first product (a step
 * repeats, so steady state allocates nothing); NULL without memory. */
static own_buf *thread_buf(void) {
  pthread_once(&g_key_once, key_init);
  if (!g_key_ok) return NULL;
  own_buf *b = pthread_getspecific(g_buf_key);
  if (b) return b;
  if (!(b = dg__malloc(sizeof *b))) return NULL;
  size_t n = (size_t)(MR * KC_MAX + B_FLOATS) * sizeof(float) + 64;
  if (!(b->raw = dg__malloc(n))) {
    dg__free(b);
    return NULL;
  }
  b->a = (float *)(((uintptr_t)b->raw + 63) & ~(uintptr_t)63);
  b->b = b->a + MR * KC_MAX;
  if (pthread_setspecific(g_buf_key, b)) {
    buf_free(b);
    return NULL;
  }
  return b;
}

static __mmask16 lanes(int64_t n) { return n >= 16 ? 0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1); }

/* d[k * ldd + c] = s[c * ld + k] for rows c < n of s and k < kt (<= 16);
 * rows n..15 of the output's columns are zeros. */
DG_TARGET_AVX512 DG_INLINE void tr16(const float *s, int64_t ld, int n, int kt, float *d,
                                     int64_t ldd) {
  __m512 r[16], t[16];
  __mmask16 km = lanes(kt);
  _Pragma("GCC unroll 16") for (int c = 0; c < 16; c++)
    r[c] = _mm512_maskz_loadu_ps(c < n ? km : 0, s + (c < n ? c : 0) * ld);
  _Pragma("GCC unroll 16") for (int c = 0; c < 16; c += 2) {
    t[c] = _mm512_unpacklo_ps(r[c], r[c + 1]);
    t[c + 1] = _mm512_unpackhi_ps(r[c], r[c + 1]);
  }
  _Pragma("GCC unroll 16") for (int c = 0; c < 16; c += 4) {
    __m512d a = _mm512_castps_pd(t[c]), b = _mm512_castps_pd(t[c + 2]);
    __m512d e = _mm512_castps_pd(t[c + 1]), f = _mm512_castps_pd(t[c + 3]);
    r[c] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
    r[c + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
    r[c + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(e, f));
    r[c + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(e, f));
  }
  /* r[4q + p]: rows 4q..4q+3 at k = 4L + p in 128-bit lane L */
  _Pragma("GCC unroll 16") for (int q = 0; q < 16; q += 8)
    _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) {
      t[q + p] = _mm512_shuffle_f32x4(r[q + p], r[q + 4 + p], 0x88);
      t[q + 4 + p] = _mm512_shuffle_f32x4(r[q + p], r[q + 4 + p], 0xdd);
    }
  _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) {
    r[p] = _mm512_shuffle_f32x4(t[p], t[8 + p], 0x88);
    r[p + 8] = _mm512_shuffle_f32x4(t[p], t[8 + p], 0xdd);
    r[p + 4] = _mm512_shuffle_f32x4(t[4 + p], t[12 + p], 0x88);
    r[p + 12] = _mm512_shuffle_f32x4(t[4 + p], t[12 + p], 0xdd);
  }
  _Pragma("GCC unroll 16") for (int k = 0; k < 16; k++)
    if (k < kt) _mm512_store_ps(d + k * ldd, r[k]);
}

/* ap (kc, MR) = rows i0..i0+mr of op(A) over k0..k0+kc, zero rows past mr. */
DG_TARGET_AVX512 static void pack_a(int ta, const float *A, int64_t lda, int64_t i0, int64_t mr,
                                    int64_t k0, int64_t kc, float *ap) {
  if (ta) { /* op(A)(i, k) = A[k][i]: MR floats of row k */
    __mmask16 m = lanes(mr);
    for (int64_t k = 0; k < kc; k++)
      _mm256_store_ps(ap + k * MR,
                      _mm512_castps512_ps256(_mm512_maskz_loadu_ps(m, A + (k0 + k) * lda + i0)));
    return;
  }
  float tmp[16 * 16] __attribute__((aligned(64)));
  for (int64_t k = 0; k < kc; k += 16) {
    int kt = kc - k < 16 ? (int)(kc - k) : 16;
    tr16(A + i0 * lda + k0 + k, lda, (int)mr, kt, tmp, 16);
    for (int q = 0; q < kt; q++) _mm256_store_ps(ap + (k + q) * MR, _mm256_load_ps(tmp + q * 16));
  }
}

/* bp: columns j0..j0+nc of op(B) over k0..k0+kc as NR-wide panels, each
 * (kc, NR) with zero columns past nc. */
DG_TARGET_AVX512 static void pack_b(int tb, const float *B, int64_t ldb, int64_t j0, int64_t nc,
                                    int64_t k0, int64_t kc, float *bp) {
  for (int64_t jp = 0; jp < nc; jp += NR) {
    int64_t nr = DG_MIN(nc - jp, NR);
    float *d = bp + jp * kc;
    if (!tb) { /* row k of B holds the panel's 32 floats */
      __mmask16 m0 = lanes(nr), m1 = lanes(nr - 16);
      for (int64_t k = 0; k < kc; k++) {
        const float *s = B + (k0 + k) * ldb + j0 + jp;
        _mm512_store_ps(d + k * NR, _mm512_maskz_loadu_ps(m0, s));
        _mm512_store_ps(d + k * NR + 16, _mm512_maskz_loadu_ps(m1, s + 16));
      }
      continue;
    }
    const float *s = B + (j0 + jp) * ldb + k0; /* op(B)(k, j) = B[j][k] */
    for (int64_t k = 0; k < kc; k += 16) {
      int kt = kc - k < 16 ? (int)(kc - k) : 16;
      tr16(s + k, ldb, (int)DG_MIN(nr, 16), kt, d + k * NR, NR);
      tr16(s + 16 * ldb + k, ldb, (int)(nr > 16 ? nr - 16 : 0), kt, d + k * NR + 16, NR);
    }
  }
}

/* C (mr, nr) = alpha * ap^T bp + (first ? beta C : C) for one micro-tile;
 * nv 16-lane vectors of columns (1 when nr <= 16). */
DG_TARGET_AVX512 DG_INLINE void tile_body(int64_t kc, const float *restrict ap,
                                          const float *restrict bp, float *C, int64_t ldc, int mr,
                                          int nr, float alpha, float beta, int first, const int nv) {
  __m512 c0[MR], c1[MR];
  _Pragma("GCC unroll 8") for (int r = 0; r < MR; r++) c0[r] = c1[r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < kc; k++) {
    __m512 b0 = _mm512_load_ps(bp), b1 = nv > 1 ? _mm512_load_ps(bp + 16) : b0;
    _Pragma("GCC unroll 8") for (int r = 0; r < MR; r++) {
      __m512 a = _mm512_set1_ps(ap[r]);
      c0[r] = _mm512_fmadd_ps(a, b0, c0[r]);
      if (nv > 1) c1[r] = _mm512_fmadd_ps(a, b1, c1[r]);
    }
    ap += MR, bp += NR;
  }
  __mmask16 m0 = lanes(nr), m1 = lanes(nr - 16);
  __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  for (int r = 0; r < mr; r++) {
    float *c = C + r * ldc;
    __m512 x0 = _mm512_mul_ps(va, c0[r]), x1 = _mm512_mul_ps(va, c1[r]);
    if (!first) {
      x0 = _mm512_add_ps(x0, _mm512_maskz_loadu_ps(m0, c));
      if (nv > 1) x1 = _mm512_add_ps(x1, _mm512_maskz_loadu_ps(m1, c + 16));
    } else if (beta != 0.0f) { /* beta 0: C is not read (it may hold NaN) */
      x0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, c), x0);
      if (nv > 1) x1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, c + 16), x1);
    }
    _mm512_mask_storeu_ps(c, m0, x0);
    if (nv > 1) _mm512_mask_storeu_ps(c + 16, m1, x1);
  }
}

DG_TARGET_AVX512 static void tile2(int64_t kc, const float *ap, const float *bp, float *C,
                                   int64_t ldc, int mr, int nr, float alpha, float beta, int first) {
  tile_body(kc, ap, bp, C, ldc, mr, nr, alpha, beta, first, 2);
}

DG_TARGET_AVX512 static void tile1(int64_t kc, const float *ap, const float *bp, float *C,
                                   int64_t ldc, int mr, int nr, float alpha, float beta, int first) {
  tile_body(kc, ap, bp, C, ldc, mr, nr, alpha, beta, first, 1);
}

typedef struct {
  int ta, tb;
  int64_t M, K, lda, ldb, ldc;
  float alpha, beta;
  const float *A, *B;
  float *C;
} own_job;

/* One pass (k0, kc) over columns j0..j0+nc: pack that B block once, then
 * each MR-row sliver of A against all its panels. */
static void own_block(const own_job *j, own_buf *buf, int64_t k0, int64_t kc, int64_t j0,
                      int64_t nc) {
  pack_b(j->tb, j->B, j->ldb, j0, nc, k0, kc, buf->b);
  for (int64_t i0 = 0; i0 < j->M; i0 += MR) {
    int mr = (int)DG_MIN(j->M - i0, MR);
    pack_a(j->ta, j->A, j->lda, i0, mr, k0, kc, buf->a);
    float *c = j->C + i0 * j->ldc + j0;
    for (int64_t jp = 0; jp < nc; jp += NR) {
      int nr = (int)DG_MIN(nc - jp, NR);
      (nr <= 16 ? tile1 : tile2)(kc, buf->a, buf->b + jp * kc, c + jp, j->ldc, mr, nr, j->alpha,
                                 j->beta, k0 == 0);
    }
  }
}

int dg__sgemm_own(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                  int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  if (M <= 0 || N <= 0 || K <= 0 || alpha == 0.0f) return -1; /* the caller's plain paths */
  own_buf *buf = thread_buf();
  if (!buf) return -1;
  own_job j = {ta, tb, M, K, lda, ldb, ldc, alpha, beta, A, B, C};
  int64_t passes = (K + KC_MAX - 1) / KC_MAX, kcs = (K + passes - 1) / passes;
  for (int64_t k0 = 0; k0 < K; k0 += kcs) {
    int64_t kc = DG_MIN(K - k0, kcs);
    /* the B block fits B_BYTES; blocks of equal width, in whole panels */
    int64_t ncap = DG_MAX((int64_t)(B_BYTES / 4) / kc / NR * NR, NR);
    int64_t nblk = (N + ncap - 1) / ncap, ncs = ((N + nblk - 1) / nblk + NR - 1) / NR * NR;
    for (int64_t j0 = 0; j0 < N; j0 += ncs) own_block(&j, buf, k0, kc, j0, DG_MIN(N - j0, ncs));
  }
  return 0;
}

int dg__sgemm_own_cpu(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") != 0;
}

#else /* no AVX-512 build: OpenBLAS or the plain loop */

int dg__sgemm_own(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                  int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)B;
  (void)ldb, (void)beta, (void)C, (void)ldc;
  return -1;
}

int dg__sgemm_own_cpu(void) { return 0; }

#define MR 8
#define NR 32
#endif

/* ---- which SGEMM a process uses ----
 *
 * Not a timing: the bits of a product depend on the kernel, and a resumed
 * run must reproduce the uninterrupted one bit for bit (checkpoint.h), so
 * every process on a machine must choose alike. A start-up race of the two
 * did not: on a loaded host ranks started together chose differently
 * (tests/ckpt's resume tests caught it). So the CPU decides: AMD's AVX-512
 * cores, where OpenBLAS's kernels (written for Intel's two 512-bit FMA
 * ports) leave the most behind and where this kernel was measured faster;
 * OpenBLAS elsewhere. DG_GEMM=own|blas overrides; bench/gemm_own compares
 * the two on any CPU (BENCHMARKS.md). */

static int g_own;
static pthread_once_t g_own_once = PTHREAD_ONCE_INIT;

static void own_decide(void) {
  const char *e = getenv("DG_GEMM");
  if (e && strcmp(e, "own") && strcmp(e, "blas")) {
    DG_LOGW("DG_GEMM=%s: neither 'own' nor 'blas'; the CPU decides", e);
    e = NULL;
  }
  if (!dg__sgemm_own_cpu() || (e && !strcmp(e, "blas"))) return; /* g_own stays 0 */
#if DG_HAVE_BLAS && defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  g_own = (e && !strcmp(e, "own")) || __builtin_cpu_is("amd");
#else
  g_own = 1; /* against the plain loop */
#endif
}

int dg__sgemm_own_fits(int64_t M, int64_t N, int64_t K) {
  if (K < 16 || (double)M * (double)N * (double)K < 262144.0) return 0;
  pthread_once(&g_own_once, own_decide);
  if (!g_own) return 0;
  /* padding: a tile has MR rows; a last panel 16 or NR columns */
  int64_t pm = (M + MR - 1) / MR * MR, r = N % NR;
  int64_t pn = N - r + (r == 0 ? 0 : r <= 16 ? 16 : NR);
  return (double)M * (double)N >= 0.9 * (double)pm * (double)pn;
}
