/* Module plumbing: dispatch with errors that name the module, generic
 * binding and freeing of children, train mode. */
#include <string.h>

#include "nn/nn_impl.h"
#include "base/trace_impl.h"

const char *dg__join(char *buf, size_t cap, const char *prefix, const char *name) {
  int n = (prefix && *prefix) ? snprintf(buf, cap, "%s.%s", prefix, name)
                              : snprintf(buf, cap, "%s", name);
  return (n >= 0 && (size_t)n < cap) ? buf : NULL;
}

/* The last n bytes of s: the end of a long path says where it is. */
static const char *path_tail(const char *s, size_t n) {
  size_t len = strlen(s);
  return len > n ? s + len - n : s;
}

uint64_t dg__param_seed(uint64_t seed, const char *name) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a, then a splitmix finaliser */
  for (const char *p = name; *p; p++) h = (h ^ (uint8_t)*p) * 1099511628211ull;
  h ^= seed + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

uint64_t dg_module_param_seed(uint64_t seed, const char *name) {
  return dg__param_seed(seed, name ? name : "");
}

int dg__bind_param(dg_params *ps, const char *prefix, const char *name, int ndim,
                   const int64_t *shape, dg_tensor **out) {
  char full[DG__NAME_MAX];
  if (!dg__join(full, sizeof full, prefix, name))
    return dg__params_fail(ps, DG_EINVAL, "module bind: parameter name longer than %d bytes: "
                           "\"...%s.%s\"", DG__NAME_MAX - 1, path_tail(prefix, 64), name);
  return dg_params_add(ps, full, ndim, shape, out);
}

int dg__bind_buffer(dg_params *ps, const char *prefix, const char *name, int ndim,
                    const int64_t *shape, dg_tensor **out) {
  char full[DG__NAME_MAX];
  if (!dg__join(full, sizeof full, prefix, name))
    return dg__params_fail(ps, DG_EINVAL, "module bind: buffer name longer than %d bytes: "
                           "\"...%s.%s\"", DG__NAME_MAX - 1, path_tail(prefix, 64), name);
  return dg_params_add_buffer(ps, full, ndim, shape, out);
}

dg_module *dg__module_alloc(size_t size, const dg_module_vtable *vt) {
  dg_module *m = dg__calloc(1, size);
  if (m) {
    m->vt = vt;
    m->train = 1;
  }
  return m;
}

int dg_module_new(dg_module **out, size_t size, const dg_module_vtable *vt) {
  if (!out) return DG_EINVAL;
  *out = NULL;
  if (!vt || size < sizeof(dg_module)) return DG_EINVAL;
  *out = dg__module_alloc(size, vt);
  return *out ? DG_OK : DG_ENOMEM;
}

/* ---- forward: the innermost failing module names itself ---- */

/* The ctx whose current error already names a module, so that the modules
 * around the failing one leave the message alone. Errors are first-wins
 * until cleared, so the mark is dropped when a forward starts on a ctx with
 * no error. Thread-local: a ctx is used by one thread at a time. */
static _Thread_local const dg_ctx *t_named;

/* Puts "<path> (<type>): " (a root's: "<type>: ") before ctx's message,
 * cutting the message's end if it no longer fits. */
static void name_error(dg_module *m, dg_ctx *ctx) {
  char pre[DG__NAME_MAX + 64];
  const char *type = dg_module_type(m);
  if (m->path && *m->path) snprintf(pre, sizeof pre, "%s (%s): ", m->path, type);
  else if (strncmp(ctx->errmsg, type, strlen(type))) snprintf(pre, sizeof pre, "%s: ", type);
  else return; /* "Conv2d: ..." names its module already */
  size_t cap = sizeof ctx->errmsg, np = strlen(pre), nm = strlen(ctx->errmsg);
  if (np > cap - 1) np = cap - 1;
  if (nm > cap - 1 - np) nm = cap - 1 - np;
  memmove(ctx->errmsg + np, ctx->errmsg, nm);
  memcpy(ctx->errmsg, pre, np);
  ctx->errmsg[np + nm] = 0;
}

/* A failed forward of m: names it once (the innermost module) and makes
 * sure the ctx holds an error (code rc, DG_ESTATE if none, when a user's
 * forward failed without saying why). */
static void forward_failed(dg_module *m, dg_ctx *ctx, int had, int bad_input, int rc) {
  if (had || t_named == ctx) return;
  if (!ctx->err && bad_input)
    dg__set_error(ctx, DG_EINVAL, "input x is NULL");
  else if (!ctx->err && rc)
    dg__set_error(ctx, rc, "forward failed (%s) and recorded no error", dg_strerror(rc));
  else if (!ctx->err)
    dg__set_error(ctx, DG_ESTATE, "forward returned NULL and recorded no error");
  name_error(m, ctx);
  t_named = ctx;
}

