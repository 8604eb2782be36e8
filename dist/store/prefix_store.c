/* Prefix store: key k of the wrapped store becomes "<prefix>/<k>" (Gloo's
 * and torch's PrefixStore). */
#include <stdio.h>
#include <string.h>

#include "dist/store/store_impl.h"
#include "base/common_impl.h"

typedef struct {
  dg_store base;
  dg_store *inner;
  char *prefix;
} prefix_store;

#define P(s) ((prefix_store *)(s))

static char *full_key(dg_store *s, const char *key) {
  size_t n = strlen(P(s)->prefix) + strlen(key) + 2;
  char *k = dg__malloc(n);
  if (k) snprintf(k, n, "%s/%s", P(s)->prefix, key);
  return k;
}

/* Copies the wrapped store's error text so callers see it on this handle. */
static int pass(dg_store *s, int rc) {
  if (rc != DG_OK) dg__store_fail(s, rc, "%s", dg_store_errmsg(P(s)->inner));
  return rc;
}

static int pfx_set(dg_store *s, const char *key, const void *val, size_t len) {
  char *k = full_key(s, key);
  if (!k) return DG_ENOMEM;
  int rc = P(s)->inner->vt->set(P(s)->inner, k, val, len);
  dg__free(k);
  return pass(s, rc);
}

static int pfx_get(dg_store *s, const char *key, void **val, size_t *len, int64_t dl) {
  char *k = full_key(s, key);
  if (!k) return DG_ENOMEM;
  int rc = P(s)->inner->vt->get(P(s)->inner, k, val, len, dl);
  dg__free(k);
  return pass(s, rc);
}

static int pfx_add(dg_store *s, const char *key, int64_t delta, int64_t *result) {
  char *k = full_key(s, key);
  if (!k) return DG_ENOMEM;
  int rc = P(s)->inner->vt->add(P(s)->inner, k, delta, result);
  dg__free(k);
  return pass(s, rc);
}

static int pfx_cas(dg_store *s, const char *key, const void *e, size_t elen, const void *d,
                   size_t dlen, void **cur, size_t *curlen) {
  char *k = full_key(s, key);
  if (!k) return DG_ENOMEM;
  int rc = P(s)->inner->vt->compare_set(P(s)->inner, k, e, elen, d, dlen, cur, curlen);
  dg__free(k);
  return pass(s, rc);
}

static char **full_keys(dg_store *s, const char *const *keys, int nkeys) {
  char **ks = dg__calloc((size_t)nkeys + 1, sizeof *ks);
  if (!ks) return NULL;
  for (int i = 0; i < nkeys; i++) {
    if (!(ks[i] = full_key(s, keys[i]))) {
      for (int j = 0; j < i; j++) dg__free(ks[j]);
      dg__free(ks);
      return NULL;
    }
  }
  return ks;
}

static void free_keys(char **ks, int nkeys) {
  for (int i = 0; i < nkeys; i++) dg__free(ks[i]);
  dg__free(ks);
}

static int pfx_check(dg_store *s, const char *const *keys, int nkeys, int *present) {
  char **ks = full_keys(s, keys, nkeys);
  if (!ks) return DG_ENOMEM;
  int rc = P(s)->inner->vt->check(P(s)->inner, (const char *const *)ks, nkeys, present);
  free_keys(ks, nkeys);
  return pass(s, rc);
}

static int pfx_wait(dg_store *s, const char *const *keys, int nkeys, int64_t dl) {
  char **ks = full_keys(s, keys, nkeys);
  if (!ks) return DG_ENOMEM;
  int rc = P(s)->inner->vt->wait(P(s)->inner, (const char *const *)ks, nkeys, dl);
  free_keys(ks, nkeys);
  return pass(s, rc);
}

static int pfx_del(dg_store *s, const char *key, int *deleted) {
  char *k = full_key(s, key);
  if (!k) return DG_ENOMEM;
  int rc = P(s)->inner->vt->del(P(s)->inner, k, deleted);
  dg__free(k);
  return pass(s, rc);
}

/* Counts every key of the wrapped store, as torch's PrefixStore does. */
static int pfx_num_keys(dg_store *s, int64_t *n) {
  return pass(s, P(s)->inner->vt->num_keys(P(s)->inner, n));
}

static int pfx_port(const dg_store *s) { return dg_store_port(P(s)->inner); }

static void pfx_destroy(dg_store *s) {
  dg__free(P(s)->prefix);
  dg__free(s);
}

static const dg_store_vt prefix_vt = {
    .kind = "prefix", .set = pfx_set, .get = pfx_get, .add = pfx_add,
    .compare_set = pfx_cas, .check = pfx_check, .wait = pfx_wait, .del = pfx_del,
    .num_keys = pfx_num_keys, .port = pfx_port, .destroy = pfx_destroy};

int dg_store_new_prefix(dg_store **out, dg_store *base, const char *prefix) {
  if (!out || !base || !prefix) return DG_EINVAL;
  *out = NULL;
  prefix_store *p = dg__calloc(1, sizeof *p);
  if (!p || !(p->prefix = dg__strdup(prefix))) {
    dg__free(p);
    return DG_ENOMEM;
  }
  dg__store_init(&p->base, &prefix_vt, base->timeout_ms);
  p->inner = base;
  *out = &p->base;
  return DG_OK;
}
