/* Caching storage allocator with per-device statistics. Blocks are rounded
 * up to a power of two and kept on per-class free lists when freed, so a
 * training loop that frees and reallocates the same sizes reaches the system
 * allocator only in its first steps. */
#include <pthread.h>
#include <string.h>

#include "backends/backend.h"
#include "core/core_impl.h"

#define NCLASS 48
#define MAX_DEVICES 9 /* CPU + 8 CUDA devices */

typedef struct free_block {
  struct free_block *next;
} free_block;

typedef struct {
  free_block *bins[NCLASS];
  dg_mem_stats st;
} dev_cache;

static dev_cache g_dev[MAX_DEVICES];
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static int size_class(size_t n) {
  int k = 6; /* 64 bytes minimum: every block is DG_ALIGN-aligned */
  while (k < NCLASS - 1 && ((size_t)1 << k) < n) k++;
  return k;
}

/* The backend of device, when this build serves it and the cache can hold
 * its blocks (the free list lives in the blocks: host-addressable memory). */
static const dg__backend *cached_backend(int device) {
  return device == DG_CPU ? dg__backend_get(device) : NULL;
}

void *dg__dev_alloc(int device, size_t nbytes) {
  const dg__backend *be = cached_backend(device);
  if (!be || nbytes > ((size_t)1 << (NCLASS - 2))) return NULL;
  int k = size_class(nbytes);
  size_t sz = (size_t)1 << k;
  dev_cache *c = &g_dev[device];
  pthread_mutex_lock(&g_mu);
  free_block *b = c->bins[k];
  if (b) {
    c->bins[k] = b->next;
    c->st.cached_bytes -= sz;
  }
  pthread_mutex_unlock(&g_mu);
  if (!b) {
    b = be->raw_alloc(device, sz);
    if (!b) return NULL;
    pthread_mutex_lock(&g_mu);
    c->st.system_allocs++;
    pthread_mutex_unlock(&g_mu);
  }
  pthread_mutex_lock(&g_mu);
  c->st.current_bytes += sz;
  if (c->st.current_bytes > c->st.peak_bytes) c->st.peak_bytes = c->st.current_bytes;
  c->st.alloc_count++;
  pthread_mutex_unlock(&g_mu);
  return b;
}

void dg__dev_free(int device, void *p, size_t nbytes) {
  if (!p || !cached_backend(device)) return;
  int k = size_class(nbytes);
  dev_cache *c = &g_dev[device];
  free_block *b = p;
  pthread_mutex_lock(&g_mu);
  b->next = c->bins[k];
  c->bins[k] = b;
  c->st.current_bytes -= (size_t)1 << k;
  c->st.cached_bytes += (size_t)1 << k;
  pthread_mutex_unlock(&g_mu);
}

int dg_mem_get_stats(int device, dg_mem_stats *out) {
  if (!out || device < 0 || device >= MAX_DEVICES) return DG_EINVAL;
  pthread_mutex_lock(&g_mu);
  *out = g_dev[device].st;
  pthread_mutex_unlock(&g_mu);
  return DG_OK;
}

void dg_mem_reset_peak(int device) {
  if (device < 0 || device >= MAX_DEVICES) return;
  pthread_mutex_lock(&g_mu);
  g_dev[device].st.peak_bytes = g_dev[device].st.current_bytes;
  pthread_mutex_unlock(&g_mu);
}

void dg_mem_empty_cache(int device) {
  if (device < 0 || device >= MAX_DEVICES) return;
  const dg__backend *be = cached_backend(device);
  if (!be) return;
  pthread_mutex_lock(&g_mu);
  dev_cache *c = &g_dev[device];
  for (int k = 0; k < NCLASS; k++) {
    while (c->bins[k]) {
      free_block *b = c->bins[k];
      c->bins[k] = b->next;
      be->raw_free(device, b, (size_t)1 << k);
    }
  }
  c->st.cached_bytes = 0;
  pthread_mutex_unlock(&g_mu);
}

void dg__dev_release(int device, void *p, size_t nbytes) {
  const dg__backend *be = cached_backend(device);
  if (!p || !be) return;
  int k = size_class(nbytes);
  pthread_mutex_lock(&g_mu);
  g_dev[device].st.current_bytes -= (size_t)1 << k;
  pthread_mutex_unlock(&g_mu);
  be->raw_free(device, p, (size_t)1 << k);
}
