/* Zero-size and overflow sweep.
 *
 * Every op of ops.h (but argmax and accuracy, which have no gradient: their
 * empty cases are in tests/nn/test_layers2.c), with each size variable of
 * its inputs set to 0 in turn
 * (the inputs' shapes are written in variables, so "K = 0" empties both
 * operands of a matmul consistently), forward and backward of
 * loss = sum(out * c), against the mathematically right answer: the output
 * shape; the values where the output is not empty (an empty sum is 0, an
 * empty mean NaN as torch, linear with in_features 0 the bias in every row,
 * conv2d with no input channels the bias, mlp_gelu with no hidden units
 * b2 (+ res)); every input's gradient (exactly zero where unused). Weights
 * and biases are parameters in a dg_params store whose gradients held
 * garbage before dg_params_zero_grad: after a step where they are unused
 * (zero rows, zero images, a batch of none) they must read 0 through
 * dg_tensor_grad and dg_params_grad. Zero-element parameters are used as
 * any other. An op may refuse a shape torch also refuses, with an error
 * code and a message; NULL with DG_OK or an empty message is a failure.
 *
 * Then: shapes whose byte size overflows are refused with DG_EINVAL naming
 * the shape (constructors, persistent tensors, parameters, reshape, ops
 * whose output would overflow), without allocating; a second backward over
 * a consumed tape is an error; a grad_out of the wrong dtype is a dtype
 * error. */
#include "gradcheck.h"
#include "test.h"

#define ZMAX 6 /* inputs */
#define VMAX 6 /* size variables */

typedef struct zcase zcase;
typedef dg_tensor *(*zcall)(dg_ctx *ctx, dg_tensor **in, const zcase *zc, const int64_t *v);

typedef struct {
  double *val;          /* expected output values; NULL: none to check */
  double *grad[ZMAX];   /* expected input gradients; NULL: zero */
} expect_t;
typedef void (*zexpect)(const zcase *zc, dg_tensor **in, dg_tensor *out, const float *c,
                        expect_t *e);

struct zcase {
  const char *name;
  zcall call;
  const char *vars;     /* one letter per size variable */
  int64_t base[VMAX];   /* their sizes when not zeroed */
  const char *shapes;   /* inputs, in the variables: "MxK KxN", "-" NULL, "Bx3C", "A+B" */
  const char *kinds;    /* per input: d data (grad), p parameter, i i64 index, - NULL */
  const char *out;      /* the output's shape ("" a scalar) */
  zexpect expect;       /* values and gradients when the output is not empty */
  const char *may_fail; /* variables whose 0 the op may refuse (torch does too) */
  const char *must_fail;
  int attr[4];
  int always_empty;     /* output empty at the base sizes too: run them */
  float lo, hi;         /* input values; both 0: [-1, 1) */
};

static int g_threads = 1;

#define LO(zc) ((zc)->hi == 0 ? -1.0f : (zc)->lo)
#define HI(zc) ((zc)->hi == 0 ? 1.0f : (zc)->hi)

/* ---- shape strings ---- */

/* term := [digits][var][/digits]; expr := term ('+' term)* */
static int64_t eval_dim(const zcase *zc, const int64_t *v, const char *s, const char *end) {
  int64_t sum = 0;
  while (s < end) {
    int64_t t = 1, lit = 0, has_lit = 0;
    while (s < end && *s >= '0' && *s <= '9') lit = lit * 10 + (*s++ - '0'), has_lit = 1;
    if (has_lit) t = lit;
    if (s < end && *s >= 'A' && *s <= 'Z') {
      const char *p = strchr(zc->vars, *s++);
      REQUIRE(p != NULL);
      t *= v[p - zc->vars];
    }
    if (s < end && *s == '/') {
      int64_t d = 0;
      for (s++; s < end && *s >= '0' && *s <= '9'; s++) d = d * 10 + (*s - '0');
      t /= d;
    }
    sum += t;
    if (s < end && *s == '+') s++;
  }
  return sum;
}

/* Shape of word k of a space-separated list; -1: "-" (NULL input). */
static int shape_of(const zcase *zc, const int64_t *v, const char *list, int k, int64_t *shape) {
  const char *s = list;
  for (int i = 0; i < k; i++) {
    s = strchr(s, ' ');
    REQUIRE(s != NULL);
    s++;
  }
  const char *end = strchr(s, ' ');
  if (!end) end = s + strlen(s);
  if (*s == '-') return -1;
  int nd = 0;
  while (s < end) {
    const char *x = memchr(s, 'x', (size_t)(end - s));
    const char *e = x ? x : end;
    shape[nd++] = eval_dim(zc, v, s, e);
    s = x ? x + 1 : end;
  }
  return nd;
}

/* Whether word k of the shapes mentions variable var. */
static int shape_uses(const zcase *zc, int k, char var) {
  const char *s = zc->shapes;
  for (int i = 0; i < k; i++) s = strchr(s, ' ') + 1;
  const char *end = strchr(s, ' ');
  if (!end) end = s + strlen(s);
  return memchr(s, var, (size_t)(end - s)) != NULL;
}

static int ninputs(const zcase *zc) { return (int)strlen(zc->kinds); }

static const char *dims_str(int nd, const int64_t *s, char *buf, size_t cap) {
  size_t n = (size_t)snprintf(buf, cap, "(");
  for (int i = 0; i < nd && n < cap; i++)
    n += (size_t)snprintf(buf + n, cap - n, i ? ", %lld" : "%lld", (long long)s[i]);
  if (n < cap) snprintf(buf + n, cap - n, ")");
  return buf;
}

static const float *F(dg_tensor *t) { return t ? dg_tensor_data(t) : NULL; }
static int64_t D(dg_tensor *t, int i) { return dg_tensor_dim(t, i); }

static double *dzeros(int64_t n) {
  double *p = calloc((size_t)(n ? n : 1), sizeof *p);
  REQUIRE(p != NULL);
  return p;
}

/* ---- op wrappers ---- */

#define BIN(nm, expr)                                                                    \
  static dg_tensor *z_##nm(dg_ctx *c, dg_tensor **in, const zcase *zc, const int64_t *v) { \
    (void)zc, (void)v;                                                                   \
    return expr;                                                                         \
  }
BIN(reshape, dg_reshape(c, in[0], 2, (int64_t[]){zc->attr[0] ? -1 : v[1], v[zc->attr[0] ? 1 : 0]}))
BIN(slice, zc->attr[0] ? dg_slice(c, in[0], v[0], v[0]) : dg_slice(c, in[0], 0, v[0]))
BIN(transpose, dg_transpose(c, in[0], 0, 1))
BIN(permute, dg_permute(c, in[0], (const int[]){2, 0, 1}))
BIN(contig_t, dg_contiguous(c, dg_transpose(c, in[0], 0, 1)))
BIN(matmul, dg_matmul_t(c, in[0], in[1], zc->attr[0], zc->attr[1]))
BIN(linear, ninputs(zc) > 3 ? dg_linear_add(c, in[0], in[1], in[2], in[3])
                            : dg_linear(c, in[0], in[1], in[2]))
BIN(sum_dim, zc->attr[2] ? dg_mean_dim(c, in[0], zc->attr[0], zc->attr[1])
                         : dg_sum_dim(c, in[0], zc->attr[0], zc->attr[1]))
