/* The CPU backend: host memory through the user's allocator hook, memcpy,
 * and the kernel tables of backends/cpu/. */
#include <string.h>

#include "backends/backend.h"
#include "backends/cpu/cpu_impl.h"

/* DG_ALIGN-aligned blocks through the user's allocator hook: aligned by
 * hand, the original pointer kept just below the block. */
static void *cpu_raw_alloc(int dev, size_t bytes) {
  (void)dev;
  char *raw = dg__malloc(bytes + DG_CPU_ALIGN);
  if (!raw) return NULL;
  char *al = (char *)(((uintptr_t)raw + DG_CPU_ALIGN) & ~(uintptr_t)(DG_CPU_ALIGN - 1));
  ((void **)al)[-1] = raw;
  return al;
}

static void cpu_raw_free(int dev, void *p, size_t bytes) {
  (void)dev, (void)bytes;
  if (p) dg__free(((void **)p)[-1]);
}

static int cpu_copy(void *dst, int ddev, const void *src, int sdev, size_t bytes) {
  if (ddev != DG_CPU || sdev != DG_CPU) return DG_EDEVICE;
  if (bytes) memmove(dst, src, bytes);
  return DG_OK;
}

const dg__backend dg__cpu_backend = {
    .name = "cpu",
    .raw_alloc = cpu_raw_alloc,
    .raw_free = cpu_raw_free,
    .copy = cpu_copy,
    /* kernel tables (one line per family, filled as families move here) */
    .mem = &dg__cpu_kern_mem,
    .norm = &dg__cpu_kern_norm,
    .batchnorm = &dg__cpu_kern_batchnorm,
    .optim = &dg__cpu_kern_optim,
    .mlp = &dg__cpu_kern_mlp,
    .attention = &dg__cpu_kern_attention,
    .conv = &dg__cpu_kern_conv,
    .view = &dg__cpu_kern_view,
    .concat = &dg__cpu_kern_concat,
    .pool = &dg__cpu_kern_pool,
    .mask = &dg__cpu_kern_mask,
    .dropout = &dg__cpu_kern_dropout,
    .embedding = &dg__cpu_kern_embedding,
    .unary = &dg__cpu_kern_unary,
    .reduce = &dg__cpu_kern_reduce,
    .softmax = &dg__cpu_kern_softmax,
    .loss = &dg__cpu_kern_loss,
    .binary = &dg__cpu_kern_binary,
    .blas = &dg__cpu_kern_blas,
};
