/* Lending a waiting rank's core (issue 19): in a synchronous data-parallel
 * step the rank that finished first sleeps until the late one posts its
 * gradients, and its core idles. A late rank whose peer on this host waits
 * (the probe the DDP segment installs says so) runs its large GEMMs as
 * column blocks claimed one at a time by itself and by one lend worker,
 * which is kept off the caller's CPU so that the scheduler puts it on the
 * idle one. On a host where a burst of another process takes the late
 * rank's core, the blocks go on at full speed on the peer's core while the
 * caller is preempted.
 *
 * The worker sleeps on a futex between jobs and never spins: a spinning
 * worker would hold the waking peer off its own core. A block's bits do not
 * depend on who computes it (the caller splits only where a split gives
 * the whole's bits), so lent or not, a step gives the same bits. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>

#include "base/common_impl.h"
#include "base/lend_impl.h"
#include "base/threads_impl.h"

static struct {
  pthread_mutex_t busy; /* held by the thread lending */
  dg__job job;
  int started, failed, cpu; /* the CPU the worker is kept off, -1: none yet */
  pthread_t tid;
  atomic_long lent; /* jobs lent */
} g_lend = {.busy = PTHREAD_MUTEX_INITIALIZER, .cpu = -1};

static _Atomic(dg__lend_probe_fn) g_probe; /* read unlocked: dg__lend_armed */
static void *g_probe_arg;

static int worker_up(void);

/* The probe is installed, cleared and called with `busy` held: clearing
 * returns only once no call is in flight, so its owner may free its state. */
void dg__lend_set_probe(dg__lend_probe_fn fn, void *arg) {
  pthread_mutex_lock(&g_lend.busy);
  if (worker_up()) { /* now, not in a step: a thread's stack is an allocation */
    g_probe_arg = arg;
    atomic_store(&g_probe, fn);
  } /* else no worker: nothing to lend to */
  pthread_mutex_unlock(&g_lend.busy);
}

void dg__lend_clear_probe(void *arg) {
  pthread_mutex_lock(&g_lend.busy);
  if (g_probe_arg == arg) g_probe_arg = NULL, atomic_store(&g_probe, NULL);
  pthread_mutex_unlock(&g_lend.busy);
}

int dg__lend_armed(void) { return atomic_load_explicit(&g_probe, memory_order_relaxed) != NULL; }

/* Lock held. */
static int probe_says(void) {
  dg__lend_probe_fn fn = atomic_load_explicit(&g_probe, memory_order_relaxed);
  return fn && fn(g_probe_arg);
}

static void *lend_worker(void *arg) {
  /* the generation when it was made: a job posted before it first runs is
   * still seen as new */
  unsigned seen = (unsigned)(uintptr_t)arg;
  for (;;) {
    unsigned g;
    while ((g = atomic_load_explicit(&g_lend.job.gen, memory_order_acquire)) == seen)
      dg__job_sleep(&g_lend.job, seen);
    seen = g;
    dg__job_run(&g_lend.job, g);
  }
  return NULL;
}

static void lend_atfork_child(void) {
  g_lend.started = 0, g_lend.cpu = -1;
  pthread_mutex_init(&g_lend.busy, NULL);
}

/* The worker, started (1) or not (0: it could not be). Lock held. */
static int worker_up(void) {
  if (g_lend.started) return 1;
  if (g_lend.failed) return 0;
  static int atfork_done;
  if (!atfork_done) pthread_atfork(NULL, NULL, lend_atfork_child), atfork_done = 1;
  void *gen = (void *)(uintptr_t)atomic_load(&g_lend.job.gen);
  if (pthread_create(&g_lend.tid, NULL, lend_worker, gen)) return !(g_lend.failed = 1);
  pthread_detach(g_lend.tid);
  g_lend.started = 1;
  return 1;
}

/* Keeps the worker off the caller's CPU (a woken thread is often placed
 * beside its waker, where it would only take turns with the caller). */
static void keep_off(void) {
  int cpu = sched_getcpu();
  if (cpu < 0 || cpu == g_lend.cpu) return;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return;
  CPU_CLR(cpu, &set);
  if (CPU_COUNT(&set) == 0) return;
  if (pthread_setaffinity_np(g_lend.tid, sizeof set, &set) == 0) g_lend.cpu = cpu;
}

int dg__lend_for(int ntasks, void (*fn)(void *arg, int i), void *arg) {
  if (ntasks < 2 || pthread_mutex_trylock(&g_lend.busy)) return 0;
  if (!probe_says() || !worker_up()) {
    pthread_mutex_unlock(&g_lend.busy);
    return 0;
  }
  keep_off();
  unsigned gen = dg__job_post(&g_lend.job, ntasks, fn, arg);
  dg__job_wake(&g_lend.job, 1);
  dg__job_run(&g_lend.job, gen);
  /* the worker's last block: it runs on another core, so it ends soon */
  while (atomic_load_explicit(&g_lend.job.left, memory_order_acquire) > 0) dg__cpu_relax();
  atomic_fetch_add_explicit(&g_lend.lent, 1, memory_order_relaxed);
  pthread_mutex_unlock(&g_lend.busy);
  return 1;
}

long dg__lend_count(void) { return atomic_load(&g_lend.lent); }

