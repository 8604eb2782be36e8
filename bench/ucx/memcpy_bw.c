/* Single-thread memcpy bandwidth, the yardstick of the UCX allreduce
 * targets: median of ITERS copies of BYTES (default 64 MiB), one JSON line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  size_t bytes = argc > 1 ? strtoull(argv[1], NULL, 10) : (size_t)64 << 20;
  int iters = argc > 2 ? atoi(argv[2]) : 11;
  if (iters < 1 || iters > 1000 || bytes == 0) return 2;
  char *a = malloc(bytes), *b = malloc(bytes);
  double t[1000];
  if (!a || !b) return 1;
  memset(a, 1, bytes);
  memset(b, 2, bytes);
  for (int i = 0; i < iters; i++) {
    double t0 = now_us();
    memcpy(b, a, bytes);
    t[i] = now_us() - t0;
    a[i % bytes] ^= b[(i * 4099) % bytes]; /* keep the copies live */
  }
  qsort(t, (size_t)iters, sizeof *t, cmp);
  printf("{\"bench\": \"memcpy\", \"bytes\": %zu, \"median_us\": %.1f, \"GBps\": %.3f}\n", bytes,
         t[iters / 2], bytes / t[iters / 2] / 1e3);
  free(a);
  free(b);
  return 0;
}
