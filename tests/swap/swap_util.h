/* Helpers for the swap tests: an MLP and the char-GPT of the example
 * (examples/transformer/gpt_model.c) on synthetic data, one training step
 * that copies the gradients out, swap options from a short name, and the
 * process's resident set. */
#ifndef DG_TEST_SWAP_UTIL_H
#define DG_TEST_SWAP_UTIL_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dgrad.h"
#include "examples/transformer/gpt_model.h"
#include "tests/test.h"

/* ---- models ---- */

enum { SW_MLP_IN = 96, SW_MLP_HID = 256, SW_MLP_OUT = 10 };

typedef struct {
  int gpt;
  gpt_model g;
  dg_params *ps; /* the MLP's, or g.ps */
  int64_t B, T;
  float *x;      /* MLP input (B, IN) */
  int64_t *idx, *tgt; /* MLP targets (B); GPT tokens and targets (B, T) */
} sw_model;

/* MLP: x (B, 96) -> linear 256 -> gelu, then SW_MLP_BLOCKS times
 * [linear 256 -> layernorm -> relu | tanh], then linear 10 ->
 * cross-entropy. Activations are (B, 256) f32: 256 KiB at B = 256. */
enum { SW_MLP_BLOCKS = 4 };

static inline int sw_mlp_new(sw_model *m, int64_t B) {
  memset(m, 0, sizeof *m);
  m->B = B;
  int rc = dg_params_new(&m->ps);
  int64_t w0[2] = {SW_MLP_HID, SW_MLP_IN}, wh[2] = {SW_MLP_HID, SW_MLP_HID};
  int64_t wo[2] = {SW_MLP_OUT, SW_MLP_HID}, bh[1] = {SW_MLP_HID}, bo[1] = {SW_MLP_OUT};
  rc = rc ? rc : dg_params_add(m->ps, "fc0.w", 2, w0, NULL);
  rc = rc ? rc : dg_params_add(m->ps, "fc0.b", 1, bh, NULL);
  for (int k = 0; k < SW_MLP_BLOCKS && !rc; k++) {
    char n[32];
    snprintf(n, sizeof n, "h%d.w", k);
    rc = dg_params_add(m->ps, n, 2, wh, NULL);
    snprintf(n, sizeof n, "h%d.b", k);
    rc = rc ? rc : dg_params_add(m->ps, n, 1, bh, NULL);
    snprintf(n, sizeof n, "h%d.ln.w", k);
    rc = rc ? rc : dg_params_add(m->ps, n, 1, bh, NULL);
    snprintf(n, sizeof n, "h%d.ln.b", k);
    rc = rc ? rc : dg_params_add(m->ps, n, 1, bh, NULL);
  }
  rc = rc ? rc : dg_params_add(m->ps, "out.w", 2, wo, NULL);
  rc = rc ? rc : dg_params_add(m->ps, "out.b", 1, bo, NULL);
  if (rc) return rc;
  size_t n;
  float *d = dg_params_data(m->ps, &n);
  dg_rng_normal(5, 0, d, n);
  for (size_t i = 0; i < n; i++) d[i] *= 0.08f;
  for (int k = 0; k < SW_MLP_BLOCKS; k++) {
    float *lw = dg_tensor_data(dg_params_get(m->ps, 4 + 4 * k));
    for (int i = 0; i < SW_MLP_HID; i++) lw[i] = 1.0f + 0.01f * (float)(i % 7);
  }
  m->x = malloc((size_t)B * SW_MLP_IN * sizeof *m->x);
  m->tgt = malloc((size_t)B * sizeof *m->tgt);
  if (!m->x || !m->tgt) return DG_ENOMEM;
  dg_rng_normal(9, 0, m->x, (size_t)B * SW_MLP_IN);
  for (int64_t i = 0; i < B; i++) m->tgt[i] = (i * 7) % SW_MLP_OUT;
  return DG_OK;
}

/* The char-GPT: L layers, C = 64, 4 heads, T = 32, vocabulary 40. */
static inline int sw_gpt_new(sw_model *m, int64_t B, int L) {
  memset(m, 0, sizeof *m);
  m->gpt = 1;
  m->B = B;
  m->T = 32;
  gpt_config c = {40, L, 4, 64, 32, 0};
  int rc = gpt_new(&m->g, &c, 3);
  if (rc) return rc;
  m->ps = m->g.ps;
  m->idx = malloc((size_t)(B * m->T) * sizeof *m->idx);
  m->tgt = malloc((size_t)(B * m->T) * sizeof *m->tgt);
  if (!m->idx || !m->tgt) return DG_ENOMEM;
  for (int64_t i = 0; i < B * m->T; i++) {
    m->idx[i] = (i * 13 + i / 5) % 40;
    m->tgt[i] = (i * 13 + i / 5 + 1) % 40;
  }
  return DG_OK;
}

