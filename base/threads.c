/* Compute threads: one pool, dgrad's own. OpenBLAS always runs single-
 * threaded and dgrad splits each large GEMM (and large element-wise loops)
 * over its pool, so no second pool spins against this one and a threaded
 * step allocates nothing (OpenBLAS's threaded GEMM mallocs per call).
 *
 * Workers spin briefly after a job (ops come back to back), then sleep on a
 * futex. The caller takes tasks too. A parallel_for issued while the pool is
 * busy (another thread's ctx, or nested) runs serially on the caller. */
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "dgrad_config.h"
#include "base/common_impl.h"
#include "base/threads_impl.h"

#if DG_HAVE_OPENBLAS
void openblas_set_num_threads(int n);
#endif

#define MAX_THREADS 64
#define SPIN_ITERS 4000

static struct {
  pthread_mutex_t busy;   /* held by the thread issuing a job */
  dg__job job;
  int nworkers;           /* started */
  atomic_int stop;
  pthread_t tid[MAX_THREADS];
} g_pool = {.busy = PTHREAD_MUTEX_INITIALIZER};

static int g_threads;
static _Thread_local int t_in_task;

void dg__job_sleep(dg__job *j, unsigned seen) {
  syscall(SYS_futex, (unsigned *)&j->gen, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
}

void dg__job_wake(dg__job *j, int takers) {
  syscall(SYS_futex, (unsigned *)&j->gen, FUTEX_WAKE_PRIVATE, takers, NULL, NULL, 0);
}

/* Claims and runs tasks of job `gen` until none is left. fn/arg/ntasks are
 * read only after a successful claim: job gen cannot end (and be replaced)
 * while a claimed task of it is unfinished. */
int dg__job_run(dg__job *j, unsigned gen) {
  int ran = 0;
  unsigned long long t = atomic_load_explicit(&j->ticket, memory_order_acquire);
  for (;;) {
    if ((unsigned)(t >> 32) != gen) break;
    unsigned i = (unsigned)t;
    if (i >= (unsigned)atomic_load(&j->ntasks)) break;
    if (!atomic_compare_exchange_weak_explicit(&j->ticket, &t, t + 1, memory_order_acq_rel,
                                               memory_order_acquire))
      continue;
    j->fn(j->arg, (int)i);
    ran++;
    atomic_fetch_sub_explicit(&j->left, 1, memory_order_acq_rel);
    t = atomic_load_explicit(&j->ticket, memory_order_acquire);
  }
  return ran;
}

/* Close the old ticket first (index all ones: nothing left to claim), so a
 * taker still holding job g's ticket cannot claim against job g+1's
 * ntasks/fn while they are being written; the caller wakes the takers. */
unsigned dg__job_post(dg__job *j, int ntasks, dg__task_fn fn, void *arg) {
  unsigned gen = atomic_load(&j->gen) + 1;
  atomic_store(&j->ticket, ((unsigned long long)gen << 32) | 0xffffffffu);
  j->fn = fn;
  j->arg = arg;
  atomic_store(&j->ntasks, ntasks);
  atomic_store(&j->left, ntasks);
  atomic_store_explicit(&j->ticket, (unsigned long long)gen << 32, memory_order_release);
  atomic_store_explicit(&j->gen, gen, memory_order_release);
  return gen;
}

static void run_tasks(unsigned gen) {
  t_in_task = 1;
  dg__job_run(&g_pool.job, gen);
  t_in_task = 0;
}

static void *worker(void *unused) {
  (void)unused;
  unsigned seen = atomic_load(&g_pool.job.gen);
  for (;;) {
    unsigned g;
    int spins = 0;
    while ((g = atomic_load_explicit(&g_pool.job.gen, memory_order_acquire)) == seen) {
      if (atomic_load(&g_pool.stop)) return NULL;
      if (++spins < SPIN_ITERS) dg__cpu_relax();
      else dg__job_sleep(&g_pool.job, seen);
    }
    seen = g;
    if (atomic_load(&g_pool.stop)) return NULL;
    run_tasks(g);
  }
}

/* After fork only the forking thread exists: forget the workers. */
static void atfork_child(void) {
  g_pool.nworkers = 0;
  pthread_mutex_init(&g_pool.busy, NULL);
}

static int start_workers(int want) {
  static int atfork_done;
  if (!atfork_done) {
    pthread_atfork(NULL, NULL, atfork_child);
    atfork_done = 1;
  }
  while (g_pool.nworkers < want) {
    if (pthread_create(&g_pool.tid[g_pool.nworkers], NULL, worker, NULL)) break;
    pthread_detach(g_pool.tid[g_pool.nworkers]);
    g_pool.nworkers++;
  }
  return g_pool.nworkers;
}

void dg__parallel_for(int ntasks, dg__task_fn fn, void *arg) {
  int threads = dg_get_num_threads();
  if (ntasks <= 1 || threads <= 1 || t_in_task || pthread_mutex_trylock(&g_pool.busy)) {
    for (int i = 0; i < ntasks; i++) fn(arg, i);
    return;
  }
  if (start_workers(DG_MIN(threads, MAX_THREADS) - 1) == 0) {
    pthread_mutex_unlock(&g_pool.busy);
    for (int i = 0; i < ntasks; i++) fn(arg, i);
    return;
  }
  unsigned gen = dg__job_post(&g_pool.job, ntasks, fn, arg);
  dg__job_wake(&g_pool.job, MAX_THREADS);
  run_tasks(gen);
  while (atomic_load_explicit(&g_pool.job.left, memory_order_acquire) > 0) dg__cpu_relax();
  pthread_mutex_unlock(&g_pool.busy);
}

void dg_set_num_threads(int n) {
  if (n <= 0) {
    const char *e = getenv("DG_NUM_THREADS");
    if (!e) e = getenv("OMP_NUM_THREADS");
    n = e ? atoi(e) : 1;
    if (n <= 0) n = 1;
  }
  g_threads = DG_MIN(n, MAX_THREADS);
#if DG_HAVE_OPENBLAS
  openblas_set_num_threads(1);
#endif
}

int dg_get_num_threads(void) {
  if (!g_threads) dg_set_num_threads(0);
  return g_threads;
}

typedef struct {
  dg__range_fn fn;
  void *arg;
  int64_t n, step;
} range_job;

static void range_task(void *arg, int i) {
  const range_job *j = arg;
  int64_t lo = i * j->step, hi = DG_MIN(lo + j->step, j->n);
  if (lo < hi) j->fn(j->arg, lo, hi);
}

void dg__parallel_range(int64_t n, int64_t grain, dg__range_fn fn, void *arg) {
  int threads = dg_get_num_threads();
  if (grain < 1) grain = 1;
  if (threads <= 1 || n < 2 * grain) {
    if (n > 0) fn(arg, 0, n);
    return;
  }
  int64_t chunks = DG_MIN((int64_t)threads, n / grain);
  range_job j = {fn, arg, n, ((n + chunks - 1) / chunks + 15) / 16 * 16};
  dg__parallel_for((int)((n + j.step - 1) / j.step), range_task, &j);
}
