/* Kernels of the element-wise binary family (ops/binary.c). Not API. */
#ifndef DG_KERN_BINARY_H
#define DG_KERN_BINARY_H

#include <stdint.h>

/* Row kinds: forward ops, then per-element gradients with d = dL/dout. */
enum {
  DG_BIN_ADD, DG_BIN_SUB, DG_BIN_MUL, DG_BIN_DIV, /* o = a op b */
  DG_BIN_GMUL_A,                                  /* d * b          (dL/da of a*b) */
  DG_BIN_GMUL_B,                                  /* d * a          (dL/db of a*b) */
  DG_BIN_GDIV_A,                                  /* d / b          (dL/da of a/b) */
  DG_BIN_GDIV_B                                   /* -d * a / b^2   (dL/db of a/b) */
};

/* A broadcast iteration plan (built by the op): the output as up to 4
 * merged dims, outermost first, and each operand's strides along them in
 * elements (0: broadcast). Dims of size 1 are dropped and adjacent dims
 * merged wherever every operand is linear across them, so the common
 * cases are one or two dims with rows of stride 1 or 0. */
typedef struct {
  int nd;             /* merged dims, 1..4 (sizes > 1, except a lone 1) */
  int64_t n[4];       /* sizes, outermost first; unused outer dims are 1 */
  int64_t s[2][4];    /* operand strides in elements; 0 = broadcast */
  int64_t total;      /* output elements */
} dg__bplan;

/* o [+]= f(a, b, d) over the plan's output elements: a and b read through
 * the plan's strides, d and o contiguous in the output's shape. */
typedef struct {
  const dg__bplan *p;
  int kind, acc;        /* DG_BIN_*; acc: 1 adds into o, 0 stores */
  const float *a, *b, *d; /* d: NULL for the forward kinds */
  float *o;
} dg__binary_args;

/* gx (x's shape, contiguous) [+]= scale * g (the output's shape,
 * contiguous) summed over the dims along which x was broadcast. */
typedef struct {
  const dg__bplan *p; /* the output's plan with x (contiguous strides) as operand 0 */
  const float *g;
  float *gx;          /* (nx) */
  int64_t nx;
  float scale;
  int acc;            /* 0 stores into a fresh gradient, 1 adds */
  double *work;       /* (nx) host scratch */
} dg__bsum_args;

struct dg__kern_binary {
  void (*run)(const dg__binary_args *a);
  void (*reduce)(const dg__bsum_args *a);
};

#endif
