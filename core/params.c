/* Parameter store: one flat value buffer and one flat gradient buffer; each
 * parameter is a named view into both, in registration order. */
#include <string.h>

#include "core/core_impl.h"
#include "backends/kern_mem.h"

#define PARAM_ALIGN 16 /* floats: 64 bytes, so every view is SIMD-aligned */

const char *dg_params_errmsg(const dg_params *ps) { return ps ? ps->errmsg : "no store"; }

int dg_params_new(dg_params **out) {
  if (!out) return DG_EINVAL;
  *out = dg__calloc(1, sizeof **out);
  return *out ? DG_OK : DG_ENOMEM;
}

void dg_params_free(dg_params *ps) {
  if (!ps) return;
  if (ps->nattached_to) {
    /* reported, and made safe: the contexts forget the store */
    DG_LOGW("params_free: the store is still attached to %d context(s); detaching it (call "
            "dg_ctx_detach_params, or free the DDP that attached it, first)", ps->nattached_to);
    dg__params_detach_all(ps);
  }
  for (int i = 0; i < ps->n; i++) {
    dg__free(ps->t[i]->grad);
    dg__free(ps->t[i]);
    dg__free(ps->names[i]);
  }
  dg__free(ps->t);
  dg__free(ps->names);
  dg__free(ps->offset);
  dg__free(ps->trainable);
  dg__free(ps->reached);
  dg__free(ps->companions);
  dg__params_free_buffers(ps);
  if (ps->data) dg__dev_free(DG_CPU, ps->data, ps->total * sizeof(float));
  if (ps->grad && !ps->grad_lent) dg__dev_free(DG_CPU, ps->grad, ps->total * sizeof(float));
  dg__free(ps);
}

static int grow_arrays(dg_params *ps) {
  if (ps->n < ps->cap) return DG_OK;
  int cap = ps->cap ? ps->cap * 2 : 16;
#define GROW(field)                                                        \
  do {                                                                     \
    void *p = dg__realloc(ps->field, (size_t)cap * sizeof *ps->field);     \
    if (!p) return DG_ENOMEM;                                              \
    ps->field = p;                                                         \
  } while (0)
  GROW(t);
  GROW(names);
  GROW(offset);
  GROW(trainable);
  GROW(reached);
#undef GROW
  ps->cap = cap;
  return DG_OK;
}

/* Moves both flat buffers to a larger allocation and re-points the views.
 * Only the used prefix is copied and nothing beyond it is touched (add_param
 * zeroes each new segment), so the spare capacity costs no resident memory;
 * the old buffers go back to the system, not to the cache: their sizes are
 * one-offs that would otherwise stay resident. */
static int grow_flat(dg_params *ps, size_t total) {
  float *d = dg__dev_alloc(DG_CPU, total * sizeof(float));
  float *g = dg__dev_alloc(DG_CPU, total * sizeof(float));
  if (!d || !g) {
    dg__dev_free(DG_CPU, d, total * sizeof(float));
    dg__dev_free(DG_CPU, g, total * sizeof(float));
    return DG_ENOMEM;
  }
  if (ps->data) {
    memcpy(d, ps->data, ps->used_total * sizeof(float));
    memcpy(g, ps->grad, ps->used_total * sizeof(float));
    dg__dev_release(DG_CPU, ps->data, ps->total * sizeof(float));
    dg__dev_release(DG_CPU, ps->grad, ps->total * sizeof(float));
  }
  ps->data = d;
  ps->grad = g;
  ps->total = total;
  for (int i = 0; i < ps->n; i++) {
    ps->t[i]->data = d + ps->offset[i];
    ps->t[i]->grad->data = g + ps->offset[i];
  }
  return DG_OK;
}

static dg_tensor *param_header(dg_params *ps, int ndim, const int64_t *shape, int id) {
  dg_tensor *t = dg__malloc(sizeof *t);
  if (!t) return NULL;
  dg__tensor_init(t, NULL, DG_CPU, DG_F32, ndim, shape, DG_TF_PARAM | DG_TF_REQUIRES_GRAD);
  t->params = ps;
  t->param_id = id;
  return t;
}

