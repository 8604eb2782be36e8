/* dg_mlp_gelu (fused linear -> GELU -> linear): finite-difference checks of
 * backward for every input, with and without biases, one and several row
 * blocks; equality with the unfused dg_linear / dg_gelu / dg_linear
 * composition forward and backward on 1 and 2 threads (the blocked weight
 * gradients accumulate across blocks); gradient accumulation into
 * gradients written earlier; eval mode; errors. Also the residual forms
 * dg_mlp_gelu_add and dg_linear_add against res + the plain op, and
 * dg_linear_relu: finite differences, and the bits of dg_relu(dg_linear())
 * forward and backward on the shapes of each GEMM path. */
#include "gradcheck.h"
#include "test.h"

typedef struct {
  int64_t R, C, F, O;
  int bias; /* 1: b1 and b2 */
} mlp_case;

/* in: x (R, C), w1 (F, C), w2 (O, F), [b1 (F), b2 (O)] */
static dg_tensor *f_fused(dg_ctx *ctx, dg_tensor **in, void *u) {
  mlp_case *c = u;
  return dg_mlp_gelu(ctx, in[0], in[1], c->bias ? in[3] : NULL, in[2], c->bias ? in[4] : NULL);
}

static dg_tensor *f_unfused(dg_ctx *ctx, dg_tensor **in, void *u) {
  mlp_case *c = u;
  dg_tensor *h = dg_gelu(ctx, dg_linear(ctx, in[0], in[1], c->bias ? in[3] : NULL));
  return dg_linear(ctx, h, in[2], c->bias ? in[4] : NULL);
}

/* The op twice on the same inputs: the second node adds to gradients the
 * first wrote. */
static dg_tensor *f_twice(dg_ctx *ctx, dg_tensor **in, void *u) {
  return dg_add(ctx, f_fused(ctx, in, u), dg_scale(ctx, f_fused(ctx, in, u), 0.5f));
}

/* in[5] = res (R, O) */
static dg_tensor *f_fused_add(dg_ctx *ctx, dg_tensor **in, void *u) {
  mlp_case *c = u;
  return dg_mlp_gelu_add(ctx, in[0], in[1], c->bias ? in[3] : NULL, in[2],
                         c->bias ? in[4] : NULL, in[5]);
}
static dg_tensor *f_unfused_add(dg_ctx *ctx, dg_tensor **in, void *u) {
  return dg_add(ctx, in[5], f_unfused(ctx, in, u));
}
/* res used twice: the fused node's residual gradient accumulates */
static dg_tensor *f_fused_add_twice(dg_ctx *ctx, dg_tensor **in, void *u) {
  return dg_mul(ctx, f_fused_add(ctx, in, u), in[5]);
}
/* dg_linear_add: in[0] x (R, C), in[1] w (F, C), in[3] b (F), in[6] res (R, F) */
static dg_tensor *f_linear_add(dg_ctx *ctx, dg_tensor **in, void *u) {
  mlp_case *c = u;
  return dg_mul(ctx, dg_linear_add(ctx, in[0], in[1], c->bias ? in[3] : NULL, in[6]), in[6]);
}
static dg_tensor *f_linear_add_ref(dg_ctx *ctx, dg_tensor **in, void *u) {
  mlp_case *c = u;
  return dg_mul(ctx, dg_add(ctx, in[6], dg_linear(ctx, in[0], in[1], c->bias ? in[3] : NULL)),
                in[6]);
}

/* dg_linear_relu: in[0] x (R, C), in[1] w (F, C), in[3] b (F) */
static dg_tensor *f_linear_relu(dg_ctx *ctx, dg_tensor **in, void *u) {
  mlp_case *c = u;
  return dg_linear_relu(ctx, in[0], in[1], c->bias ? in[3] : NULL);
}
static dg_tensor *f_linear_relu_ref(dg_ctx *ctx, dg_tensor **in, void *u) {
  mlp_case *c = u;
  return dg_relu(ctx, dg_linear(ctx, in[0], in[1], c->bias ? in[3] : NULL));
}
/* twice on the same inputs: the second node adds to the first's gradients */
static dg_tensor *f_linear_relu_twice(dg_ctx *ctx, dg_tensor **in, void *u) {
  return dg_add(ctx, f_linear_relu(ctx, in, u), dg_scale(ctx, f_linear_relu(ctx, in, u), 0.5f));
}

