/* The timeline recorder's event sites (include/dgrad/trace.h). Internal.
 *
 * A scope:    uint64_t t0 = dg__trace_t0();  ...work...
 *             DG__TRACE_END(t0, "backward", NULL, NULL, 0, NULL, 0);
 * An instant: DG__TRACE_INSTANT("bucket ready", "bucket", k, "bytes", n);
 * Off, dg__trace_t0 is one relaxed load and a branch, and the end is a test
 * of t0 (0 when off). Names and arg keys must be static strings; a label
 * (a module's path, say) is copied, at most 31 bytes. */
#ifndef DG_TRACE_IMPL_H
#define DG_TRACE_IMPL_H

#include <stdatomic.h>
#include <stdint.h>

#include "dgrad/trace.h"

extern atomic_int dg__trace_on;

uint64_t dg__trace_now(void); /* CLOCK_MONOTONIC in ns, never 0 */

static inline int dg__trace_is_on(void) {
  return __builtin_expect(atomic_load_explicit(&dg__trace_on, memory_order_relaxed), 0);
}
/* The start of a scope: now, or 0 when tracing is off. */
static inline uint64_t dg__trace_t0(void) { return dg__trace_is_on() ? dg__trace_now() : 0; }

/* A complete event [t0, now] on this thread. */
void dg__trace_complete(uint64_t t0, const char *name, const char *label, const char *k0,
                        int64_t v0, const char *k1, int64_t v1);
/* An instant on this thread. */
void dg__trace_instant(const char *name, const char *k0, int64_t v0, const char *k1, int64_t v1);
/* An async span [t0, now] with an id (written as a "b"/"e" pair on its own
 * track, so it may overlap this thread's scopes: a bucket's all-reduce). */
void dg__trace_async(uint64_t t0, const char *name, int64_t id, const char *k0, int64_t v0,
                     const char *k1, int64_t v1);

#define DG__TRACE_END(t0, ...)                                       \
  do {                                                               \
    if (__builtin_expect((t0) != 0, 0)) dg__trace_complete((t0), __VA_ARGS__); \
  } while (0)
#define DG__TRACE_INSTANT(...)                      \
  do {                                              \
    if (dg__trace_is_on()) dg__trace_instant(__VA_ARGS__); \
  } while (0)
#define DG__TRACE_ASYNC(t0, ...)                                  \
  do {                                                            \
    if (__builtin_expect((t0) != 0, 0)) dg__trace_async((t0), __VA_ARGS__); \
  } while (0)

#endif
