/* Kernels of the element-wise unary family (ops/unary.c). Not API. */
#ifndef DG_KERN_UNARY_H
#define DG_KERN_UNARY_H

#include <stdint.h>

typedef enum {
  DG_UNARY_RELU,
  DG_UNARY_GELU, /* tanh form, torch's approximate='tanh' */
  DG_UNARY_TANH,
  DG_UNARY_SIGMOID,
  DG_UNARY_EXP,
  DG_UNARY_LOG,
  DG_UNARY_LEAKY_RELU /* x > 0 ? x : alpha x */
} dg__unary_kind;

/* n contiguous elements. Backward reads the saved tensor s in x: the
 * output for relu, tanh, sigmoid and exp, the input for gelu, log and
 * leaky_relu. */
typedef struct {
  dg__unary_kind kind;
  int acc;             /* backward: 0 stores into a fresh gradient, 1 adds */
  const float *x, *dy; /* x: input (forward) or s (backward); dy: (n) backward */
  float *y;            /* output (forward) or dx (backward) */
  int64_t n;
  float alpha;         /* leaky_relu: the slope below 0 */
} dg__unary_args;

struct dg__kern_unary {
  /* y = f(x) */
  void (*fwd)(const dg__unary_args *a);
  /* dx (+)= dy * f'(x), f' expressed through s */
  void (*bwd)(const dg__unary_args *a);
};

#endif
