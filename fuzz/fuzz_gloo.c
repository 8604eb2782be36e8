/* Gloo wire frames of the TCP transport (48-byte headers: NOTIFY_SEND_READY,
 * NOTIFY_RECV_READY, SEND_UNBOUND and their payloads) in a mixed group,
 * where dgrad's own opcodes are refused: fuzz_wire.h. */
#include "fuzz_wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_wire(data, size, 0);
  return 0;
}
