/* Leaf modules: Linear, Conv2d, MaxPool2d, AvgPool2d, GlobalAvgPool2d,
 * activations, Dropout, Flatten, LayerNorm, Embedding. Initialisation
 * follows torch's defaults. */
#include <math.h>

#include "nn/nn_impl.h"

/* torch: kaiming_uniform_(a=sqrt(5)) gives bound 1/sqrt(fan_in) for weights,
 * and biases are uniform in the same bound. */
static int bind_affine(dg_params *ps, const char *prefix, uint64_t seed, int wnd,
                       const int64_t *wshape, int64_t fan_in, int64_t nbias, dg_tensor **w,
                       dg_tensor **b) {
  int rc = dg__bind_param(ps, prefix, "weight", wnd, wshape, w);
  if (rc) return rc;
  dg_init_kaiming_uniform(*w, fan_in, 1.0f / sqrtf(3.0f), dg__param_seed(seed, dg_tensor_name(*w)));
  if (!nbias) return DG_OK;
  if ((rc = dg__bind_param(ps, prefix, "bias", 1, &nbias, b))) return rc;
  float bound = fan_in > 0 ? 1.0f / sqrtf((float)fan_in) : 0.0f;
  dg_init_uniform(*b, -bound, bound, dg__param_seed(seed, dg_tensor_name(*b)));
  return DG_OK;
}

/* ---- Linear ---- */

typedef struct {
  dg_module base;
  int64_t in, out;
  int bias;
  dg_tensor *w, *b;
} linear_m;

static dg_tensor *linear_fwd(dg_module *m, dg_ctx *ctx, dg_tensor *x) {
  linear_m *l = (linear_m *)m;
  if (!l->w) {
    dg__set_error(ctx, DG_ESTATE, "Linear(%lld, %lld): forward before dg_module_bind",
                  (long long)l->in, (long long)l->out);
    return NULL;
  }
  return dg_linear(ctx, x, l->w, l->b);
}

static int linear_bind(dg_module *m, dg_params *ps, const char *prefix, uint64_t seed) {
  linear_m *l = (linear_m *)m;
  int64_t ws[2] = {l->out, l->in};
  return bind_affine(ps, prefix, seed, 2, ws, l->in, l->bias ? l->out : 0, &l->w, &l->b);
}

static const dg_module_vtable linear_vt = {"Linear", linear_fwd, linear_bind, NULL, NULL};

int dg__linear_weights(dg_module *m, dg_tensor **w, dg_tensor **b) {
  if (!m || m->vt != &linear_vt || !((linear_m *)m)->w) return 0;
  *w = ((linear_m *)m)->w;
  *b = ((linear_m *)m)->b;
  return 1;
}

int dg_nn_linear(dg_module **out, int64_t in, int64_t outf, int bias) {
  if (!out) return DG_EINVAL;
  *out = NULL;
  if (in <= 0 || outf <= 0) return DG_EINVAL;
  linear_m *l = (linear_m *)dg__module_alloc(sizeof *l, &linear_vt);
  if (!l) return DG_ENOMEM;
  l->in = in, l->out = outf, l->bias = bias;
  *out = &l->base;
  return DG_OK;
}

/* ---- Conv2d ---- */

typedef struct {
  dg_module base;
  int64_t cin, cout;
  int k, stride, pad, bias;
  dg_tensor *w, *b;
} conv_m;

static dg_tensor *conv_fwd(dg_module *m, dg_ctx *ctx, dg_tensor *x) {
  conv_m *c = (conv_m *)m;
  if (!c->w) {
    dg__set_error(ctx, DG_ESTATE, "Conv2d: forward before dg_module_bind");
    return NULL;
  }
  return dg_conv2d(ctx, x, c->w, c->b, c->stride, c->pad);
}

static int conv_bind(dg_module *m, dg_params *ps, const char *prefix, uint64_t seed) {
  conv_m *c = (conv_m *)m;
  int64_t ws[4] = {c->cout, c->cin, c->k, c->k};
  return bind_affine(ps, prefix, seed, 4, ws, c->cin * c->k * c->k, c->bias ? c->cout : 0,
                     &c->w, &c->b);
}

static const dg_module_vtable conv_vt = {"Conv2d", conv_fwd, conv_bind, NULL, NULL};

