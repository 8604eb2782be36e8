/* Built-in DDP communication hooks: f32 all-reduce (average in the
 * collective), and fp16 / bf16 compression (scale by 1/world while
 * converting, sum in the reduced type, convert back times scale * world). */
#include <string.h>

#include "dist/ddp_impl.h"
#include "dist/pg_ext.h"

/* Bucket 0 carries Join's count: one element after the gradients. */
static int carries(const dg_ddp *d, const dg_ddp_bucket *b) { return d->piggy && b->index == 0; }

int dg__ddp_can_piggy(const dg_ddp *d) {
  if (d->opts.hook || d->opts.no_join) return 0;
  /* shared gradients: the count rides in the segment's round, no staging */
  if (d->red && d->red->count_rides) return 1;
  /* through shared memory a separate 4-byte all-reduce costs microseconds,
   * less than staging bucket 0 */
  if (dg__pg_local_shm(d->pg)) return 0;
  /* the count is summed in the reduced type: exact integers up to 2^11
   * (f16) and 2^8 (bf16) */
  if (d->opts.comm == DG_DDP_COMM_FP16) return d->world <= 2048;
  if (d->opts.comm == DG_DDP_COMM_BF16) return d->world <= 256;
  return 1;
}

/* ---- f32 ---- */

static int f32_start(void *state, dg_pg *pg, const dg_ddp_bucket *b, void **pending) {
  dg_ddp *d = state;
  dg_work *w = NULL;
  int rc;
  if (carries(d, b)) { /* staged: (n + 1) floats, averaged like the rest */
    if (d->stage_cap < b->n + 1) {
      float *p = dg__realloc(d->stage, (b->n + 1) * sizeof *p);
      if (!p) return DG_ENOMEM;
      d->stage = p;
      d->stage_cap = b->n + 1;
    }
    memcpy(d->stage, b->grad, b->n * sizeof *b->grad);
    d->stage[b->n] = (float)d->has_data;
    rc = dg_pg_allreduce(pg, d->stage, b->n + 1, DG_F32, DG_RED_AVG, &w);
  } else {
    rc = dg_pg_allreduce(pg, b->grad, b->n, DG_F32, DG_RED_AVG, &w);
  }
  *pending = w;
  return rc;
}

/* Waits for w; on failure copies its message into the DDP's detail. */
static int wait_work(dg_ddp *d, dg_work *w) {
  int rc = dg_work_wait(w, 0);
  if (rc) dg_ddp_hook_error(d, dg_work_errmsg(w));
  dg_work_free(w);
  return rc;
}

static int f32_finish(void *state, dg_pg *pg, const dg_ddp_bucket *b, void *pending,
                      float scale) {
  (void)pg;
  dg_ddp *d = state;
  int rc = wait_work(d, pending);
  float f = scale * (float)b->world_size; /* the collective divided by world */
  if (!rc && carries(d, b)) {
    if (f != 1.0f)
      for (size_t i = 0; i < b->n; i++) b->grad[i] = d->stage[i] * f;
    else
      memcpy(b->grad, d->stage, b->n * sizeof *b->grad);
  } else if (!rc && f != 1.0f) {
    for (size_t i = 0; i < b->n; i++) b->grad[i] *= f;
  }
  return rc;
}

int32_t dg__ddp_piggy_count(dg_ddp *d, void *pending) {
  dg_work *w = pending;
  int rc = dg_work_wait(w, 0);
  if (rc) {
    dg_ddp_hook_error(d, dg_work_errmsg(w));
    return -1;
  }
  size_t n = dg_work_count(w) - 1; /* the count is the last element */
  double v;
  switch (d->opts.comm) {
    case DG_DDP_COMM_FP16: v = dg_f16_to_f32(d->half[0][n]); break;
    case DG_DDP_COMM_BF16: v = dg_bf16_to_f32(d->half[0][n]); break;
    default: v = (double)d->stage[n] * d->world; break; /* averaged */
  }
  return (int32_t)(v + 0.5);
}

static void work_release(void *state, void *pending) {
  (void)state;
  dg_work_free(pending);
}

/* ---- fp16 / bf16 ---- */

