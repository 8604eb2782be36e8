/* Heap-call counting for the benchmarks: malloc & co. are interposed in the
 * benchmark binary (alloc_count.c) and forwarded to glibc, so a benchmark can
 * prove that a steady-state step allocates nothing. */
#ifndef DG_BENCH_ALLOC_COUNT_H
#define DG_BENCH_ALLOC_COUNT_H

#include <stdint.h>

/* malloc, calloc, realloc and the aligned variants so far. */
uint64_t allocs_now(void);
/* free of a non-NULL pointer so far. */
uint64_t frees_now(void);
/* While on, every allocation prints a backtrace to stderr (to find who
 * allocates). bench_trace_from_env("X") turns it on when $X is set and not
 * "0", preloading what backtrace() needs so that is not counted. */
void bench_trace_allocs(int on);
void bench_trace_from_env(const char *var);

#endif