BIN(add, dg_add(c, in[0], in[1]))
BIN(sub, dg_sub(c, in[0], in[1]))
BIN(mul, dg_mul(c, in[0], in[1]))
BIN(div, dg_div(c, in[0], in[1]))
BIN(scale, dg_scale(c, in[0], -1.5f))
BIN(add_scalar, dg_add_scalar(c, in[0], 0.5f))
BIN(sum, dg_sum(c, in[0]))
BIN(mean, dg_mean(c, in[0]))
BIN(relu, dg_relu(c, in[0]))
BIN(gelu, dg_gelu(c, in[0]))
BIN(tanh, dg_tanh(c, in[0]))
BIN(sigmoid, dg_sigmoid(c, in[0]))
BIN(exp, dg_exp(c, in[0]))
BIN(log, dg_log(c, in[0]))
BIN(softmax, dg_softmax(c, in[0]))
BIN(log_softmax, dg_log_softmax(c, in[0]))
BIN(cross_entropy, dg_cross_entropy(c, in[0], in[1]))
BIN(mse, dg_mse(c, in[0], in[1]))
BIN(layernorm, dg_layernorm(c, in[0], in[1], in[2], 1e-5f))
BIN(batchnorm, dg_batchnorm(c, in[0], in[1], in[2], NULL, NULL, 1, 0.1f, 1e-5f))
BIN(embedding, dg_embedding(c, in[0], in[1]))
BIN(dropout, dg_dropout(c, in[0], 0.5f))
BIN(causal_mask, dg_causal_mask(c, in[0]))
BIN(conv2d, dg_conv2d(c, in[0], in[1], in[2], zc->attr[0], zc->attr[1]))
BIN(maxpool2d, dg_maxpool2d(c, in[0], 2, 2))
BIN(avgpool2d, dg_avgpool2d(c, in[0], 2, 2))
BIN(global_avgpool2d, dg_global_avgpool2d(c, in[0]))
BIN(leaky_relu, dg_leaky_relu(c, in[0], 0.1f))
BIN(concat, dg_concat(c, 2, in, zc->attr[0]))
BIN(attention, dg_attention(c, in[0], zc->attr[0], zc->attr[1], 0.5f))
BIN(mlp, ninputs(zc) > 5 ? dg_mlp_gelu_add(c, in[0], in[1], in[2], in[3], in[4], in[5])
                         : dg_mlp_gelu(c, in[0], in[1], in[2], in[3], in[4]))
/* split x (A, S + T) along dim 1; the second part */
static dg_tensor *z_split(dg_ctx *c, dg_tensor **in, const zcase *zc, const int64_t *v) {
  (void)zc;
  int64_t sizes[2] = {v[1], v[2]};
  dg_tensor *parts[2] = {0};
  if (dg_split(c, in[0], 1, 2, sizes, parts) != DG_OK) return NULL;
  return parts[1];
}

/* ---- references (double), for outputs that are not empty ---- */

/* matmul_t, 2-D, batched or with a shared 2-D b; attr: ta, tb */
static void ex_matmul(const zcase *zc, dg_tensor **in, dg_tensor *out, const float *c,
                      expect_t *e) {
  int ta = zc->attr[0], tb = zc->attr[1], nb = dg_tensor_ndim(in[1]);
  int64_t B = dg_tensor_ndim(in[0]) == 3 ? D(in[0], 0) : 1;
  int64_t M = ta ? D(in[0], -1) : D(in[0], -2), K = ta ? D(in[0], -2) : D(in[0], -1);
  int64_t N = tb ? D(in[1], -2) : D(in[1], -1);
  const float *a = F(in[0]), *b = F(in[1]);
  e->val = dzeros(dg_tensor_numel(out));
  e->grad[0] = dzeros(dg_tensor_numel(in[0]));
  e->grad[1] = dzeros(dg_tensor_numel(in[1]));
  for (int64_t i = 0; i < B; i++)
    for (int64_t m = 0; m < M; m++)
      for (int64_t n = 0; n < N; n++) {
        int64_t yi = (i * M + m) * N + n;
        for (int64_t k = 0; k < K; k++) {
          int64_t ai = i * M * K + (ta ? k * M + m : m * K + k);
          int64_t bi = (nb == 3 ? i * K * N : 0) + (tb ? n * K + k : k * N + n);
          e->val[yi] += (double)a[ai] * b[bi];
          e->grad[0][ai] += (double)c[yi] * b[bi];
          e->grad[1][bi] += (double)a[ai] * c[yi];
        }
      }
}

/* linear / linear_add: x (.., I), w (O, I), b (O) or NULL, [res (.., O)] */
static void ex_linear(const zcase *zc, dg_tensor **in, dg_tensor *out, const float *c,
                      expect_t *e) {
  int64_t I = D(in[1], 1), O = D(in[1], 0), R = I ? dg_tensor_numel(in[0]) / I : 0;
  if (!I) R = dg_tensor_numel(out) / (O ? O : 1);
  const float *x = F(in[0]), *w = F(in[1]), *b = F(in[2]);
  const float *res = ninputs(zc) > 3 ? F(in[3]) : NULL;
  e->val = dzeros(R * O);
  for (int k = 0; k < 4 && k < ninputs(zc); k++)
    if (in[k]) e->grad[k] = dzeros(dg_tensor_numel(in[k]));
  for (int64_t r = 0; r < R; r++)
    for (int64_t o = 0; o < O; o++) {
      int64_t yi = r * O + o;
      double y = (b ? b[o] : 0) + (res ? res[yi] : 0);
      for (int64_t i = 0; i < I; i++) {
        y += (double)x[r * I + i] * w[o * I + i];
        e->grad[0][r * I + i] += (double)c[yi] * w[o * I + i];
        e->grad[1][o * I + i] += (double)c[yi] * x[r * I + i];
      }
      e->val[yi] = y;
      if (b) e->grad[2][o] += c[yi];
      if (res) e->grad[3][yi] = c[yi];
    }
}

/* sum / mean over everything (attr[0] < 0) or over dim attr[0] of a 3-d x;
 * attr[2]: mean. An empty mean is NaN. */
static void ex_reduce(const zcase *zc, dg_tensor **in, dg_tensor *out, const float *c,
                      expect_t *e) {
  int dim = zc->attr[0], mean = zc->attr[2];
  const float *x = F(in[0]);
  int64_t n = dg_tensor_numel(in[0]);
  int64_t outer = 1, S = n, inner = 1;
  if (dim >= 0) {
    S = D(in[0], dim);
    for (int i = 0; i < dim; i++) outer *= D(in[0], i);
    for (int i = dim + 1; i < dg_tensor_ndim(in[0]); i++) inner *= D(in[0], i);
  }
  e->val = dzeros(dg_tensor_numel(out));
  e->grad[0] = dzeros(n);
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      int64_t yi = o * inner + i;
      double s = 0;
      for (int64_t k = 0; k < S; k++) {
        int64_t xi = (o * S + k) * inner + i;
        s += x[xi];
        e->grad[0][xi] = mean ? c[yi] / (double)S : c[yi];
      }
      e->val[yi] = mean ? (S ? s / (double)S : NAN) : s;
    }
}

/* mse: mean of squared differences (NaN when empty) */
static void ex_mse(const zcase *zc, dg_tensor **in, dg_tensor *out, const float *c,
                   expect_t *e) {
  (void)zc, (void)out;
  int64_t n = dg_tensor_numel(in[0]);
  const float *p = F(in[0]), *t = F(in[1]);
  e->val = dzeros(1);
  e->grad[0] = dzeros(n), e->grad[1] = dzeros(n);
  double s = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = (double)p[i] - t[i];
    s += d * d;
    e->grad[0][i] = 2 * d / (double)n * c[0];
    e->grad[1][i] = -e->grad[0][i];
  }
  e->val[0] = n ? s / (double)n : NAN;
}

