/* Batch normalisation over the channels (dim 1), matching
 * torch.nn.functional.batch_norm: training mode normalises with the batch's
 * mean and biased variance and moves the running statistics towards the
 * batch's mean and unbiased variance; eval mode normalises with the running
 * statistics. The op: validation, recording, backward wiring; the kernels
 * are the backend's (backends/kern_batchnorm.h). dg__batchnorm_ex is the
 * same op with the statistics combined across processes
 * (ops/batchnorm_impl.h, for SyncBatchNorm). */
#include "backends/kern_batchnorm.h"
#include "ops/batchnorm_impl.h"

typedef struct {
  float *mean, *corr, *invstd; /* (C) each, on the op's device */
  double count;                /* values per channel behind the statistics */
  int train, has_sync;
  dg__bn_sync sync;            /* training with a sync: its copy */
  const dg__backend *be;
} bn_state;

/* Saved tensors: 0 = x, 1 = w (when node->i[3]). */
static int bn_backward(dg_ctx *ctx, dg_node *n) {
  const bn_state *st = n->extra;
  const int64_t N = n->i[0], C = n->i[1], L = n->i[2];
  const int has_w = (int)n->i[3];
  dg_tensor *sx = dg__saved(ctx, n, 0), *sw = has_w ? dg__saved(ctx, n, 1) : NULL;
  if (!sx || (has_w && !sw)) return ctx->err;
  const float *x = dg__contig_data(ctx, n->op, sx);                   /* (N, C, L) */
  const float *w = has_w ? dg__contig_data(ctx, n->op, sw) : NULL;    /* (C) */
  int ox, ow, ob;
  float *dx = dg__grad_buf_w(ctx, n->in[0], &ox);                     /* (N, C, L) */
  float *dw = dg__grad_buf_w(ctx, n->in[1], &ow), *db = dg__grad_buf_w(ctx, n->in[2], &ob);
  double *sums = x ? dg__arena_alloc(&ctx->arena, 4 * (size_t)C * sizeof(double)) : NULL;
  if (x && !sums && !ctx->err) dg__set_error(ctx, DG_ENOMEM, "%s backward: out of memory", n->op);
  if (!sums || (has_w && !w) || ctx->err) return ctx->err;
  dg__bn_args a = {x,  n->out->grad->data, w,  NULL, dx, dw,  db, N, C, L, st->mean, st->corr,
                   st->invstd, !ox, !ow, !ob};
  if (st->train || dw || db) /* eval with frozen w, b needs no pass over x */
    st->be->batchnorm->grad_sums(&a, sums); /* dw, db: this process's batch */
  if (!dx) return DG_OK;
  if (!st->train) { /* fixed statistics: dx = w invstd dy */
    st->be->batchnorm->bwd_dx(&a, NULL, NULL);
    return DG_OK;
  }
  if (st->has_sync) { /* collective: every process's node reaches it */
    char err[256] = "";
    int rc = st->sync.grad_sums(st->sync.user, sums, C, err, sizeof err);
    if (rc) return dg__set_error(ctx, rc, "%s backward: %s", n->op, err);
  }
  double *mdy = sums + 2 * C, *mdyx = sums + 3 * C;
  for (int64_t c = 0; c < C; c++) mdy[c] = sums[c] / st->count, mdyx[c] = sums[C + c] / st->count;
  st->be->batchnorm->bwd_dx(&a, mdy, mdyx);
  return DG_OK;
}

static const char *const bn_names[5] = {"x", "w", "b", "running_mean", "running_var"};

/* The inputs' shapes for a message ("none" for a NULL one), formatted on
 * failure only (a forward per layer per step passes here); returns 1. */
static int bn_shapes(dg_tensor *const *in, char s[5][96]) {
  for (int k = 0; k < 5; k++)
    if (in[k]) dg__shape_str(in[k], s[k], sizeof s[k]);
    else snprintf(s[k], sizeof s[k], "none");
  return 1;
}

static int bn_check(dg_ctx *ctx, const char *op, dg_tensor *const *in, int train,
                    float momentum, float eps) {
  for (int k = 0; k < 5; k++)
    if (in[k] && !dg__check_f32(ctx, op, bn_names[k], in[k])) return ctx->err;
  const dg_tensor *x = in[0];
  char s[5][96];
  if (x->ndim < 2 && bn_shapes(in, s))
    return dg__set_error(ctx, DG_ESHAPE, "%s: x %s must be (N, C), (N, C, L) or (N, C, H, W)",
                         op, s[0]);
  int64_t C = x->shape[1];
  for (int k = 1; k < 5; k++)
    if (in[k] && (in[k]->ndim != 1 || in[k]->shape[0] != C) && bn_shapes(in, s))
      return dg__set_error(ctx, DG_ESHAPE, "%s: x %s has %lld channels: w, b, running_mean and "
                           "running_var must be (%lld); got w %s, b %s, running_mean %s, "
                           "running_var %s", op, s[0], (long long)C, (long long)C, s[1], s[2],
                           s[3], s[4]);
  if (!in[3] != !in[4] && bn_shapes(in, s))
    return dg__set_error(ctx, DG_EINVAL, "%s: running_mean and running_var go together; got "
                         "running_mean %s, running_var %s", op, s[3], s[4]);
  if (!train && !in[3])
    return dg__set_error(ctx, DG_EINVAL, "%s: eval mode (train 0) normalises with running_mean "
                         "and running_var, which are NULL", op);
  if (in[3] && (!dg__is_contig(in[3]) || !dg__is_contig(in[4])))
    return dg__set_error(ctx, DG_EINVAL, "%s: running_mean and running_var must be contiguous "
                         "(they are updated in place)", op);
  if (!(momentum >= 0 && momentum <= 1))
    return dg__set_error(ctx, DG_EINVAL, "%s: momentum %g is outside [0, 1]", op,
                         (double)momentum);
  if (!(eps >= 0)) return dg__set_error(ctx, DG_EINVAL, "%s: eps %g must be >= 0", op, (double)eps);
  return DG_OK;
}

