/* Parameter counts and a model summary (torchinfo / Keras summary style):
 * one row per module of a bound tree with its path, type, parameter counts
 * of its subtree and its own parameters and buffers with their shapes. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "nn/nn_impl.h"

int64_t dg_params_numel(const dg_params *ps, int trainable_only) {
  int64_t n = 0;
  for (int i = 0; i < dg_params_count(ps); i++)
    if (!trainable_only || dg_params_trainable(ps, i)) n += dg_tensor_numel(dg_params_get(ps, i));
  return n;
}

/* ---- writer: snprintf into buf, counting what did not fit ---- */

typedef struct {
  char *buf;
  size_t cap, len; /* len: the whole text's length, even past cap */
} sum_wr;

static void wr(sum_wr *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void wr(sum_wr *w, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *at = w->len < w->cap ? w->buf + w->len : NULL;
  int n = vsnprintf(at, at ? w->cap - w->len : 0, fmt, ap);
  va_end(ap);
  if (n > 0) w->len += (size_t)n;
}

/* ---- the tree, flattened in depth-first order ---- */

typedef struct {
  const dg_module *m;
  int parent, depth;
  int64_t total, trainable; /* parameters of the subtree */
} sum_mod;

typedef struct {
  sum_mod *mods;
  int n, cap;
  int *owner; /* (params) the deepest module whose path prefixes the name, or -1 */
  int *bowner; /* (buffers) the same */
} sum_tree;

static int flatten(sum_tree *t, const dg_module *m, int parent, int depth) {
  if (t->n == t->cap) {
    int cap = t->cap ? 2 * t->cap : 32;
    sum_mod *p = dg__realloc(t->mods, (size_t)cap * sizeof *p);
    if (!p) return DG_ENOMEM;
    t->mods = p, t->cap = cap;
  }
  int k = t->n++;
  t->mods[k] = (sum_mod){m, parent, depth, 0, 0};
  for (int c = 0; c < m->nchildren; c++) {
    int rc = m->children[c] ? flatten(t, m->children[c], k, depth + 1) : DG_OK;
    if (rc) return rc;
  }
  return DG_OK;
}

/* 1 when `name` lies under module path `path` ("" holds every name). */
static int under(const char *path, const char *name) {
  size_t n = strlen(path);
  return !n || (!strncmp(name, path, n) && name[n] == '.');
}

/* The deepest bound module of the tree whose path prefixes name, or -1. */
static int owner_of(const sum_tree *t, const char *name) {
  int best = -1;
  size_t blen = 0;
  for (int k = 0; k < t->n; k++) {
    const char *p = t->mods[k].m->path;
    if (!p || !under(p, name)) continue;
    if (best < 0 || strlen(p) > blen) best = k, blen = strlen(p);
  }
  return best;
}

/* Assigns parameters and buffers to modules and sums each subtree. */
static int assign(sum_tree *t, const dg_params *ps) {
  int np = dg_params_count(ps), nb = dg_params_buffer_count(ps);
  t->owner = dg__malloc(((size_t)np + 1) * sizeof *t->owner);
  t->bowner = dg__malloc(((size_t)nb + 1) * sizeof *t->bowner);
  if (!t->owner || !t->bowner) return DG_ENOMEM;
  for (int i = 0; i < np; i++) {
    dg_tensor *p = dg_params_get(ps, i);
    int k = t->owner[i] = owner_of(t, dg_tensor_name(p));
    if (k < 0) continue;
    t->mods[k].total += dg_tensor_numel(p);
    if (dg_params_trainable(ps, i)) t->mods[k].trainable += dg_tensor_numel(p);
  }
  for (int i = 0; i < nb; i++) t->bowner[i] = owner_of(t, dg_tensor_name(dg_params_buffer_get(ps, i)));
  for (int k = t->n - 1; k > 0; k--) { /* children come after their parent */
    sum_mod *c = &t->mods[k], *p = &t->mods[c->parent];
    p->total += c->total;
    p->trainable += c->trainable;
  }
  return DG_OK;
}

static void shape_text(char *buf, size_t cap, const dg_tensor *t) {
  size_t k = (size_t)snprintf(buf, cap, "(");
  for (int d = 0; d < dg_tensor_ndim(t) && k < cap; d++)
    k += (size_t)snprintf(buf + k, cap - k, d ? ", %" PRId64 : "%" PRId64, dg_tensor_dim(t, d));
  if (k < cap) snprintf(buf + k, cap - k, dg_tensor_ndim(t) == 1 ? ",)" : ")");
}

/* The module's own tensors: "weight (10, 32), bias (10,) frozen, ...". */
static void own_tensors(sum_wr *w, const sum_tree *t, int k, const dg_params *ps) {
  const char *path = t->mods[k].m->path;
  size_t skip = *path ? strlen(path) + 1 : 0;
  int first = 1;
  char sh[96];
  for (int i = 0; i < dg_params_count(ps); i++) {
    if (t->owner[i] != k) continue;
    dg_tensor *p = dg_params_get(ps, i);
    shape_text(sh, sizeof sh, p);
    wr(w, "%s%s %s%s", first ? "  " : ", ", dg_tensor_name(p) + skip, sh,
       dg_params_trainable(ps, i) ? "" : " frozen");
    first = 0;
  }
  for (int i = 0; i < dg_params_buffer_count(ps); i++) {
    if (t->bowner[i] != k) continue;
    dg_tensor *b = dg_params_buffer_get(ps, i);
    shape_text(sh, sizeof sh, b);
    wr(w, "%s%s %s buffer", first ? "  " : ", ", dg_tensor_name(b) + skip, sh);
    first = 0;
  }
}

static const char *shown_path(const dg_module *m) {
  return !m->path ? "(unbound)" : *m->path ? m->path : "(root)";
}

/* The table: widths first, then one row per module, then the totals. */
static void write_table(sum_wr *w, const sum_tree *t, const dg_params *ps) {
  int pw = (int)strlen("module"), tw = (int)strlen("type");
  for (int k = 0; k < t->n; k++) {
    int l = 2 * t->mods[k].depth + (int)strlen(shown_path(t->mods[k].m));
    if (l > pw) pw = l;
    l = (int)strlen(dg_module_type(t->mods[k].m));
    if (l > tw) tw = l;
  }
  wr(w, "%-*s  %-*s  %12s  %12s  %s\n", pw, "module", tw, "type", "params", "trainable",
     "own parameters and buffers");
  for (int k = 0; k < t->n; k++) {
    const sum_mod *s = &t->mods[k];
    int ind = 2 * s->depth;
    wr(w, "%*s%-*s  %-*s  %12" PRId64 "  %12" PRId64, ind, "", pw - ind, shown_path(s->m), tw,
       dg_module_type(s->m), s->total, s->trainable);
    own_tensors(w, t, k, ps);
    wr(w, "\n");
  }
  int64_t nt = 0, nbuf = 0, ebuf = 0, out = 0, eout = 0;
  for (int i = 0; i < dg_params_count(ps); i++)
    if (t->owner[i] >= 0) nt++;
    else out++, eout += dg_tensor_numel(dg_params_get(ps, i));
  for (int i = 0; i < dg_params_buffer_count(ps); i++)
    if (t->bowner[i] >= 0) nbuf++, ebuf += dg_tensor_numel(dg_params_buffer_get(ps, i));
  const sum_mod *r = &t->mods[0];
  wr(w, "total: %" PRId64 " parameters in %" PRId64 " tensors (%" PRId64 " trainable, %" PRId64
     " frozen); %" PRId64 " buffer elements in %" PRId64 " buffers; %d modules\n", r->total, nt,
     r->trainable, r->total - r->trainable, ebuf, nbuf, t->n);
  if (out)
    wr(w, "the store holds %" PRId64 " more parameters (%" PRId64 " elements) outside this "
       "module\n", out, eout);
}

int dg_module_summary(const dg_module *m, const dg_params *ps, char *buf, size_t cap) {
  if (!m || !ps || (!buf && cap)) return DG_EINVAL;
  if (!m->path) return DG_ESTATE; /* bind it first: parameters are found by path */
  sum_tree t = {0};
  int rc = flatten(&t, m, -1, 0);
  if (!rc) rc = assign(&t, ps);
  sum_wr w = {buf, cap, 0};
  if (!rc) write_table(&w, &t, ps);
  dg__free(t.mods);
  dg__free(t.owner);
  dg__free(t.bowner);
  if (rc) return rc;
  if (cap) buf[w.len < cap ? w.len : cap - 1] = '\0';
  return w.len > (size_t)INT32_MAX ? DG_ENOMEM : (int)w.len; /* no 2 GiB tables */
}