/* cross_entropy, mean over the rows (NaN with none) */
static void ex_ce(const zcase *zc, dg_tensor **in, dg_tensor *out, const float *c,
                  expect_t *e) {
  (void)zc, (void)out;
  int64_t N = D(in[0], 0), C = D(in[0], 1);
  const float *x = F(in[0]);
  const int64_t *t = dg_tensor_data(in[1]);
  e->val = dzeros(1);
  e->grad[0] = dzeros(N * C);
  double s = 0;
  for (int64_t r = 0; r < N; r++) {
    double mx = -INFINITY, z = 0;
    for (int64_t j = 0; j < C; j++) mx = fmax(mx, x[r * C + j]);
    for (int64_t j = 0; j < C; j++) z += exp(x[r * C + j] - mx);
    s += mx + log(z) - x[r * C + t[r]];
    for (int64_t j = 0; j < C; j++)
      e->grad[0][r * C + j] = (exp(x[r * C + j] - mx) / z - (j == t[r])) / (double)N * c[0];
  }
  e->val[0] = N ? s / (double)N : NAN;
}

/* conv2d, x (N, C, H, W), w (O, C, K, K), b (O) or NULL; attr stride, pad */
static void ex_conv(const zcase *zc, dg_tensor **in, dg_tensor *out, const float *c,
                    expect_t *e) {
  int s = zc->attr[0], p = zc->attr[1];
  int64_t N = D(in[0], 0), C = D(in[0], 1), H = D(in[0], 2), W = D(in[0], 3);
  int64_t O = D(in[1], 0), K = D(in[1], 2), OH = D(out, 2), OW = D(out, 3);
  const float *x = F(in[0]), *w = F(in[1]), *b = F(in[2]);
  e->val = dzeros(dg_tensor_numel(out));
  for (int k = 0; k < 3; k++)
    if (in[k]) e->grad[k] = dzeros(dg_tensor_numel(in[k]));
  for (int64_t n = 0; n < N; n++)
    for (int64_t o = 0; o < O; o++)
      for (int64_t oh = 0; oh < OH; oh++)
        for (int64_t ow = 0; ow < OW; ow++) {
          int64_t yi = ((n * O + o) * OH + oh) * OW + ow;
          double y = b ? b[o] : 0;
          for (int64_t ci = 0; ci < C; ci++)
            for (int64_t i = 0; i < K * K; i++) {
              int64_t h = oh * s - p + i / K, ww = ow * s - p + i % K;
              if (h < 0 || h >= H || ww < 0 || ww >= W) continue;
              int64_t xi = ((n * C + ci) * H + h) * W + ww, wi = (o * C + ci) * K * K + i;
              y += (double)x[xi] * w[wi];
              e->grad[0][xi] += (double)c[yi] * w[wi];
              e->grad[1][wi] += (double)c[yi] * x[xi];
            }
          e->val[yi] = y;
          if (b) e->grad[2][o] += c[yi];
        }
}

/* global_avgpool2d: x (N, C, H, W) -> (N, C) plane means; no elements: NaN */
static void ex_gap(const zcase *zc, dg_tensor **in, dg_tensor *out, const float *c,
                   expect_t *e) {
  (void)zc;
  int64_t P = D(in[0], 2) * D(in[0], 3), planes = dg_tensor_numel(out);
  const float *x = F(in[0]);
  e->val = dzeros(planes);
  e->grad[0] = dzeros(planes * P);
  for (int64_t p = 0; p < planes; p++) {
    double s = 0;
    for (int64_t i = 0; i < P; i++) {
      s += x[p * P + i];
      e->grad[0][p * P + i] = c[p] / (double)P;
    }
    e->val[p] = P ? s / (double)P : NAN;
  }
}

/* concat of two 2-d inputs along attr[0] */
static void ex_concat(const zcase *zc, dg_tensor **in, dg_tensor *out, const float *c,
                      expect_t *e) {
  int dim = zc->attr[0];
  int64_t R = D(out, 0), S = D(out, 1);
  e->val = dzeros(R * S);
  e->grad[0] = dzeros(dg_tensor_numel(in[0])), e->grad[1] = dzeros(dg_tensor_numel(in[1]));
  for (int64_t r = 0; r < R; r++)
    for (int64_t j = 0; j < S; j++) {
      int64_t cut = dim ? D(in[0], 1) : D(in[0], 0), q = dim ? j : r;
      int k = q >= cut;
      int64_t rr = dim ? r : r - k * cut, jj = dim ? j - k * cut : j;
      int64_t xi = rr * D(in[k], 1) + jj;
      e->val[r * S + j] = F(in[k])[xi];
      e->grad[k][xi] = c[r * S + j];
    }
}

/* the second part of x (A, S + T) split along dim 1 */
static void ex_split(const zcase *zc, dg_tensor **in, dg_tensor *out, const float *c,
                     expect_t *e) {
  (void)zc;
  int64_t A = D(in[0], 0), W = D(in[0], 1), T = D(out, 1), S = W - T;
  e->val = dzeros(A * T);
  e->grad[0] = dzeros(A * W);
  for (int64_t r = 0; r < A; r++)
    for (int64_t j = 0; j < T; j++) {
      e->val[r * T + j] = F(in[0])[r * W + S + j];
      e->grad[0][r * W + S + j] = c[r * T + j];
    }
}

static double gelu_d(double x, double *dg) {
  const double k = 0.7978845608028654, a = 0.044715;
  double t = tanh(k * (x + a * x * x * x));
  *dg = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * a * x * x);
  return 0.5 * x * (1 + t);
}

/* mlp_gelu(_add): x (.., C), w1 (F, C), b1, w2 (O, F), b2, [res] */
static void ex_mlp(const zcase *zc, dg_tensor **in, dg_tensor *out, const float *c,
                   expect_t *e) {
  int64_t C = D(in[1], 1), Fh = D(in[1], 0), O = D(in[3], 0);
  int64_t R = dg_tensor_numel(out) / (O ? O : 1);
  const float *x = F(in[0]), *w1 = F(in[1]), *b1 = F(in[2]), *w2 = F(in[3]), *b2 = F(in[4]);
  const float *res = ninputs(zc) > 5 ? F(in[5]) : NULL;
  e->val = dzeros(R * O);
  for (int k = 0; k < ninputs(zc); k++)
    if (in[k]) e->grad[k] = dzeros(dg_tensor_numel(in[k]));
  double *g = dzeros(Fh), *gp = dzeros(Fh), *a = dzeros(Fh);
  for (int64_t r = 0; r < R; r++) {
    for (int64_t f = 0; f < Fh; f++) {
      double h = b1 ? b1[f] : 0;
      for (int64_t i = 0; i < C; i++) h += (double)x[r * C + i] * w1[f * C + i];
      g[f] = gelu_d(h, &gp[f]);
      a[f] = 0;
    }
    for (int64_t o = 0; o < O; o++) {
      double y = (b2 ? b2[o] : 0) + (res ? res[r * O + o] : 0), dy = c[r * O + o];
      for (int64_t f = 0; f < Fh; f++) {
        y += g[f] * w2[o * Fh + f];
        e->grad[3][o * Fh + f] += dy * g[f];
        a[f] += dy * w2[o * Fh + f];
      }
      e->val[r * O + o] = y;
      if (b2) e->grad[4][o] += dy;
      if (res) e->grad[5][r * O + o] = dy;
    }
    for (int64_t f = 0; f < Fh; f++) {
      a[f] *= gp[f];
      if (b1) e->grad[2][f] += a[f];
      for (int64_t i = 0; i < C; i++) {
        e->grad[1][f * C + i] += a[f] * x[r * C + i];
        e->grad[0][r * C + i] += a[f] * w1[f * C + i];
      }
    }
  }
  free(g), free(gp), free(a);
}

