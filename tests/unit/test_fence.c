/* The fence: a parameter with a pending writer (DDP's overlapped update is
 * the one today) is brought up to date before anything reads it. A fake
 * writer lands +1 on each pending parameter when the fence calls it; every
 * public function that reads a parameter (each op, view and conversion,
 * the raw accessors) must see the landed values. Each op's result is
 * compared, bit for bit, with the same op on a parameter already holding
 * the new values. In debug builds (the ASan suite) a pending parameter's
 * data pointer is poisoned, so a path that skips the fence faults. */
#include <dgrad.h>

#include "core/core_impl.h"
#include "test.h"

static int g_landed;

/* Lands +1 on parameter i (every pending one for i < 0). */
static int fake_writer(void *user, dg_params *ps, int i, char *err, size_t cap) {
  (void)user, (void)err, (void)cap;
  for (int k = 0; k < ps->n; k++) {
    if ((i >= 0 && k != i) || !(ps->t[k]->flags & DG_TF_PENDING)) continue;
    float *d = ps->data + ps->offset[k];
    for (int64_t e = 0; e < dg__numel(ps->t[k]); e++) d[e] += 1.0f;
    dg__param_set_pending(ps, k, 0);
    g_landed++;
  }
  return DG_OK;
}

typedef struct {
  dg_params *ps;
  dg_tensor *w, *v, *u, *q, *g; /* (2, 2), (1, 1, 2, 2), (1), (1, 2, 3), (2) */
} env;

typedef dg_tensor *(*reader)(dg_ctx *c, const env *e);

#define R(name, expr) \
  static dg_tensor *r_##name(dg_ctx *c, const env *e) { return (expr); }
R(relu, dg_relu(c, e->w))
R(gelu, dg_gelu(c, e->w))
R(tanh, dg_tanh(c, e->w))
R(sigmoid, dg_sigmoid(c, e->w))
R(exp, dg_exp(c, e->w))
R(log, dg_log(c, e->w))
R(add, dg_add(c, e->w, e->w))
R(sub, dg_sub(c, e->v, e->w))
R(mul, dg_mul(c, e->w, e->u))
R(div, dg_div(c, e->u, e->w))
R(scale, dg_scale(c, e->w, 3.0f))
R(add_scalar, dg_add_scalar(c, e->w, 3.0f))
R(sum, dg_sum(c, e->w))
R(mean, dg_mean(c, e->w))
R(sum_dim, dg_sum_dim(c, e->w, 1, 0))
R(mean_dim, dg_mean_dim(c, e->w, 0, 1))
R(softmax, dg_softmax(c, e->w))
R(log_softmax, dg_log_softmax(c, e->w))
R(matmul, dg_matmul(c, e->w, e->w))
R(matmul_t, dg_matmul_t(c, e->w, e->w, 1, 0))
R(linear, dg_linear(c, e->w, e->w, NULL))
R(linear_add, dg_linear_add(c, e->w, e->w, NULL, e->w))
R(mse, dg_mse(c, e->w, dg_full(c, 2, (int64_t[]){2, 2}, 0.5f)))
R(cross_entropy, dg_cross_entropy(c, e->w, dg_zeros(c, DG_I64, 1, (int64_t[]){2})))
R(layernorm, dg_layernorm(c, e->w, NULL, NULL, 1e-5f))
R(layernorm_w, dg_layernorm(c, e->w, e->g, e->g, 1e-5f))
R(batchnorm, dg_batchnorm(c, e->w, e->g, e->g, NULL, NULL, 1, 0.1f, 1e-5f))
R(embedding, dg_embedding(c, e->w, dg_zeros(c, DG_I64, 1, (int64_t[]){3})))
R(causal_mask, dg_causal_mask(c, e->w))
R(conv2d, dg_conv2d(c, e->v, e->v, NULL, 1, 0))
R(maxpool2d, dg_maxpool2d(c, e->v, 2, 2))
R(avgpool2d, dg_avgpool2d(c, e->v, 2, 1))
R(global_avgpool2d, dg_global_avgpool2d(c, e->v))
R(leaky_relu, dg_leaky_relu(c, e->w, 0.1f))
R(argmax, dg_argmax(c, e->w, 1, 0))
R(concat, dg_concat(c, 2, (dg_tensor *const[]){e->w, e->w}, 0))
R(attention, dg_attention(c, e->q, 1, 1, 1.0f))
R(mlp_gelu, dg_mlp_gelu(c, e->w, e->w, NULL, e->w, NULL))
R(mlp_gelu_add, dg_mlp_gelu_add(c, e->w, e->w, NULL, e->w, NULL, e->w))
R(reshape, dg_contiguous(c, dg_transpose(c, dg_reshape(c, e->w, 2, (int64_t[]){4, 1}), 0, 1)))
R(slice, dg_scale(c, dg_slice(c, e->w, 1, 2), 1.0f))
R(transpose, dg_contiguous(c, dg_transpose(c, e->w, 0, 1)))
R(permute, dg_contiguous(c, dg_permute(c, e->v, (int[]){0, 1, 3, 2})))
R(contiguous, dg_scale(c, dg_contiguous(c, e->w), 1.0f))
R(to_dtype, dg_to_dtype(c, e->w, DG_F64))
static dg_tensor *r_accuracy(dg_ctx *c, const env *e) {
  int64_t n = -1;
  if (dg_accuracy(c, e->w, dg_zeros(c, DG_I64, 1, (int64_t[]){2}), &n)) return NULL;
  return dg_full(c, 1, (int64_t[]){1}, (float)n);
}
static dg_tensor *r_split(dg_ctx *c, const env *e) {
  dg_tensor *parts[2];
  if (dg_split(c, e->w, 1, 2, (int64_t[]){1, 1}, parts)) return NULL;
  return dg_contiguous(c, parts[1]);
}

