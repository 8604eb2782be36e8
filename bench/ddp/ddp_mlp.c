/* DDP benchmark: the MLP of bench/mlp.c (784-512-256-10, ReLU,
 * cross-entropy, SGD) trained data-parallel on W local ranks (forked here,
 * rendezvous through a FileStore in a temp dir, TCP transport on loopback).
 *
 *   ddp_mlp [--nproc W] [--ddp 0|1] [--batch B] [--threads T] [--steps S]
 *           [--warmup N] [--bucket-mib X] [--first-mib X] [--comm f32|fp16|bf16]
 *           [--no-overlap] [--overlap-fwd [--no-shard]] [--optim sgd|adamw] [--no-join] [--layers 784,512,256,10]
 *           [--parts] [--ring] [--label TEXT] [--trace FILE]
 *
 * --trace FILE records the timeline (dgrad/trace.h) on every rank for the
 * whole run and writes FILE.rank<R> at the end: the overhead of tracing is
 * this run's step_ms against one without the flag.
 * The update is SGD (lr 0.01; --optim adamw: AdamW with its defaults)
 * through dg_optim, then dg_params_zero_grad.
 * --overlap-fwd hands it to DDP (dg_ddp_overlap_optimizer): each bucket's
 * update lands when the next forward reads it, so the all-reduce overlaps
 * the next forward as well as backward.
 *
 * --ring forces Gloo's ring over the TCP sockets (no shared-memory path
 * between local ranks), so that a slowed loopback slows the all-reduce.
 *
 * Environment (read here, into the options): DG_BACKEND, DG_SHM,
 * DG_SPIN_US, DG_SOCKET_IFNAME (dg_pg_opts_from_env), DG_DDP_SHM_INLINE
 * (dg_ddp_opts.engine_thread: 1 none, 0 always), DG_SIM_LINK_GBIT=R (the
 * simulated link of simlink.c, dg_pg_opts.link).
 *
 * --ddp 0 runs the same loop without DDP (W must be 1): the overhead baseline.
 * --parts also times, on every rank, compute alone (forward + backward + SGD
 * with no DDP on a separate context), forward alone, and communication alone
 * (the bucket all-reduces of the gradient buffer, posted back to back,
 * waited together); step_over_fwd_plus_max compares the step with the best
 * an overlap with backward alone allows: forward + max(rest of compute,
 * communication); step_over_max with the best of any overlap.
 *
 * Prints one JSON line from rank 0 with samples/s over all ranks, step time,
 * and DDP's time waiting at backward end (median over ranks is not taken:
 * rank 0's own figures), and "ranks": every rank's step split into phases,
 * mean ms per step over the first timed window:
 *   forward_ms    forward and loss
 *   backward_ms   backward's own work (its hooks included), DDP's wait not
 *   avg_wait_ms   waiting for the gradient averaging (dg_ddp_stats.wait_s;
 *                 with --overlap-fwd it happens in the next forward and is
 *                 taken out of forward_ms instead)
 *   peer_wait_ms  the part of avg_wait_ms during which a peer was still
 *                 computing its backward: time this rank lost to a late peer
 *                 rather than to communication (null with --overlap-fwd)
 *   optim_ms      the optimizer step, zero_grad and dg_ctx_reset
 *   step_ms, step_max_ms   the mean and the slowest step
 * The ranks write per-step timestamps into memory shared across the fork
 * (CLOCK_MONOTONIC is one clock for every process of the host); a rank's
 * wait starts at its backward end minus its wait, and a peer finishes
 * computing at its own backward end minus its own wait. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <dgrad.h>
#include <dgrad/dist.h>

#include "simlink.h"

#define MAXL 32

typedef struct {
  int nproc, ddp, threads, no_overlap, overlap_fwd, no_shard, no_join, parts, nl, ring;
  long batch, steps, warmup;
  double bucket_mib, first_mib;
  const char *comm, *label, *trace, *optim;
  int64_t dims[MAXL + 1];
} bopts;

typedef struct {
  dg_params *ps;
  dg_tensor *w[MAXL], *b[MAXL];
} mlp;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int mlp_init(mlp *m, const bopts *o) {
  int rc = dg_params_new(&m->ps);
  for (int l = 0; !rc && l < o->nl; l++) {
    char name[32];
    int64_t ws[2] = {o->dims[l + 1], o->dims[l]};
    snprintf(name, sizeof name, "fc%d.weight", l + 1);
    rc = dg_params_add(m->ps, name, 2, ws, &m->w[l]);
    snprintf(name, sizeof name, "fc%d.bias", l + 1);
    if (!rc) rc = dg_params_add(m->ps, name, 1, ws, &m->b[l]);
  }
  for (int l = 0; !rc && l < o->nl; l++) {
    float bound = 1.0f / sqrtf((float)o->dims[l]);
    dg_init_uniform(m->w[l], -bound, bound, 1234 + (uint64_t)l);
    dg_init_uniform(m->b[l], -bound, bound, 4321 + (uint64_t)l);
  }
  return rc;
}

static double g_bwd_s; /* time inside dg_backward, summed over steps */

