/* Heap-call counting by interposition, shared by the benchmarks (see
 * alloc_count.h). */
#include <errno.h>
#include <execinfo.h>
#include <stdio.h>
#include <stdlib.h>

#include "alloc_count.h"

extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t sz);
extern void *__libc_realloc(void *p, size_t n);
extern void *__libc_memalign(size_t align, size_t n);
extern void __libc_free(void *p);

static uint64_t g_allocs; /* malloc, calloc, realloc, aligned variants */
static uint64_t g_frees;  /* free of a non-NULL pointer */
static int g_trace;
static __thread int g_in_trace;

static void count_alloc(void) {
  __atomic_fetch_add(&g_allocs, 1, __ATOMIC_RELAXED);
  if (__atomic_load_n(&g_trace, __ATOMIC_RELAXED) && !g_in_trace) {
    void *bt[16];
    g_in_trace = 1;
    int n = backtrace(bt, 16);
    fprintf(stderr, "-- heap allocation during a timed step:\n");
    backtrace_symbols_fd(bt, n, 2);
    g_in_trace = 0;
  }
}

void *malloc(size_t n) {
  count_alloc();
  return __libc_malloc(n);
}

void *calloc(size_t n, size_t sz) {
  count_alloc();
  return __libc_calloc(n, sz);
}

void *realloc(void *p, size_t n) {
  count_alloc();
  return __libc_realloc(p, n);
}

void free(void *p) {
  if (p) __atomic_fetch_add(&g_frees, 1, __ATOMIC_RELAXED);
  __libc_free(p);
}

void *memalign(size_t align, size_t n);
void *memalign(size_t align, size_t n) {
  count_alloc();
  return __libc_memalign(align, n);
}

void *aligned_alloc(size_t align, size_t n) {
  count_alloc();
  return __libc_memalign(align, n);
}

int posix_memalign(void **out, size_t align, size_t n) {
  count_alloc();
  if (align < sizeof(void *) || (align & (align - 1))) return EINVAL;
  void *p = __libc_memalign(align, n);
  if (!p && n) return ENOMEM;
  *out = p;
  return 0;
}

uint64_t allocs_now(void) { return __atomic_load_n(&g_allocs, __ATOMIC_RELAXED); }
uint64_t frees_now(void) { return __atomic_load_n(&g_frees, __ATOMIC_RELAXED); }

void bench_trace_allocs(int on) { __atomic_store_n(&g_trace, on, __ATOMIC_RELAXED); }

void bench_trace_from_env(const char *var) {
  const char *tr = getenv(var);
  if (!tr || !*tr || *tr == '0') return;
  void *bt[2];
  backtrace(bt, 2); /* loads libgcc now, not inside the measured window */
  bench_trace_allocs(1);
}
