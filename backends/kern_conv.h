/* Kernels of the convolution family (ops/conv.c). Not API. */
#ifndef DG_KERN_CONV_H
#define DG_KERN_CONV_H

#include <stdint.h>

/* conv2d geometry, NCHW: x (N, C, H, W), w (O, C, KH, KW), y (N, O, OH, OW);
 * stride s, zero padding p. */
typedef struct {
  int64_t N, C, H, W, O, KH, KW, OH, OW, s, p;
} dg__conv_geom;

typedef struct {
  const dg__conv_geom *g;
  const float *x, *w, *b, *dy; /* (N, C, H, W), (O, C*KH*KW), (O) or NULL, (N, O, OH*OW) */
  float *y;                    /* forward: (N, O, OH*OW) */
  float *dx, *dw, *db;         /* backward, each NULL when not wanted */
  int accx, accw, accb;        /* backward: 0 stores into a fresh gradient, 1 adds */
  float *scratch;              /* the floats the matching *_scratch query asked for */
  int64_t nscratch;
} dg__conv_args;

struct dg__kern_conv {
  /* floats of scratch forward and backward_x need (0: none) */
  int64_t (*image_scratch)(const dg__conv_geom *g);
  /* floats of scratch backward_wb needs with dw wanted (0: none) */
  int64_t (*wb_scratch)(const dg__conv_geom *g);
  /* y = w @ im2col(x) + b */
  void (*forward)(const dg__conv_args *a);
  /* dw, db (each when non-NULL): sums over the images, in order */
  void (*backward_wb)(const dg__conv_args *a);
  /* dx = col2im(w^T @ dy) */
  void (*backward_x)(const dg__conv_args *a);
};

#endif
