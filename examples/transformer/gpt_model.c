/* Character-level GPT from dgrad modules; see gpt_model.h. */
#include "gpt_model.h"

#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && !strcmp(s + n - k, suffix);
}

/* GPT-2 initialisation of every parameter of ps (see gpt_model.h), each
 * from its name: a store holding part of the model (a pipeline stage) gets
 * the values the whole model would. */
void gpt_init_params(dg_params *ps, int layers, uint64_t seed) {
  float std_resid = 0.02f / sqrtf(2.0f * (float)layers);
  int n = dg_params_count(ps);
  for (int i = 0; i < n; i++) {
    dg_tensor *p = dg_params_get(ps, i);
    const char *name = dg_tensor_name(p);
    uint64_t s = dg_module_param_seed(seed, name);
    if (dg_tensor_ndim(p) == 1) {
      dg_init_constant(p, ends_with(name, "ln_1.weight") || ends_with(name, "ln_2.weight") ||
                                  !strcmp(name, "ln_f.weight")
                              ? 1.0f
                              : 0.0f);
    } else if (ends_with(name, "c_proj.weight")) {
      dg_init_normal(p, 0.0f, std_resid, s);
    } else {
      dg_init_normal(p, 0.0f, 0.02f, s);
    }
  }
}

static int add_child(dg_module *seq, int rc, dg_module *c, const char *name) {
  if (rc) return rc;
  rc = dg_sequential_add(seq, c, name);
  if (rc) dg_module_free(c);
  return rc;
}

int gpt_new(gpt_model *m, const gpt_config *cfg, uint64_t seed) {
  memset(m, 0, sizeof *m);
  if (cfg->vocab <= 0 || cfg->layers <= 0 || cfg->heads <= 0 || cfg->dim <= 0 ||
      cfg->dim % cfg->heads || cfg->context <= 0)
    return DG_EINVAL;
  m->cfg = *cfg;
  int rc = dg_params_new(&m->ps);
  rc = rc ? rc : dg_nn_embedding(&m->wte, cfg->vocab, cfg->dim);
  rc = rc ? rc : dg_nn_embedding(&m->wpe, cfg->context, cfg->dim);
  rc = rc ? rc : dg_nn_sequential(&m->h);
  for (int l = 0; !rc && l < cfg->layers; l++) {
    dg_module *b = NULL;
    rc = dg_nn_transformer_block(&b, cfg->dim, cfg->heads, 0.0f);
    rc = add_child(m->h, rc, b, NULL);
  }
  rc = rc ? rc : dg_nn_layernorm(&m->ln_f, cfg->dim, 1e-5f);
  if (!rc && !cfg->tie) rc = dg_nn_linear(&m->lm_head, cfg->dim, cfg->vocab, 0);
  rc = rc ? rc : dg_module_bind(m->wte, m->ps, "wte", seed);
  rc = rc ? rc : dg_module_bind(m->wpe, m->ps, "wpe", seed);
  rc = rc ? rc : dg_module_bind(m->h, m->ps, "h", seed);
  rc = rc ? rc : dg_module_bind(m->ln_f, m->ps, "ln_f", seed);
  if (!rc && m->lm_head) rc = dg_module_bind(m->lm_head, m->ps, "lm_head", seed);
  if (!rc) {
    m->pos = malloc((size_t)cfg->context * sizeof *m->pos);
    if (!m->pos) rc = DG_ENOMEM;
  }
  if (rc) {
    gpt_free(m);
    return rc;
  }
  for (int t = 0; t < cfg->context; t++) m->pos[t] = t;
  m->wte_w = dg_params_find(m->ps, "wte.weight");
  gpt_init_params(m->ps, cfg->layers, seed);
  return DG_OK;
}

void gpt_free(gpt_model *m) {
  if (!m) return;
  dg_module_free(m->wte);
  dg_module_free(m->wpe);
  dg_module_free(m->h);
  dg_module_free(m->ln_f);
  dg_module_free(m->lm_head);
  dg_params_free(m->ps);
  free(m->pos);
  memset(m, 0, sizeof *m);
}

dg_tensor *gpt_forward(gpt_model *m, dg_ctx *ctx, int64_t *idx, int64_t B, int64_t T) {
  if (T > m->cfg.context) T = m->cfg.context;
  int64_t s_bt[2] = {B, T};
  dg_tensor *tok = dg_module_forward(m->wte, ctx, dg_wrap(ctx, DG_I64, 2, s_bt, idx));
  dg_tensor *pos = dg_module_forward(m->wpe, ctx, dg_wrap(ctx, DG_I64, 1, &T, m->pos));
  dg_tensor *x = dg_add(ctx, tok, pos); /* (B, T, C) + (T, C) */
  x = dg_module_forward(m->h, ctx, x);
  x = dg_module_forward(m->ln_f, ctx, x);
  if (!x) return NULL;
  if (m->lm_head) return dg_module_forward(m->lm_head, ctx, x); /* (B, T, V) */
  return dg_linear(ctx, x, m->wte_w, NULL);
}

