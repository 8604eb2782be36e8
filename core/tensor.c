/* Tensor headers: arena and persistent tensors, shapes, strides, dtype
 * conversion, inspection. */
#include <math.h>
#include <string.h>

#include "core/core_impl.h"
#include "backends/kern_mem.h"

int64_t dg__numel(const dg_tensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
  return n;
}

void dg__set_contig_strides(dg_tensor *t) {
  int64_t s = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    t->stride[i] = s;
    s *= t->shape[i];
  }
}

int dg__is_contig(const dg_tensor *t) {
  int64_t s = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->shape[i] != 1 && t->stride[i] != s) return 0;
    s *= t->shape[i];
  }
  return 1;
}

int dg__same_shape(const dg_tensor *a, const dg_tensor *b) {
  if (a->ndim != b->ndim) return 0;
  for (int i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i]) return 0;
  return 1;
}

const char *dg__dims_str(int ndim, const int64_t *shape, char *buf, size_t cap) {
  size_t n = 0;
  n += (size_t)snprintf(buf + n, cap - n, "(");
  for (int i = 0; i < ndim && n < cap; i++)
    n += (size_t)snprintf(buf + n, cap - n, i ? ", %lld" : "%lld", (long long)shape[i]);
  if (n < cap) snprintf(buf + n, cap - n, ")");
  return buf;
}

const char *dg__shape_str(const dg_tensor *t, char *buf, size_t cap) {
  return dg__dims_str(t->ndim, t->shape, buf, cap);
}

int64_t dg__shape_numel(int ndim, const int64_t *shape, size_t es) {
  int64_t n = 1, span = (int64_t)es;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0) return -1;
    /* span bounds every stride and byte offset, zero-size dims or not */
    if (__builtin_mul_overflow(span, shape[i] ? shape[i] : 1, &span) || span > DG_MAX_BYTES)
      return -1;
    n *= shape[i];
  }
  return n;
}

int dg__shape_error(int ndim, const int64_t *shape, dg_dtype dt, char *msg, size_t cap) {
  if (ndim < 0 || ndim > DG_MAX_DIMS || (ndim && !shape)) {
    snprintf(msg, cap, "ndim %d outside [0, %d]", ndim, DG_MAX_DIMS);
    return DG_EINVAL;
  }
  if ((unsigned)dt >= DG_NDTYPES) {
    snprintf(msg, cap, "invalid dtype %d", (int)dt);
    return DG_EINVAL;
  }
  if (dg__shape_numel(ndim, shape, dg_dtype_size(dt)) >= 0) return DG_OK;
  char s[DG_MAX_DIMS * 22 + 4];
  dg__dims_str(ndim, shape, s, sizeof s);
  for (int i = 0; i < ndim; i++)
    if (shape[i] < 0) {
      snprintf(msg, cap, "shape %s has a negative size in dim %d", s, i);
      return DG_EINVAL;
    }
  snprintf(msg, cap, "shape %s of %s is too large (its byte size overflows)", s,
           dg_dtype_name(dt));
  return DG_EINVAL;
}

static int check_shape(dg_ctx *ctx, const char *op, dg_dtype dt, int ndim, const int64_t *shape) {
  char msg[256];
  int rc = dg__shape_error(ndim, shape, dt, msg, sizeof msg);
  return rc ? dg__set_error(ctx, rc, "%s: %s", op, msg) : DG_OK;
}

dg_tensor *dg__tensor_init(dg_tensor *t, void *data, int device, dg_dtype dt, int ndim,
                           const int64_t *shape, uint32_t flags) {
  memset(t, 0, sizeof *t);
  t->data = data;
  t->ndim = ndim;
  for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
  dg__set_contig_strides(t);
  t->dtype = dt;
  t->device = device;
  t->flags = flags;
  t->param_id = -1;
  return t;
}

/* A contiguous tensor header (in the host arena, t) over data on device. */
static dg_tensor *arena_header(dg_tensor *t, void *data, int device, dg_dtype dt, int ndim,
                               const int64_t *shape) {
  return dg__tensor_init(t, data, device, dt, ndim, shape, DG_TF_ARENA);
}

