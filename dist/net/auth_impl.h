/* Shared-secret authentication of dgrad-only groups: SHA-256, HMAC-SHA-256
 * (sha256.c), nonces and proofs (auth.c). A proof is HMAC(token, label ||
 * the parts), always over a nonce the verifier chose, so it cannot be
 * replayed, and labelled by direction, so it cannot be reflected. The token
 * itself never travels. Internal. */
#ifndef DG_AUTH_IMPL_H
#define DG_AUTH_IMPL_H

#include <stddef.h>
#include <stdint.h>

#define DG_SHA256_LEN 32
#define DG_AUTH_NONCE 16
#define DG_AUTH_MAC DG_SHA256_LEN

typedef struct {
  uint32_t h[8];
  uint64_t len;
  uint8_t buf[64];
  size_t nbuf;
} dg_sha256;

typedef struct {
  dg_sha256 in, out;
} dg_hmac;

void dg__sha256_init(dg_sha256 *s);
void dg__sha256_update(dg_sha256 *s, const void *data, size_t n);
void dg__sha256_final(dg_sha256 *s, uint8_t out[DG_SHA256_LEN]);
void dg__sha256(const void *data, size_t n, uint8_t out[DG_SHA256_LEN]);
void dg__hmac_init(dg_hmac *m, const void *key, size_t kn);
void dg__hmac_update(dg_hmac *m, const void *data, size_t n);
void dg__hmac_final(dg_hmac *m, uint8_t out[DG_SHA256_LEN]);

/* Fills a fresh random nonce (getrandom); DG_ESYS when the kernel has none. */
int dg__auth_nonce(uint8_t out[DG_AUTH_NONCE]);
/* HMAC(token, label || 0 || a || b): the proof of whoever knows the token
 * over the verifier's nonce (in a or b). */
void dg__auth_proof(const char *token, const char *label, const void *a, size_t an,
                    const void *b, size_t bn, uint8_t out[DG_AUTH_MAC]);
/* 1 when equal; time independent of where they differ. */
int dg__auth_equal(const void *a, const void *b, size_t n);

#endif
