/* Balance by time (issue #13 item 4): each rank times its share of the
 * layers on a sample micro-batch, the group sums the costs, and every rank
 * computes the same exact partition from them. */
#include <math.h>
#include <string.h>

#include "dgrad/autograd.h"
#include "dgrad/ops.h"
#include "core/core_impl.h"
#include "dist/net/net_impl.h"
#include "dist/pipe_plan.h"
#include "dist/pipe_profile.h"

enum { REPS = 3 }; /* timed runs per layer after one warm-up; the best counts */
#define TAG_PING 0x70690003u /* the link's ping-pong, before the pipe runs */

static double now_s(void) { return 1e-9 * (double)dg__now_ns(); }

/* Bytes of a layer's parameters and of its buffers: bound alone into a
 * scratch store (the sizes do not depend on the names). */
static int layer_bytes(dg_module *l, uint64_t seed, double *params, double *bufs) {
  dg_params *one;
  if (dg_params_new(&one)) return DG_ENOMEM;
  int rc = dg_module_bind(l, one, "p", seed);
  size_t nb = 0;
  dg_params_buffer_data(one, &nb);
  *params = 4.0 * (double)dg_params_numel(one, 0);
  *bufs = 4.0 * (double)nb;
  dg_params_free(one);
  return rc;
}

/* Bytes of the tensors xs, and of those a gradient flows back through. */
static void tuple_bytes(dg_tensor *const *xs, int n, double *bytes, double *gbytes) {
  *bytes = *gbytes = 0;
  for (int i = 0; i < n; i++) {
    double b = (double)dg_tensor_numel(xs[i]) * (double)dg_dtype_size(dg_tensor_dtype(xs[i]));
    *bytes += b;
    if (dg_tensor_dtype(xs[i]) == DG_F32) *gbytes += b;
  }
}

/* Seconds of layer l's forward and backward on xs (best of REPS after a
 * warm-up) and the arena bytes its forward keeps for the backward. */
static int time_layer(dg_module *l, dg_ctx *c, dg_tensor *const *xs, int nx, double *secs,
                      double *act) {
  *secs = INFINITY;
  for (int r = 0; r <= REPS; r++) {
    dg_ctx_reset(c);
    dg_tensor *xi[DG_MODULE_MAX_IO], *ys[DG_MODULE_MAX_IO], *roots[DG_MODULE_MAX_IO];
    for (int i = 0; i < nx; i++) {
      if (!(xi[i] = dg_empty(c, dg_tensor_dtype(xs[i]), dg_tensor_ndim(xs[i]),
                             dg_tensor_shape(xs[i]))))
        return dg_ctx_errcode(c);
      memcpy(dg_tensor_data(xi[i]), dg_tensor_data(xs[i]),
             (size_t)dg_tensor_numel(xs[i]) * dg_dtype_size(dg_tensor_dtype(xs[i])));
      if (dg_tensor_dtype(xs[i]) == DG_F32) dg_tensor_set_requires_grad(xi[i], 1);
    }
    const size_t used = dg_ctx_arena_used(c);
    int ny = 0, nr = 0;
    double t0 = now_s();
    int rc = dg_module_forward_n(l, c, xi, nx, ys, &ny);
    if (rc) return rc;
    double tf = now_s() - t0;
    *act = (double)(dg_ctx_arena_used(c) - used);
    for (int i = 0; i < ny; i++) /* ones into every output a gradient comes back for */
      if (dg_tensor_requires_grad(ys[i])) roots[nr++] = ys[i];
    double tb = 0;
    if (nr) {
      t0 = now_s();
      if ((rc = dg_backward_multi(c, nr, roots, NULL))) return rc;
      tb = now_s() - t0;
    }
    if (r > 0 && tf + tb < *secs) *secs = tf + tb;
  }
  return DG_OK;
}

/* Times this rank's layers (i % K == rank) with the model bound to tps;
 * the inputs come from a tapeless forward of the chain. ns and mem stay
 * zero for the other layers; bytes[i] and gbytes[i]: what crosses a
 * boundary after layer i, and its gradient. */