static const struct {
  const char *name;
  reader fn;
} readers[] = {
#define E(n) {#n, r_##n}
    E(relu), E(gelu), E(tanh), E(sigmoid), E(exp), E(log), E(add), E(sub), E(mul), E(div),
    E(scale), E(add_scalar), E(sum), E(mean), E(sum_dim), E(mean_dim), E(softmax),
    E(log_softmax), E(matmul), E(matmul_t), E(linear), E(linear_add), E(mse), E(cross_entropy),
    E(layernorm), E(layernorm_w), E(embedding), E(causal_mask), E(conv2d), E(maxpool2d),
    E(concat), E(attention), E(mlp_gelu), E(mlp_gelu_add), E(reshape), E(slice), E(transpose),
    E(permute), E(contiguous), E(to_dtype), E(split), E(avgpool2d), E(global_avgpool2d),
    E(leaky_relu), E(argmax), E(accuracy), E(batchnorm),
#undef E
};

/* Adds d to every parameter's values, behind the fence's back. */
static void shift(env *e, float d) {
  for (int64_t k = 0; k < (int64_t)e->ps->used_total; k++) e->ps->data[k] += d;
}

static void mark_all(env *e) {
  for (int i = 0; i < e->ps->n; i++) dg__param_set_pending(e->ps, i, 1);
}

static int same(const dg_tensor *a, const dg_tensor *b) {
  int64_t n = dg_tensor_numel(a);
  if (n != dg_tensor_numel(b)) return 0;
  for (int64_t i = 0; i < n; i++)
    if (dg_tensor_get(a, i) != dg_tensor_get(b, i)) return 0;
  return 1;
}