/* The tuple forward_n returned: 1..DG_MODULE_MAX_IO tensors, none NULL. */
static int check_outputs(dg_ctx *ctx, int rc, dg_tensor **ys, int ny) {
  if (rc) return ctx->err ? ctx->err : rc;
  if (ny < 1 || ny > DG_MODULE_MAX_IO)
    return dg__set_error(ctx, DG_EINVAL, "forward returned %d tensors (1 to %d allowed)", ny,
                         DG_MODULE_MAX_IO);
  for (int i = 0; i < ny; i++)
    if (!ys[i])
      return ctx->err ? ctx->err : dg__set_error(ctx, DG_ESTATE, "forward returned output %d "
                                                 "NULL", i);
  return DG_OK;
}

/* One tensor through a module that has only forward_n. */
static dg_tensor *forward_one_of_n(dg_module *m, dg_ctx *ctx, dg_tensor *x) {
  dg_tensor *ys[DG_MODULE_MAX_IO];
  int ny = 0;
  int rc = m->vt->forward_n(m, ctx, &x, 1, ys, &ny);
  if (rc && !ctx->err)
    dg__set_error(ctx, rc, "forward failed (%s) and recorded no error", dg_strerror(rc));
  if (rc || check_outputs(ctx, rc, ys, ny)) return NULL;
  if (ny == 1) return ys[0];
  dg__set_error(ctx, DG_EINVAL, "forward returned %d tensors where one was wanted (call "
                "dg_module_forward_n)", ny);
  return NULL;
}

dg_tensor *dg_module_forward(dg_module *m, dg_ctx *ctx, dg_tensor *x) {
  if (!ctx) return NULL;
  if (!m || !m->vt || (!m->vt->forward && !m->vt->forward_n)) {
    dg__set_error(ctx, DG_EINVAL, "module forward: module is NULL or has no forward");
    return NULL;
  }
  int had = ctx->err;
  if (!had && t_named == ctx) t_named = NULL;
  uint64_t tr0 = dg__trace_t0();
  dg_tensor *y = m->vt->forward ? m->vt->forward(m, ctx, x) : forward_one_of_n(m, ctx, x);
  DG__TRACE_END(tr0, "forward", m->path, NULL, 0, NULL, 0);
  if (!y) forward_failed(m, ctx, had, !x, 0);
  return y;
}

int dg_module_forward_n(dg_module *m, dg_ctx *ctx, dg_tensor *const *xs, int nx, dg_tensor **ys,
                        int *ny) {
  if (ny) *ny = 0;
  if (!ctx) return DG_EINVAL;
  if (!m || !m->vt || (!m->vt->forward && !m->vt->forward_n))
    return dg__set_error(ctx, DG_EINVAL, "module forward: module is NULL or has no forward");
  if (!ys || !ny || nx < 1 || nx > DG_MODULE_MAX_IO || !xs)
    return dg__set_error(ctx, DG_EINVAL, "module forward: %d inputs (1 to %d), inputs %s, "
                         "outputs %s", nx, DG_MODULE_MAX_IO, xs ? "given" : "NULL",
                         ys && ny ? "given" : "NULL");
  int had = ctx->err, bad = 0, urc = DG_OK;
  if (!had && t_named == ctx) t_named = NULL;
  for (int i = 0; i < nx; i++) bad |= !xs[i];
  uint64_t tr0 = dg__trace_t0();
  int rc;
  if (m->vt->forward_n) {
    urc = m->vt->forward_n(m, ctx, xs, nx, ys, ny); /* then *ny is read */
    rc = check_outputs(ctx, urc, ys, *ny);
  } else if (nx != 1) {
    rc = dg__set_error(ctx, DG_EINVAL, "takes one tensor, got %d (a module of several inputs "
                       "needs a forward_n)", nx);
  } else {
    ys[0] = m->vt->forward(m, ctx, xs[0]);
    *ny = 1;
    rc = ys[0] ? DG_OK : ctx->err ? ctx->err : DG_ESTATE;
  }
  DG__TRACE_END(tr0, "forward", m->path, NULL, 0, NULL, 0);
  if (rc) {
    forward_failed(m, ctx, had, bad, urc);
    *ny = 0;
    return ctx->err ? ctx->err : rc;
  }
  return DG_OK;
}

/* ---- bind, free, train mode: generic over children ---- */

static int set_path(dg_module *m, const char *prefix) {
  char *p = dg__strdup(prefix);
  if (!p) return DG_ENOMEM;
  dg__free(m->path);
  m->path = p;
  return DG_OK;
}

