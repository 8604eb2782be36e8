/* A small key -> bytes map (open hashing over a growable array), used by the
 * in-process store and the TCP store server. Not thread-safe. Internal. */
#ifndef DG_KV_IMPL_H
#define DG_KV_IMPL_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  char *key;
  size_t klen;
  unsigned char *val;
  size_t vlen;
  uint64_t hash;
} dg_kv_entry;

typedef struct {
  dg_kv_entry *e; /* (cap) buckets, key NULL = empty, linear probing */
  size_t cap, n;
} dg_kv;

void dg__kv_free(dg_kv *kv);
dg_kv_entry *dg__kv_find(dg_kv *kv, const char *key, size_t klen);
/* Copies key and value; replaces an existing value. */
int dg__kv_set(dg_kv *kv, const char *key, size_t klen, const void *val, size_t vlen);
/* 1 when a key was removed. */
int dg__kv_del(dg_kv *kv, const char *key, size_t klen);
/* ADD semantics of TCPStore: value is decimal ASCII; missing = 0.
 * DG_EFORMAT when the stored value is not an integer. */
int dg__kv_add(dg_kv *kv, const char *key, size_t klen, int64_t delta, int64_t *out);

#endif
