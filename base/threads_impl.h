/* dgrad's compute pool. Not API. */
#ifndef DG_THREADS_IMPL_H
#define DG_THREADS_IMPL_H

#include <stdatomic.h>
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

/* A job of ntasks tasks that several threads take one at a time (the pool
 * and the lend worker, lend.c). gen is the futex word the takers sleep on;
 * ticket is (gen << 32) | next task, so a thread late from job g can never
 * claim a task of job g+1. Post with the job's previous takers' claims
 * done or doomed, wake the takers, then every taker runs dg__job_run(j,
 * gen). A taker waits for the next job with dg__job_sleep (a futex wait on
 * gen while it still reads `seen`; it may return early). */
typedef struct {
  atomic_uint gen;
  atomic_ullong ticket;
  atomic_int left; /* tasks not finished */
  atomic_int ntasks;
  dg__task_fn fn;
  void *arg;
} dg__job;
unsigned dg__job_post(dg__job *j, int ntasks, dg__task_fn fn, void *arg);
int dg__job_run(dg__job *j, unsigned gen); /* the count of tasks it ran */
void dg__job_sleep(dg__job *j, unsigned seen);
void dg__job_wake(dg__job *j, int takers);

#endif
