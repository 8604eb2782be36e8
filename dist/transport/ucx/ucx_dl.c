/* UCX loaded at run time (see ucx_dl.h for why). */
#include "dist/transport/ucx/ucx_dl.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common_impl.h"

dg_ucx_api dg__ucx_api;

static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;
static int loaded;

/* UCS reads these once, in libucs's constructor (ucs_init -> ucs_debug_init,
 * UCX 1.13 src/ucs/sys/init.c), so they must be in the environment before
 * the dlopen that runs it. Values as UCX documents them (ucx_info -c). */
static const struct {
  const char *var, *value;
  const char *unless; /* also left alone when the user set this one */
} quiet_env[] = {
    /* no SIGSEGV/SIGBUS/SIGILL/SIGFPE handlers, no sigaltstack; a user who
     * named UCX_ERROR_SIGNALS asked for handlers on those */
    {"UCX_HANDLE_ERRORS", "none", "UCX_ERROR_SIGNALS"},
    {"UCX_DEBUG_SIGNO", "0", NULL}, /* no SIGHUP handler */
};
#define NQUIET (sizeof quiet_env / sizeof *quiet_env)

/* Sets each quiet_env variable the user has not set; set[i] says which
 * were set here, for restore_env. setenv races with getenv in other
 * threads; it runs once per process, when the first UCX group is created. */
static void quiet_ucx(int set[NQUIET]) {
  for (size_t i = 0; i < NQUIET; i++) {
    set[i] = 0;
    if (getenv(quiet_env[i].var) || (quiet_env[i].unless && getenv(quiet_env[i].unless)))
      continue;
    set[i] = setenv(quiet_env[i].var, quiet_env[i].value, 0) == 0;
  }
}

/* The host's environment as it was: UCS has read the values by now. */
static void restore_env(const int set[NQUIET]) {
  for (size_t i = 0; i < NQUIET; i++)
    if (set[i]) unsetenv(quiet_env[i].var);
}

/* dlsym into a function pointer without the object-to-function pointer
 * cast ISO C leaves undefined (POSIX guarantees the representation). */
static int sym(void *h, const char *name, void *fn, size_t n) {
  void *p = dlsym(h, name);
  if (!p || n != sizeof p) return 0;
  memcpy(fn, &p, n);
  return 1;
}

static int resolve(void *h, dg_ucx_api *api, const char *lib, char *err, size_t cap) {
#define DG_UCX_SYM(name)                                                                   \
  if (!sym(h, #name, &api->name, sizeof api->name))                                        \
    return dg__fail_msg(err, cap, DG_EUNSUPPORTED,                                         \
                        "ucx backend: %s has no %s (UCX older than 1.9?); install UCX "    \
                        "1.9 or later (apt-get install libucx0) or use the tcp backend",  \
                        lib, #name);
  DG_UCX_FUNCS(DG_UCX_SYM)
#undef DG_UCX_SYM
  return DG_OK;
}

int dg__ucx_load(const char *lib, char *err, size_t cap) {
  if (!lib) lib = DG_UCX_LIBRARY;
  pthread_mutex_lock(&load_mu);
  int rc = DG_OK;
  if (!loaded) {
    /* A host that already runs UCX made its own choice: change nothing. */
    void *ucs = dlopen("libucs.so.0", RTLD_LAZY | RTLD_NOLOAD);
    dlerror(); /* not loaded is no error for the host to find later */
    int set[NQUIET] = {0};
    if (!ucs) quiet_ucx(set);
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char *why = dlerror();
      rc = dg__fail_msg(err, cap, DG_EUNSUPPORTED,
                        "ucx backend: cannot load %s (%s): install UCX's runtime libraries "
                        "(apt-get install libucx0) or use the tcp backend", lib,
                        why ? why : "dlopen failed");
    }
    restore_env(set);
    if (ucs) dlclose(ucs);
    dg_ucx_api api;
    if (h && (rc = resolve(h, &api, lib, err, cap)) != DG_OK) {
      dlclose(h);
    } else if (h) {
      /* Never closed: UCX keeps threads and state of its own. */
      dg__ucx_api = api;
      loaded = 1;
      DG_LOGD("ucx backend: loaded %s", lib);
    }
  }
  pthread_mutex_unlock(&load_mu);
  return rc;
}
