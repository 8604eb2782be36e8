/* A host program's signal handlers survive dgrad (issue #16 item 9).
 *
 * Linked against libdgrad.so like any program. It installs its own handlers
 * for SIGSEGV, SIGBUS, SIGILL, SIGFPE and SIGHUP, creates a two-rank group
 * over TCP (UCX must not even be mapped then) and, with argument "ucx", one
 * over UCX, and checks with sigaction that every handler is still its own
 * and that no rank thread got UCX's signal stack. With "user-bt" the user
 * set UCX_HANDLE_ERRORS=bt, which dgrad respects: UCX then owns the error
 * signals (proof that the check sees UCX's handlers when they are there),
 * and SIGHUP stays the program's. */
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dgrad/dist.h"
#include "tests/test.h"

static const int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGHUP};
#define NSIGS (int)(sizeof sigs / sizeof *sigs)

static void own_handler(int sig) { (void)sig; }

static void install(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = own_handler;
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < NSIGS; i++) REQUIRE(sigaction(sigs[i], &sa, NULL) == 0);
}

/* Number of the error signals (all but SIGHUP) whose handler is not ours;
 * SIGHUP's must be ours in every mode. */
static int foreign_handlers(const char *when) {
  int n = 0;
  for (int i = 0; i < NSIGS; i++) {
    struct sigaction cur;
    REQUIRE(sigaction(sigs[i], NULL, &cur) == 0);
    int ours = !(cur.sa_flags & SA_SIGINFO) && cur.sa_handler == own_handler;
    if (ours) continue;
    fprintf(stderr, "%s: the handler of %s is not the program's\n", when, strsignal(sigs[i]));
    if (sigs[i] == SIGHUP) T_FAIL_("%s: SIGHUP handler replaced", when);
    else n++;
  }
  return n;
}

static int ucx_mapped(void) {
  void *h = dlopen("libucp.so.0", RTLD_LAZY | RTLD_NOLOAD);
  if (h) dlclose(h);
  return h != NULL;
}

typedef struct {
  int rank;
  dg_store *store;
  const char *backend;
  int altstack_changed;
} rank_arg;

static void *rank_main(void *p) {
  rank_arg *a = p;
  stack_t before, after;
  REQUIRE(sigaltstack(NULL, &before) == 0);
  dg_pg *pg = NULL;
  char err[512] = "";
  dg_pg_opts o = {.rank = a->rank, .world_size = 2, .store = a->store, .backend = a->backend,
                  .timeout_ms = 30000};
  int rc = dg_pg_new(&pg, &o, err, sizeof err);
  if (rc != DG_OK) {
    T_FAIL_("%s rank %d: dg_pg_new: %s: %s", a->backend, a->rank, dg_err_name(rc), err);
    return NULL;
  }
  float v = (float)(a->rank + 1);
  CHECK_OK(dg_pg_allreduce_sync(pg, &v, 1, DG_F32, DG_RED_SUM));
  CHECK_NEAR(v, 3.0, 0);
  REQUIRE(sigaltstack(NULL, &after) == 0);
  a->altstack_changed = before.ss_flags != after.ss_flags || before.ss_sp != after.ss_sp;
  dg_pg_free(pg);
  return NULL;
}

/* Two ranks in two threads over one memory store; returns how many rank
 * threads found their signal stack changed. */
static int run_group(const char *backend) {
  dg_store *root = NULL;
  REQUIRE(dg_store_new_mem(&root, 30000) == DG_OK);
  pthread_t th[2];
  rank_arg a[2];
  for (int r = 0; r < 2; r++) {
    a[r] = (rank_arg){r, NULL, backend, 0};
    REQUIRE(dg_store_clone(&a[r].store, root) == DG_OK);
    REQUIRE(pthread_create(&th[r], NULL, rank_main, &a[r]) == 0);
  }
  int changed = 0;
  for (int r = 0; r < 2; r++) {
    pthread_join(th[r], NULL);
    dg_store_free(a[r].store);
    if (a[r].altstack_changed) fprintf(stderr, "%s rank %d: sigaltstack changed\n", backend, r);
    changed += a[r].altstack_changed;
  }
  dg_store_free(root);
  return changed;
}

/* test_signals [tcp | ucx | user-bt] */
int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "tcp";
  int user_bt = !strcmp(mode, "user-bt");
  install();
  CHECK(!ucx_mapped());

  CHECK_EQ_INT(run_group("tcp"), 0);
  CHECK_EQ_INT(foreign_handlers("after a tcp group"), 0);
  CHECK(!ucx_mapped()); /* nothing asked for UCX: not loaded */

  if (strcmp(mode, "tcp") != 0) {
    int alt = run_group("ucx"); /* UCX's handlers run on a stack of their own */
    CHECK(ucx_mapped());
    int n = foreign_handlers("after a ucx group");
    CHECK_EQ_INT(n, user_bt ? NSIGS - 1 : 0);
    CHECK_EQ_INT(alt, user_bt ? 1 : 0);
    /* dgrad's settings for UCX do not stay in the environment */
    CHECK(getenv("UCX_DEBUG_SIGNO") == NULL);
    if (!user_bt) CHECK(getenv("UCX_HANDLE_ERRORS") == NULL);
  }
  return TEST_DONE();
}
