/* DP x PP: the stage's gradients averaged over its replicas, bucket by
 * bucket as the last backward makes them final (pipe_dp.h). */
#include "dist/pipe_dp.h"

#include <stdio.h>
#include <string.h>

#include "dgrad/tensor.h"
#include "dist/net/net_impl.h"
#include "dist/pg_ext.h"
#include "base/common_impl.h"

#define BUCKETS 4                       /* a stage's gradients in about this many */
#define BUCKET_MAX ((size_t)25 << 18)   /* elements: 25 MiB, DDP's default cap */

struct dg__pipe_dp {
  dg_pg *dp;
  dg_params *ps;
  int nb, next, armed, early, err;
  int *of;           /* (params) each parameter's bucket */
  int *need, *left;  /* (nb) parameters per bucket, not yet final this step */
  size_t *lo;        /* (nb + 1) bucket k: elements [lo[k + 1], lo[k]) of the flat gradient */
  dg_work **w;       /* (nb) posted all-reduces */
  double wait;
  char msg[900]; /* a failing all-reduce's message (pg_work.h) */
};

static int by_offset_desc(const void *a, const void *b, void *ps) {
  size_t x = dg_params_offset(ps, *(const int *)a), y = dg_params_offset(ps, *(const int *)b);
  return x < y ? 1 : x > y ? -1 : 0;
}

/* Buckets over the parameters in descending offset (the order backward
 * usually finishes them: last layer first), each at least cap elements. */
static int make_buckets(dg__pipe_dp *d) {
  const int P = dg_params_count(d->ps);
  size_t n = 0;
  dg_params_grad(d->ps, &n);
  int *ord = dg__malloc((size_t)(P ? P : 1) * sizeof *ord);
  d->of = dg__malloc((size_t)(P ? P : 1) * sizeof *d->of);
  d->need = dg__calloc((size_t)P + 1, sizeof *d->need);
  d->left = dg__calloc((size_t)P + 1, sizeof *d->left);
  d->lo = dg__calloc((size_t)P + 2, sizeof *d->lo);
  d->w = dg__calloc((size_t)P + 1, sizeof *d->w);
  if (!ord || !d->of || !d->need || !d->left || !d->lo || !d->w) {
    dg__free(ord);
    return DG_ENOMEM;
  }
  for (int i = 0; i < P; i++) ord[i] = i;
  qsort_r(ord, (size_t)P, sizeof *ord, by_offset_desc, d->ps);
  size_t cap = (n + BUCKETS - 1) / BUCKETS;
  if (cap > BUCKET_MAX) cap = BUCKET_MAX;
  d->nb = 0;
  d->lo[0] = n;
  for (int j = 0; j < P; j++) {
    const int i = ord[j];
    d->of[i] = d->nb;
    d->need[d->nb]++;
    const size_t off = dg_params_offset(d->ps, i);
    if (d->lo[d->nb] - off >= cap || j == P - 1) d->lo[++d->nb] = j == P - 1 ? 0 : off;
  }
  dg__free(ord);
  memcpy(d->left, d->need, (size_t)d->nb * sizeof *d->left);
  return DG_OK;
}

int dg__pipe_dp_new(dg__pipe_dp **out, dg_pg *dp, dg_params *ps, const int64_t id[4], char *err,
                    size_t cap) {
  *out = NULL;
  const int R = dg_pg_size(dp);
  int64_t *all = dg__malloc((size_t)4 * R * sizeof *all);
  dg__pipe_dp *d = dg__calloc(1, sizeof *d);
  if (d) d->dp = dp, d->ps = ps;
  if (!all || !d || make_buckets(d)) {
    dg__free(all);
    dg__pipe_dp_free(d);
    return dg__fail_msg(err, cap, DG_ENOMEM, "pipe_new: out of memory");
  }
  int rc = dg_pg_allgather_sync(dp, id, all, 4, DG_I64);
  if (rc) dg__fail_msg(err, cap, rc, "pipe_new: stage %lld: exchanging stages with the replicas: "
                       "%s", (long long)id[0], dg_pg_errmsg(dp));
  for (int r = 0; !rc && r < R; r++)
    if (memcmp(all + 4 * r, id, 4 * sizeof *id))
      rc = dg__fail_msg(err, cap, DG_EMISMATCH, "pipe_new: replica rank %d holds stage %lld "
                        "(layers %lld-%lld, %lld parameters), replica rank %d stage %lld (layers "
                        "%lld-%lld, %lld): dp_group must join the ranks of one stage",
                        dg_pg_rank(dp), (long long)id[0], (long long)id[1], (long long)id[2] - 1,
                        (long long)id[3], r, (long long)all[4 * r], (long long)all[4 * r + 1],
                        (long long)all[4 * r + 2] - 1, (long long)all[4 * r + 3]);
  dg__free(all);
  size_t n = 0, nb = 0;
  float *v = dg_params_data(ps, &n), *b = dg_params_buffer_data(ps, &nb);
  if (!rc && n) rc = dg_pg_broadcast_sync(dp, v, n, DG_F32, 0);
  if (!rc && nb) rc = dg_pg_broadcast_sync(dp, b, nb, DG_F32, 0);
  if (rc && !*err) dg__fail_msg(err, cap, rc, "pipe_new: stage %lld: broadcasting the "
                                "parameters over the replicas: %s", (long long)id[0],
                                dg_pg_errmsg(dp));
  if (rc) {
    dg__pipe_dp_free(d);
    return rc;
  }
  *out = d;
  return DG_OK;
}

