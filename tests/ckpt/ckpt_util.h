/* Shared helpers of the checkpoint tests: small models, files. */
#ifndef DG_CKPT_UTIL_H
#define DG_CKPT_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dgrad.h>

#include "test.h"

/* layers: Linear(8, hidden), ReLU, Dropout(0), Linear(hidden, 10) bound
 * under "layers" with `seed`. */
static inline dg_module *ck_mlp(dg_params *ps, int64_t hidden, uint64_t seed) {
  dg_module *seq, *m;
  REQUIRE(dg_nn_sequential(&seq) == DG_OK);
  REQUIRE(dg_nn_linear(&m, 8, hidden, 1) == DG_OK);
  dg_sequential_add(seq, m, NULL);
  REQUIRE(dg_nn_relu(&m) == DG_OK);
  dg_sequential_add(seq, m, NULL);
  REQUIRE(dg_nn_dropout(&m, 0.0f) == DG_OK);
  dg_sequential_add(seq, m, NULL);
  REQUIRE(dg_nn_linear(&m, hidden, 10, 1) == DG_OK);
  dg_sequential_add(seq, m, NULL);
  REQUIRE(dg_module_bind(seq, ps, "layers", seed) == DG_OK);
  return seq;
}

static inline void *ck_read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  REQUIRE(f != NULL);
  fseek(f, 0, SEEK_END);
  long sz = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)sz + 1);
  REQUIRE(buf && fread(buf, 1, (size_t)sz, f) == (size_t)sz);
  fclose(f);
  buf[sz] = 0;
  *n = (size_t)sz;
  return buf;
}

static inline void ck_write_file(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  REQUIRE(f != NULL);
  REQUIRE(fwrite(p, 1, n, f) == n);
  fclose(f);
}

#endif