dg_tensor *dg__new(dg_ctx *ctx, const char *op, dg_dtype dt, int ndim, const int64_t *shape) {
  if (check_shape(ctx, op, dt, ndim, shape)) return NULL;
  dg_tensor *t = dg__arena_alloc(&ctx->arena, sizeof *t);
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  const int dev = ctx->op_device;
  void *d = t ? dg__arena_data(ctx, dev, (size_t)n * dg_dtype_size(dt)) : NULL;
  if (!t || !d) {
    char a[24];
    dg__set_error(ctx, DG_ENOMEM, "%s: out of memory for a %lld-element %s tensor on %s", op,
                  (long long)n, dg_dtype_name(dt), dg__device_name(dev, a, sizeof a));
    return NULL;
  }
  return arena_header(t, d, dev, dt, ndim, shape);
}

dg_tensor *dg__new_like(dg_ctx *ctx, const char *op, const dg_tensor *x) {
  return dg__new(ctx, op, DG_F32, x->ndim, x->shape);
}

dg_tensor *dg__alias(dg_ctx *ctx, const char *op, dg_tensor *x) {
  dg_tensor *t = dg__arena_alloc(&ctx->arena, sizeof *t);
  if (!t) {
    dg__set_error(ctx, DG_ENOMEM, "%s: out of memory for a view header", op);
    return NULL;
  }
  *t = *x;
  t->flags = DG_TF_ARENA;
  t->grad = NULL;
  t->node = NULL;
  t->storage = NULL;
  t->params = NULL;
  t->param_id = -1;
  return t;
}

/* Copies src's elements (any strides, any dtype) into dst's (same shape,
 * same device) through the device's copy kernel. */
static void copy_elems(dg_tensor *dst, const dg_tensor *src) {
  dg__mem_copy_args a = {dst->data, src->data, dst->dtype, src->dtype, src->ndim, src->shape,
                         dg__is_contig(dst) ? NULL : dst->stride,
                         dg__is_contig(src) ? NULL : src->stride};
  dg__be_of(dst)->mem->copy(&a);
}

/* x packed into a new arena tensor of dtype dt, where x lives. */
static dg_tensor *packed(dg_ctx *ctx, const char *op, dg_tensor *x, dg_dtype dt) {
  const int keep = ctx->op_device;
  ctx->op_device = x->device;
  dg_tensor *c = dg__new(ctx, op, dt, x->ndim, x->shape);
  ctx->op_device = keep;
  if (c) copy_elems(c, x);
  return c;
}

const float *dg__contig_data(dg_ctx *ctx, const char *op, dg_tensor *x) {
  if (dg__is_contig(x)) return x->data;
  dg_tensor *c = packed(ctx, op, x, DG_F32);
  return c ? c->data : NULL;
}

dg_tensor *dg__contig_copy(dg_ctx *ctx, const char *op, dg_tensor *x) {
  return packed(ctx, op, x, x->dtype);
}

int64_t *dg__index_data(dg_ctx *ctx, const char *op, const char *what, const char *where,
                        dg_tensor *t, int64_t limit) {
  int64_t n = dg__numel(t);
  int64_t *out = dg__op_data(ctx, (size_t)(n ? n : 1) * sizeof *out);
  if (!out) {
    dg__set_error(ctx, DG_ENOMEM, "%s: out of memory for %lld %ss", op, (long long)n, what);
    return NULL;
  }
  dg__mem_copy_args a = {out, t->data, DG_I64, t->dtype, t->ndim, t->shape, NULL,
                         dg__is_contig(t) ? NULL : t->stride};
  dg__be_of(t)->mem->copy(&a);
  for (int64_t k = 0; k < n; k++) /* the check reads host memory: CPU tensors for now */
    if (out[k] < 0 || out[k] >= limit) {
      dg__set_error(ctx, DG_EINVAL, "%s: %s %lld %s %lld is outside [0, %lld)", op, what,
                    (long long)out[k], where, (long long)k, (long long)limit);
      return NULL;
    }
  return out;
}

/* ---- public constructors (arena) ---- */

/* A constructor's tensor: on the host (no public call places arena tensors
 * on a device yet; dg__new follows ctx->op_device). */
static dg_tensor *ctor_new(dg_ctx *ctx, const char *op, dg_dtype dt, int ndim,
                           const int64_t *shape) {
  ctx->op_device = DG_CPU;
  return dg__new(ctx, op, dt, ndim, shape);
}

dg_tensor *dg_empty(dg_ctx *ctx, dg_dtype dt, int ndim, const int64_t *shape) {
  if (!ctx) return NULL;
  return ctor_new(ctx, "empty", dt, ndim, shape);
}

