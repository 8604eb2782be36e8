/* conv2d (NCHW), forward and backward, by im2col + GEMM, one image at a time.
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
 * run image by image in order with each dw GEMM split over the pool. Fresh
 * gradients are stored (GEMM beta 0 for the first image), not zeroed. */
#include <string.h>

#include "core/core_impl.h"
#include "backends/cpu/cpu_impl.h"

typedef struct {
  int64_t N, C, H, W, O, KH, KW, OH, OW, s, p;
} conv_geom;

/* Output columns ow in [lo, hi) read input columns inside [0, W) for kernel
 * column kw; the rest read padding. */
static void ow_range(const conv_geom *g, int64_t kw, int64_t *lo, int64_t *hi) {
  int64_t a = g->p - kw; /* need ow*s >= a */
  int64_t l = a <= 0 ? 0 : (a + g->s - 1) / g->s;
  int64_t b = g->W - 1 + g->p - kw; /* need ow*s <= b */
  int64_t h = b < 0 ? 0 : b / g->s + 1;
  if (h > g->OW) h = g->OW;
  if (l > h) l = h;
  *lo = l, *hi = h;
}

/* col (C*KH*KW, OH*OW) from one image x (C, H, W); padding reads as zero. */
static void im2col(const conv_geom *g, const float *restrict x, float *restrict col) {
  const int64_t OW = g->OW, L = g->OH * OW, s = g->s;
  for (int64_t c = 0; c < g->C; c++)
    for (int64_t kh = 0; kh < g->KH; kh++)
      for (int64_t kw = 0; kw < g->KW; kw++) {
        float *restrict row = col + ((c * g->KH + kh) * g->KW + kw) * L; /* (OH, OW) */
        int64_t lo, hi;
        ow_range(g, kw, &lo, &hi);
        for (int64_t oh = 0; oh < g->OH; oh++) {
          float *restrict d = row + oh * OW; /* (OW) */
          int64_t ih = oh * s - g->p + kh;
          if (ih < 0 || ih >= g->H) {
            memset(d, 0, (size_t)OW * sizeof(float));
            continue;
          }
          const float *restrict src = x + (c * g->H + ih) * g->W + kw - g->p; /* col ow*s */
          for (int64_t ow = 0; ow < lo; ow++) d[ow] = 0.0f;
          if (s == 1)
            for (int64_t ow = lo; ow < hi; ow++) d[ow] = src[ow];
          else
            for (int64_t ow = lo; ow < hi; ow++) d[ow] = src[ow * s];
          for (int64_t ow = hi; ow < OW; ow++) d[ow] = 0.0f;
        }
      }
}

