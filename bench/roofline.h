/* The GEMM roofline of a training step: OpenBLAS sgemm timed alone on the
 * step's own GEMM shapes (forward and backward), on the step's thread count.
 * A step cannot be faster than its GEMMs run back to back, so
 *   roofline_pct = 100 * (sgemm seconds for the step's GEMMs) / (step seconds)
 * which equals the step's GEMM FLOP rate as a share of sgemm's FLOP rate on
 * those shapes. Built with OpenBLAS only (BENCH_OPENBLAS); elsewhere
 * roofline_measure returns -1 and the benchmarks print null. */
#ifndef DG_BENCH_ROOFLINE_H
#define DG_BENCH_ROOFLINE_H

#include <stdint.h>

/* C(M,N) = op(A) op(B), row-major, op = transpose when ta / tb; `count`
 * such products per step (heads x batch for attention). */
typedef struct {
  int ta, tb;
  int64_t M, N, K;
  int64_t count;
} rl_gemm;

/* The GEMMs of a linear layer y (rows, out) = x (rows, in) W^T: forward,
 * dW = dy^T x and, when need_dx, dx = dy W. Appends to g[*n] (room for 3). */
void rl_linear(rl_gemm *g, int *n, int64_t rows, int64_t in, int64_t out, int need_dx);

/* The GEMMs of an MLP step over dims[0..layers]: every layer's forward and
 * weight gradient, the input gradient of all but the first (x needs none).
 * Appends to g[*n] (room for 3 * layers). */
void rl_mlp(rl_gemm *g, int *n, int64_t rows, const int64_t *dims, int layers);

/* The GEMMs of a conv2d layer as the CPU backend runs them (im2col, one
 * image at a time; backends/cpu/conv.c) over N images (C, H, W) with O
 * k x k filters: per image y = w col, dw += dy col^T and, when need_dx,
 * dcol = w^T dy. Appends to g[*n] (room for 3). */
void rl_conv(rl_gemm *g, int *n, int64_t N, int64_t C, int64_t H, int64_t W, int64_t O,
             int64_t k, int64_t stride, int64_t pad, int need_dx);

/* The GEMMs of a step of examples/transformer's model at batch B (bench/gpt.c):
 * the linear layers, attention's six (T, T, head dim) products per (batch,
 * head) counted at half (causal), the head. Writes g (room for 64); returns
 * their number, or -1 when heads do not divide dim. */
int rl_gpt(rl_gemm *g, int64_t B, int64_t layers, int64_t heads, int64_t dim, int64_t context,
           int64_t vocab);

typedef struct {
  double flop;    /* GEMM FLOP of one step (2 M N K per product) */
  double sgemm_s; /* OpenBLAS's time for them, seconds */
  double gflops;  /* flop / sgemm_s / 1e9 */
} rl_result;

/* Times each shape (best of a few rounds, ~min_ms in all) on 1 OpenBLAS
 * thread and, for threads > 1, on `threads`; a shape's roofline time is the
 * faster of the latter and the 1-thread time / threads (perfect scaling: a
 * ceiling no split of the 1-thread kernel passes). Puts OpenBLAS back to
 * the thread count it had.
 * Returns 0, or -1 without OpenBLAS or on allocation failure. */
int roofline_measure(const rl_gemm *g, int n, int threads, double min_ms, rl_result *out);

/* Appends ,"gemm_gflop_per_step":..,"sgemm_gflops":..,"step_gflops":..,
 * "roofline_pct":.. (nulls when r is NULL) for a step of step_s seconds. */
void roofline_print_json(const rl_result *r, double step_s);

#endif