/* One step of one rank: CLOCK_MONOTONIC seconds at its start, forward end,
 * backward end and end; DDP's wait inside it (s). */
typedef struct {
  double t0, fwd, bwd, end, wait;
} step_rec;
static step_rec *g_rec; /* (nproc, steps), MAP_SHARED across the fork */
static int g_rec_on, g_rank;
static long g_rec_n; /* steps recorded by this rank */

static double ddp_wait_s(const dg_ddp *ddp) {
  dg_ddp_stats st;
  return ddp && !dg_ddp_get_stats(ddp, &st) ? st.wait_s : 0.0;
}

/* Forward + backward + SGD (forward and loss only when `fwd_only`);
 * returns the loss or NAN. */
static float step(dg_ctx *ctx, mlp *m, const bopts *o, float *x, int64_t *y, dg_ddp *ddp,
                  dg_optim *opt, int fwd_only) {
  int64_t B = o->batch, xs[2] = {B, o->dims[0]};
  step_rec *rec = g_rec_on && g_rec_n < o->steps ? &g_rec[g_rank * o->steps + g_rec_n++] : NULL;
  double w0 = rec ? ddp_wait_s(ddp) : 0.0;
  if (rec) rec->t0 = now_s();
  dg_tensor *h = dg_wrap(ctx, DG_F32, 2, xs, x);
  for (int l = 0; l < o->nl; l++) {
    h = dg_linear(ctx, h, m->w[l], m->b[l]);
    if (l < o->nl - 1) h = dg_relu(ctx, h);
  }
  dg_tensor *loss = dg_cross_entropy(ctx, h, dg_wrap(ctx, DG_I64, 1, &B, y));
  if (loss && fwd_only) {
    float lv = dg_tensor_item(loss);
    dg_ctx_reset(ctx);
    return lv;
  }
  double tb = now_s();
  if (rec) rec->fwd = tb;
  int brc = loss ? dg_backward(ctx, loss) : -1;
  g_bwd_s += now_s() - tb; /* with DDP: its wait at backward end included */
  if (rec) rec->bwd = now_s();
  if (brc) {
    fprintf(stderr, "ddp_mlp: step failed: %s\n", dg_ctx_errmsg(ctx));
    return NAN;
  }
  float lv = dg_tensor_item(loss);
  if (!ddp || dg_ddp_step_ready(ddp)) { /* 0 when DDP owns the step */
    dg_optim_step(opt);
    dg_params_zero_grad(m->ps);
  }
  dg_ctx_reset(ctx);
  if (rec) rec->end = now_s(), rec->wait = ddp_wait_s(ddp) - w0;
  return lv;
}