static dg_tensor *f_linear_relu_ref_twice(dg_ctx *ctx, dg_tensor **in, void *u) {
  return dg_add(ctx, f_linear_relu_ref(ctx, in, u),
                dg_scale(ctx, f_linear_relu_ref(ctx, in, u), 0.5f));
}

/* A linear after dg_linear_relu: its input gradient is the ReLU output's
 * only one, masked in the GEMM's stores, and the ReLU's node skips its
 * mask. h = relu(x w1^T + b1); y = h w2^T + b2 (in[2] w2 (O, F), in[4] b2). */
static dg_tensor *chain(dg_ctx *ctx, dg_tensor **in, mlp_case *c, int fused) {
  dg_tensor *b1 = c->bias ? in[3] : NULL, *b2 = c->bias ? in[4] : NULL;
  dg_tensor *h = fused ? dg_linear_relu(ctx, in[0], in[1], b1)
                       : dg_relu(ctx, dg_linear(ctx, in[0], in[1], b1));
  return dg_linear(ctx, h, in[2], b2);
}
static dg_tensor *f_chain(dg_ctx *ctx, dg_tensor **in, void *u) { return chain(ctx, in, u, 1); }
static dg_tensor *f_chain_ref(dg_ctx *ctx, dg_tensor **in, void *u) {
  return chain(ctx, in, u, 0);
}
/* h used twice: the masked linear writes h's gradient first (recorded
 * last), then dg_scale's backward adds an unmasked part, so the ReLU's
 * node must mask after all: y = h w2^T + b2 + (h / 2) w2^T. */
static dg_tensor *chain2(dg_ctx *ctx, dg_tensor **in, mlp_case *c, int fused) {
  dg_tensor *b1 = c->bias ? in[3] : NULL, *b2 = c->bias ? in[4] : NULL;
  dg_tensor *h = fused ? dg_linear_relu(ctx, in[0], in[1], b1)
                       : dg_relu(ctx, dg_linear(ctx, in[0], in[1], b1));
  dg_tensor *y2 = dg_linear(ctx, dg_scale(ctx, h, 0.5f), in[2], NULL);
  return dg_add(ctx, dg_linear(ctx, h, in[2], b2), y2);
}
static dg_tensor *f_chain2(dg_ctx *ctx, dg_tensor **in, void *u) { return chain2(ctx, in, u, 1); }
/* Two in a row: the second's input gradient masked in its GEMM, its own
 * gradient masked by its node with the bias sum (y = relu(h w2^T + b2)). */
static dg_tensor *chain3(dg_ctx *ctx, dg_tensor **in, mlp_case *c, int fused) {
  dg_tensor *b1 = c->bias ? in[3] : NULL, *b2 = c->bias ? in[4] : NULL;
  if (fused) return dg_linear_relu(ctx, dg_linear_relu(ctx, in[0], in[1], b1), in[2], b2);
  return dg_relu(ctx, dg_linear(ctx, dg_relu(ctx, dg_linear(ctx, in[0], in[1], b1)), in[2], b2));
}
static dg_tensor *f_chain3(dg_ctx *ctx, dg_tensor **in, void *u) { return chain3(ctx, in, u, 1); }
static dg_tensor *f_chain3_ref(dg_ctx *ctx, dg_tensor **in, void *u) {
  return chain3(ctx, in, u, 0);
}
static dg_tensor *f_chain2_ref(dg_ctx *ctx, dg_tensor **in, void *u) {
  return chain2(ctx, in, u, 0);
}

static int make_inputs(const mlp_case *c, dg_tensor **in, uint64_t seed) {
  int64_t sx[2] = {c->R, c->C}, s1[2] = {c->F, c->C}, s2[2] = {c->O, c->F};
  in[0] = gc_input(2, sx, -2.0f, 2.0f, seed);
  in[1] = gc_input(2, s1, -1.0f, 1.0f, seed + 1);
  in[2] = gc_input(2, s2, -1.0f, 1.0f, seed + 2);
  in[3] = gc_input(1, &c->F, -1.0f, 1.0f, seed + 3);
  in[4] = gc_input(1, &c->O, -1.0f, 1.0f, seed + 4);
  int64_t sr[2] = {c->R, c->O}, sl[2] = {c->R, c->F};
  in[5] = gc_input(2, sr, -1.0f, 1.0f, seed + 5);
  in[6] = gc_input(2, sl, -1.0f, 1.0f, seed + 6);
  return c->bias ? 5 : 3;
}

