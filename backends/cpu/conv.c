/* conv2d kernels of the CPU backend (the op: ops/conv.c): im2col + GEMM,
 * one image at a time.
 *
 * Per image n, with L = OH*OW and CK = C*KH*KW:
 *   col (CK, L) = im2col(x[n])            y[n] (O, L) = w (O, CK) @ col + b
 *   dw (O, CK) += dy[n] (O, L) @ col^T    dcol (CK, L) = w^T @ dy[n]; dx[n] += col2im(dcol)
 *   db (O) += row sums of dy[n]
 * The GEMM output (O, L) is already y[n]'s NCHW layout, so no transpose is
 * needed. Backward recomputes im2col from the saved input instead of keeping
 * the columns: the columns are KH*KW times the input (57 MiB for a 32->64 3x3
 * conv on 28x28 at batch 64) while re-running im2col costs a memory pass that
 * is small next to the GEMMs. A 1x1, stride-1, unpadded conv uses x[n] as its
 * own columns.
 *
 * Threads: forward and dx split the batch over the pool (each task its own
 * column scratch, each image's GEMM single-threaded as at 1 thread, so the
 * bits do not depend on the thread count); dw and db, sums over the images,
 * run image by image in order with each dw GEMM split over the pool (the
 * columns of a group of images, one per thread, are built in parallel
 * first). Fresh gradients are stored (GEMM beta 0 for the first image),
 * not zeroed. */
#include <string.h>

#include "backends/cpu/cpu_impl.h"
#include "backends/kern_conv.h"

/* Output columns ow in [lo, hi) read input columns inside [0, W) for kernel
 * column kw; the rest read padding. */
static void ow_range(const dg__conv_geom *g, int64_t kw, int64_t *lo, int64_t *hi) {
  int64_t a = g->p - kw; /* need ow*s >= a */
  int64_t l = a <= 0 ? 0 : (a + g->s - 1) / g->s;
  int64_t b = g->W - 1 + g->p - kw; /* need ow*s <= b */
  int64_t h = b < 0 ? 0 : b / g->s + 1;
  if (h > g->OW) h = g->OW;
  if (l > h) l = h;
  *lo = l, *hi = h;
}

/* Unaligned 8-float moves: a block of floats copied or cleared without a
 * call to memcpy or memset (gcc turns plain loops into those calls, and
 * for the 1-28 floats moved here the call cost more than the move; the
 * empty asm hides the loop's step from that rewrite). */
typedef float v8u __attribute__((vector_size(32), may_alias, aligned(4)));

DG_INLINE void copy_floats(float *restrict d, const float *restrict s, int64_t n) {
  if (n < 8) {
    for (int64_t i = 0; i < n; i++) {
      __asm__("" : "+r"(i));
      d[i] = s[i];
    }
    return;
  }
  for (int64_t i = 0; i + 8 <= n; i += 8) {
    __asm__("" : "+r"(i));
    *(v8u *)(d + i) = *(const v8u *)(s + i);
  }
  *(v8u *)(d + n - 8) = *(const v8u *)(s + n - 8); /* the tail, overlapping */
}

DG_INLINE void fill_floats(float *d, float v, int64_t n) {
  const v8u z = {v, v, v, v, v, v, v, v};
  if (n < 8) {
    for (int64_t i = 0; i < n; i++) {
      __asm__("" : "+r"(i));
      d[i] = v;
    }
    return;
  }
  for (int64_t i = 0; i + 8 <= n; i += 8) {
    __asm__("" : "+r"(i));
    *(v8u *)(d + i) = z;
  }
  *(v8u *)(d + n - 8) = z;
}

/* Where the plane's tap (kh, kw) lands in row (OH, OW) of col at stride 1
 * with OW == W (a "same" convolution): output row oh reads input row oh +
 * kh - p shifted by kw - p, so rows [*oh0, *oh1) read the plane, as one
 * flat run [*first, *last) of the row from input element *src; columns
 * [0, lo) and [hi, OW) of those rows read padding. 0: no element does. */
