/* In-process store: one shared map behind a mutex and a condition variable;
 * clones share it (ranks as threads). */
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "dist/store/kv_impl.h"
#include "dist/store/store_impl.h"
#include "dist/net/net_impl.h"
#include "base/common_impl.h"

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv; /* broadcast on every change */
  dg_kv kv;
  int refs;
} mem_shared;

typedef struct {
  dg_store base;
  mem_shared *sh;
} mem_store;

#define SH(s) (((mem_store *)(s))->sh)

static int mem_set(dg_store *s, const char *key, const void *val, size_t len) {
  mem_shared *sh = SH(s);
  pthread_mutex_lock(&sh->mu);
  int rc = dg__kv_set(&sh->kv, key, strlen(key), val, len);
  pthread_cond_broadcast(&sh->cv);
  pthread_mutex_unlock(&sh->mu);
  return rc < 0 ? DG_ENOMEM : DG_OK;
}

static int all_present(mem_shared *sh, const char *const *keys, int nkeys) {
  for (int i = 0; i < nkeys; i++)
    if (!dg__kv_find(&sh->kv, keys[i], strlen(keys[i]))) return 0;
  return 1;
}

/* Called with the lock held; returns with it held. */
static int wait_locked(mem_shared *sh, const char *const *keys, int nkeys, int64_t deadline) {
  while (!all_present(sh, keys, nkeys)) {
    int64_t left = deadline - dg__now_ms();
    if (left <= 0) return DG_ETIMEDOUT;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t ns = ts.tv_nsec + (left % 1000) * 1000000;
    ts.tv_sec += left / 1000 + ns / 1000000000;
    ts.tv_nsec = ns % 1000000000;
    pthread_cond_timedwait(&sh->cv, &sh->mu, &ts);
  }
  return DG_OK;
}

static int mem_wait(dg_store *s, const char *const *keys, int nkeys, int64_t deadline) {
  mem_shared *sh = SH(s);
  int64_t start = dg__now_ms();
  pthread_mutex_lock(&sh->mu);
  int rc = wait_locked(sh, keys, nkeys, deadline);
  pthread_mutex_unlock(&sh->mu);
  if (rc == DG_ETIMEDOUT) return dg__store_timeout(s, keys, nkeys, (int)(deadline - start));
  return rc;
}

static int mem_get(dg_store *s, const char *key, void **val, size_t *len, int64_t deadline) {
  mem_shared *sh = SH(s);
  int64_t start = dg__now_ms();
  pthread_mutex_lock(&sh->mu);
  int rc = wait_locked(sh, &key, 1, deadline);
  if (rc == DG_OK) {
    dg_kv_entry *e = dg__kv_find(&sh->kv, key, strlen(key));
    *val = dg__malloc(e->vlen ? e->vlen : 1);
    if (!*val) {
      rc = DG_ENOMEM;
    } else {
      memcpy(*val, e->val, e->vlen);
      *len = e->vlen;
    }
  }
  pthread_mutex_unlock(&sh->mu);
  if (rc == DG_ETIMEDOUT) return dg__store_timeout(s, &key, 1, (int)(deadline - start));
  return rc;
}

static int mem_add(dg_store *s, const char *key, int64_t delta, int64_t *result) {
  mem_shared *sh = SH(s);
  pthread_mutex_lock(&sh->mu);
  int rc = dg__kv_add(&sh->kv, key, strlen(key), delta, result);
  pthread_cond_broadcast(&sh->cv);
  pthread_mutex_unlock(&sh->mu);
  if (rc == -EINVAL)
    return dg__store_fail(s, DG_EFORMAT, "mem store: value of \"%s\" is not an integer", key);
  return rc < 0 ? DG_ENOMEM : DG_OK;
}

static int copy_out(const void *v, size_t n, void **cur, size_t *curlen) {
  *cur = dg__malloc(n ? n : 1);
  if (!*cur) return DG_ENOMEM;
  if (n) memcpy(*cur, v, n);
  *curlen = n;
  return DG_OK;
}

