/* dgrad's own SGEMM (row-major, as dg__sgemm): an 8x32 micro-tile of FMAs
 * on AVX-512 CPUs, BLIS-style, and a 6x16 one on AVX2 CPUs with the same
 * bits (below).
 *
 * Why not OpenBLAS everywhere: on a Zen 4 core (AVX-512 on 256-bit units)
 * OpenBLAS's kernel runs the training steps' shapes at 82-91% of the FMA
 * peak; packing (a scalar-ish transpose for x W^T) and its beta = 0
 * clearing pass are most of the gap. This kernel reaches 97% of peak on hot
 * panels, reads the broadcast operand's rows in place where they run along
 * k (no packing), transposes with 16x16 in-register shuffles, and computes
 * x W^T as its transpose where x has few rows for its K (transposed_pays).
 * End to end it is 2-14% faster than OpenBLAS there (bench/gemm_own). On a
 * Zen 3 (AVX2) the AVX2 kernel measured level with OpenBLAS (MLP steps -5%
 * to +6%, char-GPT -3% to +3%, in a noisy window), so AVX2 CPUs keep
 * OpenBLAS unless DG_GEMM=own (the choice is the CPU's, not a timing: see
 * own_decide); DG_GEMM=own|blas pins it.
 *
 * Rounding: each C element is the sequential FMA chain over its k in passes
 * of at most KC_MAX (the pass length depends on K only), added to C per
 * pass, the same whichever operand is broadcast (a * b is exact before the
 * add). So an element's bits do not depend on where it sits in a tile, on
 * the product being computed as its transpose or on how a split cuts C
 * (gemm.c's splits rely on it), only on K, and not on the ISA: the AVX2
 * kernel does the same operations in the same order. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "dgrad_config.h"
#include "backends/cpu/cpu_impl.h"
#include "base/common_impl.h"

/* dg__sgemm_small and dg__transpose as plain loops, for a CPU or build
 * without AVX2 (never called there: dg__sgemm_own_on and
 * dg__sgemm_small_on are 0): the contract, not the bits. */
static void small_plain(int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                        int64_t ars, int64_t aks, const float *B, int64_t ldb, float beta,
                        float *C, int64_t ldc) {
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; k++) acc += A[i * ars + k * aks] * B[k * ldb + j];
      float *c = C + i * ldc + j;
      *c = beta == 0.0f ? alpha * acc : alpha * acc + beta * *c;
    }
}

static void transpose_plain(const float *S, int64_t lds, int64_t rows, int64_t cols, float *D,
                            int64_t ldd) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) D[c * ldd + r] = S[r * lds + c];
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MR 8                  /* rows of a micro-tile: 8 broadcasts per k */
#define NR 32                 /* columns: two 16-lane vectors */
#define KC_MAX 512            /* a pass: the A sliver (MR x KC) is 16 KiB, L1 */
#define B_BYTES (512 << 10)   /* a packed B block, streamed from L2 per sliver */
#define B_FLOATS (B_BYTES / 4 + KC_MAX * NR)
#define AG 4                  /* slivers of a transposed A packed together */
_Static_assert(AG * MR <= 32, "pack_a reads a transposed A two vectors a row");

typedef struct {
  float *a, *b; /* 64-byte aligned inside raw */
  void *raw;
} own_buf;

/* Packing buffers: a pool of slots, one claimed per product. Not per
 * thread: a pool thread that took no block of a product during warm-up
 * would make its buffer in a steady-state step (tests/unit/test_noalloc
 * caught one doing so); dg__sgemm_own_reserve makes as many as the compute
 * threads before the first product, and more only for products run at
 * once from several contexts. Slots live until exit. */
#define SLOTS_MAX 64
static own_buf g_slot[SLOTS_MAX];
static atomic_int g_busy[SLOTS_MAX];
static atomic_int g_nslots; /* slots made; g_slot[i] is set before i < g_nslots is seen */
static pthread_mutex_t g_slot_mu = PTHREAD_MUTEX_INITIALIZER;

/* Makes slot g_nslots (lock held); 0, or -1 without memory or room. */
static int slot_add(int busy) {
  int n = atomic_load_explicit(&g_nslots, memory_order_relaxed);
  if (n >= SLOTS_MAX) return -1;
  size_t bytes = (size_t)(AG * MR * KC_MAX + B_FLOATS) * sizeof(float) + 64;
  own_buf *b = &g_slot[n];
  if (!(b->raw = dg__malloc(bytes))) return -1;
  b->a = (float *)(((uintptr_t)b->raw + 63) & ~(uintptr_t)63);
  b->b = b->a + AG * MR * KC_MAX;
  atomic_store_explicit(&g_busy[n], busy, memory_order_relaxed);
  atomic_store_explicit(&g_nslots, n + 1, memory_order_release);
  return 0;
}

void dg__sgemm_own_reserve(int n) {
  if (atomic_load_explicit(&g_nslots, memory_order_acquire) >= n) return;
  pthread_mutex_lock(&g_slot_mu);
  while (atomic_load_explicit(&g_nslots, memory_order_relaxed) < n && !slot_add(0))
    continue; /* stops short without memory: slot_claim tries again */
  pthread_mutex_unlock(&g_slot_mu);
}

/* A free slot, claimed (its index in *idx); NULL without memory. */
static own_buf *slot_claim(int *idx) {
  int n = atomic_load_explicit(&g_nslots, memory_order_acquire);
  for (int i = 0; i < n; i++) {
    int z = 0;
    if (!atomic_load_explicit(&g_busy[i], memory_order_relaxed) &&
        atomic_compare_exchange_strong_explicit(&g_busy[i], &z, 1, memory_order_acquire,
                                                memory_order_relaxed)) {
      *idx = i;
      return &g_slot[i];
    }
  }
  pthread_mutex_lock(&g_slot_mu); /* all busy: one more, claimed as made */
  int i = atomic_load_explicit(&g_nslots, memory_order_relaxed);
  own_buf *b = slot_add(1) ? NULL : &g_slot[i];
  pthread_mutex_unlock(&g_slot_mu);
  *idx = i;
  return b;
}

static void slot_release(int i) { atomic_store_explicit(&g_busy[i], 0, memory_order_release); }

static __mmask16 lanes(int64_t n) {
  return n >= 16 ? 0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
}

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

/* Loads n (<= 16 or, unmasked, 16) floats at p. */
#define LOAD16(full, m, p) ((full) ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps((m), (p)))