static void check_ops(dg_ctx *c, env *e) {
  for (size_t k = 0; k < sizeof readers / sizeof *readers; k++) {
    dg_ctx_reset(c);
    shift(e, 1.0f); /* the values the pending update will land */
    dg_tensor *want = readers[k].fn(c, e);
    shift(e, -1.0f);
    mark_all(e);
    int before = g_landed;
    dg_tensor *got = readers[k].fn(c, e);
    if (!want || !got) {
      T_FAIL_("%s: failed: %s", readers[k].name, dg_ctx_errmsg(c));
      continue;
    }
    if (g_landed == before)
      T_FAIL_("%s: read a pending parameter without the fence", readers[k].name);
    if (!same(want, got)) T_FAIL_("%s: saw the previous values", readers[k].name);
    dg__params_flush(e->ps, DG__SETTLE_ALL); /* land the rest (unread) */
    shift(e, -1.0f);                         /* back to the start values */
  }
}

/* Marks parameter w pending again, its values back at the start. */
static void rearm(env *e, float w0) {
  float *d = e->ps->data + e->ps->offset[0];
  for (int k = 0; k < 4; k++) d[k] -= 1.0f;
  CHECK_NEAR(d[0], w0, 0);
  dg__param_set_pending(e->ps, 0, 1);
}

/* The raw accessors (no op, no context). */
static void check_raw(env *e) {
  float w0 = e->ps->data[e->ps->offset[0]];
  dg__param_set_pending(e->ps, 0, 1);
  CHECK_NEAR(((const float *)dg_tensor_data(e->w))[0], w0 + 1.0f, 0);
  rearm(e, w0);
  CHECK_NEAR(dg_tensor_get(e->w, 0), w0 + 1.0f, 0);
  rearm(e, w0);
  dg_tensor *dst = NULL;
  REQUIRE(dg_tensor_new(&dst, DG_F32, 2, (int64_t[]){2, 2}, NULL, 0) == DG_OK);
  CHECK_OK(dg_tensor_copy(dst, e->w, NULL, 0));
  CHECK_NEAR(dg_tensor_get(dst, 0), w0 + 1.0f, 0);
  dg_tensor_free(dst);
  rearm(e, w0);
  size_t n = 0;
  const float *flat = dg_params_data(e->ps, &n);
  CHECK_NEAR(flat[e->ps->offset[0]], w0 + 1.0f, 0);
  rearm(e, w0);
  float u0 = e->ps->data[e->ps->offset[2]];
  dg__param_set_pending(e->ps, 2, 1);
  CHECK_NEAR(dg_tensor_item(e->u), u0 + 1.0f, 0);
  dg__params_flush(e->ps, DG__SETTLE_ALL);
  for (int i = 0; i < e->ps->n; i++) CHECK(!(e->ps->t[i]->flags & DG_TF_PENDING));
}

int main(void) {
  env e = {0};
  REQUIRE(dg_params_new(&e.ps) == DG_OK);
  REQUIRE(dg_params_add(e.ps, "w", 2, (int64_t[]){2, 2}, &e.w) == DG_OK);
  REQUIRE(dg_params_add(e.ps, "v", 4, (int64_t[]){1, 1, 2, 2}, &e.v) == DG_OK);
  REQUIRE(dg_params_add(e.ps, "u", 1, (int64_t[]){1}, &e.u) == DG_OK);
  REQUIRE(dg_params_add(e.ps, "q", 3, (int64_t[]){1, 2, 3}, &e.q) == DG_OK);
  REQUIRE(dg_params_add(e.ps, "g", 1, (int64_t[]){2}, &e.g) == DG_OK);
  for (int64_t k = 0; k < (int64_t)e.ps->used_total; k++)
    e.ps->data[k] = 0.25f + 0.125f * (float)(k % 7);
  dg__params_set_writer(e.ps, fake_writer, NULL);
  dg_ctx *c = NULL;
  REQUIRE(dg_ctx_new(&c, NULL) == DG_OK);
  check_ops(c, &e);
  check_raw(&e);
  dg__params_set_writer(e.ps, NULL, NULL);
  dg_ctx_free(c);
  dg_params_free(e.ps);
  if (dg_test_failures) return 1;
  printf("ok: %zu readers\n", sizeof readers / sizeof *readers);
  return 0;
}
