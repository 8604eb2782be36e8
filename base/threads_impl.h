/* dgrad's compute pool. Not API. */
#ifndef DG_THREADS_IMPL_H
#define DG_THREADS_IMPL_H

#include <stdint.h>

typedef void (*dg__task_fn)(void *arg, int i);

/* Runs fn(arg, i) for i in [0, ntasks) on the pool (the caller included)
 * and returns when all are done. Serial when the pool has one thread, is
 * busy, or this is called from inside a task. */
void dg__parallel_for(int ntasks, dg__task_fn fn, void *arg);

/* Splits [0, n) into at most one chunk per thread, each at least `grain`
 * long (multiples of 16 elements), and runs fn(arg, lo, hi) on the pool.
 * Serial for n < 2 * grain. For element-wise loops whose elements are
 * independent. */
typedef void (*dg__range_fn)(void *arg, int64_t lo, int64_t hi);
void dg__parallel_range(int64_t n, int64_t grain, dg__range_fn fn, void *arg);

#endif
