/* Small conv net against PyTorch (fixtures/conv.dgref):
 * (4,1,12,12) -> conv 1->4 3x3 s1 p1 -> relu -> maxpool 2 -> (4,4,6,6)
 * -> conv 4->8 3x3 s2 p0 -> relu -> (4,8,2,2) -> flatten -> linear 32->10,
 * cross-entropy. */
#include "ref_fixture.h"

static dg_tensor *forward(ref_env *e, dg_tensor **out, void *user) {
  (void)user;
  dg_ctx *c = e->ctx;
  dg_tensor *x = ref_input(e, "x"); /* (4, 1, 12, 12) */
  dg_tensor *h = dg_relu(c, dg_conv2d(c, x, ref_param(e, "conv1.weight"),
                                      ref_param(e, "conv1.bias"), 1, 1)); /* (4, 4, 12, 12) */
  h = dg_maxpool2d(c, h, 2, 2);                                        /* (4, 4, 6, 6) */
  h = dg_relu(c, dg_conv2d(c, h, ref_param(e, "conv2.weight"),
                           ref_param(e, "conv2.bias"), 2, 0)); /* (4, 8, 2, 2) */
  int64_t flat[2] = {4, -1};
  h = dg_reshape(c, h, 2, flat); /* (4, 32) */
  *out = dg_linear(c, h, ref_param(e, "fc.weight"), ref_param(e, "fc.bias")); /* (4, 10) */
  return dg_cross_entropy(c, *out, ref_input(e, "targets"));
}

int main(int argc, char **argv) { return ref_main("conv", argc, argv, forward, NULL); }
