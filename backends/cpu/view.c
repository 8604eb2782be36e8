/* View backward kernels of the CPU backend (the op: ops/view.c): a view's
 * gradient copied (fresh input gradient) or added back into its input's. */
#include <string.h>

#include "backends/cpu/cpu_impl.h"
#include "backends/kern_view.h"

/* d (n) += s (n), or d = s when store. */
static void add_or_copy(int store, float *restrict d, const float *restrict s, int64_t n) {
  if (store) memcpy(d, s, (size_t)n * sizeof *d);
  else for (int64_t i = 0; i < n; i++) d[i] += s[i];
}

static void cpu_range_bwd(const dg__view_range_args *a) {
  float *dx = a->dx;
  if (a->store && (a->lo || a->nx != a->n)) { /* fresh: zero outside the range */
    memset(dx, 0, (size_t)a->lo * sizeof *dx);
    memset(dx + a->lo + a->n, 0, (size_t)(a->nx - a->lo - a->n) * sizeof *dx);
  }
  add_or_copy(a->store, dx + a->lo, a->dy, a->n);
}

static int64_t numel(int nd, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < nd; i++) n *= shape[i];
  return n;
}

/* dst at strides st = g (contiguous in shape sh); every element of dst is
 * written (a permutation of dst's dims). Rows when the last dim is
 * contiguous. */
static void strided_store(int nd, const int64_t *sh, const int64_t *st, float *dst,
                          const float *g) {
  int64_t n = numel(nd, sh), idx[DG__VIEW_MAX_DIMS] = {0};
  int rows = nd >= 1 && st[nd - 1] == 1;
  int64_t len = rows ? sh[nd - 1] : 1;
  for (int64_t k = 0; k < n; k += len) {
    int64_t off = 0;
    for (int i = 0; i < nd - rows; i++) off += idx[i] * st[i];
    if (rows) memcpy(dst + off, g + k, (size_t)len * sizeof *dst);
    else dst[off] = g[k];
    for (int i = nd - rows - 1; i >= 0; i--) {
      if (++idx[i] < sh[i]) break;
      idx[i] = 0;
    }
  }
}

/* Scatter-add g (contiguous in shape sh) into dst at strides st. */
static void strided_add(int nd, const int64_t *sh, const int64_t *st, float *dst,
                        const float *g) {
  int64_t n = numel(nd, sh), idx[DG__VIEW_MAX_DIMS] = {0};
  if (nd >= 2 && st[nd - 1] == 1) { /* contiguous rows: vector adds */
    int64_t len = sh[nd - 1];
    for (int64_t k = 0; k < n; k += len) {
      int64_t off = 0;
      for (int i = 0; i < nd - 1; i++) off += idx[i] * st[i];
      float *restrict dr = dst + off;
      const float *restrict gr = g + k;
      for (int64_t j = 0; j < len; j++) dr[j] += gr[j];
      for (int i = nd - 2; i >= 0; i--) {
        if (++idx[i] < sh[i]) break;
        idx[i] = 0;
      }
    }
    return;
  }
  for (int64_t k = 0; k < n; k++) {
    int64_t off = 0;
    for (int i = 0; i < nd; i++) off += idx[i] * st[i];
    dst[off] += g[k];
    for (int i = nd - 1; i >= 0; i--) {
      if (++idx[i] < sh[i]) break;
      idx[i] = 0;
    }
  }
}

static void cpu_strided_bwd(const dg__view_strided_args *a) {
  if (a->store) strided_store(a->ndim, a->shape, a->stride, a->dx, a->dy);
  else strided_add(a->ndim, a->shape, a->stride, a->dx, a->dy);
}

const struct dg__kern_view dg__cpu_kern_view = {cpu_range_bwd, cpu_strided_bwd};