/* Prints ,"ranks":[...] from every rank's records (see the top). */
static void print_phases(const bopts *o) {
  printf(",\"ranks\":[");
  for (int r = 0; r < o->nproc; r++) {
    double f = 0, b = 0, w = 0, pw = 0, op = 0, st = 0, mx = 0;
    for (long s = 0; s < o->steps; s++) {
      const step_rec *e = &g_rec[r * o->steps + s];
      double late = 0; /* the last peer's compute end after this rank's wait began */
      for (int p = 0; p < o->nproc; p++) {
        const step_rec *q = &g_rec[p * o->steps + s];
        double d = (q->bwd - q->wait) - (e->bwd - e->wait);
        if (p != r && d > late) late = d;
      }
      f += e->fwd - e->t0 - (o->overlap_fwd ? e->wait : 0);
      b += e->bwd - e->fwd - (o->overlap_fwd ? 0 : e->wait);
      w += e->wait;
      pw += late < e->wait ? late : e->wait;
      op += e->end - e->bwd;
      st += e->end - e->t0;
      if (e->end - e->t0 > mx) mx = e->end - e->t0;
    }
    double k = 1e3 / (double)o->steps;
    printf("%s{\"rank\":%d,\"forward_ms\":%.4f,\"backward_ms\":%.4f,\"avg_wait_ms\":%.4f,", r ? "," : "",
           r, f * k, b * k, w * k);
    if (o->overlap_fwd) printf("\"peer_wait_ms\":null,");
    else printf("\"peer_wait_ms\":%.4f,", pw * k);
    printf("\"optim_ms\":%.4f,\"step_ms\":%.4f,\"step_max_ms\":%.4f}", op * k, st * k, mx * 1e3);
  }
  printf("]");
}

/* Seconds per step of `steps` steps after `warmup`. */
static double time_steps(dg_ctx *ctx, mlp *m, const bopts *o, float *x, int64_t *y, dg_ddp *ddp,
                         dg_optim *opt, float *loss, int fwd_only) {
  for (long s = 0; s < o->warmup; s++)
    if (isnan(*loss = step(ctx, m, o, x, y, ddp, opt, fwd_only))) return -1;
  g_bwd_s = 0;
  double t0 = now_s();
  for (long s = 0; s < o->steps; s++)
    if (isnan(*loss = step(ctx, m, o, x, y, ddp, opt, fwd_only))) return -1;
  return (now_s() - t0) / (double)o->steps;
}

/* Communication alone: the DDP's buckets of the gradient buffer, posted back
 * to back and waited together; seconds per round. */
static double time_comm(dg_pg *pg, dg_ddp *ddp, mlp *m, const bopts *o) {
  int nb = 0;
  dg_ddp_stats st;
  dg_ddp_get_stats(ddp, &st);
  nb = st.nbuckets;
  float *g = dg_params_grad(m->ps, NULL);
  dg_work *w[256];
  double total = 0;
  long rounds = o->steps / 2 + 2;
  for (long it = 0; it < rounds; it++) {
    dg_pg_barrier_sync(pg);
    double t0 = now_s();
    size_t off = 0;
    for (int k = 0; k < nb && k < 256; k++) {
      size_t bytes;
      dg_ddp_bucket_info(ddp, k, NULL, &bytes, NULL);
      dg_pg_allreduce(pg, g + off, bytes / 4, DG_F32, DG_RED_AVG, &w[k]);
      off += bytes / 4;
    }
    for (int k = 0; k < nb && k < 256; k++) {
      dg_work_wait(w[k], 0);
      dg_work_free(w[k]);
    }
    if (it >= 2) total += now_s() - t0; /* two warm-up rounds */
  }
  return total / (double)(rounds - 2);
}

static int make_pg(int r, const bopts *o, const char *dir, dg_store **st, dg_pg **pg) {
  int rc = dg_store_new_file(st, dir, 60000, NULL, 0);
  dg_pg_opts po;
  memset(&po, 0, sizeof po);
  po.rank = r;
  po.world_size = o->nproc;
  po.store = *st;
  po.timeout_ms = 60000;
  po.link = simlink_from_env();
  dg_pg_opts_from_env(&po);
  char err[256] = "";
  if (!rc) rc = dg_pg_new(pg, &po, err, sizeof err);
  if (!rc && o->ring) rc = dg_pg_set_algo(*pg, DG_ALGO_RING);
  if (rc) fprintf(stderr, "ddp_mlp: rank %d: group: %s %s\n", r, dg_strerror(rc), err);
  return rc;
}

/* Waits (5 ms polls, up to 20 s) until store counter `key` reaches n. */
static void wait_count(dg_store *st, const char *key, int n) {
  int64_t v = 0;
  for (int i = 0; i < 4000 && !dg_store_add(st, key, 0, &v) && v < n; i++) usleep(5000);
  if (v < n) fprintf(stderr, "ddp_mlp: %s: %lld of %d ranks after 20 s\n", key, (long long)v, n);
}