DG_INLINE int same_run(const dg__conv_geom *g, int64_t kh, int64_t kw, int64_t *oh0,
                       int64_t *oh1, int64_t *lo, int64_t *hi, int64_t *first, int64_t *last,
                       int64_t *src) {
  ow_range(g, kw, lo, hi);
  *oh0 = DG_MAX(g->p - kh, (int64_t)0), *oh1 = DG_MIN(g->H + g->p - kh, g->OH);
  if (*oh1 <= *oh0 || *hi <= *lo) return 0;
  *first = *oh0 * g->OW + *lo, *last = (*oh1 - 1) * g->OW + *hi;
  *src = (*oh0 + kh - g->p) * g->W + *lo + kw - g->p;
  return 1;
}

/* row (., OW): columns [0, lo) and [hi, OW) of rows [oh0, oh1) = v (a
 * padding column or two: stores, not a memset call per row). */
DG_INLINE void fill_edges(float *row, int64_t oh0, int64_t oh1, int64_t lo, int64_t hi,
                          int64_t OW, float v) {
  for (int64_t oh = oh0; oh < oh1; oh++) {
    fill_floats(row + oh * OW, v, lo);
    fill_floats(row + oh * OW + hi, v, OW - hi);
  }
}

DG_INLINE int is_same(const dg__conv_geom *g) { return g->s == 1 && g->OW == g->W; }

/* One row of col for tap (kh, kw) of channel plane xc (H, W) of a "same"
 * convolution: one flat copy of the run (rows of 14-28 floats one at a
 * time spent more in the loop's overhead than in the copy), then the
 * padding columns, which it filled from the neighbouring rows, zeroed. */
DG_INLINE void im2col_same(const dg__conv_geom *g, const float *restrict xc, int64_t kh,
                           int64_t kw, float *restrict row) {
  const int64_t OW = g->OW, L = g->OH * OW;
  int64_t oh0, oh1, lo, hi, first, last, src;
  if (!same_run(g, kh, kw, &oh0, &oh1, &lo, &hi, &first, &last, &src)) {
    fill_floats(row, 0.0f, L);
    return;
  }
  copy_floats(row + first, xc + src, last - first);
  fill_floats(row, 0.0f, first);
  fill_floats(row + last, 0.0f, L - last);
  fill_edges(row, oh0, oh1, lo, hi, OW, 0.0f);
}

/* col (C*KH*KW, OH*OW) from one image x (C, H, W); padding reads as zero. */
DG_INLINE void im2col_body(const dg__conv_geom *g, const float *restrict x,
                           float *restrict col) {
  const int64_t OW = g->OW, L = g->OH * OW, s = g->s;
  const int same = is_same(g);
  for (int64_t c = 0; c < g->C; c++)
    for (int64_t kh = 0; kh < g->KH; kh++)
      for (int64_t kw = 0; kw < g->KW; kw++) {
        float *restrict row = col + ((c * g->KH + kh) * g->KW + kw) * L; /* (OH, OW) */
        if (same) {
          im2col_same(g, x + c * g->H * g->W, kh, kw, row);
          continue;
        }
        int64_t lo, hi;
        ow_range(g, kw, &lo, &hi);
        for (int64_t oh = 0; oh < g->OH; oh++) {
          float *restrict d = row + oh * OW; /* (OW) */
          int64_t ih = oh * s - g->p + kh;
          if (ih < 0 || ih >= g->H) {
            fill_floats(d, 0.0f, OW);
            continue;
          }
          const float *restrict src = x + (c * g->H + ih) * g->W + kw - g->p; /* col ow*s */
          fill_floats(d, 0.0f, lo);
          if (s == 1)
            copy_floats(d + lo, src + lo, hi - lo);
          else
            for (int64_t ow = lo; ow < hi; ow++) d[ow] = src[ow * s];
          fill_floats(d + hi, 0.0f, OW - hi);
        }
      }
}
DG_SIMD_FN(im2col, (const dg__conv_geom *g, const float *x, float *col), (g, x, col))