/* ---- the sweep ---- */

static void fill_uniform(float *d, int64_t n, float lo, float hi, uint64_t seed) {
  dg_rng_uniform(seed, 0, d, (size_t)n);
  for (int64_t i = 0; i < n; i++) d[i] = lo + (hi - lo) * d[i];
}

/* Parameters (kind p) at sizes v, in a new store; values filled. */
static int make_params(const zcase *zc, const int64_t *v, dg_tensor **in, dg_params **ps,
                       uint64_t seed, const char *label) {
  *ps = NULL;
  if (!strchr(zc->kinds, 'p')) return 0;
  REQUIRE(dg_params_new(ps) == DG_OK);
  for (int k = 0; k < ninputs(zc); k++) {
    if (zc->kinds[k] != 'p') continue;
    int64_t s[4];
    int nd = shape_of(zc, v, zc->shapes, k, s);
    char name[16], sb[96];
    snprintf(name, sizeof name, "p%d", k);
    int rc = dg_params_add(*ps, name, nd, s, &in[k]);
    if (rc) {
      T_FAIL_("%s: dg_params_add %s %s: %s", label, name, dims_str(nd, s, sb, sizeof sb),
              dg_err_name(rc));
      return 1;
    }
  }
  for (int k = 0; k < ninputs(zc); k++)
    if (zc->kinds[k] == 'p')
      fill_uniform(dg_tensor_data(in[k]), dg_tensor_numel(in[k]), LO(zc), HI(zc),
                   seed + (uint64_t)k);
  return 0;
}

/* Data inputs (kinds d, i) at sizes v. Indices: j % v[attr[3]] (0 when that
 * size is 0: out of range, for ops that must refuse). */
static void make_data(const zcase *zc, const int64_t *v, dg_tensor **in, uint64_t seed) {
  for (int k = 0; k < ninputs(zc); k++) {
    char kind = zc->kinds[k];
    if (kind != 'd' && kind != 'i') continue;
    int64_t s[4];
    int nd = shape_of(zc, v, zc->shapes, k, s);
    REQUIRE(dg_tensor_new(&in[k], kind == 'i' ? DG_I64 : DG_F32, nd, s, NULL, 0) == DG_OK);
    int64_t n = dg_tensor_numel(in[k]);
    if (kind == 'i') {
      int64_t mod = v[zc->attr[3]], *p = dg_tensor_data(in[k]);
      for (int64_t j = 0; j < n; j++) p[j] = mod ? (j * 7) % mod : 0;
      continue;
    }
    fill_uniform(dg_tensor_data(in[k]), n, LO(zc), HI(zc), seed + (uint64_t)k);
    dg_tensor_set_requires_grad(in[k], 1);
  }
}

static void free_data(const zcase *zc, dg_tensor **in) {
  for (int k = 0; k < ninputs(zc); k++)
    if (zc->kinds[k] == 'd' || zc->kinds[k] == 'i') dg_tensor_free(in[k]), in[k] = NULL;
}

/* An earlier step (at the base sizes where no parameter's shape uses the
 * zeroed size) leaves gradients; they are then overwritten with garbage
 * and zero_grad marks them stale. */
static void prior_step(dg_ctx *ctx, const zcase *zc, int z, const int64_t *v, dg_tensor **in,
                       dg_params *ps, uint64_t seed, const char *label) {
  int uses = 0;
  for (int k = 0; k < ninputs(zc); k++)
    if (zc->kinds[k] == 'p' && z >= 0 && shape_uses(zc, k, zc->vars[z])) uses = 1;
  const int64_t *vp = uses ? v : zc->base;
  make_data(zc, vp, in, seed + 100);
  dg_ctx_reset(ctx);
  dg_tensor *y = zc->call(ctx, in, zc, vp);
  dg_tensor *loss = y ? dg_sum(ctx, y) : NULL;
  if (!loss || dg_backward(ctx, loss))
    T_FAIL_("%s: the earlier step (%s sizes) failed: %s", label, uses ? "zeroed" : "base",
            dg_ctx_errmsg(ctx));
  free_data(zc, in);
  for (int k = 0; k < ninputs(zc); k++) {
    if (zc->kinds[k] != 'p') continue;
    dg_tensor *g = dg_tensor_grad(in[k]);
    REQUIRE(g != NULL);
    float *gd = dg_tensor_data(g);
    for (int64_t e = 0, n = dg_tensor_numel(in[k]); e < n; e++) gd[e] = 100.0f + (float)e;
  }
  dg_params_zero_grad(ps);
}

/* got (n floats) against want (NULL: exactly zero); reports the first miss. */
static int compare(const char *label, const char *what, const float *got, const double *want,
                   int64_t n) {
  int64_t bad = 0, at = -1;
  for (int64_t e = 0; e < n; e++) {
    double w = want ? want[e] : 0, g = got[e];
    int ok = want ? (isnan(w) ? isnan(g) : fabs(g - w) <= 1e-4 * (1 + fabs(w))) : g == 0;
    if (!ok && at < 0) at = e;
    bad += !ok;
  }
  if (bad)
    T_FAIL_("%s: %s: %lld of %lld wrong, first [%lld] = %.6g, want %.6g", label, what,
            (long long)bad, (long long)n, (long long)at, got[at], want ? want[at] : 0.0);
  return bad != 0;
}

static void check_grads(const zcase *zc, dg_tensor **in, dg_params *ps, const expect_t *e,
                        int flat_first, const char *label) {
  for (int pass = 0; pass < 2; pass++) {
    int flat = pass == 0 ? flat_first : !flat_first;
    size_t nf = 0;
    const float *fg = flat && ps ? dg_params_grad(ps, &nf) : NULL;
    for (int k = 0; k < ninputs(zc); k++) {
      char kind = zc->kinds[k], what[64];
      int64_t n = in[k] ? dg_tensor_numel(in[k]) : 0;
      if ((kind != 'd' && kind != 'p') || !n || (flat && kind != 'p')) continue;
      snprintf(what, sizeof what, "input %d (%s) gradient via %s", k,
               kind == 'p' ? "parameter" : "data", flat ? "dg_params_grad" : "dg_tensor_grad");
      if (flat) {
        compare(label, what, fg + dg_params_offset(ps, dg_tensor_param_index(in[k])), e->grad[k], n);
        continue;
      }
      dg_tensor *g = dg_tensor_grad(in[k]);
      if (!g) T_FAIL_("%s: %s: none (want %s)", label, what, e->grad[k] ? "values" : "zeros");
      else compare(label, what, dg_tensor_data(g), e->grad[k], n);
    }
  }
}

/* Output shape and values, backward of sum(out * c), every gradient. */
static void check_step(dg_ctx *ctx, const zcase *zc, const int64_t *v, dg_tensor **in,
                       dg_params *ps, dg_tensor *out, int flat_first, const char *label) {
  int64_t ws[4];
  char a[96], b[96];
  int wn = shape_of(zc, v, zc->out, 0, ws);
  int nd = dg_tensor_ndim(out), same = nd == wn;
  for (int i = 0; same && i < nd; i++) same = dg_tensor_shape(out)[i] == ws[i];
  if (!same) {
    T_FAIL_("%s: output %s, want %s", label, dims_str(nd, dg_tensor_shape(out), a, sizeof a),
            dims_str(wn, ws, b, sizeof b));
    return;
  }
  int64_t n = dg_tensor_numel(out);
  float *c = malloc((size_t)(n ? n : 1) * sizeof *c);
  REQUIRE(c != NULL);
  fill_uniform(c, n, -1, 1, 4242);
  expect_t e = {0};
  if (n && !zc->expect) T_FAIL_("%s: test table: no reference for a non-empty output", label);
  else if (n) zc->expect(zc, in, out, c, &e);
  if (e.val) {
    float *y = malloc((size_t)n * sizeof *y);
    for (int64_t i = 0; i < n; i++) y[i] = (float)dg_tensor_get(out, i);
    compare(label, "output", y, e.val, n);
    free(y);
  }
  dg_tensor *ct = dg_from_data(ctx, DG_F32, nd, dg_tensor_shape(out), c);
  dg_tensor *loss = dg_sum(ctx, dg_mul(ctx, out, ct));
  int rc = loss ? dg_backward(ctx, loss) : dg_ctx_errcode(ctx);
  if (!loss || rc) T_FAIL_("%s: backward of sum(out * c): %s (%s)", label, dg_err_name(rc),
                           dg_ctx_errmsg(ctx));
  else check_grads(zc, in, ps, &e, flat_first, label);
  free(e.val);
  for (int k = 0; k < ZMAX; k++) free(e.grad[k]);
  free(c);
}

