/* Loading UCX at run time (dist/transport/ucx/ucx_dl.c): a missing library
 * or one without UCX's functions is an error naming the library and what to
 * install, not a crash, and leaves nothing behind (environment, state); the
 * real library then loads, once. */
#include <stdlib.h>

#include "dist/transport/ucx/ucx_dl.h"
#include "dgrad/common.h"
#include "tests/test.h"

int main(void) {
  char err[512] = "";
  int user_env = getenv("UCX_HANDLE_ERRORS") || getenv("UCX_DEBUG_SIGNO");

  int rc = dg__ucx_load("libdgrad-no-such-ucx.so.0", err, sizeof err);
  fprintf(stderr, "missing: %s\n", err);
  CHECK_EQ_INT(rc, DG_EUNSUPPORTED);
  CHECK_STR_HAS(err, "cannot load libdgrad-no-such-ucx.so.0");
  CHECK_STR_HAS(err, "apt-get install libucx0");
  CHECK_STR_HAS(err, "tcp backend");
  CHECK(dg__ucx_api.ucp_init_version == NULL);
  if (!user_env) CHECK(!getenv("UCX_HANDLE_ERRORS") && !getenv("UCX_DEBUG_SIGNO"));

  /* a library that is not UCX (the C library, loaded anyway): the first
   * missing function is named */
  err[0] = 0;
  rc = dg__ucx_load("libc.so.6", err, sizeof err);
  fprintf(stderr, "not ucx: %s\n", err);
  CHECK_EQ_INT(rc, DG_EUNSUPPORTED);
  CHECK_STR_HAS(err, "libc.so.6 has no ucp_config_read");
  CHECK(dg__ucx_api.ucp_config_read == NULL);

  CHECK_OK(dg__ucx_load(NULL, err, sizeof err));
  CHECK(dg__ucx_api.ucp_tag_send_nbx != NULL && dg__ucx_api.ucs_status_string != NULL);
  CHECK_STR_HAS(dg__ucx_api.ucs_status_string(UCS_ERR_NO_MEMORY), "memory");
  CHECK_OK(dg__ucx_load(NULL, err, sizeof err)); /* once loaded, at once */
  if (!user_env) CHECK(!getenv("UCX_HANDLE_ERRORS") && !getenv("UCX_DEBUG_SIGNO"));
  return TEST_DONE();
}