/* ap: rows i0..i0+mr of op(A) over k0..k0+kc as slivers (kc, MR), zero
 * rows past mr; mr <= MR, or with ta up to AG * MR (sliver s at s * kc * MR). */
DG_TARGET_AVX512 static void pack_a(int ta, const float *A, int64_t lda, int64_t i0, int64_t mr,
                                    int64_t k0, int64_t kc, float *ap) {
  if (ta) { /* op(A)(i, k) = A[k][i]: AG slivers' floats of row k at once, whole
             * lines (one sliver's 32 B a row took a line each, and A's rows
             * a power of two apart share few L1 sets) */
    __mmask16 m0 = lanes(mr), m1 = lanes(mr - 16);
    int ns = (int)((mr + MR - 1) / MR);
    for (int64_t k = 0; k < kc; k++) {
      const float *s = A + (k0 + k) * lda + i0;
      __m512 v0 = _mm512_maskz_loadu_ps(m0, s), v1 = _mm512_maskz_loadu_ps(m1, s + 16);
      __m512 v[4] = {v0, _mm512_shuffle_f32x4(v0, v0, 0xee), v1,
                     _mm512_shuffle_f32x4(v1, v1, 0xee)}; /* sliver q in v[q]'s low half */
      for (int q = 0; q < ns; q++)
        _mm256_store_ps(ap + (q * kc + k) * MR, _mm512_castps512_ps256(v[q]));
    }
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
  if (!tb) { /* row k of B holds every panel's 32 floats: read it whole, in order (a
              * panel at a time strides across pages, where prefetchers stop) */
    __mmask16 m0 = lanes(nc % NR), m1 = lanes(nc % NR - 16); /* the last panel's */
    for (int64_t k = 0; k < kc; k++) {
      const float *s = B + (k0 + k) * ldb + j0;
      float *d = bp + k * NR;
      for (int64_t jp = 0; jp < nc; jp += NR) {
        int full = nc - jp >= NR;
        _mm512_store_ps(d + jp * kc, LOAD16(full, m0, s + jp));
        _mm512_store_ps(d + jp * kc + 16, LOAD16(full, m1, s + jp + 16));
      }
    }
    return;
  }
  for (int64_t jp = 0; jp < nc; jp += NR) {
    int64_t nr = DG_MIN(nc - jp, NR);
    float *d = bp + jp * kc;
    const float *s = B + (j0 + jp) * ldb + k0; /* op(B)(k, j) = B[j][k] */
    for (int h = 0; h < 2; h++) /* 16 rows at a time: 16 streams, not 32 */
      for (int64_t k = 0; k < kc; k += 16) {
        int kt = kc - k < 16 ? (int)(kc - k) : 16;
        tr16(s + h * 16 * ldb + k, ldb, (int)DG_MIN(DG_MAX(nr - 16 * h, 0), 16), kt,
             d + k * NR + 16 * h, NR);
      }
  }
}

/* What the first pass adds to alpha * acc: res + bias where either is
 * given (res at C's offset and stride, bias at C's first column), else
 * beta * C. Later passes add C. The last pass's selects: relu stores
 * max(0, value) (x < 0 ? 0 : x, as the relu kernel: NaN and -0 kept);
 * mask (at C's offset and stride) stores mask > 0 ? value : 0. */
typedef struct {
  float alpha, beta;
  const float *res, *bias, *mask;
  int relu;
} own_epi;

/* The last pass's selects on 16 lanes of C: the ReLU, 0 where x < 0 (MAXPS
 * returns its second operand for a NaN), then the mask's, 0 where the mask
 * (its 16 floats at p, loaded under m unless full) is not > 0 (NaN is
 * not). */
DG_TARGET_AVX512 DG_INLINE __m512 select16(const own_epi *e, __m512 x, const float *p,
                                           __mmask16 m, int full) {
  if (e->relu) x = _mm512_max_ps(_mm512_setzero_ps(), x);
  if (e->mask)
    x = _mm512_maskz_mov_ps(
        _mm512_cmp_ps_mask(LOAD16(full, m, p), _mm512_setzero_ps(), _CMP_GT_OQ), x);
  return x;
}

/* The epilogue of a tile kept as C's transpose: C'(r, c) = C[c * ldc + r],
 * C' = alpha * acc + (first ? res' + bias or beta C' : C'), the bias along
 * r here. t is the accumulators (MR, NR); each 16-column half is turned by
 * tr16 so C's rows are stored whole. */
DG_TARGET_AVX512 DG_INLINE void store_t(const float *t, float *C, int64_t ldc, int mr, int nr,
                                        const own_epi *e, int first) {
  float u[16 * 16] __attribute__((aligned(64)));
  __mmask16 m = lanes(mr);
  __m512 va = _mm512_set1_ps(e->alpha), vb = _mm512_set1_ps(e->beta);
  int add = first && (e->res || e->bias);
  __m512 tb = e->bias ? _mm512_maskz_loadu_ps(m, e->bias) : _mm512_setzero_ps();
  for (int h = 0; h * 16 < nr; h++) {
    tr16(t + h * 16, NR, MR, 16, u, 16); /* u[c * 16 + r] = t[r * NR + 16 h + c] */
    for (int c = 0; c < 16 && h * 16 + c < nr; c++) {
      float *cp = C + (h * 16 + c) * ldc;
      __m512 x = _mm512_mul_ps(va, _mm512_load_ps(u + c * 16));
      if (add) {
        __m512 y = tb;
        if (e->res) {
          __m512 r = _mm512_maskz_loadu_ps(m, e->res + (h * 16 + c) * ldc);
          y = e->bias ? _mm512_add_ps(r, tb) : r;
        }
        x = _mm512_add_ps(x, y);
      } else if (!first) {
        x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(m, cp));
      } else if (e->beta != 0.0f) {
        x = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m, cp), x);
      }
      if (e->relu || e->mask)
        x = select16(e, x, e->mask ? e->mask + (h * 16 + c) * ldc : NULL, m, 0);
      _mm512_mask_storeu_ps(cp, m, x);
    }
  }
}