/* NULL from the op: needs an error code and a message, and a shape the op
 * may refuse. */
static void check_refusal(dg_ctx *ctx, int allowed, const char *label) {
  int code = dg_ctx_errcode(ctx);
  const char *m = dg_ctx_errmsg(ctx);
  if (code == DG_OK || !m || !*m)
    T_FAIL_("%s: NULL with %s and message \"%s\"", label, dg_err_name(code), m ? m : "(null)");
  else if (!allowed)
    T_FAIL_("%s: refused: %s (%s)", label, dg_err_name(code), m);
  else
    fprintf(stderr, "ok   %s: refused (%s: %s)\n", label, dg_err_name(code), m);
}

static void run_zero(const zcase *zc, int z, uint64_t seed) {
  int64_t v[VMAX];
  memcpy(v, zc->base, sizeof v);
  char var = z >= 0 ? zc->vars[z] : 0, label[256];
  if (z >= 0) v[z] = 0;
  int must = var && zc->must_fail && strchr(zc->must_fail, var);
  int may = var && zc->may_fail && strchr(zc->may_fail, var);
  snprintf(label, sizeof label, "%s [%s] with %c = 0, threads %d", zc->name, zc->shapes,
           var ? var : '-', g_threads);
  if (!var) snprintf(label, sizeof label, "%s [%s] base sizes, threads %d", zc->name,
                     zc->shapes, g_threads);
  int before = dg_test_failures;
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  dg_params *ps = NULL;
  dg_tensor *in[ZMAX] = {0};
  if (make_params(zc, v, in, &ps, seed, label)) goto done;
  if (ps && !must && !may) prior_step(ctx, zc, z, v, in, ps, seed, label);
  make_data(zc, v, in, seed);
  dg_ctx_reset(ctx);
  dg_tensor *out = zc->call(ctx, in, zc, v);
  if (!out) check_refusal(ctx, must || may, label);
  else if (must) T_FAIL_("%s: accepted (torch refuses it: indices out of range)", label);
  else check_step(ctx, zc, v, in, ps, out, z & 1, label);
  if (out || !(must || may))
    fprintf(stderr, "%s %s\n", dg_test_failures == before ? "ok  " : "FAIL", label);
done:
  free_data(zc, in);
  dg_params_free(ps);
  dg_ctx_free(ctx);
}

