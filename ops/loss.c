/* Losses: cross-entropy from logits with integer targets, and mean squared
 * error, forward and backward.
 *
 * cross_entropy fuses log-softmax and the negative log-likelihood: forward
 * keeps each row's max m and log-sum-exp l of x - m (2N floats in the
 * node), so backward is one pass, dx = (exp(x - m - l) - onehot(t)) * g / N,
 * with no (N, C) softmax stored. Both passes run the vector exp of
 * cpu_impl.h, are compiled per ISA and split by rows over the pool; the
 * loss is summed over the rows in order (thread-count invariant). */
#include <math.h>

#include "core/core_impl.h"
#include "backends/cpu/cpu_impl.h"

/* Integer tensor t (any shape, any strides, i32/i64) as a contiguous int64
 * arena array. */
static int64_t *load_index(dg_ctx *ctx, const char *op, dg_tensor *t) {
  int64_t n = dg__numel(t), idx[DG_MAX_DIMS] = {0};
  int64_t *out = dg__arena_alloc(&ctx->arena, (size_t)n * sizeof *out);
  if (!out) {
    dg__set_error(ctx, DG_ENOMEM, "%s: out of memory for %lld targets", op, (long long)n);
    return NULL;
  }
  for (int64_t k = 0; k < n; k++) {
    int64_t off = 0;
    for (int i = 0; i < t->ndim; i++) off += idx[i] * t->stride[i];
    out[k] = t->dtype == DG_I32 ? ((const int32_t *)t->data)[off] : ((const int64_t *)t->data)[off];
    for (int i = t->ndim - 1; i >= 0; i--) {
      if (++idx[i] < t->shape[i]) break;
      idx[i] = 0;
    }
  }
  return out;
}

/* ---- cross-entropy ---- */

typedef struct {
  const int64_t *target; /* (N) */
  float *max, *lsum;     /* (N) each: row max m and log(sum(exp(x - m))) */
} ce_saved;

typedef struct {
  const float *x;         /* (N, C) logits */
  const int64_t *target;  /* (N) */
  float *max, *lsum;      /* (N) each */
  float *dx;              /* (N, C) backward */
  float g;                /* dL/dloss / N */
  int64_t C;
  int acc;                /* 0: store into a fresh gradient */
} ce_job;

/* Forward rows [r0, r1): max and log-sum-exp of each row. The exp sum runs
 * in 16 float lanes (exp of x - m <= 0 by the vector polynomial), folded
 * into double per row. */
DG_INLINE void ce_fwd_rows_body(const ce_job *j, int64_t r0, int64_t r1) {
  const int64_t C = j->C;
  for (int64_t r = r0; r < r1; r++) {
    const float *restrict xr = j->x + r * C;
    float m16[16], m = -INFINITY;
    for (int k = 0; k < 16; k++) m16[k] = -INFINITY;
    int64_t i = 0;
    for (; i + 16 <= C; i += 16)
      for (int k = 0; k < 16; k++) m16[k] = xr[i + k] > m16[k] ? xr[i + k] : m16[k];
    for (; i < C; i++) m = xr[i] > m ? xr[i] : m;
    for (int k = 0; k < 16; k++) m = m16[k] > m ? m16[k] : m;
    float s16[16] = {0};
    double s = 0;
    for (i = 0; i + 16 <= C; i += 16)
      for (int k = 0; k < 16; k++) s16[k] += dg__exp_nonpos(xr[i + k] - m);
    for (; i < C; i++) s += dg__exp_nonpos(xr[i] - m);
    for (int k = 0; k < 16; k++) s += s16[k];
    j->max[r] = m, j->lsum[r] = (float)log(s);
  }
}
DG_SIMD_FN(ce_fwd_rows, (const ce_job *j, int64_t r0, int64_t r1), (j, r0, r1))

