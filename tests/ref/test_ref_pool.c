/* Leaky ReLU, average and global average pooling against PyTorch
 * (fixtures/pool.dgref): (4,2,11,10) -> conv 2->4 3x3 p1 -> leaky_relu 0.1
 * -> avgpool 3 s2 -> (4,4,5,4) -> conv 4->6 3x3 p1 -> leaky_relu 0.01
 * -> avgpool 2 s1 -> (4,6,4,3) -> global average pool -> (4,6)
 * -> linear 6->5, cross-entropy; the input's gradient is checked too. */
#include "ref_fixture.h"

static dg_tensor *forward(ref_env *e, dg_tensor **out, void *user) {
  (void)user;
  dg_ctx *c = e->ctx;
  dg_tensor *x = ref_input(e, "x"); /* (4, 2, 11, 10) */
  dg_tensor *h = dg_conv2d(c, x, ref_param(e, "conv1.weight"), ref_param(e, "conv1.bias"), 1,
                           1);                          /* (4, 4, 11, 10) */
  h = dg_avgpool2d(c, dg_leaky_relu(c, h, 0.1f), 3, 2); /* (4, 4, 5, 4) */
  h = dg_conv2d(c, h, ref_param(e, "conv2.weight"), ref_param(e, "conv2.bias"), 1,
                1);                                      /* (4, 6, 5, 4) */
  h = dg_avgpool2d(c, dg_leaky_relu(c, h, 0.01f), 2, 1); /* (4, 6, 4, 3) */
  h = dg_global_avgpool2d(c, h);                         /* (4, 6) */
  *out = dg_linear(c, h, ref_param(e, "fc.weight"), ref_param(e, "fc.bias")); /* (4, 5) */
  return dg_cross_entropy(c, *out, ref_input(e, "targets"));
}

int main(int argc, char **argv) { return ref_main("pool", argc, argv, forward, NULL); }
