/* Small helpers shared by the C benchmarks. */
#ifndef DG_BENCH_UTIL_H
#define DG_BENCH_UTIL_H

/* Monotonic wall seconds; CPU seconds of the whole process (all threads,
 * user + system). */
double now_s(void);
double cpu_s(void);
/* The value after argv[*i] as a long >= min (advances *i); exits 2 with a
 * message naming the program and the flag when it is missing or bad. */
long arg_long(int argc, char **argv, int *i, long min);

#endif
