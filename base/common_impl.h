/* Internal helpers shared by every module: allocation through the user's
 * allocator hook, logging, invariants. Not API. */
#ifndef DG_COMMON_IMPL_H
#define DG_COMMON_IMPL_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "dgrad/common.h"

void *dg__malloc(size_t n);
void *dg__calloc(size_t count, size_t n);
void *dg__realloc(void *p, size_t n);
void dg__free(void *p);
char *dg__strdup(const char *s);

/* Number of heap allocations dgrad has made through dg__malloc & co. since
 * start; tests use it to prove a steady-state step allocates nothing. */
uint64_t dg__alloc_count(void);

void dg__log(dg_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
#define DG_LOGE(...) dg__log(DG_LOG_ERROR, __VA_ARGS__)
#define DG_LOGW(...) dg__log(DG_LOG_WARN, __VA_ARGS__)
#define DG_LOGI(...) dg__log(DG_LOG_INFO, __VA_ARGS__)
#define DG_LOGD(...) dg__log(DG_LOG_DEBUG, __VA_ARGS__)

/* Internal invariant: a bug in dgrad, never user input. */
#define DG_ASSERT(cond)                                                   \
  do {                                                                    \
    if (!(cond)) dg__assert_fail(#cond, __FILE__, __LINE__);              \
  } while (0)
_Noreturn void dg__assert_fail(const char *expr, const char *file, int line);

/* Bounded formatting into a fixed buffer (truncates, always terminates). */
void dg__vfmt(char *buf, size_t cap, const char *fmt, va_list ap);
/* Formats into err (cap bytes) when err is non-NULL; returns code: the
 * one-line failure of functions that report into a caller's buffer. */
int dg__fail_msg(char *err, size_t cap, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* A spin-wait hint to the core (PAUSE on x86, nothing elsewhere). */
static inline void dg__cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

#define DG_MIN(a, b) ((a) < (b) ? (a) : (b))
#define DG_MAX(a, b) ((a) > (b) ? (a) : (b))

#endif