static void free_inputs(dg_tensor **in) {
  for (int k = 0; k < 7; k++) dg_tensor_free(in[k]);
}

/* Grad on for the inputs in mask (bit k: in[k]) only: gc_check wants a
 * gradient for every grad-requiring input. */
static void use_only(dg_tensor **in, unsigned mask) {
  for (int k = 0; k < 7; k++) dg_tensor_set_requires_grad(in[k], (int)(mask >> k) & 1);
}

/* x and w to multiples of 1/4, b to an odd multiple of 1/32: every
 * pre-activation of dg_linear_relu is then an odd multiple of 1/32, at
 * least 0.03 from the ReLU's kink, which the finite differences' steps
 * (0.01 times an input of at most 2 in magnitude) cannot cross. */
static void quantize_off_zero(const mlp_case *c, dg_tensor **in) {
  float *x = dg_tensor_data(in[0]), *w = dg_tensor_data(in[1]), *b = dg_tensor_data(in[3]);
  for (int64_t i = 0; i < c->R * c->C; i++) x[i] = roundf(x[i] * 4) / 4;
  for (int64_t i = 0; i < c->F * c->C; i++) w[i] = roundf(w[i] * 4) / 4;
  for (int64_t i = 0; i < c->F; i++) b[i] = floorf(b[i] * 16) / 16 + 1.0f / 32;
}