/* Leaves once every rank is done with its collectives (see tests/ddp). */
static void leave(dg_store *st, dg_pg *pg, int W) {
  int64_t n = 0;
  dg_store_add(st, "bench_done", 1, &n);
  for (int i = 0; i < 4000 && n < W; i++) {
    usleep(5000);
    dg_store_add(st, "bench_done", 0, &n);
  }
  dg_pg_free(pg);
  dg_store_free(st);
}

/* parts: compute, forward, communication, backward alone, backward in the
 * DDP step (seconds) */
static void print_json(const bopts *o, double step_s, const dg_ddp_stats *st, const double *pt,
                       float loss) {
  double comp_s = pt[0], fwd_s = pt[1], comm_s = pt[2], bwd_s = pt[3], bwd_ddp_s = pt[4];
  printf("{\"impl\":\"dgrad\",\"bench\":\"ddp_mlp\",\"label\":\"%s\",\"nproc\":%d,\"ddp\":%d,"
         "\"batch\":%ld,\"threads\":%d,\"steps\":%ld,\"bucket_mib\":%g,\"first_mib\":%g,"
         "\"comm\":\"%s\",\"overlap\":%d,\"overlap_fwd\":%d,\"join\":%d,\"nbuckets\":%d,\"step_ms\":%.4f,"
         "\"samples_per_s\":%.1f,\"wait_ms\":%.4f,\"trace\":%d",
         o->label, o->nproc, o->ddp, o->batch, o->threads, o->steps, o->bucket_mib, o->first_mib,
         o->comm, !o->no_overlap, o->overlap_fwd, !o->no_join, st->nbuckets, step_s * 1e3,
         (double)o->nproc * (double)o->batch / step_s,
         st->sync_steps ? st->wait_s / (double)st->sync_steps * 1e3 : 0.0, o->trace != NULL);
  /* DDP overlaps communication with backward only: the best a step can do
   * is forward + max(the rest of compute, communication) */
  double rest = comp_s - fwd_s, ideal = fwd_s + (rest > comm_s ? rest : comm_s);
  if (o->parts)
    printf(",\"compute_ms\":%.4f,\"forward_ms\":%.4f,\"comm_ms\":%.4f,\"step_over_max\":%.3f,"
           "\"step_over_sum\":%.3f,\"step_over_fwd_plus_max\":%.3f,\"backward_ms\":%.4f,"
           "\"backward_ddp_ms\":%.4f,\"backward_ddp_over_max\":%.3f",
           comp_s * 1e3, fwd_s * 1e3, comm_s * 1e3, step_s / (comp_s > comm_s ? comp_s : comm_s),
           step_s / (comp_s + comm_s), step_s / ideal, bwd_s * 1e3, bwd_ddp_s * 1e3,
           bwd_ddp_s / (bwd_s > comm_s ? bwd_s : comm_s));
  if (g_rec) print_phases(o);
  printf(",\"loss\":%.5f}\n", (double)loss);
  fflush(stdout);
}