/* A tile row's nv vectors into c, masked only when not full (masks m0, m1). */
DG_TARGET_AVX512 DG_INLINE void store_row(float *c, __m512 x0, __m512 x1, __mmask16 m0,
                                          __mmask16 m1, const int nv, int full) {
  if (full) {
    _mm512_storeu_ps(c, x0);
    if (nv > 1) _mm512_storeu_ps(c + 16, x1);
  } else {
    _mm512_mask_storeu_ps(c, m0, x0);
    if (nv > 1) _mm512_mask_storeu_ps(c + 16, m1, x1);
  }
}

/* One micro-tile: acc (MR, nv * 16) = sum over k of a(r, k) bp(k, c), with
 * a(r, k) = ap[k * MR + r] (packed) or ap[r * lda + k] (in place: rows of
 * A read where they are); then C (mr, nr) = alpha * acc + (first ? res +
 * bias or beta C : C) (own_epi), through the last pass's selects
 * (select16), stored into C or into C's transpose (trc). nv 16-lane vectors
 * (1 when nr <= 16). res + bias is rounded before acc is added, as a fill
 * of C with them and beta 1 would. */
DG_TARGET_AVX512 DG_INLINE void tile_body(int64_t kc, const float *restrict ap, int64_t lda,
                                          const float *restrict bp, float *C, int64_t ldc, int mr,
                                          int nr, const own_epi *e, int first, const int nv,
                                          const int inplace, const int trc) {
  if (first) { /* C's lines, fetched for writing while the tile computes */
    if (trc)
      for (int c = 0; c < nr; c++) __builtin_prefetch(C + c * ldc, 1);
    else
      for (int r = 0; r < mr; r++) {
        __builtin_prefetch(C + r * ldc, 1);
        if (nv > 1) __builtin_prefetch(C + r * ldc + 16, 1);
      }
  }
  if (e->mask) { /* and the mask's, read as C is stored */
    if (trc)
      for (int c = 0; c < nr; c++) __builtin_prefetch(e->mask + c * ldc);
    else
      for (int r = 0; r < mr; r++) {
        __builtin_prefetch(e->mask + r * ldc);
        if (nv > 1) __builtin_prefetch(e->mask + r * ldc + 16);
      }
  }
  __m512 c0[MR], c1[MR];
  _Pragma("GCC unroll 8") for (int r = 0; r < MR; r++) c0[r] = c1[r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < kc; k++) {
    __m512 b0 = _mm512_load_ps(bp), b1 = nv > 1 ? _mm512_load_ps(bp + 16) : b0;
    _Pragma("GCC unroll 8") for (int r = 0; r < MR; r++) {
      __m512 a = _mm512_set1_ps(inplace ? ap[r * lda] : ap[r]);
      c0[r] = _mm512_fmadd_ps(a, b0, c0[r]);
      if (nv > 1) c1[r] = _mm512_fmadd_ps(a, b1, c1[r]);
    }
    ap += inplace ? 1 : MR, bp += NR;
  }
  if (trc) {
    float t[MR * NR] __attribute__((aligned(64)));
    _Pragma("GCC unroll 8") for (int r = 0; r < MR; r++) {
      _mm512_store_ps(t + r * NR, c0[r]);
      _mm512_store_ps(t + r * NR + 16, c1[r]);
    }
    store_t(t, C, ldc, mr, nr, e, first);
    return;
  }
  /* masks only at C's edge: AMD's cores do not forward a masked store */
  __mmask16 m0 = lanes(nr), m1 = lanes(nr - 16);
  int full = nr == nv * 16, add = first && (e->res || e->bias);
  __m512 va = _mm512_set1_ps(e->alpha), vb = _mm512_set1_ps(e->beta);
  __m512 tb0 = _mm512_setzero_ps(), tb1 = tb0;
  if (add && e->bias) {
    tb0 = LOAD16(full, m0, e->bias);
    if (nv > 1) tb1 = LOAD16(full, m1, e->bias + 16);
  }
  for (int r = 0; r < mr; r++) {
    float *c = C + r * ldc;
    __m512 x0 = _mm512_mul_ps(va, c0[r]), x1 = _mm512_mul_ps(va, c1[r]);
    if (add) { /* + (res + bias) */
      __m512 y0 = tb0, y1 = tb1;
      if (e->res) {
        const float *rr = e->res + r * ldc;
        __m512 r0 = LOAD16(full, m0, rr), r1 = nv > 1 ? LOAD16(full, m1, rr + 16) : r0;
        y0 = e->bias ? _mm512_add_ps(r0, tb0) : r0;
        y1 = e->bias ? _mm512_add_ps(r1, tb1) : r1;
      }
      x0 = _mm512_add_ps(x0, y0);
      if (nv > 1) x1 = _mm512_add_ps(x1, y1);
    } else if (!first || e->beta != 0.0f) { /* beta 0: C is not read (it may hold NaN) */
      __m512 y0 = LOAD16(full, m0, c), y1 = nv > 1 ? LOAD16(full, m1, c + 16) : y0;
      x0 = first ? _mm512_fmadd_ps(vb, y0, x0) : _mm512_add_ps(x0, y0);
      if (nv > 1) x1 = first ? _mm512_fmadd_ps(vb, y1, x1) : _mm512_add_ps(x1, y1);
    }
    if (e->relu || e->mask) {
      const float *mk = e->mask ? e->mask + r * ldc : NULL;
      x0 = select16(e, x0, mk, m0, full);
      if (nv > 1) x1 = select16(e, x1, mk ? mk + 16 : NULL, m1, full);
    }
    store_row(c, x0, x1, m0, m1, nv, full);
  }
}

typedef void tile_fn(int64_t kc, const float *ap, int64_t lda, const float *bp, float *C,
                     int64_t ldc, int mr, int nr, const own_epi *e, int first);

/* The tile variants: [trc][inplace][nv - 1] */
#define TILE(name, nv, inplace, trc)                                                            \
  DG_TARGET_AVX512 static void name(int64_t kc, const float *ap, int64_t lda, const float *bp,   \
                                    float *C, int64_t ldc, int mr, int nr, const own_epi *e,     \
                                    int first) {                                                 \
    tile_body(kc, ap, lda, bp, C, ldc, mr, nr, e, first, nv, inplace, trc);                      \
  }
TILE(tile_pk1, 1, 0, 0)
TILE(tile_pk2, 2, 0, 0)
TILE(tile_ip1, 1, 1, 0)
TILE(tile_ip2, 2, 1, 0)
TILE(tile_pk1_t, 1, 0, 1)
TILE(tile_pk2_t, 2, 0, 1)
TILE(tile_ip1_t, 1, 1, 1)
TILE(tile_ip2_t, 2, 1, 1)