/* Backward rows [r0, r1): dx = (softmax(x) - onehot(t)) * g. */
DG_INLINE void ce_bwd_rows_body(const ce_job *j, int64_t r0, int64_t r1) {
  const int64_t C = j->C;
  const float g = j->g;
  for (int64_t r = r0; r < r1; r++) {
    const float *restrict xr = j->x + r * C;
    float *restrict dr = j->dx + r * C;
    const float m = j->max[r], l = j->lsum[r];
    if (j->acc)
      for (int64_t i = 0; i < C; i++) dr[i] += g * dg__exp_nonpos((xr[i] - m) - l);
    else
      for (int64_t i = 0; i < C; i++) dr[i] = g * dg__exp_nonpos((xr[i] - m) - l);
    dr[j->target[r]] -= g;
  }
}
DG_SIMD_FN(ce_bwd_rows, (const ce_job *j, int64_t r0, int64_t r1), (j, r0, r1))

static void ce_fwd_task(void *arg, int64_t lo, int64_t hi) { ce_fwd_rows(arg, lo, hi); }
static void ce_bwd_task(void *arg, int64_t lo, int64_t hi) { ce_bwd_rows(arg, lo, hi); }

/* Rows per pool chunk: about 16K elements. */
static int64_t ce_grain(int64_t C) { return DG_MAX((int64_t)1, 16384 / DG_MAX(C, (int64_t)1)); }

static int ce_backward(dg_ctx *ctx, dg_node *n) {
  dg_tensor *sx = dg__saved(ctx, n, 0);
  if (!sx) return ctx->err;
  const float *x = dg__contig_data(ctx, "cross_entropy backward", sx); /* (N, C) */
  int overwrite;
  float *dx = dg__grad_buf_w(ctx, n->in[0], &overwrite);              /* (N, C) */
  if (!x || !dx) return ctx->err;
  const ce_saved *s = n->extra;
  int64_t N = n->i[0], C = n->i[1];
  float g = ((const float *)n->out->grad->data)[0] / (float)N;
  ce_job j = {x, s->target, s->max, s->lsum, dx, g, C, !overwrite};
  dg__parallel_range(N, ce_grain(C), ce_bwd_task, &j);
  return DG_OK;
}

static int ce_check(dg_ctx *ctx, dg_tensor *logits, dg_tensor *targets) {
  char sl[96], st[96];
  if (!dg__check_f32(ctx, "cross_entropy", "logits", logits)) return ctx->err;
  if (targets->dtype != DG_I32 && targets->dtype != DG_I64)
    return dg__set_error(ctx, DG_EDTYPE, "cross_entropy: targets %s must be i32 or i64, got %s",
                         dg__shape_str(targets, st, sizeof st), dg_dtype_name(targets->dtype));
  int ok = logits->ndim >= 1 && targets->ndim == logits->ndim - 1;
  for (int i = 0; ok && i < targets->ndim; i++) ok = targets->shape[i] == logits->shape[i];
  if (!ok)
    return dg__set_error(ctx, DG_ESHAPE,
                         "cross_entropy: logits %s (..., C) need targets of shape (...), got %s",
                         dg__shape_str(logits, sl, sizeof sl),
                         dg__shape_str(targets, st, sizeof st));
  return DG_OK;
}

dg_tensor *dg_cross_entropy(dg_ctx *ctx, dg_tensor *logits, dg_tensor *targets) {
  if (!ctx || dg__null_input(ctx, "cross_entropy", "logits", logits) ||
      dg__null_input(ctx, "cross_entropy", "targets", targets) || ce_check(ctx, logits, targets))
    return NULL;
  int64_t C = logits->shape[logits->ndim - 1], N = dg__numel(targets);
  dg_tensor *loss = dg__new(ctx, "cross_entropy", DG_F32, 0, NULL);
  const float *x = loss ? dg__contig_data(ctx, "cross_entropy", logits) : NULL; /* (N, C) */
  int64_t *t = x ? load_index(ctx, "cross_entropy", targets) : NULL;            /* (N) */
  float *st = t ? dg__arena_alloc(&ctx->arena, 2 * (size_t)N * sizeof *st) : NULL; /* (2, N) */
  if (t && !st) dg__set_error(ctx, DG_ENOMEM, "cross_entropy: out of memory");
  if (!st) return NULL;
  for (int64_t r = 0; r < N; r++)
    if (t[r] < 0 || t[r] >= C) {
      dg__set_error(ctx, DG_EINVAL, "cross_entropy: target %lld in row %lld is outside [0, %lld)",
                    (long long)t[r], (long long)r, (long long)C);
      return NULL;
    }
  ce_job j = {x, t, st, st + N, NULL, 0, C, 0};
  dg__parallel_range(N, ce_grain(C), ce_fwd_task, &j);
  double total = 0;
  for (int64_t r = 0; r < N; r++) total += ((double)st[r] - x[r * C + t[r]]) + st[N + r];
  *(float *)loss->data = (float)(total / (double)N); /* N = 0: NaN, as in PyTorch */
  if (dg__needs_grad(ctx, 1, &logits)) {
    dg_node *n = dg__record(ctx, "cross_entropy", ce_backward, loss, 1, &logits);
    ce_saved *s = n ? dg__arena_alloc(&ctx->arena, sizeof *s) : NULL;
    if (n && !s) dg__set_error(ctx, DG_ENOMEM, "cross_entropy: out of memory");
    if (!s || dg__save(ctx, n, logits)) return NULL;
    s->target = t, s->max = st, s->lsum = st + N;
    n->extra = s;
    n->i[0] = N, n->i[1] = C;
  }
  return loss;
}

