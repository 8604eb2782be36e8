/* Small helpers shared by the C benchmarks (see bench_util.h). */
#include "bench_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double clock_s(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double now_s(void) { return clock_s(CLOCK_MONOTONIC); }
double cpu_s(void) { return clock_s(CLOCK_PROCESS_CPUTIME_ID); }

long arg_long(int argc, char **argv, int *i, long min) {
  const char *prog = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
  if (*i + 1 >= argc) {
    fprintf(stderr, "%s: %s needs a value\n", prog, argv[*i]);
    exit(2);
  }
  char *end;
  long v = strtol(argv[++*i], &end, 10);
  if (*end || v < min) {
    fprintf(stderr, "%s: bad value for %s: %s\n", prog, argv[*i - 1], argv[*i]);
    exit(2);
  }
  return v;
}