/* dx (C, H, W) += col2im(dcol (C*KH*KW, OH*OW)); padding taps are dropped.
 * A "same" convolution's tap adds its run flat, as im2col copied it, after
 * setting dcol's padding columns (scratch) to -0: x + -0 is x for every x
 * (also -0 and a quiet NaN, rounding to nearest as dgrad runs), so the
 * elements they land on keep their bits, and every element gets the same
 * adds in the same order as row by row.
 * Compiled per SIMD level (one add per element: the same bits on each). */
DG_INLINE void col2im_add_body(const dg__conv_geom *g, float *restrict dcol,
                               float *restrict dx) {
  const int64_t OW = g->OW, L = g->OH * OW, s = g->s;
  const int same = is_same(g);
  for (int64_t c = 0; c < g->C; c++)
    for (int64_t kh = 0; kh < g->KH; kh++)
      for (int64_t kw = 0; kw < g->KW; kw++) {
        float *restrict row = dcol + ((c * g->KH + kh) * g->KW + kw) * L; /* (OH, OW) */
        int64_t oh0, oh1, lo, hi, first, last, src;
        if (same) {
          if (!same_run(g, kh, kw, &oh0, &oh1, &lo, &hi, &first, &last, &src)) continue;
          fill_edges(row, oh0, oh1, lo, hi, OW, -0.0f);
          float *restrict dst = dx + c * g->H * g->W + src;
          const float *restrict d = row + first;
          for (int64_t i = 0; i < last - first; i++) dst[i] += d[i];
          continue;
        }
        ow_range(g, kw, &lo, &hi);
        for (int64_t oh = 0; oh < g->OH; oh++) {
          int64_t ih = oh * s - g->p + kh;
          if (ih < 0 || ih >= g->H) continue;
          const float *restrict d = row + oh * OW;                  /* (OW) */
          float *restrict dst = dx + (c * g->H + ih) * g->W + kw - g->p; /* col ow*s */
          if (s == 1)
            for (int64_t ow = lo; ow < hi; ow++) dst[ow] += d[ow];
          else
            for (int64_t ow = lo; ow < hi; ow++) dst[ow * s] += d[ow];
        }
      }
}
DG_SIMD_FN(col2im_add, (const dg__conv_geom *g, float *dcol, float *dx), (g, dcol, dx))

/* Sum of p[0..n) in float lanes (vectorisable) folded into double. */
static double row_sum(const float *restrict p, int64_t n) {
  float acc[16] = {0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 16; k++) acc[k] += p[i + k];
  double s = 0;
  for (int k = 0; k < 16; k++) s += acc[k];
  for (; i < n; i++) s += p[i];
  return s;
}

static int is_pointwise(const dg__conv_geom *g) {
  return g->KH == 1 && g->KW == 1 && g->s == 1 && g->p == 0;
}

/* Images split over the pool: task t of nt runs images [N*t/nt, N*(t+1)/nt)
 * with its own column scratch; each image's GEMM runs single-threaded
 * inside the task, exactly as at 1 thread (same bits). */
typedef struct {
  const dg__conv_geom *g;
  const float *x, *w, *b, *dy; /* (N, C, H, W), (O, CK), (O), (N, O, L) */
  float *out;                  /* y (N, O, L) forward, dx (N, C, H, W) backward */
  float *cols;                 /* (nt, CK, L) scratch */
  int nt, acc;                 /* acc: dx accumulates (else stored) */
} conv_job;

/* Tasks for N images: one per thread, none when the pool would not help. */
static int conv_tasks(const dg__conv_geom *g) {
  int t = dg_get_num_threads();
  return (int)DG_MIN((int64_t)t, g->N);
}

