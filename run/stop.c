/* Graceful stop: signals become a request that dg_stop_agree shares over
 * the process group, so every rank stops after the same step. The handler
 * only stores into lock-free atomics (async-signal-safe); the program, not
 * the library, saves and exits. */
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "base/common_impl.h"
#include "dgrad/run.h"

#define STOP_MAX_SIGNALS 8
#define STOP_REPEAT_NS 1000000000LL /* a repeat sooner than this is a duplicate */

static atomic_int g_sig;          /* first request's signal, 0: none */
static atomic_llong g_first_ns;   /* when it arrived (CLOCK_MONOTONIC) */
static int g_installed;           /* handlers in place */
static int g_nsig, g_sigs[STOP_MAX_SIGNALS];
static struct sigaction g_old[STOP_MAX_SIGNALS];

static long long mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts); /* async-signal-safe */
  return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The first signal is a request; one a second or more later runs the
 * default action (the user means it), earlier ones are duplicates. */
static void on_stop_signal(int sig) {
  int none = 0;
  if (atomic_compare_exchange_strong(&g_sig, &none, sig)) {
    atomic_store(&g_first_ns, mono_ns());
    return;
  }
  if (mono_ns() - atomic_load(&g_first_ns) < STOP_REPEAT_NS) return;
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, NULL);
  raise(sig);
}

static int check_signal(int s, int k, const int *signals, char *err, size_t errcap) {
  if (s <= 0 || s >= NSIG || s == SIGKILL || s == SIGSTOP || s == SIGSEGV || s == SIGBUS ||
      s == SIGFPE || s == SIGILL || s == SIGCHLD)
    return dg__fail_msg(err, errcap, DG_EINVAL, "stop_install: signal %d (entry %d) cannot "
                        "request a stop (SIGKILL and SIGSTOP cannot be caught; faults and "
                        "SIGCHLD are not stop requests)", s, k);
  for (int j = 0; j < k; j++)
    if (signals[j] == s)
      return dg__fail_msg(err, errcap, DG_EINVAL, "stop_install: signal %d given twice", s);
  return DG_OK;
}

int dg_stop_install(const int *signals, int n, char *err, size_t errcap) {
  static const int dflt[] = {SIGTERM, SIGINT};
  if (err && errcap) err[0] = 0;
  if (g_installed)
    return dg__fail_msg(err, errcap, DG_ESTATE, "stop_install: handlers are installed already "
                        "(dg_stop_uninstall first)");
  if (!signals && n == 0) signals = dflt, n = 2;
  if (!signals || n <= 0 || n > STOP_MAX_SIGNALS)
    return dg__fail_msg(err, errcap, DG_EINVAL, "stop_install: %d signals (1..%d, or NULL, 0 "
                        "for SIGTERM and SIGINT)", n, STOP_MAX_SIGNALS);
  for (int k = 0; k < n; k++) {
    int rc = check_signal(signals[k], k, signals, err, errcap);
    if (rc) return rc;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART; /* system calls of the loop and the library go on */
  atomic_store(&g_sig, 0);
  g_nsig = 0;
  for (int k = 0; k < n; k++) {
    struct sigaction old;
    if (sigaction(signals[k], NULL, &old)) continue;
    if (old.sa_handler == SIG_IGN) continue; /* nohup and `&` keep their meaning */
    if (sigaction(signals[k], &sa, &g_old[g_nsig])) {
      dg_stop_uninstall(); /* those already replaced */
      return dg__fail_msg(err, errcap, DG_ESYS, "stop_install: sigaction(%d) failed", signals[k]);
    }
    g_sigs[g_nsig++] = signals[k];
  }
  g_installed = 1;
  return DG_OK;
}

void dg_stop_uninstall(void) {
  for (int k = 0; k < g_nsig; k++) sigaction(g_sigs[k], &g_old[k], NULL);
  g_nsig = 0;
  g_installed = 0;
}

int dg_stop_signal(void) { return atomic_load(&g_sig); }

void dg_stop_request(int sig) {
  int none = 0;
  if (sig > 0 && atomic_compare_exchange_strong(&g_sig, &none, sig))
    atomic_store(&g_first_ns, mono_ns());
}

int dg_stop_agree(dg_pg *pg, int *sig, char *err, size_t errcap) {
  if (err && errcap) err[0] = 0;
  if (!sig) return dg__fail_msg(err, errcap, DG_EINVAL, "stop_agree: NULL sig");
  int32_t v = atomic_load(&g_sig);
  *sig = v;
  if (!pg) return DG_OK;
  int rc = dg_pg_allreduce_sync(pg, &v, 1, DG_I32, DG_RED_MAX);
  if (rc)
    return dg__fail_msg(err, errcap, rc, "stop_agree: rank %d: the all-reduce of the stop flag "
                        "failed: %s", dg_pg_rank(pg), dg_pg_errmsg(pg));
  *sig = v;
  return DG_OK;
}
