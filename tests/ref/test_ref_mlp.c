/* MLP 784-128-64-10 (ReLU), batch 8, cross-entropy, against PyTorch
 * (fixtures/mlp.dgref from make_fixtures.py). */
#include "ref_fixture.h"

static dg_tensor *forward(ref_env *e, dg_tensor **out, void *user) {
  (void)user;
  dg_ctx *c = e->ctx;
  dg_tensor *x = ref_input(e, "x"); /* (8, 784) */
  dg_tensor *h = dg_relu(c, dg_linear(c, x, ref_param(e, "fc1.weight"),
                                      ref_param(e, "fc1.bias"))); /* (8, 128) */
  h = dg_relu(c, dg_linear(c, h, ref_param(e, "fc2.weight"),
                           ref_param(e, "fc2.bias"))); /* (8, 64) */
  *out = dg_linear(c, h, ref_param(e, "fc3.weight"), ref_param(e, "fc3.bias")); /* (8, 10) */
  return dg_cross_entropy(c, *out, ref_input(e, "targets"));
}

int main(int argc, char **argv) { return ref_main("mlp", argc, argv, forward, NULL); }