static int mem_compare_set(dg_store *s, const char *key, const void *e, size_t elen,
                           const void *d, size_t dlen, void **cur, size_t *curlen) {
  mem_shared *sh = SH(s);
  int rc = DG_OK;
  pthread_mutex_lock(&sh->mu);
  dg_kv_entry *ent = dg__kv_find(&sh->kv, key, strlen(key));
  /* TCPStore semantics: a missing key matches an empty `expected`; with a
   * non-empty one the caller gets `expected` back and nothing changes. */
  if (!ent) {
    if (elen == 0) {
      rc = dg__kv_set(&sh->kv, key, strlen(key), d, dlen) < 0 ? DG_ENOMEM : DG_OK;
      if (rc == DG_OK) rc = copy_out(d, dlen, cur, curlen);
    } else {
      rc = copy_out(e, elen, cur, curlen);
    }
  } else {
    if (ent->vlen == elen && (elen == 0 || !memcmp(ent->val, e, elen)))
      rc = dg__kv_set(&sh->kv, key, strlen(key), d, dlen) < 0 ? DG_ENOMEM : DG_OK;
    ent = dg__kv_find(&sh->kv, key, strlen(key));
    if (rc == DG_OK) rc = copy_out(ent->val, ent->vlen, cur, curlen);
  }
  pthread_cond_broadcast(&sh->cv);
  pthread_mutex_unlock(&sh->mu);
  return rc;
}

static int mem_check(dg_store *s, const char *const *keys, int nkeys, int *present) {
  mem_shared *sh = SH(s);
  pthread_mutex_lock(&sh->mu);
  *present = all_present(sh, keys, nkeys);
  pthread_mutex_unlock(&sh->mu);
  return DG_OK;
}

static int mem_del(dg_store *s, const char *key, int *deleted) {
  mem_shared *sh = SH(s);
  pthread_mutex_lock(&sh->mu);
  *deleted = dg__kv_del(&sh->kv, key, strlen(key));
  pthread_mutex_unlock(&sh->mu);
  return DG_OK;
}

static int mem_num_keys(dg_store *s, int64_t *n) {
  mem_shared *sh = SH(s);
  pthread_mutex_lock(&sh->mu);
  *n = (int64_t)sh->kv.n;
  pthread_mutex_unlock(&sh->mu);
  return DG_OK;
}

static void mem_destroy(dg_store *s) {
  mem_shared *sh = SH(s);
  pthread_mutex_lock(&sh->mu);
  int last = --sh->refs == 0;
  pthread_mutex_unlock(&sh->mu);
  if (last) {
    dg__kv_free(&sh->kv);
    pthread_cond_destroy(&sh->cv);
    pthread_mutex_destroy(&sh->mu);
    dg__free(sh);
  }
  dg__free(s);
}

static const dg_store_vt mem_vt = {
    .kind = "mem", .set = mem_set, .get = mem_get, .add = mem_add,
    .compare_set = mem_compare_set, .check = mem_check, .wait = mem_wait,
    .del = mem_del, .num_keys = mem_num_keys, .port = NULL, .destroy = mem_destroy};

static int new_handle(dg_store **out, mem_shared *sh, int timeout_ms) {
  mem_store *m = dg__calloc(1, sizeof *m);
  if (!m) return DG_ENOMEM;
  dg__store_init(&m->base, &mem_vt, timeout_ms);
  m->sh = sh;
  *out = &m->base;
  return DG_OK;
}

int dg_store_new_mem(dg_store **out, int timeout_ms) {
  if (!out) return DG_EINVAL;
  *out = NULL;
  mem_shared *sh = dg__calloc(1, sizeof *sh);
  if (!sh) return DG_ENOMEM;
  pthread_mutex_init(&sh->mu, NULL);
  pthread_cond_init(&sh->cv, NULL);
  sh->refs = 1;
  int rc = new_handle(out, sh, timeout_ms);
  if (rc != DG_OK) {
    pthread_cond_destroy(&sh->cv);
    pthread_mutex_destroy(&sh->mu);
    dg__free(sh);
  }
  return rc;
}

int dg_store_clone(dg_store **out, dg_store *s) {
  if (!out || !s || s->vt != &mem_vt) return DG_EINVAL;
  mem_shared *sh = SH(s);
  pthread_mutex_lock(&sh->mu);
  sh->refs++;
  pthread_mutex_unlock(&sh->mu);
  int rc = new_handle(out, sh, s->timeout_ms);
  if (rc != DG_OK) {
    pthread_mutex_lock(&sh->mu);
    sh->refs--;
    pthread_mutex_unlock(&sh->mu);
  }
  return rc;
}