int dg_params_add(dg_params *ps, const char *name, int ndim, const int64_t *shape,
                  dg_tensor **out) {
  if (out) *out = NULL;
  if (!ps) return DG_EINVAL;
  if (!name || !*name) return dg__params_fail(ps, DG_EINVAL, "params_add: the name is empty");
  if (ps->grad_lent)
    return dg__params_fail(ps, DG_ESTATE, "params_add: \"%s\": the gradient buffer is lent "
                           "(to DDP): add parameters before wrapping the model", name);
  if (dg_params_find(ps, name))
    return dg__params_fail(ps, DG_EINVAL, "params_add: duplicate parameter name \"%s\"", name);
  if (dg_params_buffer_find(ps, name))
    return dg__params_fail(ps, DG_EINVAL, "params_add: \"%s\" is the name of a buffer", name);
  char msg[256];
  if (dg__shape_error(ndim, shape, DG_F32, msg, sizeof msg))
    return dg__params_fail(ps, DG_EINVAL, "params_add: \"%s\": %s", name, msg);
  int64_t n = dg__shape_numel(ndim, shape, 1);
  if (grow_arrays(ps)) return dg__params_fail(ps, DG_ENOMEM, "params_add: out of memory");
  int id = ps->n;
  dg_tensor *t = param_header(ps, ndim, shape, id);
  dg_tensor *g = param_header(ps, ndim, shape, id);
  char *nm = dg__strdup(name);
  if (!t || !g || !nm) goto nomem;
  g->flags = DG_TF_PARAM;
  g->param_id = -1;
  t->grad = g;
  t->flags |= DG_TF_GRAD_STALE; /* no gradient yet (a step before backward is refused) */
  size_t off = (ps->used_total + PARAM_ALIGN - 1) / PARAM_ALIGN * PARAM_ALIGN;
  /* every segment is padded to PARAM_ALIGN so the total does not depend on
   * the order (dg_params_relayout) */
  size_t need = off + ((size_t)n + PARAM_ALIGN - 1) / PARAM_ALIGN * PARAM_ALIGN;
  ps->t[id] = t;
  ps->names[id] = nm;
  ps->offset[id] = off;
  ps->trainable[id] = 1;
  ps->reached[id] = 0;
  ps->n++;
  size_t cap = ps->total;
  /* a store of zero-element parameters still gets buffers: every view has
   * a real address (ops and memset never see NULL) */
  if (need > cap || !ps->data) {
    size_t ncap = cap ? cap : 1024;
    while (ncap < need) ncap *= 2;
    if (grow_flat(ps, ncap)) {
      ps->n--;
      goto nomem;
    }
  }
  /* the new segment and its alignment padding start zeroed */
  memset(ps->data + ps->used_total, 0, (need - ps->used_total) * sizeof(float));
  memset(ps->grad + ps->used_total, 0, (need - ps->used_total) * sizeof(float));
  t->data = ps->data + off;
  g->data = ps->grad + off;
  /* total counts the used prefix; keep the capacity separate by padding */
  ps->used_total = need;
  if (out) *out = t;
  return DG_OK;
nomem:
  dg__free(t);
  dg__free(g);
  dg__free(nm);
  return dg__params_fail(ps, DG_ENOMEM, "params_add: \"%s\": out of memory", name);
}

int dg_params_count(const dg_params *ps) { return ps ? ps->n : 0; }
dg_tensor *dg_params_get(const dg_params *ps, int i) {
  return (ps && i >= 0 && i < ps->n) ? ps->t[i] : NULL;
}

dg_tensor *dg_params_find(const dg_params *ps, const char *name) {
  if (!ps || !name) return NULL;
  for (int i = 0; i < ps->n; i++)
    if (!strcmp(ps->names[i], name)) return ps->t[i];
  return NULL;
}

const char *dg_tensor_name(const dg_tensor *t) {
  if (t && (t->flags & DG_TF_BUFFER)) return dg__buffer_name(t);
  if (!t || !t->params || t->param_id < 0) return NULL;
  return t->params->names[t->param_id];
}

int dg_tensor_param_index(const dg_tensor *t) { return (t && t->params) ? t->param_id : -1; }
dg_params *dg_tensor_param_store(const dg_tensor *t) { return t ? t->params : NULL; }

size_t dg_params_offset(const dg_params *ps, int i) {
  return (ps && i >= 0 && i < ps->n) ? ps->offset[i] : 0;
}

void dg__params_set_writer(dg_params *ps, dg__writer_fn fn, void *user) {
  ps->writer = fn;
  ps->writer_user = user;
  if (!fn)
    for (int i = 0; i < ps->n; i++) dg__param_set_pending(ps, i, 0);
}

int dg__params_has_writer(const dg_params *ps, const void *user) {
  return ps && ps->writer && (!user || ps->writer_user == user);
}

