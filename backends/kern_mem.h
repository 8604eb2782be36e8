/* Core's own loops on a device's memory: zeroing and filling, strided and
 * converting copies (contiguous packing, dtype conversion, tensor copies,
 * gradient seeding and zeroing). core/ and autograd/ reach device memory
 * only through these and the backend's copy. Not API. */
#ifndef DG_KERN_MEM_H
#define DG_KERN_MEM_H

#include <stddef.h>
#include <stdint.h>

#include "dgrad/common.h"

/* Most dims a copy may have (at least the tensors' DG_MAX_DIMS). */
#define DG__MEM_MAX_DIMS 8

/* n elements in logical (row-major) order of `shape`: element i of src at
 * its strides, converted from sdt to ddt, into element i of dst at its
 * strides. A NULL stride means contiguous. Both on the backend's device. */
typedef struct {
  void *dst;
  const void *src;
  dg_dtype ddt, sdt;
  int ndim;
  const int64_t *shape, *dstride, *sstride; /* in elements */
} dg__mem_copy_args;

struct dg__kern_mem {
  void (*zero)(void *p, size_t bytes);
  void (*fill_f32)(float *p, int64_t n, float v);
  /* y[i] += x ? x[i] : 1 (seeding a backward's output gradient) */
  void (*add_f32)(float *y, const float *x, int64_t n);
  void (*copy)(const dg__mem_copy_args *a);
};

#endif
