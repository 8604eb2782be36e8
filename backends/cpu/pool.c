/* Pooling kernels of the CPU backend (the op: ops/pool.c): max and average.
 *
 * Max: forward keeps, for every output, the index of its maximum inside the
 * input plane (H*W, int32); backward scatters dy through those indices.
 * Ties go to the first maximum in row-major window order and a NaN wins, as
 * in PyTorch's CPU kernel. Average: each window is summed in double and
 * scaled once; backward adds dy / (kh kw) to every element of the window.
 * Planes are independent: every pass splits them over the pool, and a fresh
 * dx is zeroed plane by plane inside the split. */
#include <math.h>
#include <string.h>

#include "backends/cpu/cpu_impl.h"
#include "backends/kern_pool.h"

typedef dg__maxpool_args pool_job;

/* One plane: y (OH, OW), idx (OH, OW) from x (H, W). */
static void pool_plane(const pool_job *g, const float *restrict x, float *restrict y,
                       int32_t *restrict idx) {
  const int64_t k = g->k, s = g->s, W = g->W;
  for (int64_t oh = 0; oh < g->OH; oh++)
    for (int64_t ow = 0; ow < g->OW; ow++) {
      int64_t base = oh * s * W + ow * s;
      float m = x[base];
      int64_t mi = base;
      for (int64_t i = 0; i < k; i++) {
        const float *r = x + base + i * W;
        for (int64_t j = 0; j < k; j++) {
          float v = r[j];
          if (v > m || isnan(v)) m = v, mi = base + i * W + j;
        }
      }
      y[oh * g->OW + ow] = m;
      idx[oh * g->OW + ow] = (int32_t)mi;
    }
}

/* The common 2x2 stride-2 window, unrolled. */
static void pool_plane_2x2(const pool_job *g, const float *restrict x, float *restrict y,
                           int32_t *restrict idx) {
  const int64_t W = g->W;
  for (int64_t oh = 0; oh < g->OH; oh++) {
    const float *r0 = x + 2 * oh * W, *r1 = r0 + W;
    for (int64_t ow = 0; ow < g->OW; ow++) {
      int64_t c = 2 * ow, mi = c;
      float m = r0[c];
      if (r0[c + 1] > m || isnan(r0[c + 1])) m = r0[c + 1], mi = c + 1;
      if (r1[c] > m || isnan(r1[c])) m = r1[c], mi = W + c;
      if (r1[c + 1] > m || isnan(r1[c + 1])) m = r1[c + 1], mi = W + c + 1;
      y[oh * g->OW + ow] = m;
      idx[oh * g->OW + ow] = (int32_t)(2 * oh * W + mi);
    }
  }
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
/* Elements 0, 2, .. 14 (odd: 1, 3, .. 15) of the 16 floats lo, hi. */
DG_TARGET_AVX2 DG_INLINE __m256 pick_even(__m256 lo, __m256 hi, int odd) {
  __m256 t = odd ? _mm256_shuffle_ps(lo, hi, 0xDD) : _mm256_shuffle_ps(lo, hi, 0x88);
  return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(t), 0xD8));
}

