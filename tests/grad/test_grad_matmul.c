/* Finite-difference checks: matmul (all transpose flags, batched, shared b),
 * linear, and the view ops. */
#include "gradcheck.h"
#include "test.h"

typedef struct { int ta, tb; } mm_flags;

static dg_tensor *f_matmul(dg_ctx *ctx, dg_tensor **in, void *u) {
  mm_flags *fl = u;
  return dg_matmul_t(ctx, in[0], in[1], fl->ta, fl->tb);
}

static dg_tensor *f_matmul_tview(dg_ctx *ctx, dg_tensor **in, void *u) {
  (void)u; /* a transposed view used as a column-major operand */
  return dg_matmul(ctx, dg_transpose(ctx, in[0], 0, 1), in[1]);
}

static dg_tensor *f_linear(dg_ctx *ctx, dg_tensor **in, void *u) {
  (void)u;
  return dg_linear(ctx, in[0], in[1], in[2]);
}

static dg_tensor *f_views(dg_ctx *ctx, dg_tensor **in, void *u) {
  (void)u;
  int64_t sh[2] = {4, 6};
  dg_tensor *r = dg_reshape(ctx, in[0], 2, sh);           /* (4, 6) */
  dg_tensor *s = dg_slice(ctx, r, 1, 3);                  /* (2, 6) */
  dg_tensor *t = dg_transpose(ctx, s, 0, 1);              /* (6, 2) */
  int perm[3] = {2, 0, 1};
  int64_t sh3[3] = {3, 2, 2};
  dg_tensor *p = dg_permute(ctx, dg_reshape(ctx, t, 3, sh3), perm); /* (2, 3, 2) */
  return dg_contiguous(ctx, p);
}

int main(void) {
  int64_t a_s[2] = {3, 4}, b_s[2] = {4, 5}, at_s[2] = {4, 3}, bt_s[2] = {5, 4};
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      mm_flags fl = {ta, tb};
      dg_tensor *in[2] = {gc_input(2, ta ? at_s : a_s, -1, 1, 1),
                          gc_input(2, tb ? bt_s : b_s, -1, 1, 2)};
      char nm[64];
      snprintf(nm, sizeof nm, "matmul ta=%d tb=%d", ta, tb);
      CHECK_EQ_INT(gc_check(nm, f_matmul, &fl, 2, in, 1e-3, 1e-2), 0);
      dg_tensor_free(in[0]);
      dg_tensor_free(in[1]);
    }
  {
    int64_t a3[3] = {2, 3, 4}, b3[3] = {2, 4, 5};
    mm_flags fl = {0, 0};
    dg_tensor *in[2] = {gc_input(3, a3, -1, 1, 3), gc_input(3, b3, -1, 1, 4)};
    CHECK_EQ_INT(gc_check("bmm", f_matmul, &fl, 2, in, 1e-3, 1e-2), 0);
    dg_tensor_free(in[1]);
    in[1] = gc_input(2, b_s, -1, 1, 5);
    CHECK_EQ_INT(gc_check("bmm shared b", f_matmul, &fl, 2, in, 1e-3, 1e-2), 0);
    dg_tensor_free(in[0]);
    dg_tensor_free(in[1]);
    int64_t bt3[3] = {2, 5, 4}, at3[3] = {2, 4, 3};
    mm_flags f2 = {1, 1};
    dg_tensor *in2[2] = {gc_input(3, at3, -1, 1, 6), gc_input(3, bt3, -1, 1, 7)};
    CHECK_EQ_INT(gc_check("bmm ta tb", f_matmul, &f2, 2, in2, 1e-3, 1e-2), 0);
    dg_tensor_free(in2[0]);
    dg_tensor_free(in2[1]);
  }
  {
    dg_tensor *in[2] = {gc_input(2, at_s, -1, 1, 8), gc_input(2, b_s, -1, 1, 9)};
    CHECK_EQ_INT(gc_check("matmul of transposed view", f_matmul_tview, NULL, 2, in, 1e-3, 1e-2), 0);
    dg_tensor_free(in[0]);
    dg_tensor_free(in[1]);
  }
  {
    int64_t xs[3] = {2, 3, 4}, ws[2] = {5, 4}, bs[1] = {5};
    dg_tensor *in[3] = {gc_input(3, xs, -1, 1, 10), gc_input(2, ws, -1, 1, 11),
                        gc_input(1, bs, -1, 1, 12)};
    CHECK_EQ_INT(gc_check("linear", f_linear, NULL, 3, in, 1e-3, 1e-2), 0);
    for (int i = 0; i < 3; i++) dg_tensor_free(in[i]);
  }
  {
    int64_t s[2] = {3, 8};
    dg_tensor *in[1] = {gc_input(2, s, -1, 1, 13)};
    CHECK_EQ_INT(gc_check("reshape/slice/transpose/permute/contiguous", f_views, NULL, 1, in,
                          1e-3, 1e-2), 0);
    dg_tensor_free(in[0]);
  }
  return TEST_DONE();
}
