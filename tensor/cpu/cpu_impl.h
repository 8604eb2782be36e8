/* CPU kernels shared between op files. Not API. */
#ifndef DG_CPU_IMPL_H
#define DG_CPU_IMPL_H

#include <stdint.h>

#include "tensor/tensor_impl.h"

/* Row-major C(M,N) = alpha * op(A)(M,K) op(B)(K,N) + beta * C; lda/ldb/ldc are
 * the stored row lengths. */
void dg__sgemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
               int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);

#endif