static uint16_t *half_buf(dg_ddp *d, int k, size_t n) {
  if (k >= d->nhalf) {
    int nn = k + 1;
    uint16_t **h = dg__realloc(d->half, (size_t)nn * sizeof *h);
    if (!h) return NULL;
    d->half = h;
    size_t *c = dg__realloc(d->half_cap, (size_t)nn * sizeof *c);
    if (!c) return NULL;
    d->half_cap = c;
    for (int j = d->nhalf; j < nn; j++) d->half[j] = NULL, d->half_cap[j] = 0;
    d->nhalf = nn;
  }
  if (d->half_cap[k] < n) {
    uint16_t *p = dg__realloc(d->half[k], (n ? n : 1) * sizeof *p);
    if (!p) return NULL;
    d->half[k] = p;
    d->half_cap[k] = n;
  }
  return d->half[k];
}

static int half_start(dg_ddp *d, dg_pg *pg, const dg_ddp_bucket *b, void **pending, int bf) {
  int carry = carries(d, b);
  uint16_t *h = half_buf(d, b->index, b->n + (size_t)carry);
  if (!h) return DG_ENOMEM;
  const float pre = 1.0f / (float)b->world_size; /* keeps the sum in range */
  if (bf)
    for (size_t i = 0; i < b->n; i++) h[i] = dg_f32_to_bf16(b->grad[i] * pre);
  else
    for (size_t i = 0; i < b->n; i++) h[i] = dg_f32_to_f16(b->grad[i] * pre);
  if (carry) /* summed as is: an exact small integer */
    h[b->n] = bf ? dg_f32_to_bf16((float)d->has_data) : dg_f32_to_f16((float)d->has_data);
  dg_work *w = NULL;
  int rc = dg_pg_allreduce(pg, h, b->n + (size_t)carry, bf ? DG_BF16 : DG_F16, DG_RED_SUM, &w);
  *pending = w;
  return rc;
}

static int fp16_start(void *state, dg_pg *pg, const dg_ddp_bucket *b, void **pending) {
  return half_start(state, pg, b, pending, 0);
}
static int bf16_start(void *state, dg_pg *pg, const dg_ddp_bucket *b, void **pending) {
  return half_start(state, pg, b, pending, 1);
}

static int half_finish(dg_ddp *d, const dg_ddp_bucket *b, void *pending, float scale, int bf) {
  int rc = wait_work(d, pending);
  if (rc) return rc;
  const uint16_t *h = d->half[b->index];
  const float f = scale * (float)b->world_size;
  if (bf)
    for (size_t i = 0; i < b->n; i++) b->grad[i] = dg_bf16_to_f32(h[i]) * f;
  else
    for (size_t i = 0; i < b->n; i++) b->grad[i] = dg_f16_to_f32(h[i]) * f;
  return DG_OK;
}

static int fp16_finish(void *state, dg_pg *pg, const dg_ddp_bucket *b, void *pending,
                       float scale) {
  (void)pg;
  return half_finish(state, b, pending, scale, 0);
}
static int bf16_finish(void *state, dg_pg *pg, const dg_ddp_bucket *b, void *pending,
                       float scale) {
  (void)pg;
  return half_finish(state, b, pending, scale, 1);
}

void dg__ddp_builtin_hook(dg_ddp *d, dg_ddp_comm_hook *out) {
  memset(out, 0, sizeof *out);
  out->state = d;
  out->release = work_release;
  switch (d->opts.comm) {
    case DG_DDP_COMM_FP16:
      out->name = "builtin:fp16";
      out->start = fp16_start;
      out->finish = fp16_finish;
      break;
    case DG_DDP_COMM_BF16:
      out->name = "builtin:bf16";
      out->start = bf16_start;
      out->finish = bf16_finish;
      break;
    default:
      out->name = "builtin:f32";
      out->start = f32_start;
      out->finish = f32_finish;
      break;
  }
}

void dg__ddp_hook_free(dg_ddp *d) {
  for (int k = 0; k < d->nhalf; k++) dg__free(d->half[k]);
  dg__free(d->half);
  dg__free(d->half_cap);
  d->half = NULL;
  d->half_cap = NULL;
  d->nhalf = 0;
  dg__free(d->stage);
  d->stage = NULL;
  d->stage_cap = 0;
}
