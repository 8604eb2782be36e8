/* Step arena: bump allocation in chunks. Reset keeps the memory; when a step
 * needed more than one chunk, reset replaces them by one chunk big enough for
 * the whole step, so from the second step on nothing is allocated. A context
 * has one arena per device it computes on: the host arena holds headers,
 * tape nodes and CPU tensor data; a device arena holds that device's tensor
 * data only (its chunk headers are host memory). */
#include <stdint.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "core/core_impl.h"

/* Asks for transparent huge pages on the whole 2 MiB pages inside a big
 * chunk: a step streams its activations through the arena, and with 4 KiB
 * pages nearly every pass over a large activation misses the TLB. Advice
 * only (THP "madvise" mode, the Debian default); failure is harmless. */
static void advise_huge(void *p, size_t n) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  const uintptr_t huge = (uintptr_t)1 << 21;
  uintptr_t lo = ((uintptr_t)p + huge - 1) & ~(huge - 1), hi = ((uintptr_t)p + n) & ~(huge - 1);
  if (n >= 4 * huge && hi > lo) (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
#else
  (void)p, (void)n;
#endif
}

static dg_arena_chunk *chunk_new(int device, size_t cap) {
  dg_arena_chunk *c = dg__malloc(sizeof *c);
  if (!c) return NULL;
  c->mem = dg__dev_alloc(device, cap);
  if (!c->mem) {
    dg__free(c);
    return NULL;
  }
  if (device == DG_CPU) advise_huge(c->mem, cap);
  c->next = NULL;
  c->cap = cap;
  c->used = 0;
  return c;
}

/* release: the bytes go back to the system, not the cache (the growth
 * chunks of a first step are one-off sizes that would stay resident). */
static void chunk_free(int device, dg_arena_chunk *c, int release) {
  if (release) dg__dev_release(device, c->mem, c->cap);
  else dg__dev_free(device, c->mem, c->cap);
  dg__free(c);
}

void *dg__arena_alloc(dg_arena *a, size_t n) {
  n = (n + DG_ALIGN - 1) & ~(size_t)(DG_ALIGN - 1);
  if (!n) n = DG_ALIGN;
  dg_arena_chunk *c = a->cur;
  while (c && c->used + n > c->cap) c = c->next;
  if (!c) {
    size_t cap = a->reserved ? a->reserved : ((size_t)1 << 20);
    if (cap < n) cap = n;
    if (a->owner && dg__ctx_arena_grow(a->owner, a, n, &cap)) return NULL;
    c = chunk_new(a->device, cap);
    if (!c) return NULL;
    /* append at the end of the list */
    if (!a->head) {
      a->head = c;
    } else {
      dg_arena_chunk *t = a->head;
      while (t->next) t = t->next;
      t->next = c;
    }
    a->reserved += cap;
  }
  a->cur = c;
  void *p = c->mem + c->used;
  c->used += n;
  a->used += n;
  if (a->used > a->peak) a->peak = a->used;
  return p;
}

int dg__arena_live(const dg_arena *a, const void *p) {
  const char *q = p;
  for (const dg_arena_chunk *c = a->head; c; c = c->next)
    if (q >= c->mem && q < c->mem + c->cap) return q < c->mem + c->used ? 1 : -1;
  for (int i = 0; i < a->ngone; i++)
    if ((uintptr_t)p >= a->gone[i].lo && (uintptr_t)p < a->gone[i].hi) return -1;
  return 0;
}

static void free_chunks(dg_arena *a, int release) {
  dg_arena_chunk *c = a->head;
  while (c) {
    dg_arena_chunk *n = c->next;
    chunk_free(a->device, c, release);
    c = n;
  }
  a->head = a->cur = NULL;
}

void dg__arena_reset(dg_arena *a) {
  a->ngone = 0; /* one step only: the system may hand those addresses out again */
  if (a->head && a->head->next) {
    /* several chunks: merge into one that fits the step just done (its
     * bytes in use, plus slack for steps that vary a little) */
    size_t want = a->used + a->used / 8 + ((size_t)1 << 20);
    want = (want + ((size_t)1 << 20) - 1) & ~(((size_t)1 << 20) - 1);
    size_t limit = a->owner ? a->owner->arena_limit : 0;
    if (limit && want > limit) want = limit > a->used ? limit : a->used;
    dg_arena_chunk *one = chunk_new(a->device, want);
    if (one) {
      for (dg_arena_chunk *c = a->head; c && a->ngone < 8; c = c->next) /* where they were */
        a->gone[a->ngone].lo = (uintptr_t)c->mem, a->gone[a->ngone++].hi = (uintptr_t)c->mem + c->cap;
      free_chunks(a, 1);
      a->head = one;
      a->reserved = want;
    }
  }
  for (dg_arena_chunk *c = a->head; c; c = c->next) c->used = 0;
  a->cur = a->head;
  a->used = 0;
}

void dg__arena_free(dg_arena *a) {
  free_chunks(a, 0);
  a->reserved = a->used = 0;
}
