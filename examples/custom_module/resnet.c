/* A custom module: a residual block written in user code, used inside a
 * built-in Sequential, trained with AdamW and freed.
 *
 *   custom_module [steps]   (default 100, at least 20)
 *
 * Exits 1 unless the mean loss of the last 10 steps is below 0.7x that of
 * the first 10 (tests/nn runs it).
 *
 * What a module needs (include/dgrad/nn.h has the rules):
 *   - a struct with dg_module as its first member, made by dg_module_new;
 *   - its sub-modules added with dg_module_add_child (they are then bound
 *     as "<path>.<name>", switched by dg_module_set_train and freed with
 *     the block);
 *   - a vtable whose forward calls dg_module_forward on m->children[i].
 * Parameters of its own would go in vt->bind, allocations of its own in
 * vt->destroy; this block has neither. */
#include <stdio.h>
#include <stdlib.h>

#include <dgrad.h>

/* ---- the block: x + conv2(relu(conv1(x))), channels kept ---- */

typedef struct {
  dg_module base; /* first, so a resblock * is a dg_module * */
} resblock;

static dg_tensor *resblock_forward(dg_module *m, dg_ctx *ctx, dg_tensor *x) {
  dg_tensor *h = dg_relu(ctx, dg_module_forward(m->children[0], ctx, x));
  /* ops pass a NULL input on, keeping the first error: one check, later */
  return dg_add(ctx, x, dg_module_forward(m->children[1], ctx, h));
}

static const dg_module_vtable resblock_vt = {"ResBlock", resblock_forward, NULL, NULL, NULL};

static int resblock_new(dg_module **out, int channels) {
  dg_module *m = NULL, *conv = NULL;
  int rc = dg_module_new(&m, sizeof(resblock), &resblock_vt);
  for (int i = 0; i < 2 && !rc; i++) {
    rc = dg_nn_conv2d(&conv, channels, channels, 3, 1, 1, 1);
    if (!rc && (rc = dg_module_add_child(m, conv, i ? "conv2" : "conv1"))) dg_module_free(conv);
  }
  if (rc) dg_module_free(m); /* frees the children added so far */
  *out = rc ? NULL : m;
  return rc;
}

/* ---- a model around it: stem -> relu -> res1 -> res2 -> pool -> fc ---- */

static int add(dg_module *seq, int rc, dg_module **m, const char *name) {
  if (!rc && (rc = dg_sequential_add(seq, *m, name))) dg_module_free(*m);
  return rc;
}

static int build(dg_module **out) {
  dg_module *net = NULL, *m = NULL;
  int rc = dg_nn_sequential(&net);
  if (rc) return rc;
  rc = add(net, dg_nn_conv2d(&m, 1, 8, 3, 1, 1, 1), &m, "stem");
  if (!rc) rc = add(net, dg_nn_relu(&m), &m, "act");
  if (!rc) rc = add(net, resblock_new(&m, 8), &m, "res1");
  if (!rc) rc = add(net, resblock_new(&m, 8), &m, "res2");
  if (!rc) rc = add(net, dg_nn_maxpool2d(&m, 2, 2), &m, "pool");
  if (!rc) rc = add(net, dg_nn_flatten(&m), &m, "flat");
  if (!rc) rc = add(net, dg_nn_linear(&m, 8 * 4 * 4, 2, 1), &m, "fc");
  if (rc) dg_module_free(net);
  *out = rc ? NULL : net;
  return rc;
}

/* Synthetic task: is the top half of an 8x8 image brighter than the bottom? */
static void make_batch(float *x, int64_t *y, int n, uint64_t seed) {
  dg_rng_normal(seed, 0, x, (size_t)n * 64);
  for (int i = 0; i < n; i++) {
    float top = 0, bottom = 0;
    for (int p = 0; p < 64; p++) *(p < 32 ? &top : &bottom) += x[i * 64 + p];
    y[i] = top > bottom;
  }
}

int main(int argc, char **argv) {
  enum { B = 32 };
  int steps = argc > 1 ? atoi(argv[1]) : 100;
  if (steps < 20) {
    fprintf(stderr, "custom_module: steps must be at least 20, got %d\n", steps);
    return 2;
  }
  dg_ctx *ctx = NULL;
  dg_params *ps = NULL;
  dg_module *net = NULL;
  dg_optim *opt = NULL;
  char err[256] = "";
  int rc = dg_ctx_new(&ctx, NULL);
  if (!rc) rc = dg_params_new(&ps);
  if (!rc) rc = build(&net);
  if (!rc && (rc = dg_module_bind(net, ps, "", 1)))
    snprintf(err, sizeof err, "%s", dg_params_errmsg(ps));
  dg_adamw_opts ao = dg_adamw_defaults();
  ao.lr = 3e-3f;
  if (!rc) rc = dg_optim_new_adamw(&opt, ps, &ao, err, sizeof err);
  if (rc) {
    fprintf(stderr, "set-up failed: %s: %s\n", dg_err_name(rc), err);
    return 1;
  }
  printf("%d parameters:", dg_params_count(ps));
  for (int i = 0; i < dg_params_count(ps); i++) printf(" %s", dg_tensor_name(dg_params_get(ps, i)));
  printf("\n");
  float x[B * 64], first = 0, last = 0;
  int64_t y[B], xs[4] = {B, 1, 8, 8}, ys[1] = {B};
  for (int step = 0; step < steps && !rc; step++) {
    make_batch(x, y, B, (uint64_t)step + 1);
    dg_params_zero_grad(ps);
    dg_tensor *logits = dg_module_forward(net, ctx, dg_wrap(ctx, DG_F32, 4, xs, x));
    dg_tensor *loss = dg_cross_entropy(ctx, logits, dg_wrap(ctx, DG_I64, 1, ys, y));
    /* a failing layer is named by its path, e.g. "res1.conv2 (Conv2d): ..." */
    const char *why = NULL;
    if (!loss || (rc = dg_backward(ctx, loss))) why = dg_ctx_errmsg(ctx);
    else if ((rc = dg_optim_step(opt))) why = dg_optim_errmsg(opt);
    if (why) {
      fprintf(stderr, "step %d: %s\n", step, why);
      rc = rc ? rc : dg_ctx_errcode(ctx);
      break;
    }
    float v = dg_tensor_item(loss);
    if (step < 10) first += v / 10;
    if (step >= steps - 10) last += v / 10;
    if (step % 20 == 0 || step == steps - 1) printf("step %3d  loss %.4f\n", step, v);
    dg_ctx_reset(ctx);
  }
  dg_optim_free(opt);
  dg_module_free(net); /* the blocks and their convolutions with it */
  dg_params_free(ps);
  dg_ctx_free(ctx);
  if (rc || !(last < 0.7f * first)) {
    fprintf(stderr, "custom_module: %s (loss %.4f -> %.4f)\n",
            rc ? dg_err_name(rc) : "the loss did not fall", first, last);
    return 1;
  }
  return 0;
}