static int measure(const dg__pipe_profile_args *a, dg_params *tps, int n, int64_t *ns,
                   int64_t *mem, double *bytes, double *gbytes, char *err, size_t cap) {
  const int K = dg_pg_size(a->pg), rank = dg_pg_rank(a->pg);
  const double inflight = a->kind == 1 ? (a->M < K ? a->M : K) : a->M;
  int rc = DG_OK;
  for (int i = rank; !rc && i < n; i += K) { /* sizes first: this binds layers alone */
    double pb = 0, bb = 0;
    rc = layer_bytes(dg_sequential_get(a->seq, i), a->seed, &pb, &bb);
    mem[i] = (int64_t)(pb * (2.0 + a->optim_factor) + bb);
  }
  if (!rc && dg_module_bind(a->seq, tps, "", a->seed))
    rc = DG_EINVAL;
  if (rc)
    return dg__fail_msg(err, cap, rc, "pipe_new: balance by time: binding the model: %s",
                        dg_params_errmsg(tps));
  dg_ctx *chain = NULL, *c = NULL;
  rc = dg_ctx_new(&chain, NULL) || dg_ctx_new(&c, NULL) ? DG_ENOMEM : DG_OK;
  if (rc) dg__fail_msg(err, cap, rc, "pipe_new: balance by time: out of memory");
  if (!rc) dg_ctx_set_grad_enabled(chain, 0);
  dg_tensor *xs[DG_MODULE_MAX_IO] = {a->sample}, *ys[DG_MODULE_MAX_IO];
  int nx = 1;
  for (int i = 0; !rc && i < n; i++) {
    dg_module *l = dg_sequential_get(a->seq, i);
    if (i % K == rank) {
      double secs = 0, act = 0;
      rc = time_layer(l, c, xs, nx, &secs, &act);
      if (rc) {
        dg__fail_msg(err, cap, rc, "pipe_new: balance by time: rank %d timing layer %d (%s): "
                     "%s", rank, i, dg_module_type(l), dg_ctx_errmsg(c));
        break;
      }
      ns[i] = (int64_t)(secs * 1e9) + 1; /* never 0: an empty layer still costs a hop */
      mem[i] += (int64_t)(act * inflight);
    }
    if (dg_module_forward_n(l, chain, xs, nx, ys, &nx)) {
      rc = dg__fail_msg(err, cap, dg_ctx_errcode(chain), "pipe_new: balance by time: layer %d "
                        "(%s) on the profile input: %s", i, dg_module_type(l),
                        dg_ctx_errmsg(chain));
      break;
    }
    memcpy(xs, ys, (size_t)nx * sizeof *xs);
    tuple_bytes(xs, nx, &bytes[i], &gbytes[i]);
  }
  dg_ctx_free(c);
  dg_ctx_free(chain);
  return rc;
}

/* One round trip of b bytes (a multiple of 4) with peer; the lower rank
 * sends first. */
static int ping(dg_pg *pg, int peer, unsigned char *buf, size_t b) {
  const int first = dg_pg_rank(pg) < peer;
  int rc = DG_OK;
  for (int k = 0; k < 2 && !rc; k++) {
    dg_work *w = NULL;
    rc = (k == 0) == first ? dg_pg_send(pg, buf, b / 4, DG_F32, peer, TAG_PING, &w)
                           : dg_pg_recv(pg, buf, b / 4, DG_F32, peer, TAG_PING, &w);
    if (!rc) rc = dg_work_wait(w, 0);
    dg_work_free(w);
  }
  return rc;
}

/* One-way seconds of b bytes between neighbouring ranks: pairs (0, 1),
 * (2, 3), ... then (1, 2), (3, 4), ...; best of REPS after a warm-up on
 * each; this rank's worst into *secs (0 when it has no neighbour). */
static int link_time(dg_pg *pg, unsigned char *buf, size_t b, double *secs) {
  const int K = dg_pg_size(pg), r = dg_pg_rank(pg);
  *secs = 0;
  for (int phase = 0; phase < 2; phase++) {
    if (r < phase) continue;
    const int peer = (r - phase) % 2 == 0 ? r + 1 : r - 1;
    if (peer >= K || peer < phase) continue;
    double best = INFINITY;
    for (int rep = 0; rep <= REPS; rep++) {
      const double t0 = now_s();
      int rc = ping(pg, peer, buf, b);
      if (rc) return rc;
      if (rep > 0) best = fmin(best, (now_s() - t0) / 2);
    }
    *secs = fmax(*secs, best);
  }
  return DG_OK;
}

