/* UCX loaded at run time. Internal.
 *
 * libdgrad does not link UCX: a program that never asks for the UCX backend
 * never maps it, and UCX's library constructors (which install handlers for
 * SIGSEGV, SIGBUS, SIGILL, SIGFPE and SIGHUP unless told otherwise) never
 * run in it. The first UCX group dlopen()s libucp.so.0 with UCX's signal
 * handling switched off and resolves the functions the transport calls into
 * dg__ucx_api; the transport calls them as DG_UCX(name)(...). The headers
 * are still needed at build time (types, constants, inline helpers). */
#ifndef DG_UCX_DL_H
#define DG_UCX_DL_H

#include <stddef.h>
#include <ucp/api/ucp.h>

/* The library the transport loads (its SONAME; it pulls libucs and libuct). */
#define DG_UCX_LIBRARY "libucp.so.0"

/* Every UCX function the transport calls. ucp_init is an inline wrapper of
 * ucp_init_version in the headers, so the table has the latter. */
#define DG_UCX_FUNCS(X)                                                              \
  X(ucp_config_read) X(ucp_config_modify) X(ucp_config_release) X(ucp_init_version) \
  X(ucp_cleanup) X(ucp_worker_create) X(ucp_worker_destroy) X(ucp_worker_get_efd)   \
  X(ucp_worker_arm) X(ucp_worker_progress) X(ucp_worker_get_address)                \
  X(ucp_worker_release_address) X(ucp_ep_create) X(ucp_ep_close_nbx)                \
  X(ucp_tag_send_nbx) X(ucp_tag_recv_nbx) X(ucp_request_check_status)               \
  X(ucp_request_cancel) X(ucp_request_free) X(ucs_status_string)

typedef struct {
#define DG_UCX_FIELD(name) __typeof__(name) *name;
  DG_UCX_FUNCS(DG_UCX_FIELD)
#undef DG_UCX_FIELD
} dg_ucx_api;

/* Filled once by a successful dg__ucx_load; read-only afterwards. */
extern dg_ucx_api dg__ucx_api;
#define DG_UCX(name) (dg__ucx_api.name)

/* Loads UCX once per process (thread-safe; later calls return at once).
 * Before the first dlopen, unless the user set them: UCX_HANDLE_ERRORS=none
 * (no error-signal handlers, no sigaltstack) and UCX_DEBUG_SIGNO=0 (no
 * SIGHUP handler); the environment is restored afterwards. `lib` NULL:
 * DG_UCX_LIBRARY (tests pass another name). DG_EUNSUPPORTED with err
 * naming the library and the package to install when it cannot be loaded. */
int dg__ucx_load(const char *lib, char *err, size_t cap);

#endif