/* m, mi = v, vi where v > m or v is NaN: pool_plane_2x2's test, per lane. */
DG_TARGET_AVX2 DG_INLINE void take_max(__m256 *m, __m256i *mi, __m256 v, __m256i vi) {
  __m256 c = _mm256_or_ps(_mm256_cmp_ps(v, *m, _CMP_GT_OQ), _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  *m = _mm256_blendv_ps(*m, v, c);
  *mi = _mm256_castps_si256(
      _mm256_blendv_ps(_mm256_castsi256_ps(*mi), _mm256_castsi256_ps(vi), c));
}

/* pool_plane_2x2, 8 outputs at a time: the same four tests in the same
 * order, as selects instead of branches (on random data the branches
 * mispredicted about once an output: 18% of the CNN step on a Zen 3), so
 * the same values and indices. A row's last outputs (fewer than 8) read
 * through a mask and store through a buffer: nothing outside the plane is
 * read or written. */
DG_TARGET_AVX2 static void pool_plane_2x2_avx2(const pool_job *g, const float *restrict x,
                                               float *restrict y, int32_t *restrict idx) {
  const int64_t W = g->W, OW = g->OW;
  const __m256i even = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14), one = _mm256_set1_epi32(1);
  const __m256i down = _mm256_set1_epi32((int32_t)W);
  for (int64_t oh = 0; oh < g->OH; oh++) {
    const float *r0 = x + 2 * oh * W, *r1 = r0 + W;
    for (int64_t ow = 0; ow < OW; ow += 8) {
      int64_t n = DG_MIN(OW - ow, (int64_t)8), c = 2 * ow;
      __m256 a0, a1, b0, b1;
      if (n == 8) {
        a0 = _mm256_loadu_ps(r0 + c), a1 = _mm256_loadu_ps(r0 + c + 8);
        b0 = _mm256_loadu_ps(r1 + c), b1 = _mm256_loadu_ps(r1 + c + 8);
      } else {
        __m256i k0 = dg__lanes8(2 * n), k1 = dg__lanes8(2 * n - 8);
        a0 = _mm256_maskload_ps(r0 + c, k0), a1 = _mm256_maskload_ps(r0 + c + 8, k1);
        b0 = _mm256_maskload_ps(r1 + c, k0), b1 = _mm256_maskload_ps(r1 + c + 8, k1);
      }
      __m256i i00 = _mm256_add_epi32(_mm256_set1_epi32((int32_t)(2 * oh * W + c)), even);
      __m256i i10 = _mm256_add_epi32(i00, down), mi = i00;
      __m256 m = pick_even(a0, a1, 0);
      take_max(&m, &mi, pick_even(a0, a1, 1), _mm256_add_epi32(i00, one));
      take_max(&m, &mi, pick_even(b0, b1, 0), i10);
      take_max(&m, &mi, pick_even(b0, b1, 1), _mm256_add_epi32(i10, one));
      float *yo = y + oh * OW + ow;
      int32_t *io = idx + oh * OW + ow;
      if (n == 8) {
        _mm256_storeu_ps(yo, m);
        _mm256_storeu_si256((__m256i *)io, mi);
      } else {
        float tm[8];
        int32_t ti[8];
        _mm256_storeu_ps(tm, m);
        _mm256_storeu_si256((__m256i *)ti, mi);
        for (int64_t q = 0; q < n; q++) yo[q] = tm[q], io[q] = ti[q];
      }
    }
  }
}
#define HAVE_POOL_AVX2 1
#endif

static void fwd_planes(void *arg, int64_t lo, int64_t hi) {
  const pool_job *j = arg;
  const int64_t L = j->OH * j->OW, P = j->H * j->W;
  int fast = j->k == 2 && j->s == 2;
#ifdef HAVE_POOL_AVX2
  if (fast && dg__simd_isa() >= DG_ISA_AVX2) {
    for (int64_t p = lo; p < hi; p++)
      pool_plane_2x2_avx2(j, j->x + p * P, j->y + p * L, j->idx + p * L);
    return;
  }
#endif
  for (int64_t p = lo; p < hi; p++) {
    if (fast) pool_plane_2x2(j, j->x + p * P, j->y + p * L, j->idx + p * L);
    else pool_plane(j, j->x + p * P, j->y + p * L, j->idx + p * L);
  }
}

static void bwd_planes(void *arg, int64_t lo, int64_t hi) {
  const pool_job *j = arg;
  const int64_t L = j->OH * j->OW, P = j->H * j->W;
  for (int64_t p = lo; p < hi; p++) {
    const float *d = j->dy + p * L;
    const int32_t *ix = j->idx + p * L;
    float *dxp = j->dx + p * P;
    if (!j->acc) memset(dxp, 0, (size_t)P * sizeof *dxp);
    for (int64_t l = 0; l < L; l++) dxp[ix[l]] += d[l];
  }
}

