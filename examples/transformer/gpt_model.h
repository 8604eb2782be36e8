/* A character-level GPT built from dgrad's modules, shared by
 * examples/transformer/train_gpt.c and bench/gpt.c.
 *
 *   logits = lm_head(ln_f(h[L-1](... h[0](wte(idx) + wpe(pos)))))
 *
 * Parameter names follow GPT-2: wte.weight, wpe.weight, h.<i>.ln_1.weight,
 * h.<i>.attn.c_attn.weight, ..., ln_f.weight, lm_head.weight (absent when the
 * head is tied to wte). Initialisation follows GPT-2: N(0, 0.02) for weights
 * and embeddings, N(0, 0.02 / sqrt(2 L)) for the residual projections
 * (attn.c_proj, mlp.c_proj), zero biases, layernorm weight 1.
 *
 * Ownership: gpt_new fills a caller-owned gpt_model that owns its modules and
 * parameter store until gpt_free. Not thread-safe; a forward uses the
 * caller's ctx. */
#ifndef DG_EXAMPLE_GPT_MODEL_H
#define DG_EXAMPLE_GPT_MODEL_H

#include <stdint.h>

#include <dgrad.h>

typedef struct {
  int vocab;   /* V */
  int layers;  /* L */
  int heads;   /* H */
  int dim;     /* C; C % H == 0 */
  int context; /* T_max: positions */
  int tie;     /* 1: lm_head is wte (logits = x @ wte^T) */
} gpt_config;

typedef struct {
  gpt_config cfg;
  dg_params *ps;
  dg_module *wte;     /* Embedding (V, C) */
  dg_module *wpe;     /* Embedding (T_max, C) */
  dg_module *h;       /* Sequential of L TransformerBlocks */
  dg_module *ln_f;    /* LayerNorm (C) */
  dg_module *lm_head; /* Linear C -> V, no bias; NULL when tied */
  dg_tensor *wte_w;   /* (V, C), owned by ps */
  int64_t *pos;       /* (T_max): 0, 1, ..., T_max - 1 */
} gpt_model;

/* Builds, binds and initialises the model from seed. DG_OK or a DG_E* code. */
int gpt_new(gpt_model *m, const gpt_config *cfg, uint64_t seed);
void gpt_free(gpt_model *m);

/* idx (B, T) i64 token ids (caller memory, must outlive the step), T <= T_max
 * -> logits (B, T, V) in ctx's arena; NULL on error (dg_ctx_errmsg(ctx)). */
dg_tensor *gpt_forward(gpt_model *m, dg_ctx *ctx, int64_t *idx, int64_t B, int64_t T);

/* Mean next-token cross-entropy of logits(idx) against targets (B, T) i64
 * -> () ; NULL on error. */
dg_tensor *gpt_loss(gpt_model *m, dg_ctx *ctx, int64_t *idx, int64_t *targets, int64_t B,
                    int64_t T);

/* GPT-2 initialisation of every parameter of ps from its name and seed
 * (the same values whether ps holds the whole model or a part of it). */
void gpt_init_params(dg_params *ps, int layers, uint64_t seed);

/* The same model as one Sequential, for the pipeline: GptEmbed (i64 (B, T)
 * -> (B, T, C)), h.0 ... h.L-1, ln_f, lm_head; parameter names as above.
 * Not bound (dg_pipe_new binds each stage; then gpt_init_params). DG_EINVAL
 * with a tied head. */
int gpt_sequential(dg_module **out, const gpt_config *cfg);

/* Number of trainable parameters (elements). */
int64_t gpt_num_params(const gpt_model *m);

#endif