/* In debug builds a pending parameter's data pointer is poisoned (a
 * non-canonical address): a read path that skips the fence faults in a test
 * instead of quietly reading the previous step's values. The writer updates
 * the flat buffer, never through the view. */
#ifndef NDEBUG
#define PENDING_POISON ((void *)(uintptr_t)0xdead00000000deadull)
#endif

void dg__param_set_pending(dg_params *ps, int i, int on) {
  if (!ps || i < 0 || i >= ps->n) return;
  dg_tensor *t = ps->t[i];
  if (on) t->flags |= DG_TF_PENDING;
  else t->flags &= ~(uint32_t)DG_TF_PENDING;
#ifdef PENDING_POISON
  t->data = on ? PENDING_POISON : ps->data + ps->offset[i];
#endif
}

void dg__params_set_update_owned(dg_params *ps, int on) {
  if (ps) ps->update_owned = !!on;
}

int dg__params_flush(dg_params *ps, int i) {
  if (!ps || !ps->writer) return DG_OK;
  char err[512];
  err[0] = '\0';
  int rc = ps->writer(ps->writer_user, ps, i, err, sizeof err);
  if (rc) { /* a background update failed: logged, and kept as the store's detail */
    dg__params_fail(ps, rc, "%s", err[0] ? err : "parameter update failed");
    DG_LOGE("%s", ps->errmsg);
  }
  return rc;
}

int dg__fence(dg_ctx *ctx, const char *op, const dg_tensor *t) {
  dg_params *ps = t->params;
  if (!ps || !ps->writer) return DG_OK;
  char err[400];
  err[0] = '\0';
  int rc = ps->writer(ps->writer_user, ps, t->param_id, err, sizeof err);
  if (rc && ctx && !ctx->err)
    dg__set_error(ctx, rc, "%s: the pending update of parameter %s failed: %s", op,
                  ps->names[t->param_id], err);
  return rc;
}

/* Raw access hands out values and gradients: pending updates land first. */
float *dg_params_data(dg_params *ps, size_t *n) {
  (void)dg__params_flush(ps, DG__SETTLE_ALL);
  if (n) *n = ps ? ps->used_total : 0;
  return ps ? ps->data : NULL;
}

void dg__param_grad_materialize(dg_tensor *t) {
  if (!(t->flags & DG_TF_GRAD_STALE)) return;
  dg__be_of(t->grad)->mem->zero(t->grad->data, (size_t)dg__numel(t) * sizeof(float));
  t->flags &= ~(uint32_t)DG_TF_GRAD_STALE;
}

float *dg__params_grad_raw(dg_params *ps) { return ps ? ps->grad : NULL; }

float *dg_params_grad(dg_params *ps, size_t *n) {
  if (n) *n = ps ? ps->used_total : 0;
  if (!ps) return NULL;
  (void)dg__params_flush(ps, DG__SETTLE_ALL);
  for (int i = 0; i < ps->n; i++) dg__param_grad_materialize(ps->t[i]);
  return ps->grad;
}

/* Lazy: marks every gradient stale. Backward's first write to a parameter
 * overwrites it (GEMM with beta 0), so the usual step never pays for a
 * memset of the whole buffer; any other reader (dg_params_grad,
 * dg_tensor_grad, backward's unreached parameters) zeroes it first. */
void dg_params_zero_grad(dg_params *ps) {
  if (!ps) return;
  (void)dg__params_flush(ps, DG__SETTLE_ALL); /* a pending update reads them */
  for (int i = 0; i < ps->n; i++) ps->t[i]->flags |= DG_TF_GRAD_STALE;
  ps->step_block[0] = '\0'; /* the partial sums are gone with the gradients */
  ps->zero_grads++;
}

void dg__params_block_step(dg_params *ps, const char *why, ...) {
  ps->step_block[0] = '\0';
  if (!why) return;
  va_list ap;
  va_start(ap, why);
  dg__vfmt(ps->step_block, sizeof ps->step_block, why, ap);
  va_end(ap);
}

void dg_params_set_trainable(dg_params *ps, int i, int on) {
  if (!ps || i < 0 || i >= ps->n) return;
  ps->trainable[i] = !!on;
  if (on) ps->t[i]->flags |= DG_TF_REQUIRES_GRAD;
  else ps->t[i]->flags &= ~(uint32_t)DG_TF_REQUIRES_GRAD;
}

int dg_params_trainable(const dg_params *ps, int i) {
  return (ps && i >= 0 && i < ps->n) ? ps->trainable[i] : 0;
}

