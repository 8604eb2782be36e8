/* Cross-core round trip: two threads, pinned to the first two CPUs this
 * process may use, pass a cache line back and forth; prints the median of
 * `--reps` runs of `--trips` round trips, in ns, as one JSON line.
 *
 *   corelat [--trips N] [--reps R]
 *
 * On a VM the host places the two virtual CPUs: on cores that share a
 * cache a round trip took 55-90 ns, across caches 300-350 ns, and the
 * placement changed from minute to minute (AMD EPYC VM, 2026-11-28). Every
 * line DDP's ranks exchange pays it, so bench/ddp/run_ddp.py records it
 * beside each run (bench/host.py core_rtt_ns). Prints {"core_rtt_ns": null}
 * with fewer than two CPUs. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static _Alignas(64) atomic_long g_ball;
static long g_trips;
static int g_cpu[2];

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

static void pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  (void)pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static void *pong(void *arg) {
  (void)arg;
  pin(g_cpu[1]);
  for (long i = 0; i < g_trips; i++) {
    while (atomic_load_explicit(&g_ball, memory_order_acquire) != 2 * i + 1) {
    }
    atomic_store_explicit(&g_ball, 2 * i + 2, memory_order_release);
  }
  return NULL;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  int reps = 3;
  g_trips = 20000;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--trips") && i + 1 < argc) g_trips = atol(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: %s [--trips N] [--reps R]\n", argv[0]);
      return 2;
    }
  }
  if (g_trips < 1 || reps < 1 || reps > 99) {
    fprintf(stderr, "corelat: --trips must be >= 1 and --reps in [1, 99]\n");
    return 2;
  }
  cpu_set_t s;
  int n = 0;
  if (sched_getaffinity(0, sizeof s, &s) == 0)
    for (int c = 0; c < CPU_SETSIZE && n < 2; c++)
      if (CPU_ISSET(c, &s)) g_cpu[n++] = c;
  if (n < 2) {
    printf("{\"core_rtt_ns\":null}\n");
    return 0;
  }
  double v[99];
  for (int r = 0; r < reps; r++) {
    atomic_store(&g_ball, 0);
    pthread_t t;
    if (pthread_create(&t, NULL, pong, NULL)) {
      fprintf(stderr, "corelat: pthread_create failed\n");
      return 1;
    }
    pin(g_cpu[0]);
    double t0 = now_ns();
    for (long i = 0; i < g_trips; i++) {
      atomic_store_explicit(&g_ball, 2 * i + 1, memory_order_release);
      while (atomic_load_explicit(&g_ball, memory_order_acquire) != 2 * i + 2) {
      }
    }
    v[r] = (now_ns() - t0) / (double)g_trips;
    pthread_join(t, NULL);
  }
  qsort(v, (size_t)reps, sizeof v[0], cmp);
  printf("{\"core_rtt_ns\":%.0f,\"cpus\":[%d,%d]}\n", v[reps / 2], g_cpu[0], g_cpu[1]);
  return 0;
}
