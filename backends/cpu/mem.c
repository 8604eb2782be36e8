/* Core's loops on host memory (backends/kern_mem.h): memset, fill, and the
 * strided converting copy with fast paths for the common cases (contiguous
 * same-dtype rows: one memcpy each; contiguous f32 to f16/bf16). */
#include <string.h>

#include "backends/kern_mem.h"
#include "backends/cpu/cpu_impl.h"

static void cpu_zero(void *p, size_t bytes) {
  if (bytes) memset(p, 0, bytes);
}

static void cpu_fill_f32(float *p, int64_t n, float v) {
  for (int64_t i = 0; i < n; i++) p[i] = v;
}

static void cpu_add_f32(float *y, const float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] += x ? x[i] : 1.0f;
}

static double load_elem(const void *base, dg_dtype dt, int64_t off) {
  switch (dt) {
    case DG_F32: return ((const float *)base)[off];
    case DG_F64: return ((const double *)base)[off];
    case DG_F16: return dg_f16_to_f32(((const uint16_t *)base)[off]);
    case DG_BF16: return dg_bf16_to_f32(((const uint16_t *)base)[off]);
    case DG_I32: return ((const int32_t *)base)[off];
    case DG_I64: return (double)((const int64_t *)base)[off];
    default: return 0;
  }
}

static void store_elem(void *base, dg_dtype dt, int64_t off, double v) {
  switch (dt) {
    case DG_F32: ((float *)base)[off] = (float)v; break;
    case DG_F64: ((double *)base)[off] = v; break;
    case DG_F16: ((uint16_t *)base)[off] = dg_f32_to_f16((float)v); break;
    case DG_BF16: ((uint16_t *)base)[off] = dg_f32_to_bf16((float)v); break;
    case DG_I32: ((int32_t *)base)[off] = (int32_t)v; break;
    case DG_I64: ((int64_t *)base)[off] = (int64_t)v; break;
    default: break;
  }
}

/* Element by element, the index carried from one element to the next (no
 * division per element). */
static void copy_elems(const dg__mem_copy_args *a, int64_t n) {
  const int nd = a->ndim;
  const size_t es = dg_dtype_size(a->sdt);
  const int same = a->ddt == a->sdt; /* bytes as they are: exact for i64 beyond 2^53 */
  int64_t idx[DG__MEM_MAX_DIMS] = {0}, so = 0, dof = 0;
  for (int64_t k = 0; k < n; k++) {
    const int64_t d = a->dstride ? dof : k, s = a->sstride ? so : k;
    if (same) memcpy((char *)a->dst + d * (int64_t)es, (const char *)a->src + s * (int64_t)es, es);
    else store_elem(a->dst, a->ddt, d, load_elem(a->src, a->sdt, s));
    for (int i = nd - 1; i >= 0; i--) {
      if (a->sstride) so += a->sstride[i];
      if (a->dstride) dof += a->dstride[i];
      if (++idx[i] < a->shape[i]) break;
      if (a->sstride) so -= a->sstride[i] * a->shape[i];
      if (a->dstride) dof -= a->dstride[i] * a->shape[i];
      idx[i] = 0;
    }
  }
}

/* f32 to f32 gather from strides into contiguous dst: the packing loop of
 * ops that need contiguous inputs. */
static void gather_f32(const dg__mem_copy_args *a, int64_t n) {
  const int nd = a->ndim;
  const float *s = a->src;
  float *d = a->dst;
  int64_t idx[DG__MEM_MAX_DIMS] = {0};
  for (int64_t k = 0; k < n; k++) {
    int64_t off = 0;
    for (int i = 0; i < nd; i++) off += idx[i] * a->sstride[i];
    d[k] = s[off];
    for (int i = nd - 1; i >= 0; i--) {
      if (++idx[i] < a->shape[i]) break;
      idx[i] = 0;
    }
  }
}

/* Same dtype, contiguous dst, src rows contiguous (last stride 1): one
 * memcpy per row. */
static void copy_rows(const dg__mem_copy_args *a, int64_t n, size_t es) {
  const int nd = a->ndim;
  const int64_t len = a->shape[nd - 1], *st = a->sstride;
  int64_t idx[DG__MEM_MAX_DIMS] = {0};
  for (int64_t k = 0; k < n; k += len) {
    int64_t off = 0;
    for (int i = 0; i < nd - 1; i++) off += idx[i] * st[i];
    memcpy((char *)a->dst + (size_t)k * es, (const char *)a->src + (size_t)off * es,
           (size_t)len * es);
    for (int i = nd - 2; i >= 0; i--) {
      if (++idx[i] < a->shape[i]) break;
      idx[i] = 0;
    }
  }
}

static void cpu_copy(const dg__mem_copy_args *a) {
  int64_t n = 1;
  for (int d = 0; d < a->ndim; d++) n *= a->shape[d];
  if (n <= 0) return;
  const size_t es = dg_dtype_size(a->sdt);
  if (a->ddt == a->sdt && !a->dstride && !a->sstride) {
    memcpy(a->dst, a->src, (size_t)n * es);
    return;
  }
  if (a->ddt == a->sdt && !a->dstride && a->ndim >= 2 && a->ndim <= DG__MEM_MAX_DIMS &&
      a->sstride[a->ndim - 1] == 1) {
    copy_rows(a, n, es);
    return;
  }
  if (a->sdt == DG_F32 && !a->sstride && !a->dstride &&
      (a->ddt == DG_F16 || a->ddt == DG_BF16)) {
    const float *s = a->src;
    uint16_t *d = a->dst;
    if (a->ddt == DG_F16)
      for (int64_t i = 0; i < n; i++) d[i] = dg_f32_to_f16(s[i]);
    else
      for (int64_t i = 0; i < n; i++) d[i] = dg_f32_to_bf16(s[i]);
    return;
  }
  if (a->ndim > DG__MEM_MAX_DIMS) return; /* callers pass tensors' dims (<= DG_MAX_DIMS) */
  if (a->ddt == DG_F32 && a->sdt == DG_F32 && !a->dstride && a->sstride) gather_f32(a, n);
  else copy_elems(a, n);
}

const struct dg__kern_mem dg__cpu_kern_mem = {
    .zero = cpu_zero,
    .fill_f32 = cpu_fill_f32,
    .add_f32 = cpu_add_f32,
    .copy = cpu_copy,
};