/* C = alpha op(A) op(B) + (res + bias or beta C), or with trc, C^T = alpha
 * op(A) op(B) + ... (the product computed as its transpose: A and B here
 * are the caller's B and A). */
typedef struct {
  int ta, tb, trc;
  int64_t M, K, lda, ldb, ldc;
  float alpha, beta;
  const float *A, *B;
  float *C;
  dg__gemm_epi e; /* res and mask at C's stride; bias along C's columns */
} own_job;

typedef void pack_a_fn(int ta, const float *A, int64_t lda, int64_t i0, int64_t mr, int64_t k0,
                       int64_t kc, float *ap);
typedef void pack_b_fn(int tb, const float *B, int64_t ldb, int64_t j0, int64_t nc, int64_t k0,
                       int64_t kc, float *bp);

/* A kernel for one ISA: its micro-tile (mr rows, nr columns in two vectors
 * of nr / 2), the slivers of a transposed A packed at once (ag), its
 * packing and its tiles [trc][inplace][two vectors] (trc NULL: never run
 * as its transpose). A packed sliver is (kc, mr). */
typedef struct {
  int mr, nr, ag;
  pack_a_fn *pack_a;
  pack_b_fn *pack_b;
  tile_fn *tiles[2][2][2];
} own_kern;

static const own_kern g_k512 = {MR, NR, AG, pack_a, pack_b,
                                {{{tile_pk1, tile_pk2}, {tile_ip1, tile_ip2}},
                                 {{tile_pk1_t, tile_pk2_t}, {tile_ip1_t, tile_ip2_t}}}};

/* One pass (k0, kc) over columns j0..j0+nc: pack that B block once, then
 * each mr-row sliver of A against all its panels. A sliver of whole rows
 * of A stored along k is read in place (no packing); others are packed. */
static void own_block(const own_kern *kn, const own_job *j, own_buf *buf, int64_t k0, int64_t kc,
                      int64_t j0, int64_t nc) {
  kn->pack_b(j->tb, j->B, j->ldb, j0, nc, k0, kc, buf->b);
  for (int64_t i0 = 0; i0 < j->M; i0 += kn->mr) {
    int mr = (int)DG_MIN(j->M - i0, kn->mr), ip = !j->ta && mr == kn->mr;
    const float *ap = j->A + i0 * j->lda + k0;
    if (j->ta) { /* ag slivers packed at the first of them */
      int64_t s = i0 / kn->mr % kn->ag;
      if (!s) kn->pack_a(1, j->A, j->lda, i0, DG_MIN(j->M - i0, kn->ag * kn->mr), k0, kc, buf->a);
      ap = buf->a + s * kc * kn->mr;
    } else if (!ip) {
      kn->pack_a(0, j->A, j->lda, i0, mr, k0, kc, buf->a), ap = buf->a;
    }
    for (int64_t jp = 0; jp < nc; jp += kn->nr) {
      int nr = (int)DG_MIN(nc - jp, kn->nr);
      int64_t off = j->trc ? (j0 + jp) * j->ldc + i0 : i0 * j->ldc + j0 + jp;
      int last = k0 + kc == j->K;
      own_epi e = {j->alpha, j->beta, j->e.res ? j->e.res + off : NULL,
                   j->e.bias ? j->e.bias + (j->trc ? i0 : j0 + jp) : NULL,
                   j->e.mask && last ? j->e.mask + off : NULL, j->e.relu && last};
      kn->tiles[j->trc][ip][nr > kn->nr / 2](kc, ap, j->lda, buf->b + jp * kc, j->C + off,
                                             j->ldc, mr, nr, &e, k0 == 0);
    }
  }
}

/* x W^T (ta 0, tb 1): both operands run along k, so one must be turned.
 * As it stands, packing turns W (N x K) while x's rows are read in place;
 * computed as its transpose, W's rows are read in place and x (M x K) is
 * turned, plus C (M x N, once per pass) on its way out. Measured on Zen 4
 * (bench/gemm_own): the transpose wins for few rows and a long K (MLP
 * batch 64: 64x512x784 +5%, 64x256x512 +10%) and loses from K < 4 M
 * (batch 256, 256x512x784: -4%). */
static int transposed_pays(int ta, int tb, int64_t M, int64_t K) {
  return !ta && tb && K >= 4 * M;
}

static const own_kern g_k256;

/* The ISA the kernel runs at: the element-wise kernels' (DG_SIMD caps
 * both, so DG_SIMD=avx2 runs the AVX2 kernel on an AVX-512 CPU), but never
 * below AVX2 where the CPU has it: a cap to the baseline must not take the
 * products dg__sgemm_own_fits gave this kernel (gemm.c splits them as the
 * own kernel's, at any cut) to OpenBLAS. DG_GEMM=blas turns it off. */
static int kern_isa(void) {
  int isa = dg__simd_isa();
  if (isa >= DG_ISA_AVX2) return isa;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f")                                     ? DG_ISA_AVX512
         : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? DG_ISA_AVX2
                                                                             : DG_ISA_BASE;
}

int dg__sgemm_own_add(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                      const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                      const dg__gemm_epi *e, float *C, int64_t ldc) {
  if (M <= 0 || N <= 0 || K <= 0 || alpha == 0.0f) return -1; /* the caller's plain paths */
  int isa = kern_isa();
  if (isa < DG_ISA_AVX2) return -1;
  const own_kern *kn = isa == DG_ISA_AVX512 ? &g_k512 : &g_k256;
  int slot;
  own_buf *buf = slot_claim(&slot);
  if (!buf) return -1;
  own_job j = {ta, tb, 0, M, K, lda, ldb, ldc, alpha, beta, A, B, C, {0}};
  if (e) j.e = *e;
  if (kn->tiles[1][0][0] && transposed_pays(ta, tb, M, K)) { /* C^T = op(B)^T op(A)^T */
    j = (own_job){!tb, !ta, 1, N, K, ldb, lda, ldc, alpha, beta, B, A, C, j.e};
    int64_t t = M;
    M = N, N = t;
  }
  /* the passes depend on K alone, alike for every ISA: the bits do */
  int64_t passes = (K + KC_MAX - 1) / KC_MAX, kcs = (K + passes - 1) / passes;
  for (int64_t k0 = 0; k0 < K; k0 += kcs) {
    int64_t kc = DG_MIN(K - k0, kcs);
    /* the B block fits B_BYTES; blocks of equal width, in whole panels */
    int64_t ncap = DG_MAX((int64_t)(B_BYTES / 4) / kc / kn->nr * kn->nr, kn->nr);
    int64_t nblk = (N + ncap - 1) / ncap;
    int64_t ncs = ((N + nblk - 1) / nblk + kn->nr - 1) / kn->nr * kn->nr;
    for (int64_t j0 = 0; j0 < N; j0 += ncs)
      own_block(kn, &j, buf, k0, kc, j0, DG_MIN(N - j0, ncs));
  }
  slot_release(slot);
  return 0;
}