static void grad_fd(void) {
  static const mlp_case cases[] = {
      {1, 1, 1, 1, 1}, {3, 4, 8, 2, 1}, {5, 3, 6, 4, 0}, {7, 2, 16, 3, 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    mlp_case c = cases[i];
    dg_tensor *in[7];
    int nin = make_inputs(&c, in, 100 + 10 * i);
    char nm[96];
    snprintf(nm, sizeof nm, "mlp_gelu R=%lld C=%lld F=%lld O=%lld bias=%d", (long long)c.R,
             (long long)c.C, (long long)c.F, (long long)c.O, c.bias);
    CHECK_EQ_INT(gc_check(nm, f_fused, &c, nin, in, 1e-3, 1e-2), 0);
    if (i == 1) CHECK_EQ_INT(gc_check("mlp_gelu twice, accumulated", f_twice, &c, nin, in, 1e-3,
                                      1e-2), 0);
    /* the residual forms, on the inputs each uses */
    snprintf(nm, sizeof nm, "mlp_gelu_add, res used twice, bias=%d", c.bias);
    use_only(in, c.bias ? 0x3f : 0x27);
    CHECK_EQ_INT(gc_check(nm, f_fused_add_twice, &c, 7, in, 1e-3, 1e-2), 0);
    snprintf(nm, sizeof nm, "linear_add, res used twice, bias=%d", c.bias);
    use_only(in, c.bias ? 0x4b : 0x43);
    CHECK_EQ_INT(gc_check(nm, f_linear_add, &c, 7, in, 1e-3, 1e-2), 0);
    if (c.bias) { /* dg_linear_relu with every pre-activation off the kink */
      quantize_off_zero(&c, in);
      snprintf(nm, sizeof nm, "linear_relu twice R=%lld C=%lld F=%lld", (long long)c.R,
               (long long)c.C, (long long)c.F);
      use_only(in, 0x0b);
      CHECK_EQ_INT(gc_check(nm, f_linear_relu_twice, &c, 4, in, 1e-3, 1e-2), 0);
    }
    free_inputs(in);
  }
  /* several row blocks (F = 4096: 32 rows a block): x and b2 only, the
   * weights' blocked accumulation is checked against the unfused path */
  mlp_case c = {70, 2, 4096, 2, 1};
  dg_tensor *in[7];
  int nin = make_inputs(&c, in, 200);
  for (int k = 1; k < 4; k++) dg_tensor_set_requires_grad(in[k], 0);
  CHECK_EQ_INT(gc_check("mlp_gelu 3 row blocks (x, b2)", f_fused, &c, nin, in, 1e-3, 1e-2), 0);
  free_inputs(in);
}

/* max |a - b| over n; *scale = max |b|. */
static double max_diff(const float *a, const float *b, int64_t n, double *scale) {
  double d = 0, s = 0;
  for (int64_t e = 0; e < n; e++) {
    d = fmax(d, fabs((double)a[e] - b[e]));
    s = fmax(s, fabs((double)b[e]));
  }
  *scale = s;
  return d;
}

/* n weights uniform in [-1, 1) for sum(f(in) * w), from seed. */
static float *weights(int64_t n, uint64_t seed) {
  float *w = malloc((size_t)(n ? n : 1) * sizeof *w);
  REQUIRE(w);
  dg_rng_uniform(seed, 0, w, (size_t)n);
  for (int64_t e = 0; e < n; e++) w[e] = 2 * w[e] - 1;
  return w;
}

/* y and every input gradient of sum(f(in) * w), copied out. */
static float *run(dg_ctx *ctx, gc_fn f, mlp_case *c, dg_tensor **in, int nin, const float *w,
                  int64_t ny, int64_t *ntot) {
  dg_ctx_reset(ctx);
  for (int k = 0; k < nin; k++) {
    dg_tensor *g = dg_tensor_grad(in[k]);
    if (g) memset(dg_tensor_data(g), 0, (size_t)dg_tensor_numel(g) * sizeof(float));
  }
  dg_tensor *y = f(ctx, in, c);
  REQUIRE(y);
  dg_tensor *wt = dg_from_data(ctx, DG_F32, dg_tensor_ndim(y), dg_tensor_shape(y), w);
  REQUIRE(wt && dg_backward_with(ctx, y, wt) == DG_OK);
  int64_t n = ny;
  for (int k = 0; k < nin; k++) n += dg_tensor_numel(in[k]);
  float *out = malloc((size_t)n * sizeof *out), *p = out;
  memcpy(p, dg_tensor_data(y), (size_t)ny * sizeof *p);
  p += ny;
  for (int k = 0; k < nin; k++) {
    dg_tensor *g = dg_tensor_grad(in[k]); /* none: an input f does not use */
    size_t m = (size_t)dg_tensor_numel(in[k]);
    if (g) memcpy(p, dg_tensor_data(g), m * sizeof *p);
    else memset(p, 0, m * sizeof *p);
    p += m;
  }
  *ntot = n;
  return out;
}

static void vs_unfused(int threads) {
  static const mlp_case cases[] = {
      {1024, 128, 512, 128, 1}, {300, 24, 1000, 7, 1}, {33, 5, 4096, 3, 0}, {1, 4, 16, 4, 1},
  };
  dg_set_num_threads(threads);
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    mlp_case c = cases[i];
    dg_tensor *in[7];
    int nin = make_inputs(&c, in, 300 + 10 * i);
    int64_t ny = c.R * c.O, nf, nu;
    float *w = weights(ny, 50 + i);
    float *a = run(ctx, f_fused, &c, in, nin, w, ny, &nf);
    float *b = run(ctx, f_unfused, &c, in, nin, w, ny, &nu);
    REQUIRE(nf == nu);
    double s = 0, d = max_diff(a, b, nf, &s);
    /* with the residual: inputs 0..5, res's gradient included */
    int64_t na, nb;
    float *fa = run(ctx, f_fused_add, &c, in, 6, w, ny, &na);
    float *fb = run(ctx, f_unfused_add, &c, in, 6, w, ny, &nb);
    double sr = 0, dr = max_diff(fa, fb, na, &sr);
    CHECK(na == nb && dr <= 2e-6 * (1 + sr));
    free(fa), free(fb);
    /* dg_linear_add vs res + dg_linear: bit-identical sums are not
     * promised (the bias is added before the GEMM), close ones are */
    int64_t nl = c.R * c.F, la, lb;
    float *wl = weights(nl, 70 + i);
    float *ga = run(ctx, f_linear_add, &c, in, 7, wl, nl, &la);
    float *gb = run(ctx, f_linear_add_ref, &c, in, 7, wl, nl, &lb);
    double sl = 0, dl = max_diff(ga, gb, la, &sl);
    CHECK(la == lb && dl <= 2e-6 * (1 + sl));
    free(ga), free(gb), free(wl);
    fprintf(stderr, "fused vs unfused R=%lld C=%lld F=%lld O=%lld threads=%d: |diff| %.3g "
            "(max %.3g)\n", (long long)c.R, (long long)c.C, (long long)c.F, (long long)c.O,
            threads, d, s);
    CHECK(d <= 2e-6 * (1 + s));
    /* eval: the same output, no node */
    dg_ctx_reset(ctx);
    int prev = dg_ctx_set_grad_enabled(ctx, 0);
    dg_tensor *ye = f_fused(ctx, in, &c);
    dg_ctx_set_grad_enabled(ctx, prev);
    REQUIRE(ye);
    CHECK(!dg_tensor_requires_grad(ye));
    CHECK(memcmp(dg_tensor_data(ye), a, (size_t)ny * sizeof *a) == 0);
    free(w), free(a), free(b);
    free_inputs(in);
  }
  dg_ctx_free(ctx);
  dg_set_num_threads(1);
}