/* name, call, vars, base sizes, input shapes, kinds, output shape, reference,
 * may fail, must fail, then as needed attr, always empty, value range (default
 * [-1, 1)): the fields left out are zero. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
static const zcase cases[] = {
    /* views */
    {"reshape to (B, A)", z_reshape, "AB", {2, 3}, "AxB", "d", "BxA", NULL, "", ""},
    /* torch refuses -1 next to a 0 size (ambiguous) */
    {"reshape to (-1, B)", z_reshape, "AB", {2, 3}, "AxB", "d", "AxB", NULL, "B", "", {1}},
    {"slice [0, A)", z_slice, "AB", {3, 2}, "AxB", "d", "AxB", NULL, "", ""},
    {"slice [A, A)", z_slice, "AB", {3, 2}, "AxB", "d", "0xB", NULL, "", "", {1}, 1},
    {"transpose", z_transpose, "AB", {2, 3}, "AxB", "d", "BxA", NULL, "", ""},
    {"permute (2, 0, 1)", z_permute, "ABC", {2, 3, 4}, "AxBxC", "d", "CxAxB", NULL, "", ""},
    {"contiguous(transpose)", z_contig_t, "AB", {2, 3}, "AxB", "d", "BxA", NULL, "", ""},
    /* matmul: 2-d, batched, batched with a shared 2-d b, transposed */
    {"matmul", z_matmul, "MKN", {2, 3, 4}, "MxK KxN", "dp", "MxN", ex_matmul, "", "", {0, 0}},
    {"matmul batched", z_matmul, "BMKN", {2, 2, 3, 4}, "BxMxK BxKxN", "dd", "BxMxN", ex_matmul,
     "", "", {0, 0}},
    {"matmul shared b", z_matmul, "BMKN", {2, 2, 3, 4}, "BxMxK KxN", "dp", "BxMxN", ex_matmul, "",
     "", {0, 0}},
    {"matmul_t ta tb", z_matmul, "MKN", {2, 3, 4}, "KxM NxK", "dp", "MxN", ex_matmul, "", "",
     {1, 1}},
    {"matmul_t shared b^T", z_matmul, "BMKN", {2, 2, 3, 4}, "BxMxK NxK", "dp", "BxMxN", ex_matmul,
     "", "", {0, 1}},
    {"matmul_t batched a^T", z_matmul, "BMKN", {2, 2, 3, 4}, "BxKxM BxKxN", "dd", "BxMxN",
     ex_matmul, "", "", {1, 0}},
    /* linear (I: in_features) */
    {"linear", z_linear, "RIO", {3, 4, 2}, "RxI OxI O", "dpp", "RxO", ex_linear, "", ""},
    {"linear no bias", z_linear, "RIO", {3, 4, 2}, "RxI OxI -", "dp-", "RxO", ex_linear, "", ""},
    {"linear 3-d x", z_linear, "BTIO", {2, 3, 4, 2}, "BxTxI OxI O", "dpp", "BxTxO", ex_linear, "",
     ""},
    {"linear_add", z_linear, "RIO", {3, 4, 2}, "RxI OxI O RxO", "dppd", "RxO", ex_linear, "", ""},
    {"linear_add no bias", z_linear, "RIO", {3, 4, 2}, "RxI OxI - RxO", "dp-d", "RxO", ex_linear,
     "", ""},
    /* element-wise */
    {"add", z_add, "AB", {3, 4}, "AxB AxB", "dd", "AxB", NULL, "", ""},
    {"sub", z_sub, "AB", {3, 4}, "AxB AxB", "dd", "AxB", NULL, "", ""},
    {"mul", z_mul, "AB", {3, 4}, "AxB AxB", "dd", "AxB", NULL, "", ""},
    {"div", z_div, "AB", {3, 4}, "AxB AxB", "dd", "AxB", NULL, "", "", {0}, 0, 0.5f, 2},
    {"add bias", z_add, "AB", {3, 4}, "AxB B", "dp", "AxB", NULL, "", ""},
    {"mul (A,1) (B)", z_mul, "AB", {3, 4}, "Ax1 B", "dp", "AxB", NULL, "", ""},
    {"div (A,B) (B)", z_div, "AB", {3, 4}, "AxB B", "dp", "AxB", NULL, "", "", {0}, 0, 0.5f, 2},
    {"scale", z_scale, "AB", {3, 4}, "AxB", "d", "AxB", NULL, "", ""},
    {"add_scalar", z_add_scalar, "AB", {3, 4}, "AxB", "d", "AxB", NULL, "", ""},
    /* reductions: an empty sum is 0, an empty mean NaN */
    {"sum", z_sum, "AB", {3, 4}, "AxB", "d", "", ex_reduce, "", "", {-1, 0, 0}},
    {"mean", z_mean, "AB", {3, 4}, "AxB", "d", "", ex_reduce, "", "", {-1, 0, 1}},
    {"sum_dim 1", z_sum_dim, "ABC", {2, 3, 4}, "AxBxC", "d", "AxC", ex_reduce, "", "", {1, 0, 0}},
    {"sum_dim 1 keepdim", z_sum_dim, "ABC", {2, 3, 4}, "AxBxC", "d", "Ax1xC", ex_reduce, "", "",
     {1, 1, 0}},
    {"sum_dim 2", z_sum_dim, "ABC", {2, 3, 4}, "AxBxC", "d", "AxB", ex_reduce, "", "", {2, 0, 0}},
    {"mean_dim 1", z_sum_dim, "ABC", {2, 3, 4}, "AxBxC", "d", "AxC", ex_reduce, "", "", {1, 0, 1}},
    {"mean_dim 0 keepdim", z_sum_dim, "ABC", {2, 3, 4}, "AxBxC", "d", "1xBxC", ex_reduce, "", "",
     {0, 1, 1}},
    /* unary, softmax */
    {"relu", z_relu, "AB", {3, 4}, "AxB", "d", "AxB", NULL, "", ""},
    {"gelu", z_gelu, "AB", {3, 4}, "AxB", "d", "AxB", NULL, "", ""},
    {"tanh", z_tanh, "AB", {3, 4}, "AxB", "d", "AxB", NULL, "", ""},
    {"sigmoid", z_sigmoid, "AB", {3, 4}, "AxB", "d", "AxB", NULL, "", ""},
    {"exp", z_exp, "AB", {3, 4}, "AxB", "d", "AxB", NULL, "", ""},
    {"log", z_log, "AB", {3, 4}, "AxB", "d", "AxB", NULL, "", "", {0}, 0, 0.5f, 2},
    {"leaky_relu", z_leaky_relu, "AB", {3, 4}, "AxB", "d", "AxB", NULL, "", ""},
    {"softmax", z_softmax, "AB", {3, 4}, "AxB", "d", "AxB", NULL, "", ""},
    {"log_softmax", z_log_softmax, "AB", {3, 4}, "AxB", "d", "AxB", NULL, "", ""},
    /* losses: mean over no rows is NaN; C = 0 leaves every target out of range */
    {"cross_entropy", z_cross_entropy, "NC", {3, 4}, "NxC N", "di", "", ex_ce, "", "C",
     {0, 0, 0, 1}},
    {"mse", z_mse, "AB", {3, 4}, "AxB AxB", "dd", "", ex_mse, "", ""},
    /* normalisation, embedding, dropout, mask */
    {"layernorm", z_layernorm, "RC", {3, 4}, "RxC C C", "dpp", "RxC", NULL, "", ""},
    {"layernorm no affine", z_layernorm, "RC", {3, 4}, "RxC - -", "d--", "RxC", NULL, "", ""},
    /* training: no rows (N or H = 0) is an empty output and no update */
    {"batchnorm", z_batchnorm, "NCHW", {3, 2, 2, 3}, "NxCxHxW C C", "dpp", "NxCxHxW", NULL, "",
     ""},
    {"embedding", z_embedding, "VDN", {5, 3, 4}, "VxD N", "pi", "NxD", NULL, "", "V"},
    {"embedding 2-d idx", z_embedding, "VDAB", {5, 3, 2, 3}, "VxD AxB", "pi", "AxBxD", NULL, "",
     "V"},
    {"dropout", z_dropout, "AB", {3, 4}, "AxB", "d", "AxB", NULL, "", ""},
    {"causal_mask", z_causal_mask, "BT", {2, 3}, "BxTxT", "d", "BxTxT", NULL, "", ""},
    /* conv2d (no input channels: the bias in every position, where torch 1.13
     * returns no channels), maxpool; torch refuses spatial 0, conv2d O = 0 and
     * maxpool2d C = 0 */
    {"conv2d 3x3 pad 1", z_conv2d, "NCHWO", {2, 3, 4, 4, 2}, "NxCxHxW OxCx3x3 O", "dpp",
     "NxOxHxW", ex_conv, "HWO", "", {1, 1}},
    {"conv2d 1x1 no bias", z_conv2d, "NCHWO", {2, 3, 4, 4, 2}, "NxCxHxW OxCx1x1 -", "dp-",
     "NxOxHxW", ex_conv, "HWO", "", {1, 0}},
    {"maxpool2d 2/2", z_maxpool2d, "NCHW", {2, 3, 4, 4}, "NxCxHxW", "d", "NxCxH/2xW/2", NULL,
     "CHW", ""},
    /* avgpool2d: H or W below the window is refused (torch too); global
     * average pooling of no elements is NaN, as torch's adaptive pool */
    {"avgpool2d 2/2", z_avgpool2d, "NCHW", {2, 3, 4, 4}, "NxCxHxW", "d", "NxCxH/2xW/2", NULL,
     "HW", ""},
    {"global_avgpool2d", z_global_avgpool2d, "NCHW", {2, 3, 4, 5}, "NxCxHxW", "d", "NxC", ex_gap,
     "", ""},
    /* concat, split */
    {"concat dim 0", z_concat, "ABC", {2, 3, 4}, "AxC BxC", "dd", "A+BxC", ex_concat, "", ""},
    {"concat dim 1", z_concat, "ABC", {2, 3, 4}, "CxA CxB", "dd", "CxA+B", ex_concat, "", "", {1}},
    {"split dim 1, second part", z_split, "AST", {3, 2, 4}, "AxS+T", "d", "AxT", ex_split, "", ""},
    /* attention: head size 0 may be refused */
    {"attention causal 2 heads", z_attention, "BTC", {2, 3, 4}, "BxTx3C", "d", "BxTxC", NULL, "C",
     "", {2, 1}},
    {"attention 1 head", z_attention, "BTC", {2, 3, 4}, "BxTx3C", "d", "BxTxC", NULL, "C", "",
     {1, 0}},
    /* fused MLP: no rows, no inputs (h = b1), no hidden units (b2 [+ res]) */
    {"mlp_gelu", z_mlp, "RCFO", {3, 4, 5, 2}, "RxC FxC F OxF O", "dpppp", "RxO", ex_mlp, "", ""},
    {"mlp_gelu no bias", z_mlp, "RCFO", {3, 4, 5, 2}, "RxC FxC - OxF -", "dp-p-", "RxO", ex_mlp,
     "", ""},
    {"mlp_gelu 3-d x", z_mlp, "BTCFO", {2, 3, 4, 5, 2}, "BxTxC FxC F OxF O", "dpppp", "BxTxO",
     ex_mlp, "", ""},
    {"mlp_gelu_add", z_mlp, "RCFO", {3, 4, 5, 2}, "RxC FxC F OxF O RxO", "dppppd", "RxO", ex_mlp,
     "", ""},
    {"mlp_gelu_add no bias", z_mlp, "RCFO", {3, 4, 5, 2}, "RxC FxC - OxF - RxO", "dp-p-d", "RxO",
     ex_mlp, "", ""},
};
#pragma GCC diagnostic pop

static void sweep(void) {
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const zcase *zc = &cases[i];
    if (zc->always_empty) run_zero(zc, -1, 100 * i);
    for (int z = 0; z < (int)strlen(zc->vars); z++) run_zero(zc, z, 100 * i + z);
  }
}