/* ---- small products of operands already in cache (attention's per-head
 * products; dg__sgemm_small in cpu_impl.h): nothing packed ---- */

/* C (mr, nr) = alpha * acc + (beta == 0 ? 0 : beta * C), acc (MR, nv * 16)
 * = sum over k < K of A(r, k) B(k, c), A(r, k) = a[r * ars + k * aks], B's
 * rows b[k * ldb ..] read in place (masked past nr unless full: nr is
 * nv * 16; AMD's cores do not forward a masked store to a later load, and
 * the next op reads these rows). Rows past mr repeat row 0 (never stored),
 * so nothing outside A is read. */
DG_TARGET_AVX512 DG_INLINE void small_body(int64_t K, const float *a, int64_t ars, int64_t aks,
                                           const float *b, int64_t ldb, float *C, int64_t ldc,
                                           int mr, int nr, float alpha, float beta, const int nv,
                                           const int full) {
  int64_t off[MR];
  _Pragma("GCC unroll 8") for (int r = 0; r < MR; r++) off[r] = (r < mr ? r : 0) * ars;
  __m512 c0[MR], c1[MR];
  _Pragma("GCC unroll 8") for (int r = 0; r < MR; r++) c0[r] = c1[r] = _mm512_setzero_ps();
  __mmask16 m0 = lanes(nr), m1 = lanes(nr - 16);
  for (int64_t k = 0; k < K; k++, a += aks, b += ldb) {
    __m512 b0 = LOAD16(full, m0, b), b1 = nv > 1 ? LOAD16(full, m1, b + 16) : b0;
    _Pragma("GCC unroll 8") for (int r = 0; r < MR; r++) {
      __m512 av = _mm512_set1_ps(a[off[r]]);
      c0[r] = _mm512_fmadd_ps(av, b0, c0[r]);
      if (nv > 1) c1[r] = _mm512_fmadd_ps(av, b1, c1[r]);
    }
  }
  __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  /* unrolled with constant indices, so the accumulators stay in registers */
  _Pragma("GCC unroll 8") for (int r = 0; r < MR; r++) {
    if (r >= mr) break;
    float *c = C + r * ldc;
    __m512 x0 = _mm512_mul_ps(va, c0[r]), x1 = _mm512_mul_ps(va, c1[r]);
    if (beta != 0.0f) { /* beta 0: C is not read (it may hold NaN) */
      x0 = _mm512_fmadd_ps(vb, LOAD16(full, m0, c), x0);
      if (nv > 1) x1 = _mm512_fmadd_ps(vb, LOAD16(full, m1, c + 16), x1);
    }
    store_row(c, x0, x1, m0, m1, nv, full);
  }
}

typedef void small_fn(int64_t K, const float *a, int64_t ars, int64_t aks, const float *b,
                      int64_t ldb, float *C, int64_t ldc, int mr, int nr, float alpha,
                      float beta);
#define SMALL(name, nv, full)                                                                  \
  DG_TARGET_AVX512 static void name(int64_t K, const float *a, int64_t ars, int64_t aks,       \
                                    const float *b, int64_t ldb, float *C, int64_t ldc, int mr, \
                                    int nr, float alpha, float beta) {                         \
    small_body(K, a, ars, aks, b, ldb, C, ldc, mr, nr, alpha, beta, nv, full);                 \
  }
SMALL(small1, 1, 1)
SMALL(small2, 2, 1)
SMALL(small1m, 1, 0)
SMALL(small2m, 2, 0)

/* A small-product kernel: tiles of mr rows and nr columns (two vectors),
 * its variants [two vectors][full] (full: nr or nr / 2 columns, no masks). */
typedef struct {
  int mr, nr;
  small_fn *f[2][2];
} small_kern;
static const small_kern g_s512 = {MR, NR, {{small1m, small1}, {small2m, small2}}};

static void small_run(const small_kern *sk, int64_t M, int64_t N, int64_t K, float alpha,
                      const float *A, int64_t ars, int64_t aks, const float *B, int64_t ldb,
                      float beta, float *C, int64_t ldc) {
  for (int64_t i0 = 0; i0 < M; i0 += sk->mr) {
    int mr = (int)DG_MIN(M - i0, sk->mr);
    for (int64_t j0 = 0; j0 < N; j0 += sk->nr) {
      int nr = (int)DG_MIN(N - j0, sk->nr), two = nr > sk->nr / 2;
      small_fn *f = sk->f[two][nr == (two ? sk->nr : sk->nr / 2)];
      f(K, A + i0 * ars, ars, aks, B + j0, ldb, C + i0 * ldc + j0, ldc, mr, nr, alpha, beta);
    }
  }
}

/* D[c * ldd + r] = S[r * lds + c], by 16x16 blocks turned in registers. */
DG_TARGET_AVX512 static void transpose512(const float *S, int64_t lds, int64_t rows, int64_t cols,
                                    float *D, int64_t ldd) {
  float t[16 * 16] __attribute__((aligned(64)));
  for (int64_t r0 = 0; r0 < rows; r0 += 16) {
    int n = (int)DG_MIN(rows - r0, 16);
    for (int64_t c0 = 0; c0 < cols; c0 += 16) {
      int kt = (int)DG_MIN(cols - c0, 16);
      tr16(S + r0 * lds + c0, lds, n, kt, t, 16);
      for (int q = 0; q < kt; q++)
        _mm512_mask_storeu_ps(D + (c0 + q) * ldd + r0, lanes(n), _mm512_load_ps(t + q * 16));
    }
  }
}