static int rank_main(int r, const bopts *o, const char *dir) {
  dg_set_num_threads(o->threads);
  dg_store *st = NULL;
  dg_pg *pg = NULL;
  dg_ctx *ctx = NULL, *ctx2 = NULL;
  dg_ddp *ddp = NULL;
  dg_optim *opt = NULL, *opt2 = NULL; /* opt2: the compute-alone runs */
  mlp m;
  memset(&m, 0, sizeof m);
  if (o->trace && dg_trace_start(NULL)) return 10;
  if (o->ddp && make_pg(r, o, dir, &st, &pg)) return 10;
  dg_sgd_opts so = dg_sgd_defaults();
  so.lr = 0.01f;
  dg_adamw_opts ao = dg_adamw_defaults();
  int adam = !strcmp(o->optim, "adamw");
  if (mlp_init(&m, o) || dg_ctx_new(&ctx, NULL) || dg_ctx_new(&ctx2, NULL) ||
      (adam ? dg_optim_new_adamw(&opt, m.ps, &ao, NULL, 0) ||
                  dg_optim_new_adamw(&opt2, m.ps, &ao, NULL, 0)
            : dg_optim_new_sgd(&opt, m.ps, &so, NULL, 0) ||
                  dg_optim_new_sgd(&opt2, m.ps, &so, NULL, 0)))
    return 11;
  size_t nx = (size_t)o->batch * (size_t)o->dims[0];
  float *x = malloc(nx * sizeof *x);
  int64_t *y = malloc((size_t)o->batch * sizeof *y);
  dg_rng_normal(42 + (uint64_t)r, 0, x, nx);
  for (long i = 0; i < o->batch; i++) y[i] = (i * 7 + r) % o->dims[o->nl];
  if (o->ddp) {
    dg_ddp_opts d = dg_ddp_defaults();
    d.bucket_cap_bytes = (size_t)(o->bucket_mib * 1048576.0);
    d.first_bucket_bytes = (size_t)(o->first_mib * 1048576.0);
    d.comm = !strcmp(o->comm, "fp16") ? DG_DDP_COMM_FP16
             : !strcmp(o->comm, "bf16") ? DG_DDP_COMM_BF16 : DG_DDP_COMM_F32;
    d.no_overlap = o->no_overlap;
    d.no_join = o->no_join;
    d.shard_update = o->no_shard ? -1 : 0;
    const char *e = getenv("DG_DDP_SHM_INLINE"); /* "1": no engine thread, "0": one */
    if (e && (*e == '0' || *e == '1')) d.engine_thread = *e == '1' ? -1 : 1;
    char err[512];
    if (dg_ddp_new(&ddp, ctx, m.ps, pg, &d, err, sizeof err)) {
      fprintf(stderr, "ddp_mlp: rank %d: %s\n", r, err);
      return 12;
    }
    if (o->overlap_fwd && dg_ddp_overlap_optimizer(ddp, opt)) return 12;
  }
  float loss = 0;
  g_rank = r;
  g_rec_on = g_rec != NULL; /* the first timed window (after its warmup) */
  double step_s = time_steps(ctx, &m, o, x, y, ddp, opt, &loss, 0), comp_s = 0, comm_s = 0, fwd_s = 0;
  g_rec_on = 0;
  if (st) dg_store_add(st, "phases_done", 1, NULL); /* rank 0 reads them below */
  double bwd_ddp_s = g_bwd_s / (double)o->steps, bwd_s = 0;
  if (step_s < 0) return 13;
  dg_ddp_stats sts;
  memset(&sts, 0, sizeof sts);
  if (ddp) {
    dg_ddp_get_stats(ddp, &sts);
    sts.wait_s = 0; /* count the timed steps only: measure again */
    sts.sync_steps = 0;
  }
  if (ddp) { /* wait time over a second timed window */
    dg_ddp_stats a, b;
    dg_ddp_get_stats(ddp, &a);
    bopts o2 = *o;
    o2.warmup = 0;
    step_s = 0.5 * (step_s + time_steps(ctx, &m, &o2, x, y, ddp, opt, &loss, 0));
    dg_ddp_get_stats(ddp, &b);
    sts.wait_s = b.wait_s - a.wait_s;
    sts.sync_steps = b.sync_steps - a.sync_steps;
  }
  if (o->parts && ddp) {
    float fl = 0;
    comp_s = time_steps(ctx2, &m, o, x, y, NULL, opt2, &fl, 0);
    bwd_s = g_bwd_s / (double)o->steps;
    fwd_s = time_steps(ctx2, &m, o, x, y, NULL, opt2, &fl, 1);
    comm_s = time_comm(pg, ddp, &m, o);
  }
  if (r == 0 && st) wait_count(st, "phases_done", o->nproc);
  if (r == 0) print_json(o, step_s, &sts, (double[]){comp_s, fwd_s, comm_s, bwd_s, bwd_ddp_s}, loss);
  if (o->trace) {
    char path[4200], err[256] = "";
    snprintf(path, sizeof path, "%s.rank%d", o->trace, r);
    if (dg_trace_stop() || dg_trace_write(path, r, err, sizeof err)) {
      fprintf(stderr, "ddp_mlp: rank %d: trace: %s\n", r, err);
      return 14;
    }
  }
  dg_ddp_free(ddp);
  dg_optim_free(opt);
  dg_optim_free(opt2);
  if (pg) leave(st, pg, o->nproc);
  dg_ctx_free(ctx);
  dg_ctx_free(ctx2);
  dg_params_free(m.ps);
  free(x);
  free(y);
  return 0;
}

