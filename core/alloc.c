/* Caching storage allocator with per-device statistics. Blocks are rounded
 * up to a power of two and kept on per-class free lists when freed, so a
 * training loop that frees and reallocates the same sizes reaches the system
 * allocator only in its first steps. The bookkeeping is host memory (a stack
 * of block addresses per class): the blocks themselves are never touched,
 * so the same cache serves device memory the host cannot address. */
#include <pthread.h>
#include <string.h>

#include "backends/backend.h"
#include "core/core_impl.h"

#define NCLASS 48

typedef struct {
  void **slot; /* free blocks of this class */
  int n, cap;
} free_stack;

typedef struct {
  free_stack bins[NCLASS];
  dg_mem_stats st;
} dev_cache;

static dev_cache g_dev[DG__MAX_DEVICES];
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static int size_class(size_t n) {
  int k = 6; /* 64 bytes minimum: every block is DG_ALIGN-aligned */
  while (k < NCLASS - 1 && ((size_t)1 << k) < n) k++;
  return k;
}

/* The backend of device when this build serves it. */
static const dg__backend *dev_backend(int device) {
  return device >= 0 && device < DG__MAX_DEVICES ? dg__backend_get(device) : NULL;
}

void *dg__dev_alloc(int device, size_t nbytes) {
  const dg__backend *be = dev_backend(device);
  if (!be || nbytes > ((size_t)1 << (NCLASS - 2))) return NULL;
  int k = size_class(nbytes);
  size_t sz = (size_t)1 << k;
  dev_cache *c = &g_dev[device];
  pthread_mutex_lock(&g_mu);
  free_stack *fs = &c->bins[k];
  void *b = fs->n ? fs->slot[--fs->n] : NULL;
  if (b) c->st.cached_bytes -= sz;
  pthread_mutex_unlock(&g_mu);
  int fresh = !b;
  if (fresh && !(b = be->raw_alloc(device, sz))) return NULL;
  pthread_mutex_lock(&g_mu);
  c->st.system_allocs += (uint64_t)fresh;
  c->st.current_bytes += sz;
  if (c->st.current_bytes > c->st.peak_bytes) c->st.peak_bytes = c->st.current_bytes;
  c->st.alloc_count++;
  pthread_mutex_unlock(&g_mu);
  return b;
}

/* Pushes b on its class's stack (g_mu held); 0 when the stack cannot grow. */
static int cache_push(free_stack *fs, void *b) {
  if (fs->n == fs->cap) {
    int cap = fs->cap ? 2 * fs->cap : 16;
    void **s = dg__realloc(fs->slot, (size_t)cap * sizeof *s);
    if (!s) return 0;
    fs->slot = s;
    fs->cap = cap;
  }
  fs->slot[fs->n++] = b;
  return 1;
}

void dg__dev_free(int device, void *p, size_t nbytes) {
  const dg__backend *be = dev_backend(device);
  if (!p || !be) return;
  int k = size_class(nbytes);
  size_t sz = (size_t)1 << k;
  dev_cache *c = &g_dev[device];
  pthread_mutex_lock(&g_mu);
  int kept = cache_push(&c->bins[k], p);
  c->st.current_bytes -= sz;
  if (kept) c->st.cached_bytes += sz;
  pthread_mutex_unlock(&g_mu);
  if (!kept) be->raw_free(device, p, sz); /* no room to remember it: give it back */
}

int dg_mem_get_stats(int device, dg_mem_stats *out) {
  if (!out || device < 0 || device >= DG__MAX_DEVICES) return DG_EINVAL;
  pthread_mutex_lock(&g_mu);
  *out = g_dev[device].st;
  pthread_mutex_unlock(&g_mu);
  return DG_OK;
}

void dg_mem_reset_peak(int device) {
  if (device < 0 || device >= DG__MAX_DEVICES) return;
  pthread_mutex_lock(&g_mu);
  g_dev[device].st.peak_bytes = g_dev[device].st.current_bytes;
  pthread_mutex_unlock(&g_mu);
}

void dg_mem_empty_cache(int device) {
  const dg__backend *be = dev_backend(device);
  if (!be) return;
  pthread_mutex_lock(&g_mu);
  dev_cache *c = &g_dev[device];
  for (int k = 0; k < NCLASS; k++) {
    free_stack *fs = &c->bins[k];
    while (fs->n) be->raw_free(device, fs->slot[--fs->n], (size_t)1 << k);
    dg__free(fs->slot);
    *fs = (free_stack){0};
  }
  c->st.cached_bytes = 0;
  pthread_mutex_unlock(&g_mu);
}

void dg__dev_release(int device, void *p, size_t nbytes) {
  const dg__backend *be = dev_backend(device);
  if (!p || !be) return;
  int k = size_class(nbytes);
  pthread_mutex_lock(&g_mu);
  g_dev[device].st.current_bytes -= (size_t)1 << k;
  pthread_mutex_unlock(&g_mu);
  be->raw_free(device, p, (size_t)1 << k);
}
