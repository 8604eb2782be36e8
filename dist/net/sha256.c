/* SHA-256 (FIPS 180-4) and HMAC-SHA-256 (RFC 2104), for the shared-secret
 * handshakes of dgrad-only groups (auth.c). Small and portable; speed is
 * irrelevant here (a few hashes per connection). */
#include <string.h>

#include "dist/net/auth_impl.h"

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

static uint32_t ror(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

/* One 64-byte block into the state. */
static void block(uint32_t h[8], const uint8_t *p) {
  uint32_t w[64];
  for (int i = 0; i < 16; i++)
    w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
           (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
  for (int i = 16; i < 64; i++) {
    uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
  for (int i = 0; i < 64; i++) {
    uint32_t t1 = k + (ror(e, 6) ^ ror(e, 11) ^ ror(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
    uint32_t t2 = (ror(a, 2) ^ ror(a, 13) ^ ror(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    k = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
  }
  h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += k;
}

void dg__sha256_init(dg_sha256 *s) {
  static const uint32_t H0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  memcpy(s->h, H0, sizeof H0);
  s->len = 0;
  s->nbuf = 0;
}

void dg__sha256_update(dg_sha256 *s, const void *data, size_t n) {
  const uint8_t *p = data;
  s->len += n;
  while (n) {
    size_t k = 64 - s->nbuf < n ? 64 - s->nbuf : n;
    memcpy(s->buf + s->nbuf, p, k);
    s->nbuf += k, p += k, n -= k;
    if (s->nbuf == 64) {
      block(s->h, s->buf);
      s->nbuf = 0;
    }
  }
}

void dg__sha256_final(dg_sha256 *s, uint8_t out[DG_SHA256_LEN]) {
  uint64_t bits = s->len * 8;
  uint8_t pad = 0x80, zero = 0, lenb[8];
  dg__sha256_update(s, &pad, 1);
  while (s->nbuf != 56) dg__sha256_update(s, &zero, 1);
  for (int i = 0; i < 8; i++) lenb[i] = (uint8_t)(bits >> (56 - 8 * i));
  dg__sha256_update(s, lenb, 8);
  for (int i = 0; i < 8; i++)
    for (int j = 0; j < 4; j++) out[4 * i + j] = (uint8_t)(s->h[i] >> (24 - 8 * j));
}

void dg__sha256(const void *data, size_t n, uint8_t out[DG_SHA256_LEN]) {
  dg_sha256 s;
  dg__sha256_init(&s);
  dg__sha256_update(&s, data, n);
  dg__sha256_final(&s, out);
}

void dg__hmac_init(dg_hmac *m, const void *key, size_t kn) {
  uint8_t k[64] = {0}, pad[64];
  if (kn > 64) dg__sha256(key, kn, k); /* long keys are hashed first */
  else if (kn) memcpy(k, key, kn);
  for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x36;
  dg__sha256_init(&m->in);
  dg__sha256_update(&m->in, pad, 64);
  for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x5c;
  dg__sha256_init(&m->out);
  dg__sha256_update(&m->out, pad, 64);
}

void dg__hmac_update(dg_hmac *m, const void *data, size_t n) { dg__sha256_update(&m->in, data, n); }

void dg__hmac_final(dg_hmac *m, uint8_t out[DG_SHA256_LEN]) {
  uint8_t inner[DG_SHA256_LEN];
  dg__sha256_final(&m->in, inner);
  dg__sha256_update(&m->out, inner, sizeof inner);
  dg__sha256_final(&m->out, out);
}
