/* docs/quickstart.c — the smallest complete dgrad program: an MLP trained on
 * Fashion-MNIST on one process, then its test accuracy.
 *
 *   cc -std=c11 quickstart.c $(pkg-config --cflags --libs dgrad) -o quickstart
 *   ./quickstart [DATA_DIR] [STEPS]
 *
 * DATA_DIR defaults to Debian's dataset-fashion-mnist package. The README
 * shows this file; tests/docs compiles and runs it, so it always builds. */
#include <dgrad.h>
#include <stdio.h>
#include <stdlib.h>

#define BATCH 64

/* Appends a freshly made module to net (rc: its constructor's status); on
 * failure frees it, as it was not added. */
static int add(dg_module *net, int rc, dg_module **l) {
  if (!rc && (rc = dg_sequential_add(net, *l, NULL))) dg_module_free(*l);
  return rc;
}

/* 784 -> 128 -> 10 with ReLU; parameters named "0.weight", "0.bias", ... */
static int build_model(dg_module **out) {
  dg_module *net, *l = NULL;
  int rc = dg_nn_sequential(&net);
  if (rc) return rc;
  rc = add(net, dg_nn_linear(&l, 784, 128, 1), &l);
  if (!rc) rc = add(net, dg_nn_relu(&l), &l);
  if (!rc) rc = add(net, dg_nn_linear(&l, 128, 10, 1), &l);
  if (rc) dg_module_free(net);
  else *out = net;
  return rc;
}

/* Share of correct predictions over the test set, with grad off. */
static double evaluate(dg_ctx *ctx, dg_module *net, dg_mnist *test) {
  int64_t n = dg_mnist_count(test), right = 0;
  static float x[500 * 784];
  int prev = dg_ctx_set_grad_enabled(ctx, 0); /* no tape while evaluating */
  for (int64_t i = 0; i < n; i += 500) {
    int64_t b = n - i < 500 ? n - i : 500;
    for (int64_t k = 0; k < b; k++) dg_mnist_image(test, i + k, x + k * 784);
    dg_tensor *logits = dg_module_forward(net, ctx, dg_wrap(ctx, DG_F32, 2,
                                                            (int64_t[]){b, 784}, x)); /* (b, 10) */
    dg_tensor *labels = dg_wrap(ctx, DG_I64, 1, &b, (void *)(dg_mnist_labels(test) + i));
    int64_t c;
    if (dg_accuracy(ctx, logits, labels, &c)) break; /* rows whose argmax is the label */
    right += c;
    dg_ctx_reset(ctx); /* frees this batch's tensors */
  }
  dg_ctx_set_grad_enabled(ctx, prev);
  return (double)right / (double)n;
}

int main(int argc, char **argv) {
  const char *dir = argc > 1 && argv[1][0] ? argv[1] : NULL; /* NULL: DG_FASHION_MNIST_DIR */
  int steps = argc > 2 ? atoi(argv[2]) : 600;
  char err[512];
  dg_mnist *train = NULL, *test = NULL;
  if (dg_mnist_open(&train, dir, 1, err, sizeof err) ||
      dg_mnist_open(&test, dir, 0, err, sizeof err)) {
    fprintf(stderr, "quickstart: %s\n", err); /* names the file and what is wrong */
    return 1;
  }
  dg_dataset ds;
  dg_mnist_dataset(train, &ds); /* fields: image f32 (28, 28), label i64 */
  dg_loader_opts lo = {.batch_size = BATCH, .shuffle = 1, .seed = 1, .drop_last = 1};
  dg_loader *loader = NULL;
  dg_ctx *ctx = NULL;
  dg_params *ps = NULL;
  dg_module *net = NULL;
  dg_optim *opt = NULL;
  int rc = dg_loader_new(&loader, &ds, &lo, err, sizeof err);
  if (!rc) rc = dg_ctx_new(&ctx, NULL);
  if (!rc) rc = dg_params_new(&ps);
  if (!rc) rc = build_model(&net);
  if (!rc) rc = dg_module_bind(net, ps, "", /*seed*/ 1); /* registers + initialises */
  dg_adamw_opts ao = dg_adamw_defaults();
  if (!rc) rc = dg_optim_new_adamw(&opt, ps, &ao, err, sizeof err);
  if (rc) {
    fprintf(stderr, "quickstart: set-up failed: %s (%s)\n", dg_strerror(rc),
            ps && dg_params_errmsg(ps)[0] ? dg_params_errmsg(ps) : err);
    return 1;
  }
  float loss_v = 0;
  for (int step = 0; step < steps && !rc; step++) {
    int64_t rows;
    if ((rc = dg_loader_next(loader, NULL, &rows))) break; /* into the loader's buffers */
    if (rows == 0) continue;                                /* end of an epoch */
    dg_tensor *x = dg_wrap(ctx, DG_F32, 2, (int64_t[]){rows, 784}, dg_loader_buffer(loader, 0));
    dg_tensor *y = dg_wrap(ctx, DG_I64, 1, (int64_t[]){rows}, dg_loader_buffer(loader, 1));
    dg_tensor *loss = dg_cross_entropy(ctx, dg_module_forward(net, ctx, x), y);
    if (!loss || (rc = dg_backward(ctx, loss))) { /* the message names module, op, shapes */
      fprintf(stderr, "quickstart: step %d: %s\n", step, dg_ctx_errmsg(ctx));
      rc = rc ? rc : DG_EINVAL;
      break;
    }
    loss_v = dg_tensor_item(loss);
    if ((rc = dg_optim_step(opt))) fprintf(stderr, "quickstart: %s\n", dg_optim_errmsg(opt));
    dg_params_zero_grad(ps);
    dg_ctx_reset(ctx); /* once per step: frees every tensor and the tape */
    if (step % 100 == 0) printf("step %d loss %.4f\n", step, loss_v);
  }
  if (!rc) printf("final loss %.4f, test accuracy %.3f\n", loss_v, evaluate(ctx, net, test));
  dg_optim_free(opt);
  dg_module_free(net);
  dg_params_free(ps);
  dg_ctx_free(ctx);
  dg_loader_free(loader);
  dg_mnist_free(train);
  dg_mnist_free(test);
  return rc ? 1 : 0;
}