static void image_range(const conv_job *j, int t, int64_t *lo, int64_t *hi) {
  *lo = j->g->N * t / j->nt, *hi = j->g->N * (t + 1) / j->nt;
}

/* y[i] (O, L) = w (O, CK) @ im2col(x[i]) + b for one image. */
static void forward_image(const conv_job *j, int64_t i, float *col) {
  const dg__conv_geom *g = j->g;
  const int64_t L = g->OH * g->OW, CK = g->C * g->KH * g->KW, O = g->O;
  float *yi = j->out + i * O * L; /* (O, L) */
  const float *c = j->x + i * g->C * g->H * g->W;
  if (col) im2col(g, c, col), c = col;
  if (j->b)
    for (int64_t o = 0; o < O; o++) {
      float bo = j->b[o], *r = yi + o * L;
      for (int64_t l = 0; l < L; l++) r[l] = bo;
    }
  dg__sgemm(0, 0, O, L, CK, 1.0f, j->w, CK, c, L, j->b ? 1.0f : 0.0f, yi, L);
}

/* dx[i] (+)= col2im(w^T @ dy[i]) for one image. */
static void dx_image(const conv_job *j, int64_t i, float *dcol) {
  const dg__conv_geom *g = j->g;
  const int64_t L = g->OH * g->OW, CK = g->C * g->KH * g->KW, O = g->O;
  const int64_t xs = g->C * g->H * g->W;
  const float *dyi = j->dy + i * O * L; /* (O, L) */
  if (!dcol) { /* pointwise: dx[i] is (CK, L) itself */
    dg__sgemm(1, 0, CK, L, O, 1.0f, j->w, CK, dyi, L, j->acc ? 1.0f : 0.0f, j->out + i * xs, L);
    return;
  }
  dg__sgemm(1, 0, CK, L, O, 1.0f, j->w, CK, dyi, L, 0.0f, dcol, L);
  if (!j->acc) memset(j->out + i * xs, 0, (size_t)xs * sizeof(float));
  col2im_add(g, dcol, j->out + i * xs);
}

static void forward_task(void *arg, int t) {
  const conv_job *j = arg;
  const int64_t CKL = j->g->C * j->g->KH * j->g->KW * j->g->OH * j->g->OW;
  int64_t lo, hi;
  image_range(j, t, &lo, &hi);
  for (int64_t i = lo; i < hi; i++) forward_image(j, i, j->cols ? j->cols + t * CKL : NULL);
}

static void dx_task(void *arg, int t) {
  const conv_job *j = arg;
  const int64_t CKL = j->g->C * j->g->KH * j->g->KW * j->g->OH * j->g->OW;
  int64_t lo, hi;
  image_range(j, t, &lo, &hi);
  for (int64_t i = lo; i < hi; i++) dx_image(j, i, j->cols ? j->cols + t * CKL : NULL);
}

static int64_t image_scratch(const dg__conv_geom *g) {
  if (is_pointwise(g)) return 0;
  return (int64_t)conv_tasks(g) * g->C * g->KH * g->KW * g->OH * g->OW;
}

/* The weight gradient's columns: one (CK, L) block per thread, so that a
 * group of images' columns is built in parallel (the products that sum
 * them stay in image order). */
static int64_t wb_scratch(const dg__conv_geom *g) {
  if (is_pointwise(g) || g->N == 0) return 0;
  return (int64_t)conv_tasks(g) * g->C * g->KH * g->KW * g->OH * g->OW;
}

/* Runs fn over the images: split over the pool by images when there are
 * several images and threads, else image by image on the caller (each
 * GEMM then splits over the pool by itself). Tasks are capped by the
 * columns the caller gave (one (CK, L) block each). */
