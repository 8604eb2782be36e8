/* The device seam. Every op reaches its kernels through the backend of its
 * inputs' device (dg__op_begin in core picks it and refuses a mismatch),
 * core allocates device memory through it, and optimizers step through it.
 * A backend is a table: device memory and copies, then one table of kernels
 * per op family (backends/kern_*.h), each kernel on raw pointers and sizes
 * (no tensors, no tape, no context). The CPU backend (backends/cpu/) is the
 * first; a CUDA backend is new files filling the same tables. Not API. */
#ifndef DG_BACKEND_H
#define DG_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "dgrad/common.h"

struct dg__kern_mem;
struct dg__kern_blas;
struct dg__kern_norm;
struct dg__kern_batchnorm;
struct dg__kern_unary;
struct dg__kern_binary;
struct dg__kern_reduce;
struct dg__kern_softmax;
struct dg__kern_loss;
struct dg__kern_embedding;
struct dg__kern_dropout;
struct dg__kern_mask;
struct dg__kern_concat;
struct dg__kern_view;
struct dg__kern_conv;
struct dg__kern_pool;
struct dg__kern_attention;
struct dg__kern_mlp;
struct dg__kern_optim;

typedef struct dg__backend {
  const char *name; /* "cpu", "cuda" */
  /* Raw device memory: core's caching allocator (core/alloc.c) sits on top,
   * so these are called only when its cache has no block of the size. */
  void *(*raw_alloc)(int dev, size_t bytes);
  void (*raw_free)(int dev, void *p, size_t bytes);
  /* bytes from src on device sdev to dst on device ddev; one of the two is
   * this backend's device, the other this device or DG_CPU */
  int (*copy)(void *dst, int ddev, const void *src, int sdev, size_t bytes);
  /* core's own loops on this device's memory (backends/kern_mem.h) */
  const struct dg__kern_mem *mem;
  /* kernel tables, one per op family: a backend fills every one */
  const struct dg__kern_blas *blas;
  const struct dg__kern_norm *norm;
  const struct dg__kern_batchnorm *batchnorm;
  const struct dg__kern_unary *unary;
  const struct dg__kern_binary *binary;
  const struct dg__kern_reduce *reduce;
  const struct dg__kern_softmax *softmax;
  const struct dg__kern_loss *loss;
  const struct dg__kern_embedding *embedding;
  const struct dg__kern_dropout *dropout;
  const struct dg__kern_mask *mask;
  const struct dg__kern_concat *concat;
  const struct dg__kern_view *view;
  const struct dg__kern_conv *conv;
  const struct dg__kern_pool *pool;
  const struct dg__kern_attention *attention;
  const struct dg__kern_mlp *mlp;
  const struct dg__kern_optim *optim;
} dg__backend;

/* Devices a build can address: the CPU and up to 8 CUDA devices. */
#define DG__MAX_DEVICES 9

/* The backend serving `device` (DG_CPU, DG_CUDA + n), or NULL when this
 * build has none for it. */
const dg__backend *dg__backend_get(int device);
/* Serves `device` (not the CPU) with `be`, or stops serving it (NULL).
 * Called before any tensor lives on the device; not thread-safe against
 * running ops. DG_EINVAL for the CPU or a device out of range. */
int dg__backend_register(int device, const dg__backend *be);
/* Name of a device for messages: "cpu", "cuda:0". */
const char *dg__device_name(int device, char *buf, size_t cap);

/* The CPU backend (backends/cpu/cpu_backend.c). */
extern const dg__backend dg__cpu_backend;

#endif