/* dg_linear_relu against dg_relu(dg_linear()): the same bits, output and
 * gradients, on each GEMM path: the own kernel over two passes of K (the
 * ReLU on the second only; 256 x 784 -> 512, the MLP benchmark's first
 * layer), as its transpose (64 rows), OpenBLAS with the ReLU a pass of its
 * own (10 outputs), tiny shapes, and rows past the bias sum's block (600)
 * in 300 columns (split over 2 threads); once and twice (the second node
 * adds to the gradients). A NaN input keeps its row of y NaN (the relu
 * op's x < 0 test keeps it), in both. */
static void linear_relu_bits(int threads) {
  static const mlp_case cases[] = {
      {256, 784, 512, 256, 1}, {64, 784, 512, 10, 0}, {256, 256, 10, 3, 1}, {7, 3, 5, 2, 1},
      {600, 40, 300, 7, 1},
  };
  dg_set_num_threads(threads);
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    mlp_case c = cases[i];
    dg_tensor *in[7];
    make_inputs(&c, in, 400 + 10 * i);
    use_only(in, c.bias ? 0x0b : 0x03);
    float *x1 = (float *)dg_tensor_data(in[0]) + c.C + 1, keep = *x1;
    *x1 = NAN; /* row 1: NaN in every output */
    int64_t ny = c.R * c.F, na, nb;
    float *w = weights(ny, 90 + i);
    float *a = run(ctx, f_linear_relu, &c, in, 4, w, ny, &na);
    float *b = run(ctx, f_linear_relu_ref, &c, in, 4, w, ny, &nb);
    REQUIRE(na == nb);
    int same = !memcmp(a, b, (size_t)na * sizeof *a), neg = 0;
    float *a2 = run(ctx, f_linear_relu_twice, &c, in, 4, w, ny, &na);
    float *b2 = run(ctx, f_linear_relu_ref_twice, &c, in, 4, w, ny, &nb);
    same = same && !memcmp(a2, b2, (size_t)na * sizeof *a2);
    free(a2), free(b2);
    /* followed by a linear: masked in its GEMM (own kernel for the first
     * two, OpenBLAS's pass for the rest), and with a second consumer; no
     * NaN (it would make every weight gradient NaN on both sides) */
    *x1 = keep;
    int64_t nc = c.R * c.O;
    use_only(in, c.bias ? 0x1f : 0x07);
    gc_fn f[3][2] = {{f_chain, f_chain_ref}, {f_chain2, f_chain2_ref}, {f_chain3, f_chain3_ref}};
    for (int v = 0; v < 3; v++) {
      a2 = run(ctx, f[v][0], &c, in, 5, w, nc, &na);
      b2 = run(ctx, f[v][1], &c, in, 5, w, nc, &nb);
      same = same && na == nb && !memcmp(a2, b2, (size_t)na * sizeof *a2);
      free(a2), free(b2);
    }
    for (int64_t e = 0; e < ny; e++) neg += a[e] < 0.0f;
    fprintf(stderr, "linear_relu R=%lld C=%lld F=%lld threads=%d: %s\n", (long long)c.R,
            (long long)c.C, (long long)c.F, threads, same ? "same bits" : "bits differ");
    CHECK(same);
    CHECK_EQ_INT(neg, 0);
    CHECK(isnan(a[c.F]));
    free(w), free(a), free(b);
    free_inputs(in);
  }
  dg_ctx_free(ctx);
  dg_set_num_threads(1);
}