int dg_nn_conv2d(dg_module **out, int64_t cin, int64_t cout, int k, int stride, int pad,
                 int bias) {
  if (!out) return DG_EINVAL;
  *out = NULL;
  if (cin <= 0 || cout <= 0 || k <= 0 || stride <= 0 || pad < 0) return DG_EINVAL;
  conv_m *c = (conv_m *)dg__module_alloc(sizeof *c, &conv_vt);
  if (!c) return DG_ENOMEM;
  c->cin = cin, c->cout = cout, c->k = k, c->stride = stride, c->pad = pad, c->bias = bias;
  *out = &c->base;
  return DG_OK;
}

/* ---- parameter-free modules ---- */

typedef struct {
  dg_module base;
  int k, s;
  float p;
} simple_m;

static dg_tensor *pool_fwd(dg_module *m, dg_ctx *ctx, dg_tensor *x) {
  simple_m *s = (simple_m *)m;
  return dg_maxpool2d(ctx, x, s->k, s->s);
}
static dg_tensor *avgpool_fwd(dg_module *m, dg_ctx *ctx, dg_tensor *x) {
  simple_m *s = (simple_m *)m;
  return dg_avgpool2d(ctx, x, s->k, s->s);
}
static dg_tensor *gap_fwd(dg_module *m, dg_ctx *ctx, dg_tensor *x) {
  (void)m;
  return dg_global_avgpool2d(ctx, x);
}
static dg_tensor *relu_fwd(dg_module *m, dg_ctx *ctx, dg_tensor *x) {
  (void)m;
  return dg_relu(ctx, x);
}
static dg_tensor *leaky_relu_fwd(dg_module *m, dg_ctx *ctx, dg_tensor *x) {
  return dg_leaky_relu(ctx, x, ((simple_m *)m)->p);
}
static dg_tensor *gelu_fwd(dg_module *m, dg_ctx *ctx, dg_tensor *x) {
  (void)m;
  return dg_gelu(ctx, x);
}
static dg_tensor *tanh_fwd(dg_module *m, dg_ctx *ctx, dg_tensor *x) {
  (void)m;
  return dg_tanh(ctx, x);
}
static dg_tensor *dropout_fwd(dg_module *m, dg_ctx *ctx, dg_tensor *x) {
  simple_m *s = (simple_m *)m;
  return m->train ? dg_dropout(ctx, x, s->p) : x;
}
static dg_tensor *flatten_fwd(dg_module *m, dg_ctx *ctx, dg_tensor *x) {
  (void)m;
  if (!x) return NULL;
  int64_t sh[2] = {x->ndim ? x->shape[0] : 1, -1};
  return dg_reshape(ctx, x, 2, sh);
}

static const dg_module_vtable pool_vt = {"MaxPool2d", pool_fwd, NULL, NULL, NULL};
static const dg_module_vtable avgpool_vt = {"AvgPool2d", avgpool_fwd, NULL, NULL, NULL};
static const dg_module_vtable gap_vt = {"GlobalAvgPool2d", gap_fwd, NULL, NULL, NULL};
static const dg_module_vtable relu_vt = {"ReLU", relu_fwd, NULL, NULL, NULL};
static const dg_module_vtable leaky_relu_vt = {"LeakyReLU", leaky_relu_fwd, NULL, NULL, NULL};
static const dg_module_vtable gelu_vt = {"GELU", gelu_fwd, NULL, NULL, NULL};
static const dg_module_vtable tanh_vt = {"Tanh", tanh_fwd, NULL, NULL, NULL};
static const dg_module_vtable dropout_vt = {"Dropout", dropout_fwd, NULL, NULL, NULL};
static const dg_module_vtable flatten_vt = {"Flatten", flatten_fwd, NULL, NULL, NULL};

static int simple_new(dg_module **out, const dg_module_vtable *vt, int k, int s, float p) {
  if (!out) return DG_EINVAL;
  simple_m *m = (simple_m *)dg__module_alloc(sizeof *m, vt);
  *out = m ? &m->base : NULL;
  if (!m) return DG_ENOMEM;
  m->k = k, m->s = s, m->p = p;
  return DG_OK;
}