dg_tensor *dg_zeros(dg_ctx *ctx, dg_dtype dt, int ndim, const int64_t *shape) {
  if (!ctx) return NULL;
  dg_tensor *t = ctor_new(ctx, "zeros", dt, ndim, shape);
  if (t) dg__be_of(t)->mem->zero(t->data, (size_t)dg__numel(t) * dg_dtype_size(dt));
  return t;
}

dg_tensor *dg_full(dg_ctx *ctx, int ndim, const int64_t *shape, float value) {
  if (!ctx) return NULL;
  dg_tensor *t = ctor_new(ctx, "full", DG_F32, ndim, shape);
  if (t) dg__be_of(t)->mem->fill_f32(t->data, dg__numel(t), value);
  return t;
}

dg_tensor *dg_from_data(dg_ctx *ctx, dg_dtype dt, int ndim, const int64_t *shape,
                        const void *data) {
  if (!ctx) return NULL;
  if (!data) {
    dg__set_error(ctx, DG_EINVAL, "from_data: data is NULL");
    return NULL;
  }
  dg_tensor *t = ctor_new(ctx, "from_data", dt, ndim, shape);
  if (t)
    dg__be_of(t)->copy(t->data, t->device, data, DG_CPU,
                       (size_t)dg__numel(t) * dg_dtype_size(dt));
  return t;
}

dg_tensor *dg_wrap(dg_ctx *ctx, dg_dtype dt, int ndim, const int64_t *shape, void *data) {
  if (!ctx) return NULL;
  if (!data) {
    dg__set_error(ctx, DG_EINVAL, "wrap: data is NULL");
    return NULL;
  }
  if (check_shape(ctx, "wrap", dt, ndim, shape)) return NULL;
  dg_tensor *t = dg__arena_alloc(&ctx->arena, sizeof *t);
  if (!t) {
    dg__set_error(ctx, DG_ENOMEM, "wrap: out of memory for a tensor header");
    return NULL;
  }
  return arena_header(t, data, DG_CPU, dt, ndim, shape); /* caller memory: host */
}

dg_tensor *dg_rand(dg_ctx *ctx, int ndim, const int64_t *shape, float lo, float hi) {
  if (!ctx) return NULL;
  dg_tensor *t = ctor_new(ctx, "rand", DG_F32, ndim, shape); /* host: drawn in place */
  if (!t) return NULL;
  float *d = t->data;
  size_t n = (size_t)dg__numel(t);
  dg__ctx_uniform(ctx, d, n);
  for (size_t i = 0; i < n; i++) d[i] = lo + (hi - lo) * d[i];
  return t;
}

dg_tensor *dg_randn(dg_ctx *ctx, int ndim, const int64_t *shape, float mean, float std) {
  if (!ctx) return NULL;
  dg_tensor *t = ctor_new(ctx, "randn", DG_F32, ndim, shape); /* host: drawn in place */
  if (!t) return NULL;
  float *d = t->data;
  size_t n = (size_t)dg__numel(t);
  dg_rng_normal(ctx->rng_seed, ctx->rng_offset, d, n);
  ctx->rng_offset += (n + 3) & ~(size_t)3;
  for (size_t i = 0; i < n; i++) d[i] = mean + std * d[i];
  return t;
}

/* ---- element access and conversion ---- */

static int64_t logical_off(const dg_tensor *t, int64_t i) {
  int64_t off = 0;
  for (int d = t->ndim - 1; d >= 0; d--) {
    off += (i % t->shape[d]) * t->stride[d];
    i /= t->shape[d];
  }
  return off;
}

double dg_tensor_get(const dg_tensor *t, int64_t i) {
  if (!t || i < 0 || i >= dg__numel(t)) return 0;
  dg__settle(t);
  const size_t es = dg_dtype_size(t->dtype);
  const void *src = (const char *)t->data + logical_off(t, i) * (int64_t)es;
  uint64_t raw = 0; /* a device element comes to the host first */
  if (t->device != DG_CPU && dg__be_of(t)->copy(&raw, DG_CPU, src, t->device, es) == DG_OK)
    src = &raw;
  double v = 0;
  dg__mem_copy_args a = {&v, src, DG_F64, t->dtype, 0, NULL, NULL, NULL};
  dg__backend_get(DG_CPU)->mem->copy(&a);
  return v;
}

/* NAN, not element 0, for anything but one element: a loss that is really
 * a vector (or a failed op's NULL) must not pass as a number. */
float dg_tensor_item(const dg_tensor *t) {
  if (!t || dg__numel(t) != 1) return NAN;
  return (float)dg_tensor_get(t, 0);
}