/* cut[i] from the boundary sizes: latency + bytes / bandwidth of the
 * slowest measured link, once per direction a boundary is crossed. Every
 * rank gets the same values (the times are agreed on by MAX). */
static int cut_costs(dg_pg *pg, const double *bytes, const double *gbytes, int n, double *cut,
                     char *err, size_t cap) {
  double big = 64;
  for (int i = 0; i + 1 < n; i++) big = fmax(big, bytes[i]);
  big = floor(fmin(big, 4.0 * 1024 * 1024) / 4) * 4; /* whole floats */
  unsigned char *buf = dg__calloc((size_t)big, 1);
  if (!buf) return dg__fail_msg(err, cap, DG_ENOMEM, "pipe_new: balance by time: out of memory");
  double t[2] = {0, 0};
  int rc = link_time(pg, buf, 64, &t[0]);
  if (!rc && big > 64) rc = link_time(pg, buf, (size_t)big, &t[1]);
  dg__free(buf);
  int64_t ns[2] = {(int64_t)(t[0] * 1e9), (int64_t)(t[1] * 1e9)};
  if (!rc) rc = dg_pg_allreduce_sync(pg, ns, 2, DG_I64, DG_RED_MAX);
  if (rc)
    return dg__fail_msg(err, cap, rc, "pipe_new: balance by time: timing the link between "
                        "stages: %s", dg_pg_errmsg(pg));
  const double lat = 1e-9 * (double)ns[0];
  const double per_byte = big > 64 ? fmax(0, (1e-9 * (double)ns[1] - lat) / (big - 64)) : 0;
  for (int i = 0; i + 1 < n; i++)
    cut[i] = lat + bytes[i] * per_byte + (gbytes[i] > 0 ? lat + gbytes[i] * per_byte : 0);
  return DG_OK;
}

int dg__pipe_profile(const dg__pipe_profile_args *a, double *cost, double *cut, int *bounds,
                     char *err, size_t cap) {
  const int n = dg_sequential_len(a->seq), K = dg_pg_size(a->pg);
  int64_t *v = dg__calloc(2 * (size_t)n, sizeof *v);
  double *mem = dg__calloc(3 * (size_t)n, sizeof *mem), *bytes = mem + n, *gbytes = bytes + n;
  dg_params *tps = NULL;
  int rc = !v || !mem || dg_params_new(&tps) ? DG_ENOMEM : DG_OK;
  if (rc) dg__fail_msg(err, cap, rc, "pipe_new: balance by time: out of memory");
  if (!rc) rc = measure(a, tps, n, v, v + n, bytes, gbytes, err, cap);
  /* a failed rank still joins the sum, so that no rank waits for it */
  int64_t failed = rc != DG_OK;
  int e = dg_pg_allreduce_sync(a->pg, &failed, 1, DG_I64, DG_RED_SUM);
  if (!e && !failed) e = dg_pg_allreduce_sync(a->pg, v, 2 * (size_t)n, DG_I64, DG_RED_SUM);
  if (e && !rc)
    rc = dg__fail_msg(err, cap, e, "pipe_new: balance by time: summing the costs: %s",
                      dg_pg_errmsg(a->pg));
  else if (failed && !rc)
    rc = dg__fail_msg(err, cap, DG_EPEER, "pipe_new: balance by time: %lld rank(s) failed to "
                      "time their layers", (long long)failed);
  for (int i = 0; !rc && i < n; i++) cost[i] = 1e-9 * (double)v[i], mem[i] = (double)v[n + i];
  if (!rc) rc = cut_costs(a->pg, bytes, gbytes, n, cut, err, cap);
  double worst = 0;
  if (!rc)
    rc = dg__pipe_partition_cut(cost, cut, a->mem_cap > 0 ? mem : NULL, n, K, a->mem_cap,
                                bounds, &worst, err, cap);
  dg_params_free(tps); /* seq's layers are bound again by the caller */
  dg__free(v), dg__free(mem);
  return rc;
}
