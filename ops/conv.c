/* conv2d (NCHW), forward and backward, by im2col + GEMM (the op:
 * validation, recording, backward wiring). Backward recomputes the columns
 * from the saved input instead of keeping them. The kernels are the
 * backend's (backends/kern_conv.h), which asks for its column scratch; the
 * op takes it from the arena. */
#include "backends/kern_conv.h"
#include "core/core_impl.h"

typedef struct {
  dg__conv_geom g;
  const dg__backend *be;
} conv_state;

/* a->scratch = n floats of arena (none when n is 0). */
static int conv_scratch(dg_ctx *ctx, const char *op, dg__conv_args *a, int64_t n) {
  a->scratch = NULL, a->nscratch = n;
  if (n <= 0) return DG_OK;
  a->scratch = dg__op_data(ctx, (size_t)n * sizeof(float));
  if (!a->scratch) return dg__set_error(ctx, DG_ENOMEM, "%s: out of memory for columns", op);
  return DG_OK;
}

static int conv_backward(dg_ctx *ctx, dg_node *n) {
  const conv_state *st = n->extra;
  const dg__conv_geom *g = &st->g;
  const struct dg__kern_conv *k = st->be->conv;
  dg_tensor *sx = dg__saved(ctx, n, 0), *sw = dg__saved(ctx, n, 1);
  if (!sx || !sw) return ctx->err;
  int ox, ow, ob = 0;
  float *dx = dg__grad_buf_w(ctx, n->in[0], &ox), *dw = dg__grad_buf_w(ctx, n->in[1], &ow);
  float *db = n->nin > 2 ? dg__grad_buf_w(ctx, n->in[2], &ob) : NULL;
  if (ctx->err) return ctx->err;
  const float *dy = n->out->grad->data; /* (N, O, L) */
  const float *xp = dw ? dg__contig_data(ctx, "conv2d backward", sx) : NULL; /* (N, C, H, W) */
  const float *wp = dx ? dg__contig_data(ctx, "conv2d backward", sw) : NULL; /* (O, CK) */
  if ((dw && !xp) || (dx && !wp)) return ctx->err;
  dg__conv_args a = {.g = g, .x = xp, .w = wp, .dy = dy, .dx = dx, .dw = dw, .db = db,
                     .accx = !ox, .accw = !ow, .accb = !ob};
  if (dw || db) { /* sums over the images, in order */
    if (conv_scratch(ctx, "conv2d backward", &a, dw ? k->wb_scratch(g) : 0)) return ctx->err;
    k->backward_wb(&a);
  }
  if (dx && g->N > 0) {
    if (conv_scratch(ctx, "conv2d", &a, k->image_scratch(g))) return ctx->err;
    k->backward_x(&a);
  }
  return DG_OK;
}

/* Validates and fills g; records the error naming the shapes, stride and pad. */
static int conv_check(dg_ctx *ctx, dg_tensor *x, dg_tensor *w, dg_tensor *b, int stride,
                      int pad, dg__conv_geom *g) {
  if (!dg__check_f32(ctx, "conv2d", "x", x) || !dg__check_f32(ctx, "conv2d", "w", w) ||
      (b && !dg__check_f32(ctx, "conv2d", "b", b)))
    return ctx->err;
  char sx[96], sw[96], sb[96];
  const char *why = NULL;
  if (x->ndim != 4 || w->ndim != 4) why = "x and w must be 4-d";
  else if (w->shape[1] != x->shape[1]) why = "channels of x and w differ";
  else if (b && (b->ndim != 1 || b->shape[0] != w->shape[0])) why = "b must be (O)";
  else if (stride < 1 || pad < 0) why = "need stride >= 1 and pad >= 0";
  else if (w->shape[2] < 1 || w->shape[3] < 1 || x->shape[2] + 2 * (int64_t)pad < w->shape[2] ||
           x->shape[3] + 2 * (int64_t)pad < w->shape[3])
    why = "kernel larger than the padded input";
  if (why)
    return dg__set_error(ctx, DG_ESHAPE, "conv2d: %s: x %s, w %s, b %s, stride %d, pad %d", why,
                         dg__shape_str(x, sx, sizeof sx), dg__shape_str(w, sw, sizeof sw),
                         b ? dg__shape_str(b, sb, sizeof sb) : "none", stride, pad);
  g->N = x->shape[0], g->C = x->shape[1], g->H = x->shape[2], g->W = x->shape[3];
  g->O = w->shape[0], g->KH = w->shape[2], g->KW = w->shape[3];
  g->s = stride, g->p = pad;
  g->OH = (g->H + 2 * g->p - g->KH) / g->s + 1;
  g->OW = (g->W + 2 * g->p - g->KW) / g->s + 1;
  return DG_OK;
}

dg_tensor *dg_conv2d(dg_ctx *ctx, dg_tensor *x, dg_tensor *w, dg_tensor *b, int stride,
                     int pad) {
  dg_tensor *in[3] = {x, w, b};
  const dg__backend *be = dg__op_begin(ctx, "conv2d", 3, in, (const char *[]){"x", "w", "b"},
                                       DG__OPT(2));
  dg__conv_geom g = {0};
  if (!be || conv_check(ctx, x, w, b, stride, pad, &g))
    return NULL;
  int64_t shape[4] = {g.N, g.O, g.OH, g.OW};
  dg_tensor *y = dg__new(ctx, "conv2d", DG_F32, 4, shape);
  const float *xp = y ? dg__contig_data(ctx, "conv2d", x) : NULL; /* (N, C, H, W) */
  const float *wp = xp ? dg__contig_data(ctx, "conv2d", w) : NULL; /* (O, C, KH, KW) */
  const float *bp = wp && b ? dg__contig_data(ctx, "conv2d", b) : NULL; /* (O) */
  if (!wp || (b && !bp)) return NULL;
  dg__conv_args a = {.g = &g, .x = xp, .w = wp, .b = bp, .y = y->data};
  if (conv_scratch(ctx, "conv2d", &a, be->conv->image_scratch(&g))) return NULL;
  be->conv->forward(&a);
  if (dg__needs_grad(ctx, 3, in)) {
    dg_node *n = dg__record(ctx, "conv2d", conv_backward, y, b ? 3 : 2, in);
    conv_state *st = n ? dg__arena_alloc(&ctx->arena, sizeof *st) : NULL;
    if (!st) {
      if (n) dg__set_error(ctx, DG_ENOMEM, "conv2d: out of memory");
      return NULL;
    }
    st->g = g, st->be = be;
    n->extra = st;
    if (dg__save(ctx, n, x) || dg__save(ctx, n, w)) return NULL;
  }
  return y;
}