/* ---- zero-element parameters in a store of their own ---- */

static void zero_element_params(void) {
  dg_params *ps = NULL;
  dg_tensor *w = NULL, *b = NULL, *e = NULL, *x = NULL;
  REQUIRE(dg_params_new(&ps) == DG_OK);
  CHECK_OK(dg_params_add(ps, "w", 2, (int64_t[]){0, 4}, &w));
  CHECK_OK(dg_params_add(ps, "b", 1, (int64_t[]){0}, &b));
  CHECK_OK(dg_params_add(ps, "emb", 2, (int64_t[]){0, 4}, &e));
  REQUIRE(w && b && e);
  REQUIRE(dg_tensor_new(&x, DG_F32, 2, (int64_t[]){3, 4}, NULL, 0) == DG_OK);
  fill_uniform(dg_tensor_data(x), 12, -1, 1, 9);
  dg_tensor_set_requires_grad(x, 1);
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  dg_params_zero_grad(ps);
  dg_tensor *y = dg_linear(ctx, x, w, b);
  dg_tensor *idx = dg_zeros(ctx, DG_I64, 1, (int64_t[]){0});
  dg_tensor *ye = y ? dg_embedding(ctx, e, idx) : NULL;
  if (!y || !ye) {
    int code = dg_ctx_errcode(ctx);
    const char *m = dg_ctx_errmsg(ctx);
    CHECK(code != DG_OK && m && *m);
    fprintf(stderr, "zero-element parameters: refused (%s: %s)\n", dg_err_name(code), m);
  } else {
    CHECK_EQ_INT(dg_tensor_dim(y, 0), 3);
    CHECK_EQ_INT(dg_tensor_dim(y, 1), 0);
    CHECK_EQ_INT(dg_tensor_dim(ye, 0), 0);
    CHECK_EQ_INT(dg_tensor_dim(ye, 1), 4);
    dg_tensor *loss = dg_add(ctx, dg_sum(ctx, y), dg_sum(ctx, ye));
    CHECK(loss && dg_backward(ctx, loss) == DG_OK);
    dg_tensor *gx = dg_tensor_grad(x);
    CHECK(gx != NULL);
    for (int i = 0; gx && i < 12; i++) CHECK(((const float *)dg_tensor_data(gx))[i] == 0.0f);
    CHECK(dg_tensor_grad(w) && dg_tensor_numel(dg_tensor_grad(w)) == 0);
    fprintf(stderr, "ok   zero-element parameters in a store of their own\n");
  }
  dg_ctx_free(ctx);
  dg_tensor_free(x);
  dg_params_free(ps);
}

/* ---- shapes whose byte size overflows ---- */

static char g_log[1024];
static void log_capture(void *user, dg_log_level level, const char *msg) {
  (void)user, (void)level;
  snprintf(g_log, sizeof g_log, "%s", msg);
  fprintf(stderr, "[dgrad log] %s\n", msg);
}

typedef struct {
  int nd;
  int64_t s[4];
} oshape;

static const oshape huge[] = {
    {2, {((int64_t)1 << 60) + 4, 4}},   /* 2^62 + 16 elements: 2^64 + 64 bytes */
    {2, {(int64_t)1 << 62, (int64_t)1 << 62}},
    {2, {INT64_MAX, 2}},
    {3, {(int64_t)1 << 31, (int64_t)1 << 31, (int64_t)1 << 31}},
    {1, {(int64_t)1 << 62}},
    {2, {((int64_t)1 << 62) + 4, 4}},   /* the element count wraps to 16 */
};

typedef struct {
  size_t reserved, current;
} mem_mark;

static mem_mark mark(dg_ctx *ctx) {
  dg_mem_stats st = {0};
  dg_mem_get_stats(DG_CPU, &st);
  return (mem_mark){dg_ctx_arena_reserved(ctx), st.current_bytes};
}

/* An arena constructor / op given a huge shape: NULL, `code` (or one of
 * code2), the shape in the message, nothing allocated. */
static void want_refused(dg_ctx *ctx, dg_tensor *t, mem_mark before, const char *what,
                         const char *shape, int code, int code2) {
  mem_mark after = mark(ctx);
  int got = dg_ctx_errcode(ctx);
  const char *m = dg_ctx_errmsg(ctx);
  int ok = !t && (got == code || got == code2) && m && strstr(m, shape) &&
           after.reserved == before.reserved && after.current == before.current;
  if (!ok)
    T_FAIL_("%s %s: %s, %s \"%s\" (want NULL, %s naming the shape); arena %zu -> %zu, "
            "memory %zu -> %zu bytes", what, shape, t ? "accepted" : "NULL", dg_err_name(got),
            m ? m : "", dg_err_name(code), before.reserved, after.reserved, before.current,
            after.current);
  else fprintf(stderr, "ok   %s %s refused: %s\n", what, shape, m);
  dg_ctx_clear_error(ctx);
}

/* The int-returning constructors: DG_EINVAL, the shape in their detail
 * (err or the store's errmsg), and nothing logged: a user's mistake is
 * returned, not printed. */
static void want_rc(int rc, const dg_tensor *t, const char *what, const char *shape,
                    const char *detail, int code2) {
  int ok = (rc == DG_EINVAL || rc == code2) && !t && strstr(detail, shape) && !g_log[0];
  if (!ok)
    T_FAIL_("%s %s: %s, %s, detail \"%s\", log \"%s\" (want DG_EINVAL, the shape in the "
            "detail, no log)", what, shape, dg_err_name(rc), t ? "a tensor" : "no tensor",
            detail, g_log);
  else fprintf(stderr, "ok   %s %s refused: %s\n", what, shape, dg_err_name(rc));
}

static void overflow_constructors(dg_ctx *ctx, const oshape *o) {
  char sh[128];
  dims_str(o->nd, o->s, sh, sizeof sh);
  static float dummy[16];
  mem_mark m = mark(ctx);
  want_refused(ctx, dg_zeros(ctx, DG_F32, o->nd, o->s), m, "zeros f32", sh, DG_EINVAL, -99);
  want_refused(ctx, dg_zeros(ctx, DG_F64, o->nd, o->s), m, "zeros f64", sh, DG_EINVAL, -99);
  want_refused(ctx, dg_empty(ctx, DG_I32, o->nd, o->s), m, "empty i32", sh, DG_EINVAL, -99);
  want_refused(ctx, dg_full(ctx, o->nd, o->s, 1.0f), m, "full", sh, DG_EINVAL, -99);
  want_refused(ctx, dg_rand(ctx, o->nd, o->s, 0, 1), m, "rand", sh, DG_EINVAL, -99);
  want_refused(ctx, dg_randn(ctx, o->nd, o->s, 0, 1), m, "randn", sh, DG_EINVAL, -99);
  want_refused(ctx, dg_from_data(ctx, DG_F32, o->nd, o->s, dummy), m, "from_data", sh,
               DG_EINVAL, -99);
  want_refused(ctx, dg_wrap(ctx, DG_F32, o->nd, o->s, dummy), m, "wrap", sh, DG_EINVAL, -99);
  dg_tensor *t = NULL;
  g_log[0] = '\0';
  char err[256] = "";
  int rc = dg_tensor_new(&t, DG_F32, o->nd, o->s, err, sizeof err);
  want_rc(rc, t, "tensor_new", sh, err, -99);
  dg_tensor_free(t);
  dg_params *ps = NULL;
  REQUIRE(dg_params_new(&ps) == DG_OK);
  t = NULL;
  g_log[0] = '\0';
  rc = dg_params_add(ps, "huge", o->nd, o->s, &t);
  want_rc(rc, t, "params_add", sh, dg_params_errmsg(ps), -99);
  CHECK_EQ_INT(dg_params_count(ps), 0);
  dg_params_free(ps);
}