int dg_nn_maxpool2d(dg_module **out, int k, int stride) {
  if (out) *out = NULL;
  if (k <= 0 || stride <= 0) return DG_EINVAL;
  return simple_new(out, &pool_vt, k, stride, 0);
}
int dg_nn_avgpool2d(dg_module **out, int k, int stride) {
  if (out) *out = NULL;
  if (k <= 0 || stride <= 0) return DG_EINVAL;
  return simple_new(out, &avgpool_vt, k, stride, 0);
}
int dg_nn_global_avgpool2d(dg_module **out) { return simple_new(out, &gap_vt, 0, 0, 0); }
int dg_nn_relu(dg_module **out) { return simple_new(out, &relu_vt, 0, 0, 0); }
int dg_nn_leaky_relu(dg_module **out, float slope) {
  return simple_new(out, &leaky_relu_vt, 0, 0, slope);
}
int dg_nn_gelu(dg_module **out) { return simple_new(out, &gelu_vt, 0, 0, 0); }
int dg_nn_tanh(dg_module **out) { return simple_new(out, &tanh_vt, 0, 0, 0); }
int dg_nn_flatten(dg_module **out) { return simple_new(out, &flatten_vt, 0, 0, 0); }
int dg_nn_dropout(dg_module **out, float p) {
  if (out) *out = NULL;
  if (!(p >= 0 && p < 1)) return DG_EINVAL;
  return simple_new(out, &dropout_vt, 0, 0, p);
}

/* ---- LayerNorm ---- */

typedef struct {
  dg_module base;
  int64_t dim;
  float eps;
  dg_tensor *w, *b;
} ln_m;

static dg_tensor *ln_fwd(dg_module *m, dg_ctx *ctx, dg_tensor *x) {
  ln_m *l = (ln_m *)m;
  if (!l->w) {
    dg__set_error(ctx, DG_ESTATE, "LayerNorm: forward before dg_module_bind");
    return NULL;
  }
  return dg_layernorm(ctx, x, l->w, l->b, l->eps);
}

static int ln_bind(dg_module *m, dg_params *ps, const char *prefix, uint64_t seed) {
  ln_m *l = (ln_m *)m;
  (void)seed;
  int rc = dg__bind_param(ps, prefix, "weight", 1, &l->dim, &l->w);
  if (!rc) rc = dg__bind_param(ps, prefix, "bias", 1, &l->dim, &l->b);
  if (rc) return rc;
  dg_init_constant(l->w, 1.0f);
  dg_init_constant(l->b, 0.0f);
  return DG_OK;
}

static const dg_module_vtable ln_vt = {"LayerNorm", ln_fwd, ln_bind, NULL, NULL};

int dg_nn_layernorm(dg_module **out, int64_t dim, float eps) {
  if (!out) return DG_EINVAL;
  *out = NULL;
  if (dim <= 0 || !(eps > 0)) return DG_EINVAL;
  ln_m *l = (ln_m *)dg__module_alloc(sizeof *l, &ln_vt);
  if (!l) return DG_ENOMEM;
  l->dim = dim, l->eps = eps;
  *out = &l->base;
  return DG_OK;
}

/* ---- Embedding ---- */

typedef struct {
  dg_module base;
  int64_t vocab, dim;
  dg_tensor *w;
} emb_m;

static dg_tensor *emb_fwd(dg_module *m, dg_ctx *ctx, dg_tensor *idx) {
  emb_m *e = (emb_m *)m;
  if (!e->w) {
    dg__set_error(ctx, DG_ESTATE, "Embedding: forward before dg_module_bind");
    return NULL;
  }
  return dg_embedding(ctx, e->w, idx);
}

static int emb_bind(dg_module *m, dg_params *ps, const char *prefix, uint64_t seed) {
  emb_m *e = (emb_m *)m;
  int64_t ws[2] = {e->vocab, e->dim};
  int rc = dg__bind_param(ps, prefix, "weight", 2, ws, &e->w);
  if (rc) return rc;
  dg_init_normal(e->w, 0.0f, 1.0f, dg__param_seed(seed, dg_tensor_name(e->w)));
  return DG_OK;
}

static const dg_module_vtable emb_vt = {"Embedding", emb_fwd, emb_bind, NULL, NULL};

int dg_nn_embedding(dg_module **out, int64_t vocab, int64_t dim) {
  if (!out) return DG_EINVAL;
  *out = NULL;
  if (vocab <= 0 || dim <= 0) return DG_EINVAL;
  emb_m *e = (emb_m *)dg__module_alloc(sizeof *e, &emb_vt);
  if (!e) return DG_ENOMEM;
  e->vocab = vocab, e->dim = dim;
  *out = &e->base;
  return DG_OK;
}
