/* Compute threads. GEMM runs on OpenBLAS's pool; dgrad's own loops stay on
 * the caller's thread, so there is one pool and nothing spins against it. */
#include <stdlib.h>

#include "dgrad_config.h"
#include "tensor/tensor_impl.h"

#if DG_HAVE_OPENBLAS
void openblas_set_num_threads(int n);
#endif

static int g_threads;

void dg_set_num_threads(int n) {
  if (n <= 0) {
    const char *e = getenv("DG_NUM_THREADS");
    n = e ? atoi(e) : 1;
    if (n <= 0) n = 1;
  }
  g_threads = n;
#if DG_HAVE_OPENBLAS
  openblas_set_num_threads(n);
#endif
}

int dg_get_num_threads(void) {
  if (!g_threads) dg_set_num_threads(0);
  return g_threads;
}
