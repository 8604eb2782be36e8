/* Tiny regression 5 -> 8 (tanh) -> 3 with mean squared error, against PyTorch
 * (fixtures/mse.dgref). */
#include "ref_fixture.h"

static dg_tensor *forward(ref_env *e, dg_tensor **out, void *user) {
  (void)user;
  dg_ctx *c = e->ctx;
  dg_tensor *x = ref_input(e, "x"); /* (6, 5) */
  dg_tensor *h = dg_tanh(c, dg_linear(c, x, ref_param(e, "fc1.weight"),
                                      ref_param(e, "fc1.bias"))); /* (6, 8) */
  *out = dg_linear(c, h, ref_param(e, "fc2.weight"), ref_param(e, "fc2.bias")); /* (6, 3) */
  return dg_mse(c, *out, ref_input(e, "target"));
}

int main(int argc, char **argv) { return ref_main("mse", argc, argv, forward, NULL); }
