/* An outside program built against the installed library via pkg-config:
 * proves the install target, dgrad.pc and the installed headers work. */
#include <dgrad.h>
#include <stdio.h>

int main(void) {
  dg_ctx *ctx = NULL;
  dg_params *ps = NULL;
  if (dg_ctx_new(&ctx, NULL) || dg_params_new(&ps)) return 1;
  int64_t ws[2] = {3, 4}, xs[2] = {2, 4};
  dg_tensor *w = NULL;
  if (dg_params_add(ps, "w", 2, ws, &w)) return 1;
  dg_tensor *y = dg_linear(ctx, dg_full(ctx, 2, xs, 1.0f), w, NULL);
  dg_tensor *loss = dg_mean(ctx, dg_relu(ctx, y));
  if (!loss || dg_backward(ctx, loss)) {
    fprintf(stderr, "consumer: %s\n", dg_ctx_errmsg(ctx));
    return 1;
  }
  printf("dgrad %s: loss %g\n", dg_version(), dg_tensor_item(loss));
  dg_params_free(ps);
  dg_ctx_free(ctx);
  return 0;
}
