/* Kernels of the fused attention family (ops/attention.c). Not API. */
#ifndef DG_KERN_ATTENTION_H
#define DG_KERN_ATTENTION_H

#include <stdint.h>

/* Multi-head self-attention over qkv (B, T, 3C): H heads of hd = C / H;
 * q, k, v of head h are the (T, hd) column blocks at h*hd, C + h*hd and
 * 2C + h*hd (row stride 3C). */
typedef struct {
  int64_t B, T, C, H;
  int causal;
  float scale;
  const float *qkv; /* (B, T, 3C) */
  float *y;         /* forward: (B, T, C) */
  float *P;         /* (B, H, T, T) softmax: written by forward (NULL: not kept),
                     * read by backward */
  const float *dy;  /* backward: (B, T, C) */
  float *dqkv;      /* backward: (B, T, 3C) */
  int acc;          /* backward: 0 stores into a fresh dqkv, 1 adds */
  float *scratch;   /* the floats `scratch` asked for */
  int64_t nscratch;
} dg__att_args;

struct dg__kern_attention {
  /* floats of scratch forward (with_tt 0 when it keeps P, 1 when not) and
   * backward (with_tt 1) need, for heads of hd; 0: none */
  int64_t (*scratch)(int64_t B, int64_t H, int64_t T, int64_t hd, int with_tt);
  void (*forward)(const dg__att_args *a);
  void (*backward)(const dg__att_args *a);
};

#endif
