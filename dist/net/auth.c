/* Nonces, proofs and the constant-time compare of the shared-secret
 * handshakes (dist/store/tcp_store*.c, dist/transport/tcp/tcp_conn.c). */
#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include "dist/net/auth_impl.h"
#include "base/common_impl.h"

int dg__auth_nonce(uint8_t out[DG_AUTH_NONCE]) {
  size_t got = 0;
  while (got < DG_AUTH_NONCE) {
    ssize_t r = getrandom(out + got, DG_AUTH_NONCE - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return DG_ESYS;
    got += (size_t)r;
  }
  return DG_OK;
}

void dg__auth_proof(const char *token, const char *label, const void *a, size_t an,
                    const void *b, size_t bn, uint8_t out[DG_AUTH_MAC]) {
  dg_hmac m;
  dg__hmac_init(&m, token, strlen(token));
  dg__hmac_update(&m, label, strlen(label) + 1); /* the NUL separates label and parts */
  dg__hmac_update(&m, a, an);
  dg__hmac_update(&m, b, bn);
  dg__hmac_final(&m, out);
}

int dg__auth_equal(const void *a, const void *b, size_t n) {
  const volatile uint8_t *x = a, *y = b;
  uint8_t d = 0;
  for (size_t i = 0; i < n; i++) d |= x[i] ^ y[i];
  return d == 0;
}