int dg__params_lend_grad(dg_params *ps, float *buf) {
  if (!ps || (!buf && !ps->grad_lent)) return DG_EINVAL;
  float *g = buf ? buf : dg__dev_alloc(DG_CPU, (ps->total ? ps->total : 1) * sizeof(float));
  if (!g) return DG_ENOMEM;
  if (ps->used_total) memcpy(g, ps->grad, ps->used_total * sizeof(float));
  if (ps->grad && !ps->grad_lent) dg__dev_release(DG_CPU, ps->grad, ps->total * sizeof(float));
  ps->grad = g;
  ps->grad_lent = buf != NULL;
  for (int i = 0; i < ps->n; i++) ps->t[i]->grad->data = g + ps->offset[i];
  return DG_OK;
}

float *dg__params_swap_data(dg_params *ps, float *buf, int lent) {
  float *old = ps->data;
  ps->data = buf;
  ps->data_lent = lent;
  for (int i = 0; i < ps->n; i++) {
    ps->t[i]->data = buf + ps->offset[i];
    if (ps->t[i]->flags & DG_TF_PENDING) dg__param_set_pending(ps, i, 1); /* (re-poisons) */
  }
  return old;
}

int dg_params_add_companion(dg_params *ps, float *buf) {
  if (!ps || !buf) return DG_EINVAL;
  float **c = dg__realloc(ps->companions, (size_t)(ps->ncompanions + 1) * sizeof *c);
  if (!c) return DG_ENOMEM;
  ps->companions = c;
  c[ps->ncompanions++] = buf;
  return DG_OK;
}

int dg_params_remove_companion(dg_params *ps, float *buf) {
  if (!ps) return DG_EINVAL;
  for (int i = 0; i < ps->ncompanions; i++) {
    if (ps->companions[i] != buf) continue;
    ps->companions[i] = ps->companions[--ps->ncompanions];
    return DG_OK;
  }
  return dg__params_fail(ps, DG_ENOTFOUND, "params_remove_companion: %p is not a companion",
                         (void *)buf);
}

/* Copies each parameter's segment of buf from old to new offsets. */
static void permute_buf(float *buf, float *tmp, size_t n, const dg_params *ps,
                        const size_t *newoff) {
  memcpy(tmp, buf, n * sizeof(float));
  memset(buf, 0, n * sizeof(float));
  for (int i = 0; i < ps->n; i++)
    memcpy(buf + newoff[i], tmp + ps->offset[i], (size_t)dg__numel(ps->t[i]) * sizeof(float));
}

int dg_params_relayout(dg_params *ps, const int *order) {
  if (!ps || !order) return DG_EINVAL;
  uint8_t *seen = dg__calloc((size_t)ps->n + 1, 1);
  size_t *newoff = dg__malloc(((size_t)ps->n + 1) * sizeof *newoff);
  float *tmp = dg__malloc((ps->used_total + 1) * sizeof(float));
  int rc = (!seen || !newoff || !tmp) ? DG_ENOMEM : DG_OK;
  size_t off = 0;
  for (int k = 0; !rc && k < ps->n; k++) {
    int i = order[k];
    if (i < 0 || i >= ps->n || seen[i]++) {
      rc = dg__params_fail(ps, DG_EINVAL, "params_relayout: order[%d] = %d is %s", k, i,
                           i < 0 || i >= ps->n ? "out of range" : "a repeat");
      break;
    }
    newoff[i] = off;
    off += ((size_t)dg__numel(ps->t[i]) + PARAM_ALIGN - 1) / PARAM_ALIGN * PARAM_ALIGN;
  }
  DG_ASSERT(rc || off == ps->used_total);
  if (!rc) {
    size_t n = ps->used_total;
    for (int i = 0; i < ps->n; i++) dg__param_grad_materialize(ps->t[i]);
    permute_buf(ps->data, tmp, n, ps, newoff);
    permute_buf(ps->grad, tmp, n, ps, newoff);
    for (int c = 0; c < ps->ncompanions; c++) permute_buf(ps->companions[c], tmp, n, ps, newoff);
    for (int i = 0; i < ps->n; i++) {
      ps->offset[i] = newoff[i];
      ps->t[i]->data = ps->data + newoff[i];
      ps->t[i]->grad->data = ps->grad + newoff[i];
    }
  }
  dg__free(seen);
  dg__free(newoff);
  dg__free(tmp);
  return rc;
}