/* Views with a huge shape of a 16-element (and a 0-element) tensor. */
static void overflow_views(dg_ctx *ctx, const oshape *o) {
  char sh[128];
  dims_str(o->nd, o->s, sh, sizeof sh);
  dg_tensor *base = NULL, *v = NULL;
  REQUIRE(dg_tensor_new(&base, DG_F32, 1, (int64_t[]){16}, NULL, 0) == DG_OK);
  g_log[0] = '\0';
  int rc = dg_tensor_view(&v, base, 0, o->nd, o->s, NULL, 0);
  if (rc == DG_OK || v) T_FAIL_("tensor_view %s of 16 floats: accepted", sh);
  dg_tensor_free(v);
  mem_mark m = mark(ctx);
  dg_tensor *x = dg_zeros(ctx, DG_F32, 1, (int64_t[]){16});
  dg_tensor *x0 = dg_zeros(ctx, DG_F32, 2, (int64_t[]){0, 3});
  REQUIRE(x && x0);
  m = mark(ctx);
  /* a shape no tensor can have is an invalid argument, not a mismatch */
  want_refused(ctx, dg_reshape(ctx, x, o->nd, o->s), m, "reshape of 16 elements to", sh,
               DG_EINVAL, DG_EINVAL);
  want_refused(ctx, dg_reshape(ctx, x0, o->nd, o->s), m, "reshape of 0 elements to", sh,
               DG_EINVAL, DG_EINVAL);
  dg_tensor_free(base);
}

/* Ops whose output (or saved intermediate) would overflow, from inputs
 * that hold no elements. */
static void overflow_ops(dg_ctx *ctx) {
  const int64_t G = (int64_t)1 << 40, H = (int64_t)1 << 21;
  dg_tensor *a = dg_zeros(ctx, DG_F32, 2, (int64_t[]){G, 0});
  dg_tensor *b = dg_zeros(ctx, DG_F32, 2, (int64_t[]){0, G});
  dg_tensor *a3 = dg_zeros(ctx, DG_F32, 3, (int64_t[]){H, H, 0});
  dg_tensor *b3 = dg_zeros(ctx, DG_F32, 3, (int64_t[]){H, 0, H});
  dg_tensor *w2 = dg_zeros(ctx, DG_F32, 2, (int64_t[]){0, G});
  REQUIRE(a && b && a3 && b3 && w2);
  dg_tensor *xg = NULL;
  REQUIRE(dg_tensor_new(&xg, DG_F32, 2, (int64_t[]){G, 0}, NULL, 0) == DG_OK);
  dg_tensor_set_requires_grad(xg, 1);
  const char *gg = "(1099511627776, 1099511627776)";
  mem_mark m = mark(ctx);
  want_refused(ctx, dg_matmul(ctx, a, b), m, "matmul (2^40, 0) @ (0, 2^40) ->", gg, DG_EINVAL,
               -99);
  want_refused(ctx, dg_linear(ctx, a, a, NULL), m, "linear x (2^40, 0), w (2^40, 0) ->", gg,
               DG_EINVAL, -99);
  want_refused(ctx, dg_matmul(ctx, a3, b3), m, "matmul (2^21, 2^21, 0) @ (2^21, 0, 2^21) ->",
               "(2097152, 2097152, 2097152)", DG_EINVAL, -99);
  /* y (2^40, 0) is empty, the saved pre-activation h (2^40, 2^40) is not */
  want_refused(ctx, dg_mlp_gelu(ctx, xg, a, NULL, w2, NULL), m,
               "mlp_gelu x (2^40, 0), w1 (2^40, 0), w2 (0, 2^40): h", gg, DG_EINVAL, -99);
  dg_tensor_free(xg);
}

static void overflow(void) {
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
    overflow_constructors(ctx, &huge[i]);
    overflow_views(ctx, &huge[i]);
    dg_ctx_reset(ctx);
  }
  overflow_ops(ctx);
  dg_ctx_free(ctx);
}

/* ---- backward misuse ---- */

static void backward_twice(dg_ctx *ctx, dg_tensor *x) {
  dg_tensor *y = dg_sum(ctx, dg_mul(ctx, x, x));
  REQUIRE(y != NULL);
  CHECK_OK(dg_backward(ctx, y));
  float g1[3];
  memcpy(g1, dg_tensor_data(dg_tensor_grad(x)), sizeof g1);
  int rc = dg_backward(ctx, y); /* the tape is consumed */
  if (rc == DG_OK) T_FAIL_("a second backward over a consumed tape returned DG_OK");
  else CHECK(dg_ctx_errcode(ctx) == rc && dg_ctx_errmsg(ctx)[0]);
  fprintf(stderr, "second backward: %s (%s)\n", dg_err_name(rc), dg_ctx_errmsg(ctx));
  CHECK(memcmp(g1, dg_tensor_data(dg_tensor_grad(x)), sizeof g1) == 0); /* unchanged */
  dg_ctx_reset(ctx);
  y = dg_sum(ctx, dg_mul(ctx, x, x)); /* a new forward: backward works again */
  CHECK(y && dg_backward(ctx, y) == DG_OK);
}

static void backward_dtype(dg_ctx *ctx, dg_tensor *x) {
  static const dg_dtype bad[2] = {DG_I64, DG_F16};
  for (int i = 0; i < 2; i++) {
    dg_ctx_reset(ctx);
    dg_tensor *y = dg_mul(ctx, x, x);
    dg_tensor *go = dg_zeros(ctx, bad[i], 1, (int64_t[]){3});
    REQUIRE(y && go);
    int rc = dg_backward_with(ctx, y, go);
    const char *m = dg_ctx_errmsg(ctx);
    fprintf(stderr, "backward_with a %s grad_out: %s (%s)\n", dg_dtype_name(bad[i]),
            dg_err_name(rc), m);
    CHECK_EQ_INT(rc, DG_EDTYPE);
    CHECK(strstr(m, "dtype") || strstr(m, dg_dtype_name(bad[i])));
    CHECK(!strstr(m, "does not match"));
    /* the refused call left the tape: a right grad_out works */
    dg_tensor *ok = dg_full(ctx, 1, (int64_t[]){3}, 1.0f);
    CHECK(ok && dg_backward_with(ctx, y, ok) == DG_OK);
  }
  dg_ctx_reset(ctx);
  dg_tensor *y = dg_mul(ctx, x, x);
  CHECK_EQ_INT(dg_backward_with(ctx, y, dg_zeros(ctx, DG_F32, 1, (int64_t[]){4})), DG_ESHAPE);
}

static void backward_misuse(void) {
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  dg_tensor *x = NULL;
  REQUIRE(dg_tensor_new(&x, DG_F32, 1, (int64_t[]){3}, NULL, 0) == DG_OK);
  float *xd = dg_tensor_data(x);
  xd[0] = 1, xd[1] = 2, xd[2] = 3;
  dg_tensor_set_requires_grad(x, 1);
  backward_twice(ctx, x);
  backward_dtype(ctx, x);
  dg_tensor_free(x);
  dg_ctx_free(ctx);
}

int main(void) {
  dg_set_log_fn(log_capture, NULL);
  static const int threads[2] = {1, 2};
  for (int t = 0; t < 2; t++) {
    g_threads = threads[t];
    dg_set_num_threads(g_threads);
    sweep();
  }
  dg_set_num_threads(1);
  zero_element_params();
  overflow();
  backward_misuse();
  return TEST_DONE();
}
