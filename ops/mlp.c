/* Fused transformer MLP, forward and backward (the op: validation,
 * recording, backward wiring; the kernels are the backend's,
 * backends/kern_mlp.h, their block scratch the step's).
 *
 * dg_mlp_gelu(x (R, C), w1 (F, C), b1 (F), w2 (O, F), b2 (O)) -> y (R, O):
 *
 *   h = x w1^T + b1   (R, F)  pre-activation, saved
 *   g = gelu(h)       (R, F)  tanh form, never kept
 *   y = g w2^T + b2   (R, O)
 *
 * Rows go by blocks of MLP_BLOCK_FLOATS / F, so g lives only in a block
 * of step scratch (reused by every layer) and the element-wise passes run
 * on L2-resident blocks. Biases are copied into the GEMM outputs first
 * (beta 1 instead of OpenBLAS's clearing for beta 0). Against linear + gelu + linear this keeps one
 * (R, F) activation per layer instead of two, drops two (R, F) gradients
 * from backward, and the GELU input, output and gradient never stream
 * through memory. Backward, per row block, with dy (m, O):
 *
 *   a  = dy w2                 (m, F)
 *   g  = gelu(h), a *= gelu'(h)   (one exp per element for both)
 *   dw2 += dy^T g,  dw1 += a^T x,  db1 += colsum(a),  dx = a w1
 *
 * and db2 = colsum(dy) once. First writers overwrite (beta 0). */
#include "backends/kern_mlp.h"
#include "core/core_impl.h"

static int mlp_backward(dg_ctx *ctx, dg_node *n) {
  const char *op = "mlp_gelu backward";
  const struct dg__kern_mlp *k = dg__backend_get(n->out->device)->mlp;
  dg_tensor *sx = dg__saved(ctx, n, 0), *sw1 = dg__saved(ctx, n, 1);
  dg_tensor *sw2 = dg__saved(ctx, n, 2), *sh = dg__saved(ctx, n, 3);
  if (!sx || !sw1 || !sw2 || !sh) return ctx->err;
  dg__mlp_args a = {.R = n->i[0], .C = n->i[1], .F = n->i[2], .O = n->i[3]};
  a.x = dg__contig_data(ctx, op, sx);
  a.w1 = dg__contig_data(ctx, op, sw1);
  a.w2 = dg__contig_data(ctx, op, sw2);
  a.h = (float *)dg__contig_data(ctx, op, sh);
  if (!a.x || !a.w1 || !a.w2 || !a.h) return ctx->err;
  a.dy = n->out->grad->data;
  int ox, o1, ob1, o2, ob2, orr = 0;
  a.dx = dg__grad_buf_w(ctx, n->in[0], &ox);
  a.dw1 = dg__grad_buf_w(ctx, n->in[1], &o1);
  a.db1 = dg__grad_buf_w(ctx, n->in[2], &ob1);
  a.dw2 = dg__grad_buf_w(ctx, n->in[3], &o2);
  a.db2 = dg__grad_buf_w(ctx, n->in[4], &ob2);
  /* dg_mlp_gelu_add: the residual's gradient is dy */
  if (n->nin > 5 && !ctx->err) a.dres = dg__grad_buf_w(ctx, n->in[5], &orr);
  if (ctx->err) return ctx->err;
  a.accx = !ox, a.accw1 = !o1, a.accb1 = !ob1, a.accw2 = !o2, a.accb2 = !ob2, a.accres = !orr;
  size_t bytes = 0;
  if (a.dx || a.dw1 || a.db1 || a.dw2) {
    int64_t rb = DG_MIN(k->block_rows(a.F), a.R);
    bytes = (size_t)(rb * a.F) * sizeof(float);
    a.a = dg__scratch_take(ctx, bytes), a.g = a.a ? dg__scratch_take(ctx, bytes) : NULL;
    if (!a.g) return ctx->err;
  }
  k->backward(&a);
  if (a.g) dg__scratch_give(ctx, a.g, bytes);
  if (a.a) dg__scratch_give(ctx, a.a, bytes);
  return DG_OK;
}

static int mlp_check(dg_ctx *ctx, dg_tensor *x, dg_tensor *w1, dg_tensor *b1, dg_tensor *w2,
                     dg_tensor *b2, dg_tensor *res) {
  const char *op = "mlp_gelu";
  if (!dg__check_f32(ctx, op, "x", x) || !dg__check_f32(ctx, op, "w1", w1) ||
      !dg__check_f32(ctx, op, "w2", w2) || (b1 && !dg__check_f32(ctx, op, "b1", b1)) ||
      (b2 && !dg__check_f32(ctx, op, "b2", b2)) ||
      (res && !dg__check_f32(ctx, "mlp_gelu_add", "res", res)))
    return ctx->err;
  int64_t C = x->ndim ? x->shape[x->ndim - 1] : 0;
  if (x->ndim < 1 || w1->ndim != 2 || w1->shape[1] != C || w2->ndim != 2 ||
      w2->shape[1] != w1->shape[0] || (b1 && (b1->ndim != 1 || b1->shape[0] != w1->shape[0])) ||
      (b2 && (b2->ndim != 1 || b2->shape[0] != w2->shape[0]))) {
    char s[5][96];
    return dg__set_error(ctx, DG_ESHAPE,
                         "mlp_gelu: x %s, w1 %s (want (F, %lld)), b1 %s, w2 %s (want (O, F)), "
                         "b2 %s",
                         dg__shape_str(x, s[0], 96), dg__shape_str(w1, s[1], 96), (long long)C,
                         b1 ? dg__shape_str(b1, s[2], 96) : "none",
                         dg__shape_str(w2, s[3], 96), b2 ? dg__shape_str(b2, s[4], 96) : "none");
  }
  return DG_OK;
}

