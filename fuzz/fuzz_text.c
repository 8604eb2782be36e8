/* Text dataset (data/text.c): the input is the text file; the first byte
 * sets the validation fraction and the window. Checks the invariants the
 * dataset promises: every token decodes to a byte of the file. */
#include <string.h>

#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_quiet();
  if (size < 1 || size > (1u << 20)) return 0;
  dg_text_opts o = {.val_fraction = data[0] & 0x80 ? -1.0 : (data[0] & 0x7f) / 128.0};
  int context = 1 + (data[0] & 7);
  char path[64], err[512];
  int fd = fz_file(data + 1, size - 1, path, sizeof path);
  dg_text *t = NULL;
  int rc = dg_text_open(&t, path, &o, err, sizeof err);
  if (rc != DG_OK && !err[0]) abort();
  if (rc == DG_OK) {
    int V = dg_text_vocab_size(t);
    if (V < 1 || V > 256) abort();
    for (int split = 0; split < 2; split++) {
      size_t n = 0;
      const uint8_t *tok = dg_text_tokens(t, split, &n);
      for (size_t i = 0; i < n; i++)
        if (tok[i] >= V || dg_text_id(t, dg_text_byte(t, tok[i])) != tok[i]) abort();
      int64_t ids[4] = {0, V - 1, V, -1};
      char out[8];
      if (dg_text_decode(t, ids, 4, out, sizeof out) != 4) abort();
      dg_dataset ds;
      rc = dg_text_dataset(t, split, context, 1 + (data[0] >> 4), &ds);
      if (rc != DG_OK && rc != DG_EINVAL) abort();
      if (rc == DG_OK && ds.size > 0) { /* the first and last windows */
        int64_t x[8], y[8];
        void *dst[2] = {x, y};
        if (ds.get(ds.self, 0, dst) != DG_OK || ds.get(ds.self, ds.size - 1, dst) != DG_OK)
          abort();
        for (int i = 0; i < context; i++)
          if (x[i] < 0 || x[i] >= V || y[i] < 0 || y[i] >= V) abort();
      }
    }
    dg_text_free(t);
  }
  close(fd);
  return 0;
}