/* ---- the AVX2 kernel (CPUs without AVX-512, as a Zen 3): a 6x16
 * micro-tile, 12 accumulators of 8 lanes, 2 vectors of B and a broadcast
 * (15 of the 16 registers). Each element is the same FMA chain over k in
 * the same passes as above, and the epilogue the same operations in the
 * same order, so the two kernels give the same bits (tests/unit/
 * test_gemm_own checks it on AVX-512 CPUs): which ISA a process runs never
 * changes a result. Never run as its transpose (a choice of speed only).
 * Packed slivers are 6 floats a row, stored as 8-float vectors in rising
 * order, each overwriting the 2 floats past the last (the buffer has room
 * past its last sliver). ---- */

#define MR2 6
#define NR2 16
#define AG2 4
#define B_AHEAD 8 /* rows of B a block's packing fetches ahead: 3-5% on 128x512x1024 */
_Static_assert(AG2 * MR2 + 1 <= AG * MR, "the A buffer holds AG2 slivers and 2 floats more");

#define LOAD8(full, m, p) ((full) ? _mm256_loadu_ps(p) : _mm256_maskload_ps((p), (m)))

/* d[k * ldd + c] = s[c * ld + k] for rows c < n of s and k < kt (<= 8);
 * rows n..7 of the output's columns are zeros. d 32-byte aligned. */
DG_TARGET_AVX2 DG_INLINE void tr8(const float *s, int64_t ld, int n, int kt, float *d,
                                  int64_t ldd) {
  __m256 r[8], t[8];
  __m256i km = dg__lanes8(kt);
  _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++) /* plain loads where whole */
    r[c] = c >= n     ? _mm256_setzero_ps()
           : kt == 8 ? _mm256_loadu_ps(s + c * ld)
                     : _mm256_maskload_ps(s + c * ld, km);
  _Pragma("GCC unroll 8") for (int c = 0; c < 8; c += 2) {
    t[c] = _mm256_unpacklo_ps(r[c], r[c + 1]);
    t[c + 1] = _mm256_unpackhi_ps(r[c], r[c + 1]);
  }
  _Pragma("GCC unroll 8") for (int c = 0; c < 8; c += 4) { /* rows c..c+3, k in pairs */
    r[c] = _mm256_shuffle_ps(t[c], t[c + 2], 0x44);
    r[c + 1] = _mm256_shuffle_ps(t[c], t[c + 2], 0xee);
    r[c + 2] = _mm256_shuffle_ps(t[c + 1], t[c + 3], 0x44);
    r[c + 3] = _mm256_shuffle_ps(t[c + 1], t[c + 3], 0xee);
  }
  _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) { /* k = p (low) and p + 4 (high) */
    t[p] = _mm256_permute2f128_ps(r[p], r[p + 4], 0x20);
    t[p + 4] = _mm256_permute2f128_ps(r[p], r[p + 4], 0x31);
  }
  _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++)
    if (k < kt) _mm256_store_ps(d + k * ldd, t[k]);
}

/* pack_a's contract, for MR2-row slivers and up to AG2 of them with ta. */
DG_TARGET_AVX2 static void pack_a2(int ta, const float *A, int64_t lda, int64_t i0, int64_t mr,
                                   int64_t k0, int64_t kc, float *ap) {
  if (ta) { /* op(A)(i, k) = A[k][i]: each sliver's floats of row k, one masked load */
    int ns = (int)((mr + MR2 - 1) / MR2);
    __m256i six = dg__lanes8(MR2);
    for (int64_t k = 0; k < kc; k++) {
      const float *s = A + (k0 + k) * lda + i0;
      for (int q = 0; q < ns; q++) {
        __m256 v = _mm256_maskload_ps(s + q * MR2, dg__lanes8(DG_MIN(mr - q * MR2, MR2)));
        if (k + 1 < kc) /* the 2 floats past it: row k + 1's, stored next */
          _mm256_storeu_ps(ap + (q * kc + k) * MR2, v);
        else /* past the sliver: the next one's first row, stored already */
          _mm256_maskstore_ps(ap + (q * kc + k) * MR2, six, v);
      }
    }
    return;
  }
  float t[8 * 8] __attribute__((aligned(32)));
  for (int64_t k = 0; k < kc; k += 8) {
    int kt = kc - k < 8 ? (int)(kc - k) : 8;
    tr8(A + i0 * lda + k0 + k, lda, (int)mr, kt, t, 8);
    for (int q = 0; q < kt; q++) _mm256_storeu_ps(ap + (k + q) * MR2, _mm256_load_ps(t + q * 8));
  }
}

/* pack_b's contract, for NR2-wide panels. */
DG_TARGET_AVX2 static void pack_b2(int tb, const float *B, int64_t ldb, int64_t j0, int64_t nc,
                                   int64_t k0, int64_t kc, float *bp) {
  if (!tb) { /* row k of B holds every panel's 16 floats: read it whole, in order */
    __m256i m0 = dg__lanes8(nc % NR2), m1 = dg__lanes8(nc % NR2 - 8); /* the last panel's */
    for (int64_t k = 0; k < kc; k++) {
      const float *s = B + (k0 + k) * ldb + j0;
      float *d = bp + k * NR2;
      if (k + B_AHEAD < kc) /* a block's rows are its row's part: prefetchers stop at pages */
        for (int64_t jp = 0; jp < nc; jp += 16) __builtin_prefetch(s + B_AHEAD * ldb + jp);
      for (int64_t jp = 0; jp < nc; jp += NR2) {
        int full = nc - jp >= NR2;
        _mm256_store_ps(d + jp * kc, LOAD8(full, m0, s + jp));
        _mm256_store_ps(d + jp * kc + 8, LOAD8(full, m1, s + jp + 8));
      }
    }
    return;
  }
  for (int64_t jp = 0; jp < nc; jp += NR2) {
    int64_t nr = DG_MIN(nc - jp, NR2);
    float *d = bp + jp * kc;
    const float *s = B + (j0 + jp) * ldb + k0; /* op(B)(k, j) = B[j][k] */
    for (int h = 0; h < 2; h++)
      for (int64_t k = 0; k < kc; k += 8) {
        int kt = kc - k < 8 ? (int)(kc - k) : 8;
        tr8(s + h * 8 * ldb + k, ldb, (int)DG_MIN(DG_MAX(nr - 8 * h, 0), 8), kt,
            d + k * NR2 + 8 * h, NR2);
      }
  }
}

/* The epilogue of 8 lanes of a tile row (n of them in C, at o from the
 * tile's corner; bias tb): tile_body's, operation for operation. The
 * product alpha * acc is kept apart from the add after it (the build
 * contracts a * b + c, and the AVX-512 kernel's add is not contracted). */