/* Training: the batch's count, per-channel mean and sum of squared
 * deviations (1 + 2C host doubles; the group's with a sync), with C more
 * doubles of room after them; NULL on failure. */
static double *bn_batch_stats(dg_ctx *ctx, const char *op, const dg__bn_args *a,
                              const dg__bn_sync *sync, const dg__backend *be) {
  const int64_t C = a->C;
  double *h = dg__arena_alloc(&ctx->arena, (1 + 3 * (size_t)C) * sizeof(double));
  if (!h) {
    dg__set_error(ctx, DG_ENOMEM, "%s: out of memory for channel statistics", op);
    return NULL;
  }
  h[0] = (double)(a->N * a->L);
  be->batchnorm->stats(a, h + 1);
  if (sync) {
    char err[256] = "";
    int rc = sync->stats(sync->user, h, C, err, sizeof err);
    if (rc) {
      dg__set_error(ctx, rc, "%s: %s", op, err);
      return NULL;
    }
  }
  return h;
}

/* Normalises with the batch statistics h (bn_batch_stats) and moves the
 * running statistics towards them (unbiased variance; an empty batch moves
 * nothing, as torch). */
static void bn_use_batch_stats(bn_state *st, double *h, int64_t C, dg_tensor *rm, dg_tensor *rv,
                               float momentum, float eps) {
  const double n = h[0];
  double *mean = h + 1, *m2 = h + 1 + C, *var = h + 1 + 2 * C; /* (C) each */
  for (int64_t c = 0; c < C; c++) var[c] = n > 0 ? m2[c] / n : 0;
  st->be->batchnorm->set_stats(st->mean, st->corr, st->invstd, mean, var, NULL, NULL, C, eps);
  st->count = n;
  if (!rm || n == 0) return;
  for (int64_t c = 0; c < C; c++) var[c] = m2[c] / (n - 1);
  st->be->batchnorm->update_running(rm->data, rv->data, mean, var, C, momentum);
}

dg_tensor *dg__batchnorm_ex(dg_ctx *ctx, dg_tensor *x, dg_tensor *w, dg_tensor *b,
                            dg_tensor *rm, dg_tensor *rv, int train, float momentum, float eps,
                            const dg__bn_sync *sync) {
  const char *op = sync ? sync->op : "batchnorm";
  dg_tensor *in[5] = {x, w, b, rm, rv};
  const dg__backend *be = dg__op_begin(ctx, op, 5, in, bn_names,
                                       DG__OPT(1) | DG__OPT(2) | DG__OPT(3) | DG__OPT(4));
  if (!be || bn_check(ctx, op, in, train, momentum, eps)) return NULL;
  int64_t N = x->shape[0], C = x->shape[1], L = 1;
  for (int d = 2; d < x->ndim; d++) L *= x->shape[d];
  dg_tensor *y = dg__new_like(ctx, op, x);
  const float *xp = y ? dg__contig_data(ctx, op, x) : NULL;  /* (N, C, L) */
  const float *wp = xp && w ? dg__contig_data(ctx, op, w) : NULL; /* (C) */
  const float *bp = xp && b ? dg__contig_data(ctx, op, b) : NULL; /* (C) */
  bn_state *st = xp ? dg__arena_alloc(&ctx->arena, sizeof *st) : NULL;
  float *ms = st ? dg__op_data(ctx, 3 * (size_t)C * sizeof(float)) : NULL;
  if (xp && !ms) dg__set_error(ctx, DG_ENOMEM, "%s: out of memory for channel statistics", op);
  if (!ms || (w && !wp) || (b && !bp)) return NULL;
  *st = (bn_state){ms, ms + C, ms + 2 * C, (double)(N * L), !!train, sync && train, {0}, be};
  dg__bn_args a = {xp, NULL, wp, bp, y->data, NULL, NULL, N, C, L, st->mean, st->corr,
                   st->invstd, 0, 0, 0};
  if (train) {
    double *h = bn_batch_stats(ctx, op, &a, sync, be);
    if (!h) return NULL;
    if (h[0] == 1) { /* as torch: a variance needs two values */
      char sx[96];
      dg__set_error(ctx, DG_ESHAPE, "%s: training needs more than 1 value per channel; got x %s%s",
                    op, dg__shape_str(x, sx, sizeof sx), sync ? " and 1 in the group's batch" : "");
      return NULL;
    }
    bn_use_batch_stats(st, h, C, rm, rv, momentum, eps);
  } else {
    be->batchnorm->set_stats(st->mean, st->corr, st->invstd, NULL, NULL, rm->data, rv->data, C,
                             eps);
  }
  be->batchnorm->fwd(&a);
  if (dg__needs_grad(ctx, 3, in)) {
    dg_node *n = dg__record(ctx, op, bn_backward, y, 3, in);
    if (!n || dg__save(ctx, n, x) || (w && dg__save(ctx, n, w))) return NULL;
    n->i[0] = N, n->i[1] = C, n->i[2] = L, n->i[3] = w != NULL;
    if (st->has_sync) st->sync = *sync;
    n->extra = st;
  }
  return y;
}

dg_tensor *dg_batchnorm(dg_ctx *ctx, dg_tensor *x, dg_tensor *w, dg_tensor *b,
                        dg_tensor *running_mean, dg_tensor *running_var, int train,
                        float momentum, float eps) {
  return dg__batchnorm_ex(ctx, x, w, b, running_mean, running_var, train, momentum, eps, NULL);
}
