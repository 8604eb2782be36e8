/* Dense linear-algebra kernels shared by the op families that multiply
 * matrices (ops/matmul.c, ops/mlp.c; the conv and attention kernels use
 * their backend's GEMM directly). Row-major, on raw pointers. Not API. */
#ifndef DG_KERN_BLAS_H
#define DG_KERN_BLAS_H

#include <stdint.h>

/* What dg__kern_blas.sgemm_add adds to a product and selects before
 * storing it: C = op(A) op(B) + res + bias, then C = C < 0 ? 0 : C where
 * relu, then C = mask > 0 ? C : 0 where mask is given (the relu op's
 * backward: mask is the ReLU's output). res and mask are (M, N) at C's row
 * stride, bias (N) is added to every row; NULL: none. */
typedef struct {
  const float *res, *bias, *mask;
  int relu;
} dg__gemm_epi;

struct dg__kern_blas {
  /* C(M,N) = alpha * op(A)(M,K) op(B)(K,N) + beta * C, row-major; lda, ldb,
   * ldc are the stored row lengths; ta/tb: op is the transpose. beta 0
   * overwrites C (its old contents are not read). */
  void (*sgemm)(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
  /* db(O) (+)= column sums of dy(R, O); overwrite: store, do not add (R 0:
   * zeros). */
  void (*colsum)(float *db, const float *dy, int64_t R, int64_t O, int overwrite);
  /* dz (R, O) = y > 0 ? dy : 0, and db (O) (+)= dz's column sums with
   * colsum's bits where db is not NULL (overwrite as colsum's). */
  void (*relu_colsum)(float *dz, const float *dy, const float *y, float *db, int64_t R,
                      int64_t O, int overwrite);
  /* C(M,N) = op(A) op(B) through the epilogue e (C is overwritten where
   * e has no res or bias). The bits of fill_rows, sgemm with beta 1 and the
   * relu kernel's forward and backward, without necessarily the fill or the
   * passes. */
  void (*sgemm_add)(int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A,
                    int64_t lda, const float *B, int64_t ldb, const dg__gemm_epi *e, float *C,
                    int64_t ldc);
  /* y (R, O) = res + b per row, before a GEMM accumulates (beta 1); res or b
   * may be NULL (both: nothing is written). */
  void (*fill_rows)(float *y, const float *res, const float *b, int64_t R, int64_t O);
  /* d (n) = s, or += s when acc: a gradient passed through. */
  void (*grad_pass)(float *d, const float *s, int64_t n, int acc);
  /* 1 when this backend's products can be lent to a waiting rank's core
   * (base/lend.c); DDP starts the lend worker only then. May be NULL. */
  int (*can_lend)(void);
};

#endif