/* A second backward in the same step through a linear fed by a
 * dg_linear_relu output whose node the first backward consumed: that node
 * will not run again, so the linear must not mask y's gradient for it; y's
 * gradient is the unfused pair's, unmasked (a reviewer's case: it read 0
 * where y was 0). */
static void linear_relu_consumed(void) {
  mlp_case c = {6, 5, 8, 3, 1};
  dg_tensor *in[7];
  make_inputs(&c, in, 500);
  use_only(in, 0x1f);
  float *g[2];
  int64_t n = c.R * c.F;
  for (int fused = 0; fused < 2; fused++) {
    dg_ctx *ctx = NULL;
    REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
    dg_tensor *y = fused ? dg_linear_relu(ctx, in[0], in[1], in[3])
                         : dg_relu(ctx, dg_linear(ctx, in[0], in[1], in[3]));
    REQUIRE(y && dg_backward(ctx, dg_sum(ctx, y)) == DG_OK);
    dg_tensor *z = dg_linear(ctx, y, in[2], in[4]);
    REQUIRE(z && dg_backward(ctx, dg_sum(ctx, z)) == DG_OK);
    dg_tensor *gy = dg_tensor_grad(y);
    REQUIRE(gy && (g[fused] = malloc((size_t)n * sizeof(float))));
    memcpy(g[fused], dg_tensor_data(gy), (size_t)n * sizeof(float));
    dg_ctx_free(ctx);
  }
  int zeros = 0;
  for (int64_t i = 0; i < n; i++) zeros += g[0][i] == 0.0f;
  CHECK_EQ_INT(zeros, 0); /* sum(z)'s gradient reaches every y unmasked */
  CHECK(!memcmp(g[0], g[1], (size_t)n * sizeof(float)));
  free(g[0]), free(g[1]);
  free_inputs(in);
}

/* A linear that also reads its x, a dg_linear_relu output h, as w or as
 * the residual: x's gradient would be masked in the GEMM's stores, then
 * the other use adds unmasked terms into the same buffer, so h's node must
 * still mask. linear_grads takes the masked path only for an x used once
 * by the node. Against the unfused pair's bits: z = h h^T, and z = h + h w2^T
 * (F == O). */
static int g_alias_res; /* 1: x read again as the residual, 0: as w */
static dg_tensor *aliased(dg_ctx *ctx, dg_tensor **in, int fused) {
  dg_tensor *h = fused ? dg_linear_relu(ctx, in[0], in[1], in[3])
                       : dg_relu(ctx, dg_linear(ctx, in[0], in[1], in[3]));
  return g_alias_res ? dg_linear_add(ctx, h, in[2], NULL, h) : dg_linear(ctx, h, h, NULL);
}
static dg_tensor *f_alias(dg_ctx *ctx, dg_tensor **in, void *u) {
  (void)u;
  return aliased(ctx, in, 1);
}
static dg_tensor *f_alias_ref(dg_ctx *ctx, dg_tensor **in, void *u) {
  (void)u;
  return aliased(ctx, in, 0);
}

static void linear_relu_aliased(void) {
  for (int which = 0; which < 2; which++) {
    mlp_case c = {6, 5, 8, 8, 1};
    dg_tensor *in[7];
    make_inputs(&c, in, 600 + 10 * which);
    use_only(in, which ? 0x0f : 0x0b);
    dg_ctx *ctx = NULL;
    REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
    int64_t ny = c.R * (which ? c.O : c.R), na, nb;
    float *w = weights(ny, 61 + which);
    g_alias_res = which;
    float *a = run(ctx, f_alias, &c, in, 4, w, ny, &na);
    float *b = run(ctx, f_alias_ref, &c, in, 4, w, ny, &nb);
    CHECK(na == nb && !memcmp(a, b, (size_t)na * sizeof *a));
    free(w), free(a), free(b);
    dg_ctx_free(ctx);
    free_inputs(in);
  }
}

