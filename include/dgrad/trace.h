/* dgrad/trace.h — a per-rank timeline of what a training step does, written as
 * Chrome trace JSON (open it in https://ui.perfetto.dev or chrome://tracing).
 *
 * While tracing is on, dgrad records: each module's forward (name "forward",
 * arg "module" = its path), each backward ("backward"), each optimizer step
 * ("optimizer step"), DDP's buckets ("bucket ready" instants, an async
 * "allreduce" span per bucket from start to the moment its average was
 * final, "bucket wait" while the step waited for one, "ddp sync" for the
 * whole end-of-backward wait), the pipeline's per-micro-batch "pipe forward",
 * "pipe backward", "pipe send", "pipe recv", and activation swapping's copies
 * ("swap out", "swap in"). Args carry the bucket index, bytes, peer stage and
 * micro-batch where they apply.
 *
 * Events go to a ring per thread, allocated by dg_trace_start: recording
 * allocates nothing, and a full ring overwrites its oldest events. Off, each
 * event site costs one predictable branch on a flag. Timestamps are
 * CLOCK_MONOTONIC, so ranks on one host line up; `dgrun --trace FILE` merges
 * the ranks' files into one, one process track per rank
 * (docs/guide-trace.md).
 *
 * Thread-safety: recording is safe from any thread. dg_trace_start,
 * dg_trace_stop, dg_trace_write and dg_trace_clear are process-wide and must
 * not race each other (call them from one thread); stop waits (bounded) for
 * threads that are inside a recording. */
#ifndef DGRAD_TRACE_H
#define DGRAD_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "dgrad/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dg_trace_opts {
  /* Events kept per thread (rounded up to a power of two; 0: 16384). */
  size_t events_per_thread;
  /* Threads that get a ring (0: 32); events of further threads are counted
   * in dg_trace_stats.dropped. */
  int max_threads;
} dg_trace_opts;

typedef struct dg_trace_stats {
  uint64_t recorded;    /* events recorded since dg_trace_start */
  uint64_t overwritten; /* of those, lost to a full ring (the oldest) */
  uint64_t dropped;     /* events of threads beyond max_threads */
  int threads;          /* threads that recorded */
} dg_trace_stats;

/* Starts recording (opts NULL: defaults), discarding an earlier session's
 * events. DG_ESTATE if already on; DG_EINVAL for a capacity over 2^24
 * events or max_threads over 4096; DG_ENOMEM. */
DG_API int dg_trace_start(const dg_trace_opts *opts);
/* Stops recording; the events stay for dg_trace_write. DG_ESTATE if not on;
 * DG_ETIMEDOUT if a thread stayed inside a recording for over 2 s. */
DG_API int dg_trace_stop(void);
/* 1 while recording. */
DG_API int dg_trace_enabled(void);
/* Writes the recorded events to path as Chrome trace JSON with pid = `pid`
 * (the rank; >= 0) and tid = the thread's Linux id. Stopped tracing only
 * (DG_ESTATE while on, or if nothing was ever started); DG_EIO naming the
 * path when it cannot be written. */
DG_API int dg_trace_write(const char *path, int pid, char *err, size_t cap);
/* Counters of the current (or last) session; zeros if none. */
DG_API int dg_trace_get_stats(dg_trace_stats *out);
/* Frees the rings of a stopped session (DG_ESTATE while on). */
DG_API int dg_trace_clear(void);

#ifdef __cplusplus
}
#endif

#endif
