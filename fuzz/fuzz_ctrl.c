/* dgrad-only control messages of the TCP transport (BYE, ABORT with its
 * blame and code, EAGER data kept until its receive is posted) mixed with
 * Gloo's frames, in a dgrad-only group: fuzz_wire.h. */
#include "fuzz_wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_wire(data, size, 1);
  return 0;
}