DG_TARGET_AVX2 DG_INLINE void epi8(const own_epi *e, __m256 acc, float *C, int64_t o, int n,
                                   __m256 tb, int first) {
  int full = n >= 8;
  __m256i m = dg__lanes8(n);
  float *c = C + o;
  __m256 x = _mm256_mul_ps(_mm256_set1_ps(e->alpha), acc);
  __asm__("" : "+x"(x));
  if (first && (e->res || e->bias)) { /* + (res + bias) */
    __m256 y = tb;
    if (e->res) {
      __m256 r = LOAD8(full, m, e->res + o);
      y = e->bias ? _mm256_add_ps(r, tb) : r;
    }
    x = _mm256_add_ps(x, y);
  } else if (!first || e->beta != 0.0f) { /* beta 0: C is not read (it may hold NaN) */
    __m256 y = LOAD8(full, m, c);
    x = first ? _mm256_fmadd_ps(_mm256_set1_ps(e->beta), y, x) : _mm256_add_ps(x, y);
  }
  if (e->relu) x = _mm256_max_ps(_mm256_setzero_ps(), x); /* NaN and -0 kept */
  if (e->mask) /* 0 where the mask is not > 0 (NaN is not) */
    x = _mm256_and_ps(_mm256_cmp_ps(LOAD8(full, m, e->mask + o), _mm256_setzero_ps(), _CMP_GT_OQ),
                      x);
  if (full)
    _mm256_storeu_ps(c, x);
  else
    _mm256_maskstore_ps(c, m, x);
}

/* tile_body's contract for an MR2 x NR2 tile, never transposed. */
DG_TARGET_AVX2 DG_INLINE void tile2_body(int64_t kc, const float *restrict ap, int64_t lda,
                                         const float *restrict bp, float *C, int64_t ldc, int mr,
                                         int nr, const own_epi *e, int first, const int nv,
                                         const int inplace) {
  for (int r = 0; r < mr; r++) {
    if (first) __builtin_prefetch(C + r * ldc, 1);
    if (e->mask) __builtin_prefetch(e->mask + r * ldc);
  }
  __m256 c0[MR2], c1[MR2];
  _Pragma("GCC unroll 6") for (int r = 0; r < MR2; r++) c0[r] = c1[r] = _mm256_setzero_ps();
  for (int64_t k = 0; k < kc; k++) {
    __m256 b0 = _mm256_load_ps(bp), b1 = nv > 1 ? _mm256_load_ps(bp + 8) : b0;
    _Pragma("GCC unroll 6") for (int r = 0; r < MR2; r++) {
      __m256 a = _mm256_broadcast_ss(inplace ? ap + r * lda : ap + r);
      c0[r] = _mm256_fmadd_ps(a, b0, c0[r]);
      if (nv > 1) c1[r] = _mm256_fmadd_ps(a, b1, c1[r]);
    }
    ap += inplace ? 1 : MR2, bp += NR2;
  }
  own_epi ev = *e; /* a local: C's float stores cannot alias it, so nothing is reloaded */
  e = &ev;
  int add = first && (e->res || e->bias);
  if (first && !add && e->beta == 0.0f && !e->relu && !e->mask && nr == nv * 8) {
    __m256 va = _mm256_set1_ps(e->alpha); /* the common case: C = alpha * acc */
    _Pragma("GCC unroll 6") for (int r = 0; r < MR2; r++) {
      if (r >= mr) break;
      _mm256_storeu_ps(C + r * ldc, _mm256_mul_ps(va, c0[r]));
      if (nv > 1) _mm256_storeu_ps(C + r * ldc + 8, _mm256_mul_ps(va, c1[r]));
    }
    return;
  }
  __m256 tb0 = _mm256_setzero_ps(), tb1 = tb0;
  if (add && e->bias) {
    tb0 = LOAD8(nr >= 8, dg__lanes8(nr), e->bias);
    if (nv > 1) tb1 = LOAD8(nr >= 16, dg__lanes8(nr - 8), e->bias + 8);
  }
  _Pragma("GCC unroll 6") for (int r = 0; r < MR2; r++) {
    if (r >= mr) break;
    epi8(e, c0[r], C, r * ldc, nr, tb0, first);
    if (nv > 1) epi8(e, c1[r], C, r * ldc + 8, nr - 8, tb1, first);
  }
}

#define TILE2(name, nv, inplace)                                                                \
  DG_TARGET_AVX2 static void name(int64_t kc, const float *ap, int64_t lda, const float *bp,     \
                                  float *C, int64_t ldc, int mr, int nr, const own_epi *e,       \
                                  int first) {                                                   \
    tile2_body(kc, ap, lda, bp, C, ldc, mr, nr, e, first, nv, inplace);                          \
  }
TILE2(tile2_pk1, 1, 0)
TILE2(tile2_pk2, 2, 0)
TILE2(tile2_ip1, 1, 1)
TILE2(tile2_ip2, 2, 1)
static const own_kern g_k256 = {MR2, NR2, AG2, pack_a2, pack_b2,
                                {{{tile2_pk1, tile2_pk2}, {tile2_ip1, tile2_ip2}}, {{0}}}};

/* small_body's contract on AVX2: 4 x 16 tiles (8 accumulators). */
#define MRS2 4
DG_TARGET_AVX2 DG_INLINE void small2_body(int64_t K, const float *a, int64_t ars, int64_t aks,
                                          const float *b, int64_t ldb, float *C, int64_t ldc,
                                          int mr, int nr, float alpha, float beta, const int nv,
                                          const int full) {
  int64_t off[MRS2];
  _Pragma("GCC unroll 4") for (int r = 0; r < MRS2; r++) off[r] = (r < mr ? r : 0) * ars;
  __m256 c0[MRS2], c1[MRS2];
  _Pragma("GCC unroll 4") for (int r = 0; r < MRS2; r++) c0[r] = c1[r] = _mm256_setzero_ps();
  __m256i m0 = dg__lanes8(nr), m1 = dg__lanes8(nr - 8);
  for (int64_t k = 0; k < K; k++, a += aks, b += ldb) {
    __m256 b0 = LOAD8(full, m0, b), b1 = nv > 1 ? LOAD8(full, m1, b + 8) : b0;
    _Pragma("GCC unroll 4") for (int r = 0; r < MRS2; r++) {
      __m256 av = _mm256_broadcast_ss(a + off[r]);
      c0[r] = _mm256_fmadd_ps(av, b0, c0[r]);
      if (nv > 1) c1[r] = _mm256_fmadd_ps(av, b1, c1[r]);
    }
  }
  own_epi e = {alpha, beta, NULL, NULL, NULL, 0};
  _Pragma("GCC unroll 4") for (int r = 0; r < MRS2; r++) {
    if (r >= mr) break;
    epi8(&e, c0[r], C, r * ldc, nr, c0[r], 1);
    if (nv > 1) epi8(&e, c1[r], C, r * ldc + 8, nr - 8, c1[r], 1);
  }
}