int dg_module_bind(dg_module *m, dg_params *ps, const char *prefix, uint64_t seed) {
  if (!m || !m->vt || !ps) return DG_EINVAL;
  if (!prefix) prefix = "";
  if (set_path(m, prefix)) return dg__params_fail(ps, DG_ENOMEM, "module bind: out of memory");
  int rc = m->vt->bind ? m->vt->bind(m, ps, prefix, seed) : DG_OK;
  return rc ? rc : dg__children_bind(m, ps, prefix, seed);
}

void dg_module_set_train(dg_module *m, int train) {
  if (!m) return;
  m->train = !!train;
  for (int i = 0; m->children && i < m->nchildren; i++)
    dg_module_set_train(m->children[i], train);
}

const char *dg_module_type(const dg_module *m) {
  return (m && m->vt && m->vt->type) ? m->vt->type : "?";
}

void dg_module_release(dg_module *m) {
  if (!m) return;
  if (m->vt && m->vt->destroy) m->vt->destroy(m);
  dg__children_free(m);
  dg__free(m->path);
  m->path = NULL;
}

void dg_module_free(dg_module *m) {
  if (!m) return;
  dg_module_release(m);
  dg__free(m);
}

/* ---- children with names ---- */

void dg__children_free(dg_module *m) {
  for (int i = 0; i < m->nchildren; i++) {
    if (m->children) dg_module_free(m->children[i]);
    if (m->child_names) dg__free(m->child_names[i]);
  }
  dg__free(m->children);
  dg__free(m->child_names);
  m->children = NULL;
  m->child_names = NULL;
  m->nchildren = 0;
}

int dg__children_bind(dg_module *m, dg_params *ps, const char *prefix, uint64_t seed) {
  char p[DG__NAME_MAX], idx[24];
  if (m->nchildren > 0 && !m->children)
    return dg__params_fail(ps, DG_EINVAL, "module bind: %s at \"%s\" has %d children but no "
                           "children array", dg_module_type(m), prefix, m->nchildren);
  for (int i = 0; i < m->nchildren; i++) {
    const char *name = m->child_names ? m->child_names[i] : NULL;
    if (!name) {
      snprintf(idx, sizeof idx, "%d", i);
      name = idx;
    }
    if (!m->children[i])
      return dg__params_fail(ps, DG_EINVAL, "module bind: child \"%s\" of %s at \"%s\" is "
                             "NULL", name, dg_module_type(m), prefix);
    if (!dg__join(p, sizeof p, prefix, name))
      return dg__params_fail(ps, DG_EINVAL, "module bind: module path longer than %d bytes: "
                             "\"...%s.%s\"", DG__NAME_MAX - 1, path_tail(prefix, 64), name);
    int rc = dg_module_bind(m->children[i], ps, p, seed);
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

int dg_module_add_child(dg_module *m, dg_module *child, const char *name) {
  if (!m || !child || child == m || (name && !*name)) return DG_EINVAL;
  if (m->nchildren > 0 && (!m->children || !m->child_names)) return DG_EINVAL; /* hand-filled */
  return dg__child_push(m, child, name);
}

/* ---- Sequential ---- */

/* The tuple through the children in turn; an empty Sequential passes it on. */
static int seq_forward_n(dg_module *m, dg_ctx *ctx, dg_tensor *const *xs, int nx, dg_tensor **ys,
                         int *ny) {
  dg_tensor *cur[DG_MODULE_MAX_IO];
  for (int i = 0; i < nx; i++) cur[i] = xs[i];
  int n = nx;
  for (int i = 0; i < m->nchildren; i++) {
    int rc = dg_module_forward_n(m->children[i], ctx, cur, n, ys, &n);
    if (rc) return rc;
    memcpy(cur, ys, (size_t)n * sizeof *cur);
  }
  memcpy(ys, cur, (size_t)n * sizeof *ys);
  *ny = n;
  return DG_OK;
}

/* One tensor in and out, through children that may pass several between
 * them. A NULL x still reaches the first child, whose error then names it. */
static dg_tensor *seq_forward(dg_module *m, dg_ctx *ctx, dg_tensor *x) {
  dg_tensor *ys[DG_MODULE_MAX_IO];
  int n = 0;
  if (seq_forward_n(m, ctx, &x, 1, ys, &n)) return NULL;
  if (n == 1) return ys[0];
  dg__set_error(ctx, DG_EINVAL, "its last layer returns %d tensors where one was wanted (call "
                "dg_module_forward_n)", n);
  return NULL;
}

static const dg_module_vtable seq_vt = {"Sequential", seq_forward, NULL, NULL, seq_forward_n};

int dg_nn_sequential(dg_module **out) {
  if (!out) return DG_EINVAL;
  *out = dg__module_alloc(sizeof(dg_module), &seq_vt);
  return *out ? DG_OK : DG_ENOMEM;
}

int dg_sequential_add(dg_module *seq, dg_module *child, const char *name) {
  if (!seq || seq->vt != &seq_vt) return DG_EINVAL;
  return dg_module_add_child(seq, child, name);
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
