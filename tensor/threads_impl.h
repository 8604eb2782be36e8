/* dgrad's compute pool. Not API. */
#ifndef DG_THREADS_IMPL_H
#define DG_THREADS_IMPL_H

typedef void (*dg__task_fn)(void *arg, int i);

/* Runs fn(arg, i) for i in [0, ntasks) on the pool (the caller included)
 * and returns when all are done. Serial when the pool has one thread, is
 * busy, or this is called from inside a task. */
void dg__parallel_for(int ntasks, dg__task_fn fn, void *arg);

#endif