static void run_images(conv_job *j, const dg__conv_args *a, dg__task_fn fn) {
  const dg__conv_geom *g = j->g;
  const int64_t CKL = g->C * g->KH * g->KW * g->OH * g->OW;
  j->nt = conv_tasks(g);
  if (j->nt < 1) return; /* no images */
  j->cols = NULL;
  if (!is_pointwise(g)) {
    j->cols = a->scratch;
    if (CKL > 0 && a->nscratch / CKL < j->nt) j->nt = (int)DG_MAX((int64_t)1, a->nscratch / CKL);
  }
  if (j->nt == 1) fn(j, 0);
  else dg__parallel_for(j->nt, fn, j);
}

static void cpu_conv_forward(const dg__conv_args *a) {
  conv_job j = {a->g, a->x, a->w, a->b, NULL, a->y, NULL, 0, 0};
  run_images(&j, a, forward_task);
}

static void cpu_conv_backward_x(const dg__conv_args *a) {
  conv_job j = {a->g, NULL, a->w, NULL, a->dy, a->dx, NULL, 0, a->accx};
  run_images(&j, a, dx_task);
}

/* im2col of images i0 + t, one task each, into block t of col. */
typedef struct {
  const dg__conv_geom *g;
  const float *x;
  float *col;
  int64_t i0, n;
} cols_job;

static void cols_task(void *arg, int t) {
  const cols_job *j = arg;
  const dg__conv_geom *g = j->g;
  const int64_t CKL = g->C * g->KH * g->KW * g->OH * g->OW;
  im2col(g, j->x + (j->i0 + t) * g->C * g->H * g->W, j->col + t * CKL);
}

static void cpu_conv_backward_wb(const dg__conv_args *a) {
  const dg__conv_geom *g = a->g;
  const int64_t L = g->OH * g->OW, CK = g->C * g->KH * g->KW, O = g->O;
  const int64_t xs = g->C * g->H * g->W;
  float *dw = a->dw, *db = a->db;
  const int ow = !a->accw, ob = !a->accb;
  if (g->N == 0) { /* no images: fresh gradients are zero */
    if (dw && ow) memset(dw, 0, (size_t)(O * CK) * sizeof *dw);
    if (db && ob) memset(db, 0, (size_t)O * sizeof *db);
    return;
  }
  /* columns of up to nt images at a time, built over the pool (they were
   * a serial tenth of the step on 2 threads), each (CK, L) */
  float *col = dw && !is_pointwise(g) ? a->scratch : NULL;
  int64_t nt = col ? DG_MAX((int64_t)1, DG_MIN((int64_t)conv_tasks(g), a->nscratch / (CK * L)))
                   : 1;
  cols_job cj = {g, a->x, col, 0, 0};
  for (int64_t i = 0; i < g->N; i++) {
    const float *dyi = a->dy + i * O * L; /* (O, L) */
    int first = i == 0;
    if (dw) {
      const float *c = a->x + i * xs;
      if (col) {
        if (i == cj.i0 + cj.n) { /* the next group's columns */
          cj.i0 = i, cj.n = DG_MIN(nt, g->N - i);
          dg__parallel_for((int)cj.n, cols_task, &cj);
        }
        c = col + (i - cj.i0) * CK * L;
      }
      dg__sgemm(0, 1, O, CK, L, 1.0f, dyi, L, c, L, first && ow ? 0.0f : 1.0f, dw, CK);
    }
    if (db) {
      if (first && ob)
        for (int64_t o = 0; o < O; o++) db[o] = (float)row_sum(dyi + o * L, L);
      else
        for (int64_t o = 0; o < O; o++) db[o] += (float)row_sum(dyi + o * L, L);
    }
  }
}

const struct dg__kern_conv dg__cpu_kern_conv = {
    .image_scratch = image_scratch,
    .wb_scratch = wb_scratch,
    .forward = cpu_conv_forward,
    .backward_wb = cpu_conv_backward_wb,
    .backward_x = cpu_conv_backward_x,
};
