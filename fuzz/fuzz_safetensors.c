/* Checkpoints (ckpt/checkpoint.c, safetensors): the input is the file.
 * Runs dg_checkpoint_verify, dg_checkpoint_meta and a load into a small
 * fixed model (two parameters, AdamW state), strict and with partial
 * matches allowed: a load that fails must leave the model as it was. */
#include <string.h>

#include "fuzz_util.h"

typedef struct {
  dg_params *ps;
  dg_optim *o;
  dg_ctx *ctx;
} model;

static model *model_get(void) {
  static model m;
  if (m.ps) return &m;
  dg_tensor *t;
  if (dg_params_new(&m.ps) || dg_params_add(m.ps, "w", 2, (int64_t[]){2, 3}, &t) ||
      dg_params_add(m.ps, "b", 1, (int64_t[]){3}, &t) ||
      dg_optim_new_adamw(&m.o, m.ps, NULL, NULL, 0))
    abort();
  dg_ctx_opts co = {.seed = 1};
  if (dg_ctx_new(&m.ctx, &co)) abort();
  return &m;
}

static float sum_params(dg_params *ps) {
  size_t n;
  const float *v = dg_params_data(ps, &n); /* (2*3 + 3) */
  float s = 0;
  for (size_t i = 0; i < n; i++) s += v[i] * (float)(i + 1);
  return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_quiet();
  if (size > (1u << 20)) return 0;
  model *m = model_get();
  char path[64], err[512], val[256];
  int fd = fz_file(data, size, path, sizeof path);
  err[0] = 0;
  if (dg_checkpoint_verify(path, err, sizeof err) != DG_OK && !err[0]) abort();
  err[0] = 0;
  if (dg_checkpoint_meta(path, "__step", val, sizeof val, err, sizeof err) != DG_OK && !err[0])
    abort();
  dg_checkpoint c = {.params = m->ps, .optim = m->o, .ctx = m->ctx};
  float before = sum_params(m->ps);
  err[0] = 0;
  int rc = dg_checkpoint_load(path, &c, err, sizeof err);
  if (rc != DG_OK && (!err[0] || sum_params(m->ps) != before)) abort();
  const char *from[] = {"model."}, *to[] = {""};
  dg_checkpoint_load_opts lo = {.non_strict = 1, .nrename = 1, .rename_from = from,
                                .rename_to = to};
  err[0] = 0;
  rc = dg_checkpoint_load_with(path, &c, &lo, err, sizeof err);
  if (rc != DG_OK && !err[0]) abort();
  close(fd);
  return 0;
}