dg_tensor *dg_to_dtype(dg_ctx *ctx, dg_tensor *t, dg_dtype dt) {
  if (!dg__op_begin(ctx, "to_dtype", 1, &t, (const char *[]){"t"}, 0)) return NULL;
  dg_tensor *o = dg__new(ctx, "to_dtype", dt, t->ndim, t->shape);
  if (o) copy_elems(o, t);
  return o;
}

/* ---- persistent tensors ---- */

static int persistent_new(dg_tensor **out, dg_storage *st, void *data, dg_dtype dt,
                          int ndim, const int64_t *shape) {
  dg_tensor *t = dg__malloc(sizeof *t);
  if (!t) return DG_ENOMEM;
  dg__tensor_init(t, data, st->device, dt, ndim, shape, 0);
  t->storage = st;
  st->refcount++;
  *out = t;
  return DG_OK;
}

int dg_tensor_new(dg_tensor **out, dg_dtype dt, int ndim, const int64_t *shape, char *err,
                  size_t cap) {
  if (!out) return dg__fail_msg(err, cap, DG_EINVAL, "tensor_new: out is NULL");
  *out = NULL;
  char msg[256];
  int rc = dg__shape_error(ndim, shape, dt, msg, sizeof msg);
  if (rc) return dg__fail_msg(err, cap, rc, "tensor_new: %s", msg);
  int64_t n = dg__shape_numel(ndim, shape, 1);
  dg_storage *st = dg__calloc(1, sizeof *st);
  if (!st) return dg__fail_msg(err, cap, DG_ENOMEM, "tensor_new: out of memory");
  st->nbytes = (size_t)n * dg_dtype_size(dt);
  st->base = dg__dev_alloc(DG_CPU, st->nbytes);
  if (!st->base) {
    dg__free(st);
    return dg__fail_msg(err, cap, DG_ENOMEM, "tensor_new: out of memory for %zu bytes",
                        (size_t)n * dg_dtype_size(dt));
  }
  dg__backend_get(DG_CPU)->mem->zero(st->base, st->nbytes);
  rc = persistent_new(out, st, st->base, dt, ndim, shape);
  if (rc) {
    dg__dev_free(DG_CPU, st->base, st->nbytes);
    dg__free(st);
    return dg__fail_msg(err, cap, rc, "tensor_new: out of memory");
  }
  return DG_OK;
}

int dg_tensor_view(dg_tensor **out, dg_tensor *t, int64_t offset, int ndim,
                   const int64_t *shape, char *err, size_t cap) {
  if (!out) return dg__fail_msg(err, cap, DG_EINVAL, "tensor_view: out is NULL");
  *out = NULL;
  if (!t || !t->storage)
    return dg__fail_msg(err, cap, DG_EINVAL, "tensor_view: %s",
                        t ? "an arena tensor has no storage to share (views of persistent "
                            "tensors only)"
                          : "t is NULL");
  if (offset < 0)
    return dg__fail_msg(err, cap, DG_EINVAL, "tensor_view: negative offset %lld",
                        (long long)offset);
  char msg[256];
  int rc = dg__shape_error(ndim, shape, t->dtype, msg, sizeof msg);
  if (rc) return dg__fail_msg(err, cap, rc, "tensor_view: %s", msg);
  int64_t n = dg__shape_numel(ndim, shape, 1);
  size_t es = dg_dtype_size(t->dtype);
  size_t off = (size_t)((char *)t->data - (char *)t->storage->base);
  /* in bytes, without forming an out-of-range pointer */
  if ((uint64_t)offset > (t->storage->nbytes - off) / es ||
      (uint64_t)n > (t->storage->nbytes - off) / es - (uint64_t)offset)
    return dg__fail_msg(err, cap, DG_ESHAPE,
                        "tensor_view: %lld elements at offset %lld run past the %zu-byte "
                        "storage", (long long)n, (long long)offset, t->storage->nbytes - off);
  char *d = (char *)t->data + offset * (int64_t)es;
  rc = persistent_new(out, t->storage, d, t->dtype, ndim, shape);
  return rc ? dg__fail_msg(err, cap, rc, "tensor_view: out of memory") : DG_OK;
}

void dg_tensor_free(dg_tensor *t) {
  if (!t || (t->flags & (DG_TF_ARENA | DG_TF_PARAM))) return;
  if (t->grad && !(t->grad->flags & DG_TF_ARENA)) dg_tensor_free(t->grad);
  if (t->storage && --t->storage->refcount == 0) {
    dg__dev_free(t->storage->device, t->storage->base, t->storage->nbytes);
    dg__free(t->storage);
  }
  dg__free(t);
}

