/* Shared by the libFuzzer harnesses: the input as a file the library opens
 * by path (an anonymous memfd, named /proc/self/fd/N), and a quiet log. */
#ifndef DG_FUZZ_UTIL_H
#define DG_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "dgrad.h"

/* A file holding data[0..n); its path into path. Returns the fd (close it
 * when done) or aborts: the harness cannot run without it. */
static inline int fz_file(const uint8_t *data, size_t n, char *path, size_t cap) {
  int fd = memfd_create("dgrad-fuzz", MFD_CLOEXEC);
  if (fd < 0) abort();
  size_t o = 0;
  while (o < n) {
    ssize_t w = write(fd, data + o, n - o);
    if (w <= 0) abort();
    o += (size_t)w;
  }
  snprintf(path, cap, "/proc/self/fd/%d", fd);
  return fd;
}

/* Library messages about the (deliberately bad) input would flood the
 * fuzzer's output: they are still formatted (that code runs), then dropped. */
static inline void fz_drop_log(void *user, dg_log_level level, const char *msg) {
  (void)user, (void)level, (void)msg;
}
static inline void fz_quiet(void) {
  dg_set_log_fn(fz_drop_log, NULL);
  dg_set_log_level(DG_LOG_DEBUG);
}

#endif