/* dx (C, H, W) += col2im(dcol (C*KH*KW, OH*OW)); padding taps are dropped. */
static void col2im_add(const conv_geom *g, const float *restrict dcol, float *restrict dx) {
  const int64_t OW = g->OW, L = g->OH * OW, s = g->s;
  for (int64_t c = 0; c < g->C; c++)
    for (int64_t kh = 0; kh < g->KH; kh++)
      for (int64_t kw = 0; kw < g->KW; kw++) {
        const float *restrict row = dcol + ((c * g->KH + kh) * g->KW + kw) * L; /* (OH, OW) */
        int64_t lo, hi;
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

static int is_pointwise(const conv_geom *g) {
  return g->KH == 1 && g->KW == 1 && g->s == 1 && g->p == 0;
}

/* Images split over the pool: task t of nt runs images [N*t/nt, N*(t+1)/nt)
 * with its own column scratch; each image's GEMM runs single-threaded
 * inside the task, exactly as at 1 thread (same bits). */
typedef struct {
  const conv_geom *g;
  const float *x, *w, *b, *dy; /* (N, C, H, W), (O, CK), (O), (N, O, L) */
  float *out;                  /* y (N, O, L) forward, dx (N, C, H, W) backward */
  float *cols;                 /* (nt, CK, L) scratch */
  int nt, acc;                 /* acc: dx accumulates (else stored) */
} conv_job;

/* Tasks for N images: one per thread, none when the pool would not help. */
static int conv_tasks(const conv_geom *g) {
  int t = dg_get_num_threads();
  return (int)DG_MIN((int64_t)t, g->N);
}

static void image_range(const conv_job *j, int t, int64_t *lo, int64_t *hi) {
  *lo = j->g->N * t / j->nt, *hi = j->g->N * (t + 1) / j->nt;
}

/* y[i] (O, L) = w (O, CK) @ im2col(x[i]) + b for one image. */
static void forward_image(const conv_job *j, int64_t i, float *col) {
  const conv_geom *g = j->g;
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
  const conv_geom *g = j->g;
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

/* Runs fn over the images: split over the pool by images when there are
 * several images and threads, else image by image on the caller (each
 * GEMM then splits over the pool by itself). */
static int run_images(dg_ctx *ctx, conv_job *j, dg__task_fn fn) {
  const conv_geom *g = j->g;
  const int64_t CKL = g->C * g->KH * g->KW * g->OH * g->OW;
  j->nt = conv_tasks(g);
  if (j->nt < 1) return DG_OK; /* no images */
  j->cols = NULL;
  if (!is_pointwise(g)) {
    j->cols = dg__arena_alloc(&ctx->arena, (size_t)(j->nt * CKL) * sizeof(float));
    if (!j->cols) return dg__set_error(ctx, DG_ENOMEM, "conv2d: out of memory for columns");
  }
  if (j->nt == 1) fn(j, 0);
  else dg__parallel_for(j->nt, fn, j);
  return DG_OK;
}

static int conv_backward(dg_ctx *ctx, dg_node *n) {
  const conv_geom *g = n->extra;
  dg_tensor *sx = dg__saved(ctx, n, 0), *sw = dg__saved(ctx, n, 1);
  if (!sx || !sw) return ctx->err;
  int ox, ow, ob = 0;
  float *dx = dg__grad_buf_w(ctx, n->in[0], &ox), *dw = dg__grad_buf_w(ctx, n->in[1], &ow);
  float *db = n->nin > 2 ? dg__grad_buf_w(ctx, n->in[2], &ob) : NULL;
  if (ctx->err) return ctx->err;
  const int64_t L = g->OH * g->OW, CK = g->C * g->KH * g->KW, O = g->O;
  const int64_t xs = g->C * g->H * g->W;
  const float *dy = n->out->grad->data; /* (N, O, L) */
  const float *xp = dw ? dg__contig_data(ctx, "conv2d backward", sx) : NULL; /* (N, C, H, W) */
  const float *wp = dx ? dg__contig_data(ctx, "conv2d backward", sw) : NULL; /* (O, CK) */
  if ((dw && !xp) || (dx && !wp)) return ctx->err;
  if (g->N == 0) { /* no images: fresh gradients are zero */
    if (dw && ow) memset(dw, 0, (size_t)(O * CK) * sizeof *dw);
    if (db && ob) memset(db, 0, (size_t)O * sizeof *db);
    return DG_OK;
  }
  if (dw || db) { /* sums over the images, in order */
    float *col = NULL; /* (CK, L) */
    if (dw && !is_pointwise(g)) {
      col = dg__arena_alloc(&ctx->arena, (size_t)(CK * L) * sizeof(float));
      if (!col) return dg__set_error(ctx, DG_ENOMEM, "conv2d backward: out of memory for columns");
    }
    for (int64_t i = 0; i < g->N; i++) {
      const float *dyi = dy + i * O * L; /* (O, L) */
      int first = i == 0;
      if (dw) {
        const float *c = xp + i * xs;
        if (col) im2col(g, c, col), c = col;
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
  if (dx) {
    conv_job j = {g, NULL, wp, NULL, dy, dx, NULL, 0, !ox};
    if (run_images(ctx, &j, dx_task)) return ctx->err;
  }
  return DG_OK;
}

/* Validates and fills g; records the error naming the shapes, stride and pad. */
static int conv_check(dg_ctx *ctx, dg_tensor *x, dg_tensor *w, dg_tensor *b, int stride,
                      int pad, conv_geom *g) {
  if (!dg__check_f32(ctx, "conv2d", "x", x) || !dg__check_f32(ctx, "conv2d", "w", w) ||
      (b && !dg__check_f32(ctx, "conv2d", "b", b)))
    return ctx->err;
  char sx[96], sw[96], sb[96];
  const char *why = NULL;
  if (x->ndim != 4 || w->ndim != 4) why = "x and w must be 4-d";
  else if (w->shape[1] != x->shape[1]) why = "channels of x and w differ";
  else if (b && (b->ndim != 1 || b->shape[0] != w->shape[0])) why = "b must be (O)";
  else if (stride < 1 || pad < 0) why = "need stride >= 1 and pad >= 0";
  else if (w->shape[2] < 1 || w->shape[3] < 1 || x->shape[2] + 2 * (int64_t)pad < w->shape[2] ||
           x->shape[3] + 2 * (int64_t)pad < w->shape[3])
    why = "kernel larger than the padded input";
  if (why)
    return dg__set_error(ctx, DG_ESHAPE, "conv2d: %s: x %s, w %s, b %s, stride %d, pad %d", why,
                         dg__shape_str(x, sx, sizeof sx), dg__shape_str(w, sw, sizeof sw),
                         b ? dg__shape_str(b, sb, sizeof sb) : "none", stride, pad);
  g->N = x->shape[0], g->C = x->shape[1], g->H = x->shape[2], g->W = x->shape[3];
  g->O = w->shape[0], g->KH = w->shape[2], g->KW = w->shape[3];
  g->s = stride, g->p = pad;
  g->OH = (g->H + 2 * g->p - g->KH) / g->s + 1;
  g->OW = (g->W + 2 * g->p - g->KW) / g->s + 1;
  return DG_OK;
}

/* y (N, O, L) = w (O, CK) @ im2col(x[n]) + b, image by image. */
static int conv_forward(dg_ctx *ctx, const conv_geom *g, const float *xp, const float *wp,
                        const float *bp, float *yp) {
  conv_job j = {g, xp, wp, bp, NULL, yp, NULL, 0, 0};
  return run_images(ctx, &j, forward_task);
}

dg_tensor *dg_conv2d(dg_ctx *ctx, dg_tensor *x, dg_tensor *w, dg_tensor *b, int stride,
                     int pad) {
  if (!ctx || dg__null_input(ctx, "conv2d", "x", x) || dg__null_input(ctx, "conv2d", "w", w))
    return NULL;
  conv_geom g = {0};
  if (conv_check(ctx, x, w, b, stride, pad, &g)) return NULL;
  int64_t shape[4] = {g.N, g.O, g.OH, g.OW};
  dg_tensor *y = dg__new(ctx, "conv2d", DG_F32, 4, shape);
  const float *xp = y ? dg__contig_data(ctx, "conv2d", x) : NULL; /* (N, C, H, W) */
  const float *wp = xp ? dg__contig_data(ctx, "conv2d", w) : NULL; /* (O, C, KH, KW) */
  const float *bp = wp && b ? dg__contig_data(ctx, "conv2d", b) : NULL; /* (O) */
  if (!wp || (b && !bp)) return NULL;
  if (conv_forward(ctx, &g, xp, wp, bp, y->data)) return NULL;
  dg_tensor *in[3] = {x, w, b};
  if (dg__needs_grad(ctx, 3, in)) {
    dg_node *n = dg__record(ctx, "conv2d", conv_backward, y, b ? 3 : 2, in);
    conv_geom *ge = n ? dg__arena_alloc(&ctx->arena, sizeof *ge) : NULL;
    if (!ge) {
      if (n) dg__set_error(ctx, DG_ENOMEM, "conv2d: out of memory");
      return NULL;
    }
    *ge = g;
    n->extra = ge;
    if (dg__save(ctx, n, x) || dg__save(ctx, n, w)) return NULL;
  }
  return y;
}
