/* Argument checks, dispatch and error text shared by every store kind. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "dist/store/store_impl.h"
#include "dist/net/net_impl.h"
#include "base/common_impl.h"

void dg__store_init(dg_store *s, const dg_store_vt *vt, int timeout_ms) {
  s->vt = vt;
  s->timeout_ms = timeout_ms > 0 ? timeout_ms : 300000;
  pthread_mutex_init(&s->err_mu, NULL);
  s->err[0] = 0;
}

int dg__store_fail(dg_store *s, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  pthread_mutex_lock(&s->err_mu);
  dg__vfmt(s->err, sizeof s->err, fmt, ap);
  pthread_mutex_unlock(&s->err_mu);
  va_end(ap);
  return code;
}

int dg__store_timeout(dg_store *s, const char *const *keys, int nkeys, int timeout_ms) {
  char list[384];
  size_t o = 0;
  list[0] = 0;
  for (int i = 0; i < nkeys && o + 4 < sizeof list; i++) {
    int present = 0;
    /* Only the missing keys are worth naming. */
    if (s->vt->check(s, &keys[i], 1, &present) == DG_OK && present) continue;
    int n = snprintf(list + o, sizeof list - o, "%s\"%s\"", o ? ", " : "", keys[i]);
    if (n < 0) break;
    o += (size_t)n < sizeof list - o ? (size_t)n : sizeof list - o - 1;
  }
  return dg__store_fail(s, DG_ETIMEDOUT, "%s store: timed out after %d ms waiting for key(s) %s",
                        s->vt->kind, timeout_ms, o ? list : "(none missing any more)");
}

const char *dg_store_errmsg(const dg_store *s) {
  if (!s) return "no store";
  return s->err[0] ? s->err : "no error";
}

void dg_store_free(dg_store *s) {
  if (!s) return;
  pthread_mutex_destroy(&s->err_mu);
  s->vt->destroy(s);
}

int dg_store_port(const dg_store *s) {
  return s && s->vt->port ? s->vt->port(s) : DG_EINVAL;
}

void dg__store_release(dg_store *s) {
  if (s && s->vt->release) s->vt->release(s);
}

int dg__store_drain(dg_store *s, int64_t deadline, int quiet_ms) {
  return s && s->vt->drain ? s->vt->drain(s, deadline, quiet_ms) : 0;
}

void dg_store_value_free(void *val) { dg__free(val); }

/* Any string is a key, "" included (torch accepts it too). */
static int bad_key(const char *key) { return !key; }

int dg_store_set(dg_store *s, const char *key, const void *val, size_t len) {
  if (!s || bad_key(key) || (len && !val)) return DG_EINVAL;
  return s->vt->set(s, key, val, len);
}

int dg_store_get(dg_store *s, const char *key, void **val, size_t *len, int timeout_ms) {
  if (!s || bad_key(key) || !val || !len) return DG_EINVAL;
  *val = NULL;
  *len = 0;
  return s->vt->get(s, key, val, len, dg__deadline(timeout_ms, s->timeout_ms));
}

int dg_store_add(dg_store *s, const char *key, int64_t delta, int64_t *result) {
  if (!s || bad_key(key)) return DG_EINVAL;
  int64_t tmp;
  return s->vt->add(s, key, delta, result ? result : &tmp);
}

int dg_store_compare_set(dg_store *s, const char *key, const void *expected,
                         size_t elen, const void *desired, size_t dlen,
                         void **cur, size_t *curlen) {
  if (!s || bad_key(key) || (elen && !expected) || (dlen && !desired) || !cur || !curlen)
    return DG_EINVAL;
  *cur = NULL;
  *curlen = 0;
  return s->vt->compare_set(s, key, expected, elen, desired, dlen, cur, curlen);
}

static int bad_keys(const char *const *keys, int nkeys) {
  if (nkeys < 0 || (nkeys > 0 && !keys)) return 1;
  for (int i = 0; i < nkeys; i++)
    if (bad_key(keys[i])) return 1;
  return 0;
}

int dg_store_check(dg_store *s, const char *const *keys, int nkeys, int *present) {
  if (!s || bad_keys(keys, nkeys) || !present) return DG_EINVAL;
  return s->vt->check(s, keys, nkeys, present);
}

int dg_store_wait(dg_store *s, const char *const *keys, int nkeys, int timeout_ms) {
  if (!s || bad_keys(keys, nkeys)) return DG_EINVAL;
  if (nkeys == 0) return DG_OK;
  return s->vt->wait(s, keys, nkeys, dg__deadline(timeout_ms, s->timeout_ms));
}

int dg_store_delete(dg_store *s, const char *key, int *deleted) {
  if (!s || bad_key(key)) return DG_EINVAL;
  int tmp;
  return s->vt->del(s, key, deleted ? deleted : &tmp);
}

int dg_store_num_keys(dg_store *s, int64_t *n) {
  if (!s || !n) return DG_EINVAL;
  return s->vt->num_keys(s, n);
}

/* libstdc++'s _Hash_bytes for 64-bit size_t (MurmurHash2-64A variant with
 * unaligned little-endian loads), which std::hash<std::string> calls with
 * seed 0xc70f6907. Gloo's FileStore names its files with it. */
static uint64_t load_bytes(const unsigned char *p, size_t n) {
  uint64_t r = 0;
  while (n-- > 0) r = (r << 8) + p[n];
  return r;
}

static uint64_t shift_mix(uint64_t v) { return v ^ (v >> 47); }

uint64_t dg__std_hash_bytes(const void *ptr, size_t len, uint64_t seed) {
  const uint64_t mul = (((uint64_t)0xc6a4a793UL) << 32) + (uint64_t)0x5bd1e995UL;
  const unsigned char *buf = ptr;
  const size_t len_aligned = len & ~(size_t)7;
  const unsigned char *end = buf + len_aligned;
  uint64_t hash = seed ^ (len * mul);
  for (const unsigned char *p = buf; p != end; p += 8) {
    uint64_t data;
    memcpy(&data, p, 8);
    data = shift_mix(data * mul) * mul;
    hash ^= data;
    hash *= mul;
  }
  if ((len & 7) != 0) {
    uint64_t data = load_bytes(end, len & 7);
    hash ^= data;
    hash *= mul;
  }
  hash = shift_mix(hash) * mul;
  hash = shift_mix(hash);
  return hash;
}
