/* TCPStore server protocol (dist/store/tcp_store_server.c): the input is
 * the streams of up to four clients (dg__ts_server_replay's records),
 * against a server without a token or, when the first byte is odd, with
 * one (the handshake gate and its parser). The server must never crash,
 * leak or read out of bounds, whatever the clients send. */
#include "fuzz_util.h"
#include "dist/store/tcp_store_impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_quiet();
  if (size < 1 || size > (1u << 16)) return 0;
  int r = dg__ts_server_replay(data + 1, size - 1, data[0] & 1 ? "fuzz-token" : NULL);
  if (r < 0 && r != DG_ENOMEM) abort();
  return 0;
}