static void errors(dg_ctx *ctx) {
  int64_t sx[2] = {3, 4}, s1[2] = {8, 4}, s2[2] = {2, 8}, bad[2] = {8, 5};
  dg_tensor *x = dg_zeros(ctx, DG_F32, 2, sx), *w1 = dg_zeros(ctx, DG_F32, 2, s1);
  dg_tensor *w2 = dg_zeros(ctx, DG_F32, 2, s2);
  CHECK(dg_mlp_gelu(ctx, x, w1, NULL, w2, NULL) != NULL);
  CHECK(dg_mlp_gelu(ctx, x, dg_zeros(ctx, DG_F32, 2, bad), NULL, w2, NULL) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_ESHAPE);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "mlp_gelu");
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "(8, 5)");
  dg_ctx_clear_error(ctx);
  CHECK(dg_mlp_gelu(ctx, x, w1, NULL, w1, NULL) == NULL); /* w2 (8, 4): want (O, 8) */
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_ESHAPE);
  dg_ctx_clear_error(ctx);
  CHECK(dg_mlp_gelu(ctx, x, w1, dg_zeros(ctx, DG_F32, 1, &sx[1]), w2, NULL) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_ESHAPE);
  dg_ctx_clear_error(ctx);
  CHECK(dg_mlp_gelu(ctx, NULL, w1, NULL, w2, NULL) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_EINVAL);
  dg_ctx_clear_error(ctx);
  CHECK(dg_mlp_gelu(ctx, dg_zeros(ctx, DG_I32, 2, sx), w1, NULL, w2, NULL) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_EDTYPE);
  dg_ctx_clear_error(ctx);
  /* residual forms: res must have the output's shape */
  int64_t so[2] = {3, 2};
  CHECK(dg_mlp_gelu_add(ctx, x, w1, NULL, w2, NULL, dg_zeros(ctx, DG_F32, 2, so)) != NULL);
  CHECK(dg_mlp_gelu_add(ctx, x, w1, NULL, w2, NULL, x) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_ESHAPE);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "residual");
  dg_ctx_clear_error(ctx);
  CHECK(dg_mlp_gelu_add(ctx, x, w1, NULL, w2, NULL, NULL) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_EINVAL);
  dg_ctx_clear_error(ctx);
  CHECK(dg_linear_add(ctx, x, w1, NULL, x) == NULL); /* (3, 8) output, (3, 4) res */
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_ESHAPE);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "(3, 8)");
  dg_ctx_clear_error(ctx);
  CHECK(dg_linear_add(ctx, x, w1, NULL, NULL) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_EINVAL);
  dg_ctx_clear_error(ctx);
  CHECK(dg_linear_relu(ctx, x, dg_zeros(ctx, DG_F32, 2, bad), NULL) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_ESHAPE);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "linear_relu");
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "(8, 5)");
  dg_ctx_clear_error(ctx);
  CHECK(dg_linear_relu(ctx, dg_zeros(ctx, DG_I32, 2, sx), w1, NULL) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_EDTYPE);
  CHECK_STR_HAS(dg_ctx_errmsg(ctx), "linear_relu");
  dg_ctx_clear_error(ctx);
  CHECK(dg_linear_relu(ctx, x, NULL, NULL) == NULL);
  CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_EINVAL);
  dg_ctx_clear_error(ctx);
  /* no rows: an empty output, backward runs */
  int64_t e[3] = {2, 0, 4};
  dg_tensor *ex = NULL;
  REQUIRE(dg_tensor_new(&ex, DG_F32, 3, e, NULL, 0) == DG_OK);
  dg_tensor_set_requires_grad(ex, 1);
  dg_tensor *y = dg_mlp_gelu(ctx, ex, w1, NULL, w2, NULL);
  REQUIRE(y);
  CHECK_EQ_INT(dg_tensor_numel(y), 0);
  CHECK_EQ_INT(dg_tensor_shape(y)[2], 2);
  CHECK_OK(dg_backward(ctx, dg_sum(ctx, y)));
  y = dg_linear_relu(ctx, ex, w1, NULL);
  REQUIRE(y);
  CHECK_EQ_INT(dg_tensor_numel(y), 0);
  CHECK_EQ_INT(dg_tensor_shape(y)[2], 8);
  CHECK_OK(dg_backward(ctx, dg_sum(ctx, y)));
  dg_tensor_free(ex);
}

int main(void) {
  grad_fd();
  vs_unfused(1);
  vs_unfused(2);
  linear_relu_bits(1);
  linear_relu_bits(2);
  linear_relu_consumed();
  linear_relu_aliased();
  dg_ctx *ctx = NULL;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  errors(ctx);
  dg_ctx_free(ctx);
  return TEST_DONE();
}