/* Planes per pool chunk: about 16K input elements. */
static int64_t plane_grain(const pool_job *g) {
  return DG_MAX((int64_t)1, 16384 / DG_MAX(g->H * g->W, (int64_t)1));
}

static void cpu_maxpool2d_fwd(const dg__maxpool_args *a) {
  dg__parallel_range(a->planes, plane_grain(a), fwd_planes, (void *)a);
}

static void cpu_maxpool2d_bwd(const dg__maxpool_args *a) {
  dg__parallel_range(a->planes, plane_grain(a), bwd_planes, (void *)a);
}

/* ---- average pooling ---- */

typedef dg__avgpool_args avg_job;

/* 1 / (kh kw) in double; an empty window gives inf, so its mean 0 * inf is NaN. */
static double avg_inv(const avg_job *j) { return 1.0 / (double)(j->kh * j->kw); }

/* One plane: y (OH, OW) = window means of x (H, W). */
static void avg_plane_fwd(const avg_job *j, const float *restrict x, float *restrict y) {
  const double inv = avg_inv(j);
  for (int64_t oh = 0; oh < j->OH; oh++)
    for (int64_t ow = 0; ow < j->OW; ow++) {
      const float *w = x + oh * j->sh * j->W + ow * j->sw;
      double acc = 0;
      for (int64_t i = 0; i < j->kh; i++)
        for (int64_t k = 0; k < j->kw; k++) acc += w[i * j->W + k];
      y[oh * j->OW + ow] = (float)(acc * inv);
    }
}

/* One plane: dx (H, W) (+)= dy (OH, OW) / (kh kw) over each window. */
static void avg_plane_bwd(const avg_job *j, const float *restrict dy, float *restrict dx) {
  const float inv = (float)avg_inv(j);
  if (!j->acc) memset(dx, 0, (size_t)(j->H * j->W) * sizeof *dx);
  for (int64_t oh = 0; oh < j->OH; oh++)
    for (int64_t ow = 0; ow < j->OW; ow++) {
      float g = dy[oh * j->OW + ow] * inv;
      float *w = dx + oh * j->sh * j->W + ow * j->sw;
      for (int64_t i = 0; i < j->kh; i++)
        for (int64_t k = 0; k < j->kw; k++) w[i * j->W + k] += g;
    }
}

static void avg_fwd_planes(void *arg, int64_t lo, int64_t hi) {
  const avg_job *j = arg;
  const int64_t L = j->OH * j->OW, P = j->H * j->W;
  for (int64_t p = lo; p < hi; p++) avg_plane_fwd(j, j->x + p * P, j->y + p * L);
}

static void avg_bwd_planes(void *arg, int64_t lo, int64_t hi) {
  const avg_job *j = arg;
  const int64_t L = j->OH * j->OW, P = j->H * j->W;
  for (int64_t p = lo; p < hi; p++) avg_plane_bwd(j, j->dy + p * L, j->dx + p * P);
}

/* Planes per pool chunk: about 16K input elements. */
static int64_t avg_grain(const avg_job *j) {
  return DG_MAX((int64_t)1, 16384 / DG_MAX(j->H * j->W, (int64_t)1));
}

static void cpu_avgpool2d_fwd(const dg__avgpool_args *a) {
  dg__parallel_range(a->planes, avg_grain(a), avg_fwd_planes, (void *)a);
}

static void cpu_avgpool2d_bwd(const dg__avgpool_args *a) {
  dg__parallel_range(a->planes, avg_grain(a), avg_bwd_planes, (void *)a);
}

const struct dg__kern_pool dg__cpu_kern_pool = {cpu_maxpool2d_fwd, cpu_maxpool2d_bwd,
                                                cpu_avgpool2d_fwd, cpu_avgpool2d_bwd};