static int parse_layers(bopts *o, const char *s) {
  o->nl = -1;
  while (*s && o->nl < MAXL) {
    char *end;
    o->dims[++o->nl] = strtol(s, &end, 10);
    if (end == s || o->dims[o->nl] <= 0) return -1;
    s = *end == ',' ? end + 1 : end;
  }
  return o->nl >= 1 ? 0 : -1;
}

static int parse(bopts *o, int argc, char **argv) {
  *o = (bopts){.nproc = 1, .ddp = 1, .threads = 1, .batch = 64, .steps = 200, .warmup = 20,
               .bucket_mib = 25, .first_mib = 1, .comm = "f32", .label = "", .optim = "sgd"};
  parse_layers(o, "784,512,256,10");
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--no-overlap")) o->no_overlap = 1;
    else if (!strcmp(a, "--overlap-fwd")) o->overlap_fwd = 1;
    else if (!strcmp(a, "--no-shard")) o->no_shard = 1; /* with --overlap-fwd */
    else if (!strcmp(a, "--no-join")) o->no_join = 1;
    else if (!strcmp(a, "--parts")) o->parts = 1;
    else if (!strcmp(a, "--ring")) o->ring = 1; /* sockets even between local ranks */
    else if (!v) return -1;
    else if (!strcmp(a, "--nproc")) o->nproc = atoi(v), i++;
    else if (!strcmp(a, "--ddp")) o->ddp = atoi(v), i++;
    else if (!strcmp(a, "--batch")) o->batch = atol(v), i++;
    else if (!strcmp(a, "--threads")) o->threads = atoi(v), i++;
    else if (!strcmp(a, "--steps")) o->steps = atol(v), i++;
    else if (!strcmp(a, "--warmup")) o->warmup = atol(v), i++;
    else if (!strcmp(a, "--bucket-mib")) o->bucket_mib = atof(v), i++;
    else if (!strcmp(a, "--first-mib")) o->first_mib = atof(v), i++;
    else if (!strcmp(a, "--comm")) o->comm = v, i++;
    else if (!strcmp(a, "--label")) o->label = v, i++;
    else if (!strcmp(a, "--optim")) o->optim = v, i++; /* sgd (default) | adamw */
    else if (!strcmp(a, "--trace")) o->trace = v, i++;
    else if (!strcmp(a, "--layers")) {
      if (parse_layers(o, v)) return -1;
      i++;
    } else return -1;
  }
  if (o->nproc < 1 || o->nproc > 64 || o->batch < 1 || o->steps < 1) return -1;
  if (!o->ddp && o->nproc != 1) return -1;
  if (strcmp(o->optim, "sgd") && strcmp(o->optim, "adamw")) return -1;
  if (o->warmup < 3) o->warmup = 3;
  return 0;
}

int main(int argc, char **argv) {
  bopts o;
  if (parse(&o, argc, argv)) {
    fprintf(stderr, "usage: %s [--nproc W] [--ddp 0|1] [--batch B] [--threads T] [--steps S] "
            "[--warmup N] [--bucket-mib X] [--first-mib X] [--comm f32|fp16|bf16] "
            "[--no-overlap] [--overlap-fwd] [--no-shard] [--optim sgd|adamw] [--no-join] [--parts] [--layers a,b,..] [--label L] "
            "[--trace FILE]\n", argv[0]);
    return 2;
  }
  char dir[64] = "/tmp/dg_ddp_bench_XXXXXX";
  if (!mkdtemp(dir)) return 1;
  /* every rank's step records, shared across the fork (print_phases) */
  size_t rec_bytes = (size_t)o.nproc * (size_t)o.steps * sizeof(step_rec);
  g_rec = mmap(NULL, rec_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (g_rec == MAP_FAILED) g_rec = NULL; /* no phases then, the rest still runs */
  pid_t pid[64];
  for (int r = 0; r < o.nproc; r++) {
    pid[r] = fork();
    if (pid[r] == 0) _exit(rank_main(r, &o, dir));
  }
  int bad = 0;
  for (int r = 0; r < o.nproc; r++) {
    int st;
    waitpid(pid[r], &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) {
      fprintf(stderr, "ddp_mlp: rank %d failed (status 0x%x)\n", r, st);
      bad = 1;
    }
  }
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd)) bad = 1;
  if (g_rec) munmap(g_rec, rec_bytes);
  return bad;
}