/* add: dg_mlp_gelu_add (res required), else dg_mlp_gelu (res NULL). */
static dg_tensor *mlp_impl(dg_ctx *ctx, const char *name, dg_tensor *x, dg_tensor *w1,
                           dg_tensor *b1, dg_tensor *w2, dg_tensor *b2, dg_tensor *res, int add) {
  const char *op = "mlp_gelu";
  dg_tensor *in[6] = {x, w1, b1, w2, b2, res};
  const dg__backend *be =
      dg__op_begin(ctx, name, 6, in, (const char *[]){"x", "w1", "b1", "w2", "b2", "res"},
                   DG__OPT(2) | DG__OPT(4) | (add ? 0 : DG__OPT(5)));
  if (!be || mlp_check(ctx, x, w1, b1, w2, b2, res))
    return NULL;
  int64_t C = x->shape[x->ndim - 1], F = w1->shape[0], O = w2->shape[0];
  int64_t R = 1;
  for (int i = 0; i < x->ndim - 1; i++) R *= x->shape[i];
  int64_t shape[DG_MAX_DIMS];
  for (int i = 0; i < x->ndim; i++) shape[i] = x->shape[i];
  shape[x->ndim - 1] = O;
  dg_tensor *y = dg__new(ctx, op, DG_F32, x->ndim, shape);
  if (!y) return NULL;
  if (res && !dg__same_shape(res, y)) {
    char sr[96], sy[96];
    dg__set_error(ctx, DG_ESHAPE, "mlp_gelu_add: residual %s, want the output's shape %s",
                  dg__shape_str(res, sr, sizeof sr), dg__shape_str(y, sy, sizeof sy));
    return NULL;
  }
  const float *rp = res ? dg__contig_data(ctx, op, res) : NULL;
  if (res && !rp) return NULL;
  const float *xp = dg__contig_data(ctx, op, x), *w1p = dg__contig_data(ctx, op, w1);
  const float *w2p = dg__contig_data(ctx, op, w2);
  const float *b1p = b1 ? dg__contig_data(ctx, op, b1) : NULL;
  const float *b2p = b2 ? dg__contig_data(ctx, op, b2) : NULL;
  if (!xp || !w1p || !w2p || (b1 && !b1p) || (b2 && !b2p)) return NULL;
  int grad = dg__needs_grad(ctx, 6, in);
  int64_t hshape[2] = {R, F}, rb = DG_MIN(be->mlp->block_rows(F), R);
  size_t bytes = (size_t)(DG_MAX(rb, (int64_t)1) * F) * sizeof(float);
  dg_tensor *h = grad ? dg__new(ctx, op, DG_F32, 2, hshape) : NULL;
  float *hs = grad ? NULL : dg__scratch_take(ctx, bytes);
  float *g = (h || hs) ? dg__scratch_take(ctx, bytes) : NULL;
  if (!g) return NULL;
  dg__mlp_args a = {.R = R, .C = C, .F = F, .O = O, .x = xp, .w1 = w1p, .b1 = b1p, .w2 = w2p,
                    .b2 = b2p, .res = rp, .y = y->data, .h = h ? h->data : hs,
                    .h_whole = h != NULL, .g = g};
  be->mlp->forward(&a);
  dg__scratch_give(ctx, g, bytes);
  if (hs) dg__scratch_give(ctx, hs, bytes);
  if (grad) {
    dg_node *n = dg__record(ctx, op, mlp_backward, y, res ? 6 : 5, in);
    if (!n || dg__save(ctx, n, x) || dg__save(ctx, n, w1) || dg__save(ctx, n, w2) ||
        dg__save(ctx, n, h))
      return NULL;
    n->i[0] = R, n->i[1] = C, n->i[2] = F, n->i[3] = O;
  }
  return y;
}

dg_tensor *dg_mlp_gelu(dg_ctx *ctx, dg_tensor *x, dg_tensor *w1, dg_tensor *b1, dg_tensor *w2,
                       dg_tensor *b2) {
  return mlp_impl(ctx, "mlp_gelu", x, w1, b1, w2, b2, NULL, 0);
}

dg_tensor *dg_mlp_gelu_add(dg_ctx *ctx, dg_tensor *x, dg_tensor *w1, dg_tensor *b1,
                           dg_tensor *w2, dg_tensor *b2, dg_tensor *res) {
  return mlp_impl(ctx, "mlp_gelu_add", x, w1, b1, w2, b2, res, 1);
}