#define SMALL2(name, nv, full)                                                                 \
  DG_TARGET_AVX2 static void name(int64_t K, const float *a, int64_t ars, int64_t aks,         \
                                  const float *b, int64_t ldb, float *C, int64_t ldc, int mr,   \
                                  int nr, float alpha, float beta) {                           \
    small2_body(K, a, ars, aks, b, ldb, C, ldc, mr, nr, alpha, beta, nv, full);                \
  }
SMALL2(small2_1, 1, 1)
SMALL2(small2_2, 2, 1)
SMALL2(small2_1m, 1, 0)
SMALL2(small2_2m, 2, 0)

static const small_kern g_s256 = {MRS2, NR2, {{small2_1m, small2_1}, {small2_2m, small2_2}}};

DG_TARGET_AVX2 static void transpose256(const float *S, int64_t lds, int64_t rows, int64_t cols,
                                        float *D, int64_t ldd) {
  float t[8 * 8] __attribute__((aligned(32)));
  for (int64_t r0 = 0; r0 < rows; r0 += 8) {
    int n = (int)DG_MIN(rows - r0, 8);
    for (int64_t c0 = 0; c0 < cols; c0 += 8) {
      int kt = (int)DG_MIN(cols - c0, 8);
      tr8(S + r0 * lds + c0, lds, n, kt, t, 8);
      for (int q = 0; q < kt; q++) { /* a Zen 3 runs a masked store several times slower */
        float *d = D + (c0 + q) * ldd + r0;
        if (n == 8) _mm256_storeu_ps(d, _mm256_load_ps(t + q * 8));
        else _mm256_maskstore_ps(d, dg__lanes8(n), _mm256_load_ps(t + q * 8));
      }
    }
  }
}

void dg__sgemm_small(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t ars,
                     int64_t aks, const float *B, int64_t ldb, float beta, float *C,
                     int64_t ldc) {
  int isa = kern_isa();
  if (isa < DG_ISA_AVX2)
    small_plain(M, N, K, alpha, A, ars, aks, B, ldb, beta, C, ldc);
  else
    small_run(isa == DG_ISA_AVX512 ? &g_s512 : &g_s256, M, N, K, alpha, A, ars, aks, B, ldb, beta,
              C, ldc);
}

void dg__transpose(const float *S, int64_t lds, int64_t rows, int64_t cols, float *D,
                   int64_t ldd) {
  int isa = kern_isa();
  (isa == DG_ISA_AVX512 ? transpose512 : isa == DG_ISA_AVX2 ? transpose256 : transpose_plain)(
      S, lds, rows, cols, D, ldd);
}

int dg__sgemm_own_cpu(void) { return kern_isa() >= DG_ISA_AVX2; }

#else /* no x86-64 gcc build: OpenBLAS or the plain loop */

int dg__sgemm_own_add(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                      const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                      const dg__gemm_epi *e, float *C, int64_t ldc) {
  (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)B;
  (void)ldb, (void)beta, (void)e, (void)C, (void)ldc;
  return -1;
}

int dg__sgemm_own_cpu(void) { return 0; }

void dg__sgemm_small(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t ars,
                     int64_t aks, const float *B, int64_t ldb, float beta, float *C,
                     int64_t ldc) {
  small_plain(M, N, K, alpha, A, ars, aks, B, ldb, beta, C, ldc);
}

void dg__transpose(const float *S, int64_t lds, int64_t rows, int64_t cols, float *D,
                   int64_t ldd) {
  transpose_plain(S, lds, rows, cols, D, ldd);
}

void dg__sgemm_own_reserve(int n) { (void)n; }

#define MR 8
#define NR 32
#endif

int dg__sgemm_own(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                  int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  return dg__sgemm_own_add(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, NULL, C, ldc);
}

/* ---- which SGEMM a process uses ----
 *
 * Not a timing: the bits of a product depend on the kernel, and a resumed
 * run must reproduce the uninterrupted one bit for bit (checkpoint.h), so
 * every process on a machine must choose alike. A start-up race of the two
 * did not: on a loaded host ranks started together chose differently
 * (tests/ckpt's resume tests caught it). So the CPU decides: AMD's AVX-512
 * cores, where OpenBLAS's kernels (written for Intel's two 512-bit FMA
 * ports) leave the most behind and where this kernel was measured faster;
 * OpenBLAS elsewhere (a Zen 3's AVX2 kernel measured level with it). Not
 * DG_SIMD: a cap to AVX2 runs the AVX2 kernel, with the same bits.
 * DG_GEMM=own|blas overrides (own: on any CPU with AVX2 and FMA);
 * bench/gemm_own compares the two on any CPU (BENCHMARKS.md). */

static int g_own, g_small;
static pthread_once_t g_own_once = PTHREAD_ONCE_INIT;

static void own_decide(void) {
  const char *e = getenv("DG_GEMM");
  if (e && strcmp(e, "own") && strcmp(e, "blas")) {
    DG_LOGW("DG_GEMM=%s: neither 'own' nor 'blas'; the CPU decides", e);
    e = NULL;
  }
  if (!dg__sgemm_own_cpu() || (e && !strcmp(e, "blas"))) return; /* g_own stays 0 */
#if DG_HAVE_BLAS && defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  g_own = (e && !strcmp(e, "own")) ||
          (__builtin_cpu_is("amd") && __builtin_cpu_supports("avx512f"));
  g_small = g_own || __builtin_cpu_is("amd");
#else
  g_own = g_small = 1; /* against the plain loop */
#endif
}

int dg__sgemm_own_on(void) {
  pthread_once(&g_own_once, own_decide);
  return g_own;
}

int dg__sgemm_small_on(void) {
  pthread_once(&g_own_once, own_decide);
  return g_small;
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