/* ---- mean squared error ---- */

static int mse_backward(dg_ctx *ctx, dg_node *n) {
  dg_tensor *sp = dg__saved(ctx, n, 0), *st = dg__saved(ctx, n, 1);
  if (!sp || !st) return ctx->err;
  const float *p = dg__contig_data(ctx, "mse backward", sp); /* (n) */
  const float *t = dg__contig_data(ctx, "mse backward", st); /* (n) */
  int op, ot;
  float *dp = dg__grad_buf_w(ctx, n->in[0], &op), *dt = dg__grad_buf_w(ctx, n->in[1], &ot); /* (n) */
  if (!p || !t || ctx->err) return ctx->err;
  int64_t N = n->i[0];
  float g = 2.0f * ((const float *)n->out->grad->data)[0] / (float)N;
  if (dp && op)
    for (int64_t i = 0; i < N; i++) dp[i] = g * (p[i] - t[i]);
  else if (dp)
    for (int64_t i = 0; i < N; i++) dp[i] += g * (p[i] - t[i]);
  if (dt && ot)
    for (int64_t i = 0; i < N; i++) dt[i] = -(g * (p[i] - t[i]));
  else if (dt)
    for (int64_t i = 0; i < N; i++) dt[i] -= g * (p[i] - t[i]);
  return DG_OK;
}

dg_tensor *dg_mse(dg_ctx *ctx, dg_tensor *pred, dg_tensor *target) {
  if (!ctx || dg__null_input(ctx, "mse", "pred", pred) ||
      dg__null_input(ctx, "mse", "target", target) || !dg__check_f32(ctx, "mse", "pred", pred) ||
      !dg__check_f32(ctx, "mse", "target", target))
    return NULL;
  if (!dg__same_shape(pred, target)) {
    char sp[96], st[96];
    dg__set_error(ctx, DG_ESHAPE, "mse: pred %s and target %s differ",
                  dg__shape_str(pred, sp, sizeof sp), dg__shape_str(target, st, sizeof st));
    return NULL;
  }
  int64_t N = dg__numel(pred);
  dg_tensor *loss = dg__new(ctx, "mse", DG_F32, 0, NULL);
  const float *p = loss ? dg__contig_data(ctx, "mse", pred) : NULL;  /* (N) */
  const float *t = p ? dg__contig_data(ctx, "mse", target) : NULL;   /* (N) */
  if (!t) return NULL;
  double s = 0;
  for (int64_t i = 0; i < N; i++) {
    double d = (double)p[i] - t[i];
    s += d * d;
  }
  *(float *)loss->data = (float)(s / (double)N);
  dg_tensor *in[2] = {pred, target};
  if (dg__needs_grad(ctx, 2, in)) {
    dg_node *n = dg__record(ctx, "mse", mse_backward, loss, 2, in);
    if (!n || dg__save(ctx, n, pred) || dg__save(ctx, n, target)) return NULL;
    n->i[0] = N;
  }
  return loss;
}