dg_tensor *gpt_loss(gpt_model *m, dg_ctx *ctx, int64_t *idx, int64_t *targets, int64_t B,
                    int64_t T) {
  int64_t s_bt[2] = {B, T};
  dg_tensor *logits = gpt_forward(m, ctx, idx, B, T);
  if (!logits) return NULL;
  return dg_cross_entropy(ctx, logits, dg_wrap(ctx, DG_I64, 2, s_bt, targets));
}

int64_t gpt_num_params(const gpt_model *m) {
  int64_t n = 0;
  for (int i = 0; i < dg_params_count(m->ps); i++)
    n += dg_tensor_numel(dg_params_get(m->ps, i));
  return n;
}

/* ---- the same model as one Sequential (for the pipeline) ---- */

/* wte(idx) + wpe(0..T-1): (B, T) i64 -> (B, T, C). The two embeddings are
 * its own (not children), bound under the GPT-2 names "wte" and "wpe"
 * whatever its place in the Sequential, so that every parameter is named as
 * in gpt_new's model. */
typedef struct {
  dg_module base;
  dg_module *wte, *wpe;
  int64_t *pos; /* (T_max) */
  int64_t context;
} gpt_embed;

static dg_tensor *embed_forward(dg_module *mod, dg_ctx *ctx, dg_tensor *idx) {
  gpt_embed *e = (gpt_embed *)mod;
  int64_t T = idx ? dg_tensor_dim(idx, -1) : 0;
  if (T > e->context) return NULL; /* dg_module_forward names the module */
  dg_tensor *tok = dg_module_forward(e->wte, ctx, idx);
  dg_tensor *pos = dg_module_forward(e->wpe, ctx, dg_wrap(ctx, DG_I64, 1, &T, e->pos));
  return dg_add(ctx, tok, pos); /* (B, T, C) + (T, C) */
}

static int embed_bind(dg_module *mod, dg_params *ps, const char *prefix, uint64_t seed) {
  gpt_embed *e = (gpt_embed *)mod;
  (void)prefix;
  int rc = dg_module_bind(e->wte, ps, "wte", seed);
  return rc ? rc : dg_module_bind(e->wpe, ps, "wpe", seed);
}

static void embed_destroy(dg_module *mod) {
  gpt_embed *e = (gpt_embed *)mod;
  dg_module_free(e->wte);
  dg_module_free(e->wpe);
  free(e->pos);
}

static const dg_module_vtable embed_vt = {"GptEmbed", embed_forward, embed_bind, embed_destroy,
                                          NULL};

static int embed_new(dg_module **out, const gpt_config *cfg) {
  int rc = dg_module_new(out, sizeof(gpt_embed), &embed_vt);
  if (rc) return rc;
  gpt_embed *e = (gpt_embed *)*out;
  e->context = cfg->context;
  e->pos = malloc((size_t)cfg->context * sizeof *e->pos);
  rc = e->pos ? DG_OK : DG_ENOMEM;
  for (int t = 0; !rc && t < cfg->context; t++) e->pos[t] = t;
  rc = rc ? rc : dg_nn_embedding(&e->wte, cfg->vocab, cfg->dim);
  rc = rc ? rc : dg_nn_embedding(&e->wpe, cfg->context, cfg->dim);
  if (rc) {
    dg_module_free(*out);
    *out = NULL;
  }
  return rc;
}

int gpt_sequential(dg_module **out, const gpt_config *cfg) {
  *out = NULL;
  if (cfg->tie || cfg->vocab <= 0 || cfg->layers <= 0 || cfg->heads <= 0 || cfg->dim <= 0 ||
      cfg->dim % cfg->heads || cfg->context <= 0)
    return DG_EINVAL; /* a tied head would share wte across the first and last stage */
  dg_module *seq = NULL, *c = NULL;
  int rc = dg_nn_sequential(&seq);
  rc = rc ? rc : embed_new(&c, cfg);
  rc = add_child(seq, rc, c, "embed"); /* its weights: wte.weight, wpe.weight */
  for (int l = 0; !rc && l < cfg->layers; l++) {
    char name[32];
    snprintf(name, sizeof name, "h.%d", l);
    rc = dg_nn_transformer_block(&c, cfg->dim, cfg->heads, 0.0f);
    rc = add_child(seq, rc, c, name);
  }
  rc = rc ? rc : dg_nn_layernorm(&c, cfg->dim, 1e-5f);
  rc = add_child(seq, rc, c, "ln_f");
  rc = rc ? rc : dg_nn_linear(&c, cfg->dim, cfg->vocab, 0);
  rc = add_child(seq, rc, c, "lm_head");
  if (rc) {
    dg_module_free(seq);
    return rc;
  }
  *out = seq;
  return DG_OK;
}