int dg_tensor_copy(dg_tensor *dst, const dg_tensor *src, char *err, size_t cap) {
  if (!dst || !src) return dg__fail_msg(err, cap, DG_EINVAL, "tensor_copy: NULL tensor");
  if (!dg__same_shape(dst, src)) {
    char a[96], b[96];
    return dg__fail_msg(err, cap, DG_ESHAPE, "tensor_copy: dst %s and src %s differ in shape",
                        dg_tensor_shape_str(dst, a, sizeof a),
                        dg_tensor_shape_str(src, b, sizeof b));
  }
  dg__settle(src);
  dg__settle(dst); /* else the pending update would land on the copy */
  if (dst->device == src->device) {
    copy_elems(dst, src);
    return DG_OK;
  }
  /* across devices: the bytes as they are, through the device's backend */
  if (dst->dtype != src->dtype || !dg__is_contig(dst) || !dg__is_contig(src)) {
    char a[24], b[24];
    return dg__fail_msg(err, cap, DG_EUNSUPPORTED, "tensor_copy: %s to %s copies contiguous "
                        "tensors of one dtype (convert or pack on one device first)",
                        dg__device_name(src->device, a, sizeof a),
                        dg__device_name(dst->device, b, sizeof b));
  }
  const dg__backend *be = dg__be_of(dst->device != DG_CPU ? dst : src);
  int rc = be->copy(dst->data, dst->device, src->data, src->device,
                    (size_t)dg__numel(src) * dg_dtype_size(src->dtype));
  return rc ? dg__fail_msg(err, cap, rc, "tensor_copy: the device copy failed") : DG_OK;
}

/* ---- inspection ---- */

int dg_tensor_ndim(const dg_tensor *t) { return t ? t->ndim : 0; }
int64_t dg_tensor_dim(const dg_tensor *t, int i) {
  if (!t) return 0;
  if (i < 0) i += t->ndim;
  return (i >= 0 && i < t->ndim) ? t->shape[i] : 0;
}
const int64_t *dg_tensor_shape(const dg_tensor *t) { return t ? t->shape : NULL; }
const int64_t *dg_tensor_strides(const dg_tensor *t) { return t ? t->stride : NULL; }
int64_t dg_tensor_numel(const dg_tensor *t) { return t ? dg__numel(t) : 0; }
dg_dtype dg_tensor_dtype(const dg_tensor *t) { return t ? t->dtype : DG_F32; }
int dg_tensor_device(const dg_tensor *t) { return t ? t->device : DG_CPU; }
int dg_tensor_is_contiguous(const dg_tensor *t) { return t ? dg__is_contig(t) : 0; }
void *dg_tensor_data(const dg_tensor *t) {
  dg__settle(t);
  return t ? t->data : NULL;
}
dg_tensor *dg_tensor_grad(const dg_tensor *t) {
  if (!t) return NULL;
  dg__settle(t);
  if (t->flags & DG_TF_GRAD_STALE) {
    if (t->param_id >= 0) dg__param_grad_materialize((dg_tensor *)t);
    else if (t->grad) {
      dg__be_of(t->grad)->mem->zero(t->grad->data, (size_t)dg__numel(t) * sizeof(float));
      ((dg_tensor *)t)->flags &= ~(uint32_t)DG_TF_GRAD_STALE;
    }
  }
  return t->grad;
}
int dg_tensor_requires_grad(const dg_tensor *t) { return dg__wants_grad(t); }

void dg_tensor_set_requires_grad(dg_tensor *t, int on) {
  /* store-owned (parameters: dg_params_set_trainable; buffers and gradient
   * headers never take a gradient) */
  if (!t || (t->flags & DG_TF_PARAM)) return;
  if (on && t->dtype == DG_F32) t->flags |= DG_TF_REQUIRES_GRAD;
  else t->flags &= ~(uint32_t)DG_TF_REQUIRES_GRAD;
}

char *dg_tensor_shape_str(const dg_tensor *t, char *buf, size_t cap) {
  if (!buf || !cap) return buf;
  if (!t) {
    snprintf(buf, cap, "(null)");
    return buf;
  }
  char s[96];
  snprintf(buf, cap, "%s %s", dg__shape_str(t, s, sizeof s), dg_dtype_name(t->dtype));
  return buf;
}
