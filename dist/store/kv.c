/* Key -> bytes map with linear probing; deletion re-inserts the cluster. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/store/kv_impl.h"
#include "dist/store/store_impl.h"
#include "base/common_impl.h"

static uint64_t kv_hash(const char *k, size_t n) {
  return dg__std_hash_bytes(k, n, 0x9e3779b97f4a7c15ULL);
}

void dg__kv_free(dg_kv *kv) {
  for (size_t i = 0; i < kv->cap; i++) {
    dg__free(kv->e[i].key);
    dg__free(kv->e[i].val);
  }
  dg__free(kv->e);
  memset(kv, 0, sizeof *kv);
}

static size_t slot_of(const dg_kv *kv, uint64_t h, const char *key, size_t klen) {
  size_t i = (size_t)h & (kv->cap - 1);
  while (kv->e[i].key &&
         !(kv->e[i].hash == h && kv->e[i].klen == klen && !memcmp(kv->e[i].key, key, klen)))
    i = (i + 1) & (kv->cap - 1);
  return i;
}

dg_kv_entry *dg__kv_find(dg_kv *kv, const char *key, size_t klen) {
  if (!kv->cap) return NULL;
  size_t i = slot_of(kv, kv_hash(key, klen), key, klen);
  return kv->e[i].key ? &kv->e[i] : NULL;
}

static int grow(dg_kv *kv) {
  size_t ncap = kv->cap ? kv->cap * 2 : 16;
  dg_kv_entry *ne = dg__calloc(ncap, sizeof *ne), *old = kv->e;
  if (!ne) return -ENOMEM;
  size_t ocap = kv->cap;
  kv->e = ne;
  kv->cap = ncap;
  for (size_t i = 0; i < ocap; i++)
    if (old[i].key) kv->e[slot_of(kv, old[i].hash, old[i].key, old[i].klen)] = old[i];
  dg__free(old);
  return 0;
}

int dg__kv_set(dg_kv *kv, const char *key, size_t klen, const void *val, size_t vlen) {
  if ((kv->n + 1) * 2 > kv->cap && grow(kv) < 0) return -ENOMEM;
  uint64_t h = kv_hash(key, klen);
  size_t i = slot_of(kv, h, key, klen);
  unsigned char *v = dg__malloc(vlen ? vlen : 1);
  if (!v) return -ENOMEM;
  if (vlen) memcpy(v, val, vlen);
  dg_kv_entry *e = &kv->e[i];
  if (!e->key) {
    e->key = dg__malloc(klen + 1);
    if (!e->key) {
      dg__free(v);
      return -ENOMEM;
    }
    memcpy(e->key, key, klen);
    e->key[klen] = 0;
    e->klen = klen;
    e->hash = h;
    kv->n++;
  }
  dg__free(e->val);
  e->val = v;
  e->vlen = vlen;
  return 0;
}

int dg__kv_del(dg_kv *kv, const char *key, size_t klen) {
  dg_kv_entry *e = dg__kv_find(kv, key, klen);
  if (!e) return 0;
  dg__free(e->key);
  dg__free(e->val);
  memset(e, 0, sizeof *e);
  kv->n--;
  /* Re-insert the rest of the probe cluster so lookups stay correct. */
  size_t i = ((size_t)(e - kv->e) + 1) & (kv->cap - 1);
  while (kv->e[i].key) {
    dg_kv_entry t = kv->e[i];
    memset(&kv->e[i], 0, sizeof t);
    kv->e[slot_of(kv, t.hash, t.key, t.klen)] = t;
    i = (i + 1) & (kv->cap - 1);
  }
  return 1;
}

int dg__kv_add(dg_kv *kv, const char *key, size_t klen, int64_t delta, int64_t *out) {
  int64_t v = 0;
  dg_kv_entry *e = dg__kv_find(kv, key, klen);
  if (e) {
    char tmp[32];
    char *endp;
    if (e->vlen == 0 || e->vlen >= sizeof tmp) return -EINVAL;
    memcpy(tmp, e->val, e->vlen);
    tmp[e->vlen] = 0;
    errno = 0;
    v = strtoll(tmp, &endp, 10);
    if (errno || *endp) return -EINVAL;
  }
  /* two's-complement wrap, as torch's int64 counter does in practice: a
   * client's huge delta must not be undefined behaviour in the server */
  v = (int64_t)((uint64_t)v + (uint64_t)delta);
  char s[32];
  int n = snprintf(s, sizeof s, "%lld", (long long)v);
  if (dg__kv_set(kv, key, klen, s, (size_t)n) < 0) return -ENOMEM;
  *out = v;
  return 0;
}