/* Posts bucket k's all-reduce (a failed post is kept for sync to report). */
static void post(dg__pipe_dp *d, int k) {
  size_t n = 0;
  float *g = dg_params_grad(d->ps, &n); /* zeroes a stale segment: none is in bucket k */
  const size_t lo = d->lo[k + 1], cnt = d->lo[k] - lo;
  int rc = cnt ? dg_pg_allreduce(d->dp, g + lo, cnt, DG_F32, DG_RED_AVG, &d->w[k]) : DG_OK;
  if (rc && !d->err) {
    d->err = rc;
    snprintf(d->msg, sizeof d->msg, "posting bucket %d of %d: %s", k, d->nb, dg_pg_errmsg(d->dp));
  }
  d->next = k + 1;
}

static void on_ready(void *user, dg_params *ps, int index, int reached) {
  (void)reached; /* a parameter backward never reached is final too (zero) */
  dg__pipe_dp *d = user;
  if (!d->armed || ps != d->ps || index < 0 || index >= dg_params_count(ps)) return;
  d->left[d->of[index]]--;
  while (d->next < d->nb && d->left[d->next] == 0) {
    post(d, d->next);
    d->early++;
  }
}

int dg__pipe_dp_hook(dg__pipe_dp *d, dg_ctx *c) {
  int id = dg_ctx_add_grad_ready_hook(c, on_ready, d);
  return id > 0 ? DG_OK : id;
}

void dg__pipe_dp_arm(dg__pipe_dp *d, int on) {
  if (on) d->early = 0;
  d->armed = on;
}

/* Ready for the next step: every bucket unposted, every parameter pending. */
static void reset(dg__pipe_dp *d) {
  for (int k = 0; k < d->nb; k++) {
    dg_work_free(d->w[k]);
    d->w[k] = NULL;
  }
  memcpy(d->left, d->need, (size_t)d->nb * sizeof *d->left);
  d->next = 0, d->armed = 0, d->err = 0, d->msg[0] = '\0';
}

int dg__pipe_dp_sync(dg__pipe_dp *d, char *err, size_t cap) {
  while (d->next < d->nb) post(d, d->next);
  const double t0 = 1e-9 * (double)dg__now_ns();
  int rc = d->err;
  for (int k = 0; k < d->nb; k++) {
    int e = d->w[k] ? dg_work_wait(d->w[k], 0) : DG_OK;
    if (e && !rc) {
      rc = e;
      snprintf(d->msg, sizeof d->msg, "bucket %d of %d: %s", k, d->nb, dg_work_errmsg(d->w[k]));
    }
  }
  d->wait = 1e-9 * (double)dg__now_ns() - t0;
  size_t nb = 0;
  float *b = dg_params_buffer_data(d->ps, &nb);
  if (!rc && nb && (rc = dg_pg_broadcast_sync(d->dp, b, nb, DG_F32, 0)))
    snprintf(d->msg, sizeof d->msg, "the running statistics: %s", dg_pg_errmsg(d->dp));
  if (rc) dg__fail_msg(err, cap, rc, "%s", d->msg);
  reset(d);
  return rc;
}

void dg__pipe_dp_abort(dg__pipe_dp *d, int code, const char *msg, int started, int own) {
  if (started || d->next > 0) dg__pg_abort(d->dp, code, msg, own);
  reset(d);
}

void dg__pipe_dp_stats(const dg__pipe_dp *d, int *buckets, int *early, double *wait) {
  *buckets = d->nb, *early = d->early, *wait = d->wait;
}

void dg__pipe_dp_free(dg__pipe_dp *d) {
  if (!d) return;
  if (d->w) reset(d);
  dg__free(d->of), dg__free(d->need), dg__free(d->left), dg__free(d->lo), dg__free(d->w);
  dg__free(d);
}
