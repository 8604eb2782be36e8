/* Buffers of a parameter store: persistent, named, non-trainable f32
 * tensors (torch's buffers, e.g. BatchNorm's running statistics). They sit
 * in a flat buffer of their own, apart from the parameters' value and
 * gradient buffers, so optimizers, clipping, DDP's buckets and the tape,
 * which walk parameters, never see them; checkpoints save them by name and
 * DDP broadcasts the flat buffer in one collective. */
#include <string.h>

#include "core/core_impl.h"

#define BUF_ALIGN 16 /* floats: 64 bytes, as the parameters' segments */

/* A buffer's header with its name, so dg_tensor_name works on it. */
typedef struct {
  dg_tensor t; /* first: the tensor handle is the header's address */
  char *name;
} dg__buffer_hdr;

const char *dg__buffer_name(const dg_tensor *t) { return ((const dg__buffer_hdr *)t)->name; }

void dg__params_free_buffers(dg_params *ps) {
  dg__buffers *b = &ps->buf;
  for (int i = 0; i < b->n; i++) {
    dg__free(((dg__buffer_hdr *)b->t[i])->name);
    dg__free(b->t[i]);
  }
  dg__free(b->t);
  dg__free(b->offset);
  if (b->data) dg__dev_free(DG_CPU, b->data, b->total * sizeof(float));
  memset(b, 0, sizeof *b);
}

static int grow_arrays(dg__buffers *b) {
  if (b->n < b->cap) return DG_OK;
  int cap = b->cap ? 2 * b->cap : 8;
  dg_tensor **t = dg__realloc(b->t, (size_t)cap * sizeof *t);
  if (t) b->t = t;
  size_t *o = t ? dg__realloc(b->offset, (size_t)cap * sizeof *o) : NULL;
  if (o) b->offset = o;
  if (!t || !o) return DG_ENOMEM;
  b->cap = cap;
  return DG_OK;
}

/* Moves the flat buffer to `total` floats; the used prefix is copied and
 * the headers re-pointed. */
static int grow_flat(dg__buffers *b, size_t total) {
  float *d = dg__dev_alloc(DG_CPU, total * sizeof(float));
  if (!d) return DG_ENOMEM;
  if (b->data) {
    memcpy(d, b->data, b->used * sizeof(float));
    dg__dev_release(DG_CPU, b->data, b->total * sizeof(float));
  }
  b->data = d;
  b->total = total;
  for (int i = 0; i < b->n; i++) b->t[i]->data = d + b->offset[i];
  return DG_OK;
}

int dg_params_add_buffer(dg_params *ps, const char *name, int ndim, const int64_t *shape,
                         dg_tensor **out) {
  if (out) *out = NULL;
  if (!ps) return DG_EINVAL;
  if (!name || !*name)
    return dg__params_fail(ps, DG_EINVAL, "params_add_buffer: the name is empty");
  if (ps->grad_lent) /* DDP checked and broadcast the buffers it found */
    return dg__params_fail(ps, DG_ESTATE, "params_add_buffer: \"%s\": the store is wrapped by "
                           "DDP: add buffers before wrapping the model", name);
  if (dg_params_find(ps, name) || dg_params_buffer_find(ps, name))
    return dg__params_fail(ps, DG_EINVAL, "params_add_buffer: duplicate name \"%s\" (a %s has it)",
                           name, dg_params_find(ps, name) ? "parameter" : "buffer");
  char msg[256];
  if (dg__shape_error(ndim, shape, DG_F32, msg, sizeof msg))
    return dg__params_fail(ps, DG_EINVAL, "params_add_buffer: \"%s\": %s", name, msg);
  dg__buffers *b = &ps->buf;
  int64_t n = dg__shape_numel(ndim, shape, 1);
  dg__buffer_hdr *h = grow_arrays(b) ? NULL : dg__calloc(1, sizeof *h);
  char *nm = h ? dg__strdup(name) : NULL;
  size_t off = b->used, need = off + ((size_t)n + BUF_ALIGN - 1) / BUF_ALIGN * BUF_ALIGN;
  if (nm && (need > b->total || !b->data)) {
    size_t cap = b->total ? b->total : 256;
    while (cap < need) cap *= 2;
    if (grow_flat(b, cap)) dg__free(nm), nm = NULL;
  }
  if (!nm) {
    dg__free(h);
    return dg__params_fail(ps, DG_ENOMEM, "params_add_buffer: \"%s\": out of memory", name);
  }
  /* owned by the store (DG_TF_PARAM: dg_tensor_free leaves it), no
   * gradient, not a parameter (params NULL, param_id -1) */
  dg__tensor_init(&h->t, b->data + off, DG_CPU, DG_F32, ndim, shape, DG_TF_PARAM | DG_TF_BUFFER);
  h->name = nm;
  memset(b->data + off, 0, (need - off) * sizeof(float));
  b->t[b->n] = &h->t;
  b->offset[b->n++] = off;
  b->used = need;
  if (out) *out = &h->t;
  return DG_OK;
}

int dg_params_buffer_count(const dg_params *ps) { return ps ? ps->buf.n : 0; }

dg_tensor *dg_params_buffer_get(const dg_params *ps, int i) {
  return (ps && i >= 0 && i < ps->buf.n) ? ps->buf.t[i] : NULL;
}

dg_tensor *dg_params_buffer_find(const dg_params *ps, const char *name) {
  if (!ps || !name) return NULL;
  for (int i = 0; i < ps->buf.n; i++)
    if (!strcmp(((const dg__buffer_hdr *)ps->buf.t[i])->name, name)) return ps->buf.t[i];
  return NULL;
}

float *dg_params_buffer_data(dg_params *ps, size_t *n) {
  if (n) *n = ps ? ps->buf.used : 0;
  return ps ? ps->buf.data : NULL;
}