static inline void sw_free(sw_model *m) {
  if (m->gpt) gpt_free(&m->g);
  else dg_params_free(m->ps);
  free(m->x);
  free(m->idx);
  free(m->tgt);
}

/* rows [first, first + n) of the batch -> scalar loss; NULL on error. */
static inline dg_tensor *sw_loss_rows(sw_model *m, dg_ctx *ctx, int64_t first, int64_t n) {
  if (m->gpt) return gpt_loss(&m->g, ctx, m->idx + first * m->T, m->tgt + first * m->T, n, m->T);
  int64_t xs[2] = {n, SW_MLP_IN}, ys[1] = {n};
  dg_params *ps = m->ps;
  dg_tensor *x = dg_wrap(ctx, DG_F32, 2, xs, m->x + first * SW_MLP_IN);
  dg_tensor *y = dg_wrap(ctx, DG_I64, 1, ys, m->tgt + first);
  dg_tensor *h = dg_gelu(ctx, dg_linear(ctx, x, dg_params_get(ps, 0), dg_params_get(ps, 1)));
  for (int k = 0; k < SW_MLP_BLOCKS; k++) {
    dg_tensor **p = (dg_tensor *[]){dg_params_get(ps, 2 + 4 * k), dg_params_get(ps, 3 + 4 * k),
                                    dg_params_get(ps, 4 + 4 * k), dg_params_get(ps, 5 + 4 * k)};
    h = dg_layernorm(ctx, dg_linear(ctx, h, p[0], p[1]), p[2], p[3], 1e-5f);
    h = k % 2 ? dg_tanh(ctx, h) : dg_relu(ctx, h);
  }
  int o = 2 + 4 * SW_MLP_BLOCKS;
  return dg_cross_entropy(ctx, dg_linear(ctx, h, dg_params_get(ps, o), dg_params_get(ps, o + 1)),
                          y);
}

static inline dg_tensor *sw_loss(sw_model *m, dg_ctx *ctx) { return sw_loss_rows(m, ctx, 0, m->B); }

/* ---- swap options from a name: off, file, bf16, file+bf16 ---- */

static char sw_dir[128];

/* A fresh directory under /var/tmp (local storage) for swap files. */
static inline const char *sw_tmpdir(void) {
  if (!sw_dir[0]) {
    snprintf(sw_dir, sizeof sw_dir, "/var/tmp/dgswap-test-XXXXXX");
    REQUIRE(mkdtemp(sw_dir) != NULL);
  }
  return sw_dir;
}

static inline void sw_rmdir(void) {
  if (sw_dir[0]) rmdir(sw_dir);
}

/* 0 for "off", else fills o: min_bytes 64 KiB, and a staging bound of
 * 256 KiB, so that forward waits for the I/O thread and what the tests
 * count (tensors out and back in) does not depend on the machine's load. */
static inline int sw_opts(const char *name, int lookahead, dg_swap_opts *o) {
  dg_swap_opts_init(o);
  o->min_bytes = 64 << 10;
  o->staging_bytes = 256 << 10;
  o->lookahead = lookahead;
  o->io_timeout_ms = 20000;
  if (!strcmp(name, "file")) o->target = DG_SWAP_FILE;
  else if (!strcmp(name, "bf16")) o->target = DG_SWAP_BF16;
  else if (!strcmp(name, "file+bf16")) o->target = DG_SWAP_FILE | DG_SWAP_BF16;
  else return 0;
  if (o->target & DG_SWAP_FILE) o->dir = sw_tmpdir();
  return 1;
}

/* VmRSS in bytes. */
static inline size_t sw_rss(void) {
  char buf[4096];
  int fd = open("/proc/self/status", O_RDONLY);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  const char *p = strstr(buf, "VmRSS:");
  return p ? (size_t)strtoull(p + 6, NULL, 10) * 1024 : 0;
}

/* ---- grad-ready, counted per parameter per backward (one context or
 * several: a pipe stage's) ---- */

enum { SW_MAXP = 256 };

typedef struct {
  int n, bad, backwards;
  int count[SW_MAXP];
} sw_ready_count;

static inline void sw_on_ready(void *user, dg_params *ps, int i, int reached) {
  (void)ps;
  sw_ready_count *c = user;
  if (i < 0 || i >= SW_MAXP || !reached) c->bad++; /* every parameter is used */
  else c->count[i]++;
}

/* Backward end: each parameter's hook fired exactly once. */
static inline int sw_on_end(void *user, dg_ctx *ctx) {
  (void)ctx;
  sw_ready_count *c = user;
  for (int i = 0; i < c->n; i++) {
    if (c->count[i] != 1) {
      fprintf(stderr, "backward %d: parameter %d grad-ready fired %d times\n", c->backwards, i,
              c->count[i]);
      c->bad++;
    }
    c->count[i] = 0;
  }
  c->backwards++;
  return DG_OK;
}

#endif
