/* IDX reader (data/idx.c), raw and gzip. The first byte picks the mode:
 *   0 mod 3: the rest is the file as is (raw IDX or gzip: the reader
 *            detects the gzip magic);
 *   1 mod 3: the rest gzip-compressed by the harness, so mutations reach
 *            the IDX parser behind zlib;
 *   2 mod 3: the rest as is, but truncated gzip streams are likelier (the
 *            compressed rest cut at a length taken from the next byte). */
#include <string.h>
#include <zlib.h>

#include "fuzz_util.h"

/* gzip of data[0..n) into a malloc'ed buffer (*out, *outn). */
static int gzip_mem(const uint8_t *data, size_t n, uint8_t **out, size_t *outn) {
  z_stream z;
  memset(&z, 0, sizeof z);
  if (deflateInit2(&z, 1, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) return -1;
  size_t cap = deflateBound(&z, (uLong)n) + 32;
  *out = malloc(cap);
  if (!*out) {
    deflateEnd(&z);
    return -1;
  }
  z.next_in = (Bytef *)data;
  z.avail_in = (uInt)n;
  z.next_out = *out;
  z.avail_out = (uInt)cap;
  int r = deflate(&z, Z_FINISH);
  *outn = z.total_out;
  deflateEnd(&z);
  return r == Z_STREAM_END ? 0 : -1;
}

static volatile uint8_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_quiet();
  if (size < 1 || size > (1u << 20)) return 0;
  int mode = data[0] % 3;
  const uint8_t *p = data + 1;
  size_t n = size - 1;
  uint8_t *z = NULL;
  if (mode) {
    size_t cut = n && mode == 2 ? p[0] : 0;
    if (mode == 2) p++, n--;
    size_t zn;
    if (gzip_mem(p, n, &z, &zn) < 0) {
      free(z);
      return 0;
    }
    p = z;
    n = mode == 2 && cut < zn ? zn - cut : zn;
  }
  char path[64], err[512];
  int fd = fz_file(p, n, path, sizeof path);
  dg_idx_array a;
  if (dg_idx_read(&a, path, err, sizeof err) == DG_OK) {
    /* every element is readable: the size the header declared arrived */
    uint8_t x = 0;
    for (size_t i = 0; i < a.count * a.elem_size; i++) x ^= ((uint8_t *)a.data)[i];
    sink = x;
    dg_idx_free(&a);
  } else if (!err[0]) {
    abort(); /* a failure always says why */
  }
  close(fd);
  free(z);
  return 0;
}
