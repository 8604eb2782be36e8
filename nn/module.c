/* Module plumbing: dispatch, binding, train mode, Sequential. */
#include <string.h>

#include "nn/nn_impl.h"

const char *dg__join(char *buf, size_t cap, const char *prefix, const char *name) {
  if (prefix && *prefix) snprintf(buf, cap, "%s.%s", prefix, name);
  else snprintf(buf, cap, "%s", name);
  return buf;
}

uint64_t dg__param_seed(uint64_t seed, const char *name) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a, then a splitmix finaliser */
  for (const char *p = name; *p; p++) h = (h ^ (uint8_t)*p) * 1099511628211ull;
  h ^= seed + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

int dg__bind_param(dg_params *ps, const char *prefix, const char *name, int ndim,
                   const int64_t *shape, dg_tensor **out) {
  char full[256];
  dg__join(full, sizeof full, prefix, name);
  return dg_params_add(ps, full, ndim, shape, out);
}

dg_module *dg__module_alloc(size_t size, const dg_module_vtable *vt) {
  dg_module *m = dg__calloc(1, size);
  if (m) {
    m->vt = vt;
    m->train = 1;
  }
  return m;
}

dg_tensor *dg_module_forward(dg_module *m, dg_ctx *ctx, dg_tensor *x) {
  if (!ctx) return NULL;
  if (!m || !m->vt || !m->vt->forward) {
    dg__set_error(ctx, DG_EINVAL, "module forward: module is NULL or has no forward");
    return NULL;
  }
  return m->vt->forward(m, ctx, x);
}

int dg_module_bind(dg_module *m, dg_params *ps, const char *prefix, uint64_t seed) {
  if (!m || !m->vt || !ps) return DG_EINVAL;
  return m->vt->bind ? m->vt->bind(m, ps, prefix ? prefix : "", seed) : DG_OK;
}

void dg_module_set_train(dg_module *m, int train) {
  if (!m) return;
  m->train = !!train;
  for (int i = 0; i < m->nchildren; i++) dg_module_set_train(m->children[i], train);
}

const char *dg_module_type(const dg_module *m) {
  return (m && m->vt && m->vt->type) ? m->vt->type : "?";
}

void dg_module_free(dg_module *m) {
  if (!m) return;
  if (m->vt && m->vt->destroy) m->vt->destroy(m);
  dg__free(m);
}

/* ---- containers: children with names ---- */

void dg__children_free(dg_module *m) {
  for (int i = 0; i < m->nchildren; i++) {
    dg_module_free(m->children[i]);
    dg__free(m->child_names[i]);
  }
  dg__free(m->children);
  dg__free(m->child_names);
  m->children = NULL;
  m->child_names = NULL;
  m->nchildren = 0;
}

int dg__children_bind(dg_module *m, dg_params *ps, const char *prefix, uint64_t seed) {
  char p[256];
  for (int i = 0; i < m->nchildren; i++) {
    int rc = dg_module_bind(m->children[i], ps, dg__join(p, sizeof p, prefix, m->child_names[i]),
                            seed);
    if (rc) return rc;
  }
  return DG_OK;
}

int dg__child_push(dg_module *m, dg_module *c, const char *name) {
  char idx[24];
  if (!name) {
    snprintf(idx, sizeof idx, "%d", m->nchildren);
    name = idx;
  }
  char *nm = dg__strdup(name);
  dg_module **ch = dg__realloc(m->children, (size_t)(m->nchildren + 1) * sizeof *ch);
  if (ch) m->children = ch;
  char **nms = ch ? dg__realloc(m->child_names, (size_t)(m->nchildren + 1) * sizeof *nms) : NULL;
  if (nms) m->child_names = nms;
  if (!nm || !ch || !nms) {
    dg__free(nm);
    return DG_ENOMEM;
  }
  m->children[m->nchildren] = c;
  m->child_names[m->nchildren++] = nm;
  return DG_OK;
}

/* ---- Sequential ---- */

static dg_tensor *seq_forward(dg_module *m, dg_ctx *ctx, dg_tensor *x) {
  for (int i = 0; i < m->nchildren && x; i++) x = dg_module_forward(m->children[i], ctx, x);
  return x;
}

static const dg_module_vtable seq_vt = {"Sequential", seq_forward, dg__children_bind, dg__children_free};

int dg_nn_sequential(dg_module **out) {
  if (!out) return DG_EINVAL;
  *out = dg__module_alloc(sizeof(dg_module), &seq_vt);
  return *out ? DG_OK : DG_ENOMEM;
}

int dg_sequential_add(dg_module *seq, dg_module *child, const char *name) {
  if (!seq || seq->vt != &seq_vt || !child || child == seq) return DG_EINVAL;
  return dg__child_push(seq, child, name);
}

int dg_sequential_len(const dg_module *seq) {
  return (seq && seq->vt == &seq_vt) ? seq->nchildren : 0;
}

dg_module *dg_sequential_get(const dg_module *seq, int i) {
  if (!seq || seq->vt != &seq_vt || i < 0 || i >= seq->nchildren) return NULL;
  return seq->children[i];
}

int dg_sequential_split(dg_module *seq, int k, dg_module **tail) {
  if (!tail) return DG_EINVAL;
  *tail = NULL;
  if (!seq || seq->vt != &seq_vt || k < 0 || k > seq->nchildren) return DG_EINVAL;
  dg_module *t;
  int rc = dg_nn_sequential(&t);
  if (rc) return rc;
  for (int i = k; i < seq->nchildren; i++) {
    if ((rc = dg__child_push(t, seq->children[i], seq->child_names[i]))) {
      t->nchildren = 0; /* children still belong to seq */
      dg__free(t->children);
      for (int j = 0; j < i - k; j++) dg__free(t->child_names[j]);
      dg__free(t->child_names);
      dg__free(t);
      return rc;
    }
  }
  for (int i = k; i < seq->nchildren; i++) dg__free(seq->child_names[i]);
  seq->nchildren = k;
  *tail = t;
  return DG_OK;
}
