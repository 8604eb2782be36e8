/* The pipe runtime: one stage per rank, micro-batches driven by the
 * validated action table of dist/pipe_plan.c. A micro-batch's tape and
 * activations live in one of a small pool of contexts (as many as the
 * schedule keeps alive on this stage) from its first action until its
 * backward ran and its sends completed, so 1F1B holds fewer than GPipe; all
 * of them accumulate into the stage's parameter store. Sends are
 * asynchronous; receives wait, bounded by the group's timeout (the table was
 * proven deadlock-free before it ran). Receives are posted ahead, so that
 * a message lands while the stage computes instead of after it asks: a
 * micro-batch's gradient when its activation is sent, the next activation
 * (header and data, into a staging buffer of the step's boundary size) when
 * the current one arrived. Point-to-point messages wait for their receive
 * (Gloo's protocol), so without that every boundary paid a round trip.
 * With re-materialization the forward runs without a tape in a scratch
 * context and the backward recomputes the stage there first. With
 * opts.swap the contexts that hold a tape swap: the pool's, or with
 * re-materialization the scratch context. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dgrad/autograd.h"
#include "dgrad/ops.h"
#include "dgrad/optim.h"
#include "dgrad/pipe.h"
#include "core/core_impl.h"
#include "dist/net/net_impl.h"
#include "dist/pg_ext.h"
#include "dist/pipe_plan.h"
#include "dist/pipe_dp.h"
#include "dist/pipe_profile.h"
#include "dist/pipe_ring.h"
#include "base/trace_impl.h"

enum { TAG_ACT = 0x70690001u, TAG_GRAD = 0x70690002u, TAG_RING = 0x70690003u };
#define NT DG_PIPE_MAX_TENSORS
#define TSZ (3 + DG_MAX_DIMS) /* a tensor in a header: ndim, dtype, grad, shape */
#define SHP (1 + NT * TSZ)    /* a boundary: its tensors' count, then each */
#define HDR (SHP + 2)         /* SHP, step, 1: in the receiver's ring */
#define ALIGN 64              /* a boundary's tensors start on cache lines */
enum { S_HDR = 0, S_ACT = 1, S_GRAD = 1 + NT, NSENDS = 1 + 2 * NT };

typedef struct {
  dg_tensor *in[NT], *out[NT], *gout[NT], *gin[NT]; /* gin: the gradients sent back */
  int nin, nout;
  int slot;                         /* pool context, -1: none */
  int done;                         /* every action ran; waits for its sends */
  dg_work *sends[NSENDS];
  dg_work *grecv[NT];               /* gout's receives, posted with the activation's send */
  int gring;                        /* gout is in this rank's ring; grecv[0] a notice */
  int64_t note, note_out;           /* the gradient's notice (its step) in, out */
} pipe_mb;

/* The next activation's receives, posted ahead into pipe-owned memory. */
typedef struct {
  int mb;                   /* the micro-batch posted, -1: none */
  dg_work *hdr, *data[NT];
  int64_t h[HDR];           /* the header being received, ahead or not */
  void *buf;                /* the step's boundary bytes; grows, never shrinks */
  size_t cap;
} pipe_ahead;

struct dg_pipe {
  dg_pg *pg, *dp;
  dg__pipe_dp *dpx; /* the replicas' all-reduce, with dp */
  dg_params *ps;
  dg_module *stage;
  int K, s, M, first, last, nlayers, remat, kind, transport;
  uint64_t seed;
  dg__pipe_table tab;
  dg_ctx **pool; /* npool contexts */
  int *owner;    /* micro-batch holding each, -1: free */
  int npool;
  dg_ctx *rctx;  /* re-materialization: tapeless forwards, recomputed backwards */
  pipe_mb *mb;   /* M */
  int64_t *hdr_out;    /* (M, HDR) headers sent, alive until their sends end */
  int64_t shape0[SHP]; /* the step's boundary: count, then each tensor's ndim, dtype, grad,
                          shape */
  pipe_ahead ahead;
  dg__pipe_link prev, next; /* rings written directly (pipe_ring.h) */
  size_t in_bytes, out_bytes; /* the last boundary received, sent (f32: 0 else) */
  float *bufsave;      /* running statistics kept across a recomputation */
  size_t nbuf;
  double *cost;        /* measured per-layer cost, or NULL */
  int eval;            /* running dg_pipe_eval */
  int64_t step;
  double loss_sum, wait;
  dg_pipe_stats st;
  char errmsg[1024]; /* a failing op's message and where this stage was */
};

#define FAIL(p, code, ...) dg__fail_msg((p)->errmsg, sizeof (p)->errmsg, code, __VA_ARGS__)

static double now_s(void) { return 1e-9 * (double)dg__now_ns(); }

dg_pipe_opts dg_pipe_defaults(void) {
  dg_pipe_opts o;
  memset(&o, 0, sizeof o);
  o.optim_factor = 2;
  return o;
}

const char *dg_pipe_errmsg(const dg_pipe *p) { return p ? p->errmsg : "no pipe"; }

int dg_pipe_stage(const dg_pipe *p, int *first, int *last) {
  if (!p) return DG_EINVAL;
  if (first) *first = p->first;
  if (last) *last = p->last;
  return p->s;
}

void dg_pipe_set_train(dg_pipe *p, int train) {
  if (p) dg_module_set_train(p->stage, train);
}

dg_module *dg_pipe_module(const dg_pipe *p) { return p ? p->stage : NULL; }

int dg_pipe_get_stats(const dg_pipe *p, dg_pipe_stats *out) {
  if (!p || !out) return DG_EINVAL;
  *out = p->st;
  out->arena_reserved = 0;
  for (int k = 0; k < p->npool; k++) out->arena_reserved += dg_ctx_arena_reserved(p->pool[k]);
  if (p->rctx) out->arena_reserved += dg_ctx_arena_reserved(p->rctx);
  return DG_OK;
}

int dg_pipe_contexts(const dg_pipe *p, dg_ctx **ctxs, int cap, int *n) {
  if (!p || (!ctxs && cap) || cap < 0) return DG_EINVAL;
  const int total = p->npool + (p->rctx != NULL);
  if (n) *n = total;
  for (int k = 0; k < total && k < cap; k++) ctxs[k] = k < p->npool ? p->pool[k] : p->rctx;
  return DG_OK;
}

int dg_pipe_layer_cost(const dg_pipe *p, double *cost, int cap, int *n) {
  if (!p || (!cost && cap)) return DG_EINVAL;
  if (n) *n = p->nlayers;
  if (!p->cost) return DG_ENOTFOUND;
  for (int i = 0; i < p->nlayers && i < cap; i++) cost[i] = p->cost[i];
  return DG_OK;
}

int dg_pipe_boundary_cost(const dg_pipe *p, double *cut, int cap, int *n) {
  if (!p || (!cut && cap)) return DG_EINVAL;
  if (n) *n = p->nlayers > 0 ? p->nlayers - 1 : 0;
  if (!p->cost) return DG_ENOTFOUND;
  for (int i = 0; i + 1 < p->nlayers && i < cap; i++) cut[i] = p->cost[p->nlayers + i];
  return DG_OK;
}

/* ---- creation ---- */

/* Every rank states (layers, M, schedule, remat, boundaries, balance); all
 * must agree. */
static int agree(dg_pipe *p, const int *bounds, char *err, size_t cap) {
  const int n = 5 + p->K + 1;
  int64_t mine[5 + DG__PIPE_MAX_STAGES + 1], *all = dg__malloc((size_t)n * p->K * sizeof *all);
  if (!all) return dg__fail_msg(err, cap, DG_ENOMEM, "pipe_new: out of memory");
  mine[0] = p->nlayers, mine[1] = p->M, mine[2] = p->kind, mine[3] = p->remat;
  mine[4] = p->transport;
  for (int s = 0; s <= p->K; s++) mine[5 + s] = bounds[s];
  int rc = dg_pg_allgather_sync(p->pg, mine, all, (size_t)n, DG_I64);
  if (rc) dg__fail_msg(err, cap, rc, "pipe_new: rank %d: exchanging the configuration: %s",
                       p->s, dg_pg_errmsg(p->pg));
  for (int r = 0; !rc && r < p->K; r++)
    if (memcmp(all + (size_t)r * n, mine, (size_t)n * sizeof *mine)) {
      const int64_t *o = all + (size_t)r * n;
      rc = dg__fail_msg(err, cap, DG_EMISMATCH, "pipe_new: rank %d has %lld layers, %lld "
                        "micro-batches, schedule %s, remat %lld, transport_boundaries %lld, "
                        "stage 1 from layer %lld; rank %d has %lld, %lld, %s, %lld, %lld, %lld",
                        p->s, (long long)mine[0], (long long)mine[1],
                        dg__pipe_kind_name((int)mine[2]), (long long)mine[3], (long long)mine[4],
                        (long long)(p->K > 1 ? mine[6] : 0), r, (long long)o[0], (long long)o[1],
                        dg__pipe_kind_name((int)o[2]), (long long)o[3], (long long)o[4],
                        (long long)(p->K > 1 ? o[6] : 0));
    }
  dg__free(all);
  return rc;
}

/* Keeps layers [first, last) of seq (bound under their own names), frees
 * the rest. */
static int take_stage(dg_pipe *p, dg_module *seq, char *err, size_t cap) {
  dg_module *mid = NULL, *tail = NULL;
  int rc = dg_sequential_split(seq, p->last, &tail);
  if (!rc) rc = dg_sequential_split(seq, p->first, &mid);
  dg_module_free(tail); /* the later stages' layers */
  dg_module_free(seq);  /* the earlier stages' (all of it when a split failed) */
  if (rc) {
    dg_module_free(mid);
    return dg__fail_msg(err, cap, rc, "pipe_new: cannot split the model at layers %d, %d",
                        p->first, p->last);
  }
  p->stage = mid;
  rc = dg_module_bind(mid, p->ps, "", p->seed);
  if (rc) return dg__fail_msg(err, cap, rc, "pipe_new: binding stage %d: %s", p->s,
                              dg_params_errmsg(p->ps));
  return DG_OK;
}

/* Swapping on context c (pool context k, or the recomputation's: k < 0). */
static int ctx_swap(dg_pipe *p, dg_ctx *c, int k, const dg_swap_opts *swap, char *err,
                    size_t cap) {
  int rc = dg_ctx_set_swap(c, swap);
  if (!rc) return DG_OK;
  char what[48];
  if (k < 0) snprintf(what, sizeof what, "the recomputation context");
  else snprintf(what, sizeof what, "micro-batch context %d", k);
  return dg__fail_msg(err, cap, rc, "pipe_new: stage %d: turning swapping on for %s: %s", p->s,
                      what, dg_ctx_errmsg(c));
}

/* The stage's contexts, swapping when asked: before the stage is bound, so
 * that options dg_ctx_set_swap refuses leave the store as it was. */
static int make_contexts(dg_pipe *p, int npool, const dg_swap_opts *swap, char *err, size_t cap) {
  p->npool = npool;
  p->pool = dg__calloc((size_t)npool, sizeof *p->pool);
  p->owner = dg__malloc((size_t)npool * sizeof *p->owner);
  if (!p->pool || !p->owner) return dg__fail_msg(err, cap, DG_ENOMEM, "pipe_new: out of memory");
  for (int k = 0; k < npool; k++) {
    p->owner[k] = -1;
    if (dg_ctx_new(&p->pool[k], NULL))
      return dg__fail_msg(err, cap, DG_ENOMEM, "pipe_new: out of memory");
    /* with remat the pool holds boundaries only: the recomputation saves */
    int rc = swap && !p->remat ? ctx_swap(p, p->pool[k], k, swap, err, cap) : DG_OK;
    if (rc) return rc;
  }
  if (p->remat && dg_ctx_new(&p->rctx, NULL))
    return dg__fail_msg(err, cap, DG_ENOMEM, "pipe_new: out of memory");
  return p->remat && swap ? ctx_swap(p, p->rctx, -1, swap, err, cap) : DG_OK;
}

static int alloc_state(dg_pipe *p, char *err, size_t cap) {
  const size_t M = (size_t)p->M;
  p->mb = dg__calloc(M, sizeof *p->mb);
  p->hdr_out = dg__calloc(M * HDR, sizeof *p->hdr_out);
  dg_params_buffer_data(p->ps, &p->nbuf);
  p->bufsave = p->remat && p->nbuf ? dg__malloc(p->nbuf * sizeof *p->bufsave) : NULL;
  if (!p->mb || !p->hdr_out || (p->remat && p->nbuf && !p->bufsave))
    return dg__fail_msg(err, cap, DG_ENOMEM, "pipe_new: out of memory");
  for (size_t m = 0; m < M; m++) p->mb[m].slot = -1;
  p->ahead.mb = -1;
  /* neighbours on this host are written directly unless asked not to */
  p->prev.peer = p->s - 1, p->next.peer = p->s + 1 < p->K ? p->s + 1 : -1;
  p->prev.pid = p->s > 0 && !p->transport ? dg__pg_peer_pid(p->pg, p->s - 1) : 0;
  p->next.pid = p->next.peer >= 0 && !p->transport ? dg__pg_peer_pid(p->pg, p->s + 1) : 0;
  return DG_OK;
}

/* The stage bounds: explicit, measured, or even. */
static int choose_bounds(dg_pipe *p, dg_module *seq, const dg_pipe_opts *o, int *bounds,
                         char *err, size_t cap) {
  if (p->nlayers < 0 || p->M < 1 || p->K > DG__PIPE_MAX_STAGES)
    return dg__fail_msg(err, cap, DG_EINVAL, "pipe_new: need a Sequential, micro_batches >= 1 "
                        "and at most %d ranks (got %d micro-batches, %d ranks)",
                        DG__PIPE_MAX_STAGES, p->M, p->K);
  if (o->balance) {
    int rc = dg__pipe_balance_check(o->balance, p->K, p->nlayers, err, cap);
    for (int s = 0; !rc && s <= p->K; s++) bounds[s] = s ? bounds[s - 1] + o->balance[s - 1] : 0;
    return rc;
  }
  if (p->nlayers < p->K)
    return dg__fail_msg(err, cap, DG_EINVAL, "pipe_new: %d layers cannot fill %d stages",
                        p->nlayers, p->K);
  if (o->profile_input) {
    p->cost = dg__malloc(2 * (size_t)p->nlayers * sizeof *p->cost); /* cost, then cut */
    if (!p->cost) return dg__fail_msg(err, cap, DG_ENOMEM, "pipe_new: out of memory");
    dg__pipe_profile_args a = {seq, p->pg, o->profile_input, p->seed, p->M, p->kind,
                               o->mem_cap, o->optim_factor};
    return dg__pipe_profile(&a, p->cost, p->cost + p->nlayers, bounds, err, cap);
  }
  for (int s = 0; s <= p->K; s++) bounds[s] = (int)((int64_t)s * p->nlayers / p->K);
  return DG_OK;
}

static int dp_setup(dg_pipe *p, char *err, size_t cap);

int dg_pipe_new(dg_pipe **out, dg_pg *pg, dg_module *seq, dg_params *ps, uint64_t seed,
                const dg_pipe_opts *opts, char *err, size_t cap) {
  dg_pipe_opts o = opts ? *opts : dg_pipe_defaults();
  if (out) *out = NULL;
  if (!out || !pg || !seq || !ps) {
    dg_module_free(seq);
    return dg__fail_msg(err, cap, DG_EINVAL, "pipe_new: NULL out, group, model or store");
  }
  dg_pipe *p = dg__calloc(1, sizeof *p);
  if (!p) {
    dg_module_free(seq);
    return dg__fail_msg(err, cap, DG_ENOMEM, "pipe_new: out of memory");
  }
  p->pg = pg, p->dp = o.dp_group, p->ps = ps, p->K = dg_pg_size(pg), p->s = dg_pg_rank(pg);
  p->M = o.micro_batches ? o.micro_batches : 1;
  p->kind = (int)o.schedule, p->remat = !!o.remat, p->seed = seed;
  p->transport = !!o.transport_boundaries;
  p->nlayers = dg_sequential_len(seq);
  int bounds[DG__PIPE_MAX_STAGES + 1];
  dg__pipe_stats ts;
  int rc = choose_bounds(p, seq, &o, bounds, err, cap);
  if (!rc) rc = agree(p, bounds, err, cap);
  if (!rc) rc = dg__pipe_schedule(&p->tab, p->kind, p->K, p->M, err, cap);
  if (!rc) rc = dg__pipe_validate(&p->tab, &ts, err, cap);
  if (!rc) p->first = bounds[p->s], p->last = bounds[p->s + 1];
  if (!rc)
    rc = make_contexts(p, ts.max_alive[p->s] > 0 ? ts.max_alive[p->s] : 1, o.swap, err, cap);
  if (!rc) rc = take_stage(p, seq, err, cap);
  else dg_module_free(seq);
  if (!rc) rc = alloc_state(p, err, cap);
  if (!rc && p->dp) rc = dp_setup(p, err, cap);
  if (rc) {
    dg_pipe_free(p);
    return rc;
  }
  p->st.contexts = p->npool;
  *out = p;
  return DG_OK;
}

void dg_pipe_free(dg_pipe *p) {
  if (!p) return;
  for (int m = 0; p->mb && m < p->M; m++) {
    for (int j = 0; j < NSENDS; j++) dg_work_free(p->mb[m].sends[j]);
    for (int i = 0; i < NT; i++) dg_work_free(p->mb[m].grecv[i]);
  }
  dg_work_free(p->ahead.hdr);
  for (int i = 0; i < NT; i++) dg_work_free(p->ahead.data[i]);
  dg__free(p->ahead.buf);
  dg__pipe_link_free(&p->prev), dg__pipe_link_free(&p->next);
  for (int k = 0; p->pool && k < p->npool; k++) dg_ctx_free(p->pool[k]);
  dg_ctx_free(p->rctx);
  dg__pipe_dp_free(p->dpx); /* its hooks went with the contexts */
  dg__free(p->pool), dg__free(p->owner), dg__free(p->mb), dg__free(p->hdr_out);
  dg__free(p->bufsave), dg__free(p->cost);
  dg__pipe_table_free(&p->tab);
  dg_module_free(p->stage);
  dg__free(p);
}

/* ---- DP x PP: the stage's replicas ---- */


/* Collective over the replicas (pipe_dp.h); the hook on every context
 * where the stage's backward runs. */
static int dp_setup(dg_pipe *p, char *err, size_t cap) {
  const int64_t id[4] = {p->s, p->first, p->last, dg_params_count(p->ps)};
  int rc = dg__pipe_dp_new(&p->dpx, p->dp, p->ps, id, err, cap);
  for (int k = 0; !rc && k <= p->npool; k++) {
    dg_ctx *c = k < p->npool ? p->pool[k] : p->rctx;
    if (c && (rc = dg__pipe_dp_hook(p->dpx, c)))
      dg__fail_msg(err, cap, rc, "pipe_new: stage %d: installing the replicas' grad-ready hook: "
                   "%s", p->s, dg_ctx_errmsg(c));
  }
  return rc;
}

/* After the last backward: the gradients averaged over the replicas (the
 * buckets not posted during it), the running statistics from replica 0. */
static int dp_sync(dg_pipe *p) {
  char e[sizeof p->errmsg] = "";
  int rc = dg__pipe_dp_sync(p->dpx, e, sizeof e);
  dg__pipe_dp_stats(p->dpx, &p->st.dp_buckets, &p->st.dp_buckets_early, &p->st.dp_wait_seconds);
  if (rc)
    return FAIL(p, rc, "pipe step %lld: stage %d: averaging gradients over the replicas: %s",
                (long long)p->step, p->s, e);
  return DG_OK;
}

int dg_pipe_clip_grad_norm(dg_pipe *p, double max_norm, double *total_norm) {
  if (total_norm) *total_norm = 0;
  if (!p || !(max_norm >= 0)) return DG_EINVAL;
  double local = 0;
  int rc = dg_clip_grad_norm(p->ps, INFINITY, &local); /* the norm only */
  if (rc) return FAIL(p, rc, "pipe_clip_grad_norm: stage %d: %s", p->s, dg_params_errmsg(p->ps));
  double sq = local * local; /* every stage's share: the whole model's norm */
  rc = dg_pg_allreduce_sync(p->pg, &sq, 1, DG_F64, DG_RED_SUM);
  if (rc)
    return FAIL(p, rc, "pipe_clip_grad_norm: stage %d: summing the norms: %s", p->s,
                dg_pg_errmsg(p->pg));
  const double total = sqrt(sq);
  if (total_norm) *total_norm = total;
  /* scale by max_norm / (total + 1e-6) as one process would: the local
   * call's own coefficient, max / (local + 1e-6), comes out as that */
  const double coef = max_norm / (total + 1e-6);
  if (!isfinite(total) || coef >= 1.0 || local == 0) return DG_OK;
  rc = dg_clip_grad_norm(p->ps, coef * (local + 1e-6), NULL);
  return rc ? FAIL(p, rc, "pipe_clip_grad_norm: %s", dg_params_errmsg(p->ps)) : DG_OK;
}

/* ---- micro-batch contexts ---- */

/* Waits for m's sends, resets its context and returns it to the pool. */
static int retire(dg_pipe *p, int m) {
  pipe_mb *b = &p->mb[m];
  int rc = DG_OK;
  double t0 = now_s();
  for (int j = 0; j < NSENDS; j++) {
    if (!b->sends[j]) continue;
    int e = dg_work_wait(b->sends[j], 0);
    if (e && !rc)
      rc = FAIL(p, e, "pipe step %lld: stage %d: %s of micro-batch %d to stage %d did not "
                "complete: %s", (long long)p->step, p->s, j >= S_GRAD ? "the gradient" :
                "the activation", m, j >= S_GRAD ? p->s - 1 : p->s + 1,
                dg_work_errmsg(b->sends[j]));
    dg_work_free(b->sends[j]);
    b->sends[j] = NULL;
  }
  for (int i = 0; i < NT; i++) { /* pending only after a failure (end_step aborted the group) */
    dg_work_free(b->grecv[i]);
    b->grecv[i] = NULL;
  }
  p->wait += now_s() - t0;
  if (b->slot >= 0) {
    dg_ctx_reset(p->pool[b->slot]);
    p->owner[b->slot] = -1;
  }
  b->slot = -1, b->done = 0, b->gring = 0, b->nin = b->nout = 0;
  memset(b->in, 0, sizeof b->in), memset(b->out, 0, sizeof b->out);
  memset(b->gout, 0, sizeof b->gout), memset(b->gin, 0, sizeof b->gin);
  return rc;
}

/* m's context: the one it holds, a free one, or the oldest finished one. */
static dg_ctx *acquire(dg_pipe *p, int m) {
  pipe_mb *b = &p->mb[m];
  if (b->slot >= 0) return p->pool[b->slot];
  int k = 0;
  while (k < p->npool && p->owner[k] >= 0) k++;
  if (k == p->npool) {
    int old = -1;
    for (int j = 0; j < p->M; j++)
      if (p->mb[j].done && p->mb[j].slot >= 0) {
        old = j;
        break;
      }
    if (old < 0) {
      FAIL(p, DG_ESTATE, "pipe step %lld: stage %d: micro-batch %d finds all %d contexts busy",
           (long long)p->step, p->s, m, p->npool);
      return NULL;
    }
    k = p->mb[old].slot;
    if (retire(p, old)) return NULL;
  }
  p->owner[k] = m, b->slot = k;
  dg_ctx *c = p->pool[k];
  dg_ctx_set_grad_enabled(c, !p->eval);
  return c;
}

/* Random numbers of (step, micro-batch), whichever context runs it: a
 * recomputation draws what its forward drew. */
static void seed_mb(dg_pipe *p, dg_ctx *c, int m) {
  dg_ctx_set_rng_state(c, p->seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)(p->s + 1)),
                       ((uint64_t)p->step * (uint64_t)p->M + (uint64_t)m) << 36);
}

static void track_memory(dg_pipe *p) {
  size_t used = p->rctx ? dg_ctx_arena_used(p->rctx) : 0;
  for (int k = 0; k < p->npool; k++) used += dg_ctx_arena_used(p->pool[k]);
  if (used > p->st.arena_peak) p->st.arena_peak = used;
}

/* ---- messages ---- */

typedef struct {
  dg_tensor *x, *targets;
  dg_pipe_loss_fn loss_fn;
  void *user;
  int64_t mb; /* rows per micro-batch */
} step_args;

/* Posts a receive of n elements from src into *w. */
static int post_recv(dg_pipe *p, void *buf, size_t n, dg_dtype dt, int src, uint32_t tag,
                     dg_work **w, const char *what, int m) {
  int rc = dg_pg_recv(p->pg, buf, n, dt, src, tag, w);
  if (rc)
    FAIL(p, rc, "pipe step %lld: stage %d: %s of micro-batch %d from stage %d: %s",
         (long long)p->step, p->s, what, m, src, dg_pg_errmsg(p->pg));
  return rc;
}

/* Waits for a posted receive (bounded by the group's timeout), frees it. */
static int wait_recv(dg_pipe *p, dg_work **w, int src, const char *what, int m) {
  double t0 = now_s();
  int rc = dg_work_wait(*w, 0);
  p->wait += now_s() - t0;
  if (rc)
    FAIL(p, rc, "pipe step %lld: stage %d: %s of micro-batch %d from stage %d: %s",
         (long long)p->step, p->s, what, m, src, dg_work_errmsg(*w));
  dg_work_free(*w);
  *w = NULL;
  return rc;
}

/* Receives n elements from src and waits. */
static int recv_wait(dg_pipe *p, void *buf, size_t n, dg_dtype dt, int src, uint32_t tag,
                     const char *what, int m) {
  dg_work *w = NULL;
  int rc = post_recv(p, buf, n, dt, src, tag, &w, what, m);
  return rc ? rc : wait_recv(p, &w, src, what, m);
}

static int post_send(dg_pipe *p, const void *buf, size_t n, dg_dtype dt, int dst, uint32_t tag,
                     const char *what, int m, int j) {
  dg_work *w = NULL;
  int rc = dg_pg_send(p->pg, buf, n, dt, dst, tag, &w);
  if (rc)
    return FAIL(p, rc, "pipe step %lld: stage %d: %s of micro-batch %d to stage %d: %s",
                (long long)p->step, p->s, what, m, dst, dg_pg_errmsg(p->pg));
  p->mb[m].sends[j] = w;
  return DG_OK;
}

/* Tensor i of the boundary header h: ndim, dtype, grad, shape. */
static const int64_t *tdesc(const int64_t *h, int i) { return h + 1 + (size_t)i * TSZ; }

static size_t tbytes(const int64_t *t) {
  size_t n = dg_dtype_size((dg_dtype)t[1]);
  for (int d = 0; d < (int)t[0]; d++) n *= (size_t)t[3 + d];
  return n;
}

/* The boundary's tensors one after the other, each on a cache line: their
 * offsets into off, the total bytes returned. grads: the gradients only
 * (the tensors marked grad; the others' offsets are unused). */
static size_t layout(const int64_t *h, int grads, size_t *off) {
  size_t total = 0;
  for (int i = 0; i < (int)h[0]; i++) {
    const int64_t *t = tdesc(h, i);
    off[i] = total;
    if (!grads || t[2]) total += (tbytes(t) + ALIGN - 1) / ALIGN * ALIGN;
  }
  return total;
}

/* "f32 (4, 8) grad, i64 (4,)" */
static const char *boundary_str(const int64_t *h, char *buf, size_t cap) {
  size_t n = 0;
  buf[0] = '\0';
  for (int i = 0; i < (int)h[0] && n < cap; i++) {
    const int64_t *t = tdesc(h, i);
    char d[96];
    int k = snprintf(buf + n, cap - n, "%s%s %s%s", i ? ", " : "", dg_dtype_name((dg_dtype)t[1]),
                     dg__dims_str((int)t[0], t + 3, d, sizeof d), t[2] ? " grad" : "");
    if (k < 0) break;
    n += (size_t)k;
  }
  return buf;
}

static int bad_boundary(dg_pipe *p, int m, const int64_t *h) {
  char a[384], b[384];
  return FAIL(p, DG_ESHAPE, "pipe step %lld: stage %d: micro-batch %d arrives as [%s], "
              "micro-batch 0 as [%s]: a boundary's tensors, shapes and dtypes must not change "
              "within a step", (long long)p->step, p->s, m, boundary_str(h, a, sizeof a),
              boundary_str(p->shape0, b, sizeof b));
}

/* Whether a boundary of n bytes goes into the receiver's ring this step:
 * both sides decide alike, from the slot the receiver announced. */
static int fits(size_t slot, size_t n) { return slot > 0 && n <= slot; }

/* A header from the peer, before anything is sized from it: counts, dtypes
 * and flags in range, and every tensor's bytes, and their aligned total,
 * without overflow and below 2^48 (so layout() and dg_wrap stay in range). */
static int check_desc(const int64_t *h) {
  if (h[0] < 1 || h[0] > NT) return 0;
  uint64_t total = 0;
  const uint64_t most = (uint64_t)1 << 48;
  for (int i = 0; i < (int)h[0]; i++) {
    const int64_t *t = tdesc(h, i);
    if (t[0] < 1 || t[0] > DG_MAX_DIMS || t[1] < 0 || t[1] >= DG_NDTYPES || (t[2] & ~1) ||
        (t[2] && t[1] != DG_F32))
      return 0;
    uint64_t n = dg_dtype_size((dg_dtype)t[1]);
    for (int d = 0; d < (int)t[0]; d++)
      if (t[3 + d] < 0 || __builtin_mul_overflow(n, (uint64_t)t[3 + d], &n) || n > most)
        return 0;
    total += (n + ALIGN - 1) / ALIGN * ALIGN; /* each term < 2^48 + 64: no overflow */
    if (total > most) return 0;
  }
  return 1;
}

static int check_header(dg_pipe *p, int m, const int64_t *h) {
  if (!check_desc(h) || h[SHP] != p->step || (h[SHP + 1] & ~1))
    return FAIL(p, DG_EPEER, "pipe step %lld: stage %d: micro-batch %d: a malformed activation "
                "header from stage %d (%lld tensors, step %lld; a count, dtype, flag or size "
                "out of range)", (long long)p->step, p->s, m, p->s - 1, (long long)h[0],
                (long long)h[SHP]);
  size_t off[NT];
  const size_t n = layout(h, 0, off);
  if (m == 0) memcpy(p->shape0, h, sizeof p->shape0), p->in_bytes = n;
  else if (memcmp(p->shape0, h, sizeof p->shape0)) return bad_boundary(p, m, h);
  if (h[SHP + 1] != fits(p->prev.slot, n))
    return FAIL(p, DG_EPEER, "pipe step %lld: stage %d: micro-batch %d: stage %d sent %zu bytes "
                "%s, but this stage's ring holds %zu per slot", (long long)p->step, p->s, m,
                p->s - 1, n, h[SHP + 1] ? "into the ring" : "by the transport", p->prev.slot);
  return DG_OK;
}

/* Posts micro-batch m's header and data receives into p->ahead, laid out
 * as the step's boundary (a sender whose m differs in bytes fails the
 * transport with both sizes; one that differs in shape only fails the
 * header check). */
static int post_ahead(dg_pipe *p, int m) {
  pipe_ahead *a = &p->ahead;
  size_t off[NT];
  const size_t n = layout(p->shape0, 0, off);
  a->mb = m;
  int rc = post_recv(p, a->h, HDR, DG_I64, p->s - 1, TAG_ACT, &a->hdr,
                     "receiving the activation header", m);
  if (rc || fits(p->prev.slot, n)) return rc; /* the data is in the ring with the header */
  if (n > a->cap) { /* the first step, or a bigger boundary: not in steady state */
    void *b = dg__malloc(n);
    if (!b) return FAIL(p, DG_ENOMEM, "pipe: stage %d: out of memory", p->s);
    dg__free(a->buf);
    a->buf = b, a->cap = n;
  }
  for (int i = 0; !rc && i < (int)p->shape0[0]; i++) {
    const int64_t *t = tdesc(p->shape0, i);
    const dg_dtype dt = (dg_dtype)t[1];
    rc = post_recv(p, (char *)a->buf + off[i], tbytes(t) / dg_dtype_size(dt), dt, p->s - 1,
                   TAG_ACT, &a->data[i], "receiving the activation", m);
  }
  return rc;
}

/* Tensor i of micro-batch m's activation into x: from the ring (nothing
 * to do), the staging buffer posted ahead, or the transport now. */
static int recv_tensor(dg_pipe *p, int m, int i, dg_tensor *x, int ring, int early, size_t off) {
  if (ring) return DG_OK;
  if (!early)
    return recv_wait(p, dg_tensor_data(x), (size_t)dg_tensor_numel(x), dg_tensor_dtype(x),
                     p->s - 1, TAG_ACT, "receiving the activation", m);
  int rc = wait_recv(p, &p->ahead.data[i], p->s - 1, "receiving the activation", m);
  const size_t n = (size_t)dg_tensor_numel(x) * dg_dtype_size(dg_tensor_dtype(x));
  if (!rc && n) memcpy(dg_tensor_data(x), (char *)p->ahead.buf + off, n); /* 0: buf may be NULL */
  return rc;
}

/* Header then data (posted ahead, or now for a step's first micro-batch);
 * the header is checked against the step's first. */
static int recv_act(dg_pipe *p, int m) {
  dg_ctx *c = acquire(p, m);
  if (!c) return DG_ESTATE;
  pipe_ahead *a = &p->ahead;
  pipe_mb *b = &p->mb[m];
  const int early = a->mb == m;
  int64_t *h = a->h; /* free when m was not posted ahead: nothing else is */
  int rc = early ? wait_recv(p, &a->hdr, p->s - 1, "receiving the activation header", m)
                 : recv_wait(p, h, HDR, DG_I64, p->s - 1, TAG_ACT,
                             "receiving the activation header", m);
  if (!rc) rc = check_header(p, m, h);
  if (rc) return rc;
  const int ring = (int)h[SHP + 1];
  size_t off[NT];
  layout(h, 0, off);
  b->nin = (int)h[0];
  for (int i = 0; !rc && i < b->nin; i++) {
    const int64_t *t = tdesc(h, i);
    const dg_dtype dt = (dg_dtype)t[1];
    dg_tensor *x = ring ? dg_wrap(c, dt, (int)t[0], t + 3,
                                  (char *)dg__pipe_link_slot(&p->prev, m) + off[i])
                        : dg_empty(c, dt, (int)t[0], t + 3);
    if (!x) return FAIL(p, DG_ENOMEM, "pipe: stage %d: %s", p->s, dg_ctx_errmsg(c));
    rc = recv_tensor(p, m, i, x, ring, early, off[i]);
    if (t[2]) dg_tensor_set_requires_grad(x, 1);
    b->in[i] = x;
  }
  a->mb = -1;
  if (!rc && m + 1 < p->M) rc = post_ahead(p, m + 1);
  return rc;
}

/* The neighbour's ring slot for this step's boundaries to it (0: none). */
static int their_slot(dg_pipe *p, dg__pipe_link *l, size_t *slot, const char *what, int m) {
  char e[160] = "";
  int rc = dg__pipe_link_theirs(l, p->step, slot, e, sizeof e);
  if (rc) FAIL(p, rc, "pipe step %lld: stage %d: %s of micro-batch %d: receiving the ring of "
               "stage %d: %s", (long long)p->step, p->s, what, m, l->peer, e[0] ? e :
               dg_pg_errmsg(p->pg));
  return rc;
}

/* Writes n bytes at offset off of the neighbour's ring slot m. */
static int write_ring(dg_pipe *p, dg__pipe_link *l, int m, size_t off, const void *src, size_t n,
                      const char *what) {
  int e = dg__pipe_link_write(l, m, off, src, n);
  if (e < 0)
    return FAIL(p, e == -ESRCH ? DG_EPEER : DG_ESYS, "pipe step %lld: stage %d: writing %s of "
                "micro-batch %d into stage %d (pid %d): %s", (long long)p->step, p->s, what, m,
                l->peer, l->pid, strerror(-e));
  p->st.bytes_direct += n;
  return DG_OK;
}

/* Posts m's gradient receives, for the outputs marked grad in header h:
 * into this rank's ring (a notice comes) or into the context (the data
 * comes). */
static int post_grad_recv(dg_pipe *p, int m, const int64_t *h) {
  pipe_mb *b = &p->mb[m];
  dg_ctx *c = p->pool[b->slot];
  size_t off[NT];
  b->gring = fits(p->next.slot, layout(h, 1, off));
  int rc = DG_OK;
  for (int i = 0; !rc && i < b->nout; i++) {
    const int64_t *t = tdesc(h, i);
    if (!t[2]) continue;
    b->gout[i] = b->gring ? dg_wrap(c, DG_F32, (int)t[0], t + 3,
                                    (char *)dg__pipe_link_slot(&p->next, m) + off[i])
                          : dg_empty(c, DG_F32, (int)t[0], t + 3);
    if (!b->gout[i]) return FAIL(p, DG_ENOMEM, "pipe: stage %d: %s", p->s, dg_ctx_errmsg(c));
    if (!b->gring)
      rc = post_recv(p, dg_tensor_data(b->gout[i]), (size_t)dg_tensor_numel(b->gout[i]), DG_F32,
                     p->s + 1, TAG_GRAD, &b->grecv[i], "receiving the gradient", m);
  }
  if (!rc && b->gring)
    rc = post_recv(p, &b->note, 1, DG_I64, p->s + 1, TAG_GRAD, &b->grecv[0],
                   "receiving the gradient's notice", m);
  return rc;
}

/* m's outputs described into header h; whether any carries a gradient. */
static int describe(dg_pipe *p, int m, int64_t *h) {
  pipe_mb *b = &p->mb[m];
  int grads = 0;
  memset(h, 0, HDR * sizeof *h);
  h[0] = b->nout;
  for (int i = 0; i < b->nout; i++) {
    int64_t *t = h + 1 + (size_t)i * TSZ;
    dg_tensor *y = b->out[i];
    t[0] = dg_tensor_ndim(y), t[1] = dg_tensor_dtype(y);
    /* with remat the forward ran without a tape: every f32 tensor */
    t[2] = !p->eval && t[1] == DG_F32 && (p->remat || dg_tensor_requires_grad(y));
    memcpy(t + 3, dg_tensor_shape(y), (size_t)t[0] * sizeof *t);
    grads |= (int)t[2];
  }
  h[SHP] = p->step;
  return grads;
}

static int send_act(dg_pipe *p, int m) {
  pipe_mb *b = &p->mb[m];
  int64_t *h = p->hdr_out + (size_t)m * HDR;
  const int grads = describe(p, m, h);
  size_t off[NT], goff[NT];
  const size_t n = layout(h, 0, off);
  if (m == 0) p->out_bytes = layout(h, 1, goff); /* the next step's gradient ring */
  size_t slot = 0;
  int rc = their_slot(p, &p->next, &slot, "sending the activation", m);
  h[SHP + 1] = fits(slot, n);
  for (int i = 0; !rc && h[SHP + 1] && i < b->nout; i++)
    rc = write_ring(p, &p->next, m, off[i], dg_tensor_data(b->out[i]), tbytes(tdesc(h, i)),
                    "the activation");
  if (!rc)
    rc = post_send(p, h, HDR, DG_I64, p->s + 1, TAG_ACT, "sending the activation header", m,
                   S_HDR);
  for (int i = 0; !rc && !h[SHP + 1] && i < b->nout; i++) {
    dg_tensor *y = b->out[i];
    rc = post_send(p, dg_tensor_data(y), (size_t)dg_tensor_numel(y), dg_tensor_dtype(y),
                   p->s + 1, TAG_ACT, "sending the activation", m, S_ACT + i);
    p->st.bytes_transport += tbytes(tdesc(h, i));
  }
  if (!rc && p->eval) b->done = 1; /* nothing comes back */
  if (!rc && grads) rc = post_grad_recv(p, m, h); /* the gradients' receives, now */
  return rc;
}

/* ---- compute ---- */

static int stage_failed(dg_pipe *p, dg_ctx *c, int m, const char *what) {
  return FAIL(p, dg_ctx_errcode(c) ? dg_ctx_errcode(c) : DG_EINVAL, "pipe step %lld: stage %d "
              "(layers %d-%d), %s of micro-batch %d: %s", (long long)p->step, p->s, p->first,
              p->last - 1, what, m, dg_ctx_errmsg(c));
}

/* The stage on micro-batch m in c: its outputs into ys (*ny), or on the
 * last stage its loss scaled by 1/M into ys[0] (counted into the step's
 * loss when `count`). Errors are c's. */
static int run_stage(dg_pipe *p, const step_args *a, dg_ctx *c, int m, int count, dg_tensor **ys,
                     int *ny) {
  seed_mb(p, c, m);
  int rc = dg_module_forward_n(p->stage, c, p->mb[m].in, p->mb[m].nin, ys, ny);
  if (rc) return rc;
  if (p->s < p->K - 1) {
    for (int i = 0; i < *ny; i++)
      if (!(ys[i] = dg_contiguous(c, ys[i]))) return dg_ctx_errcode(c);
    return DG_OK;
  }
  if (*ny != 1)
    return dg__set_error(c, DG_EINVAL, "the last stage returns %d tensors; the loss takes one",
                         *ny);
  dg_tensor *t = dg_slice(c, a->targets, m * a->mb, (m + 1) * a->mb);
  dg_tensor *l = t ? a->loss_fn(a->user, c, ys[0], t) : NULL;
  if (!l) return dg_ctx_errcode(c) ? dg_ctx_errcode(c) : DG_EINVAL;
  if (dg_tensor_numel(l) != 1)
    return dg__set_error(c, DG_ESHAPE, "the loss function returned %lld elements, want 1",
                         (long long)dg_tensor_numel(l));
  if (count) p->loss_sum += dg_tensor_item(l);
  ys[0] = dg_scale(c, l, 1.0f / (float)p->M); /* mean over micro-batches */
  return ys[0] ? DG_OK : dg_ctx_errcode(c);
}

/* A copy of t in c (what must outlive the scratch context). */
static dg_tensor *keep(dg_ctx *c, const dg_tensor *t) {
  dg_tensor *k = dg_empty(c, dg_tensor_dtype(t), dg_tensor_ndim(t), dg_tensor_shape(t));
  const size_t n = (size_t)dg_tensor_numel(t) * dg_dtype_size(dg_tensor_dtype(t));
  if (k && n) memcpy(dg_tensor_data(k), dg_tensor_data(t), n);
  return k;
}

static int forward(dg_pipe *p, const step_args *a, int m) {
  dg_ctx *c = acquire(p, m);
  if (!c) return DG_ESTATE;
  pipe_mb *b = &p->mb[m];
  if (p->s == 0) {
    b->in[0] = dg_slice(c, a->x, m * a->mb, (m + 1) * a->mb), b->nin = 1;
    if (!b->in[0]) return stage_failed(p, c, m, "forward");
  }
  if (!p->remat || p->eval) {
    if (run_stage(p, a, c, m, 1, b->out, &b->nout)) return stage_failed(p, c, m, "forward");
  } else { /* no tape: keep the outputs only */
    dg_tensor *ys[NT];
    int ny = 0;
    dg_ctx_set_grad_enabled(p->rctx, 0);
    if (run_stage(p, a, p->rctx, m, 1, ys, &ny)) return stage_failed(p, p->rctx, m, "forward");
    b->nout = p->s < p->K - 1 ? ny : 0;
    for (int i = 0; i < b->nout; i++)
      if (!(b->out[i] = keep(c, ys[i]))) break;
    dg_ctx_reset(p->rctx);
    for (int i = 0; i < b->nout; i++)
      if (!b->out[i]) return FAIL(p, DG_ENOMEM, "pipe: stage %d: %s", p->s, dg_ctx_errmsg(c));
  }
  if (p->eval && p->s == p->K - 1) b->done = 1;
  return DG_OK;
}

/* Waits for the receives send_act posted. */
static int recv_grad(dg_pipe *p, int m) {
  pipe_mb *b = &p->mb[m];
  int rc = DG_OK;
  for (int i = 0; !rc && i < NT; i++) /* none: no gradient flows through the boundary */
    if (b->grecv[i])
      rc = wait_recv(p, &b->grecv[i], p->s + 1, b->gring ? "receiving the gradient's notice" :
                     "receiving the gradient", m);
  if (!rc && b->gring && b->note != p->step)
    rc = FAIL(p, DG_EPEER, "pipe step %lld: stage %d: the gradient of micro-batch %d from stage "
              "%d is of step %lld", (long long)p->step, p->s, m, p->s + 1, (long long)b->note);
  return rc;
}

/* Re-materialization: the stage again, with a tape, in the scratch context;
 * the running statistics as the forward left them. */
static int recompute(dg_pipe *p, const step_args *a, int m, dg_tensor **ys, int *ny) {
  size_t nb = 0;
  float *buf = dg_params_buffer_data(p->ps, &nb);
  if (nb) memcpy(p->bufsave, buf, nb * sizeof *buf);
  dg_ctx_set_grad_enabled(p->rctx, 1);
  int rc = run_stage(p, a, p->rctx, m, 0, ys, ny);
  if (nb) memcpy(buf, p->bufsave, nb * sizeof *buf);
  return rc;
}

/* Which of m's inputs t is (an output passed through unchanged), or -1. */
static int input_of(const pipe_mb *b, const dg_tensor *t) {
  for (int j = 0; j < b->nin; j++)
    if (b->in[j] == t) return j;
  return -1;
}

/* The gradients of m's inputs marked grad, to send back: what the
 * backward left (zeros for an input it did not reach), plus the gradient
 * of each output that is an input passed through (y, ny: the outputs). */
static int input_grads(dg_pipe *p, int m, dg_ctx *c, dg_tensor *const *y, int ny) {
  pipe_mb *b = &p->mb[m];
  for (int i = 0; p->s > 0 && i < b->nin; i++) {
    if (!tdesc(p->shape0, i)[2]) continue; /* what the sender waits for, whatever the layers did */
    dg_tensor *g = dg_tensor_grad(b->in[i]);
    b->gin[i] = !g ? dg_zeros(c, DG_F32, dg_tensor_ndim(b->in[i]), dg_tensor_shape(b->in[i]))
                   : p->remat ? keep(c, g) : g;
    if (!b->gin[i]) return FAIL(p, DG_ENOMEM, "pipe: stage %d: %s", p->s, dg_ctx_errmsg(c));
  }
  for (int i = 0; i < ny && p->s < p->K - 1; i++) {
    const int j = b->gout[i] ? input_of(b, y[i]) : -1;
    if (j < 0 || !b->gin[j]) continue;
    float *d = dg_tensor_data(b->gin[j]);
    const float *g = dg_tensor_data(b->gout[i]);
    for (int64_t k = 0, n = dg_tensor_numel(b->gin[j]); k < n; k++) d[k] += g[k];
  }
  return DG_OK;
}

/* Backward from the outputs a gradient came back for (the loss on the last
 * stage); an output that is one of the stage's inputs takes no part (its
 * gradient is added to the input's: with remat it is not of the context
 * the backward runs in). */
static int backward(dg_pipe *p, const step_args *a, int m) {
  pipe_mb *b = &p->mb[m];
  const int last = p->s == p->K - 1;
  dg_ctx *c = p->pool[b->slot], *bc = p->remat ? p->rctx : c;
  dg_tensor *roots[NT], *grads[NT], *ys[NT], **y = p->remat ? ys : b->out;
  int n = 0, ny = b->nout;
  if (p->remat && recompute(p, a, m, ys, &ny)) return stage_failed(p, bc, m, "recomputation");
  for (int i = 0; i < (last ? 1 : ny); i++)
    if (last || (b->gout[i] && dg_tensor_requires_grad(y[i]) && input_of(b, y[i]) < 0))
      roots[n] = y[i], grads[n++] = last ? NULL : b->gout[i];
  if (n) {
    if (p->dpx) dg__pipe_dp_arm(p->dpx, m == p->M - 1); /* the step's last backward */
    int rc = dg_backward_multi(bc, n, roots, grads);
    if (p->dpx) dg__pipe_dp_arm(p->dpx, 0);
    if (rc) return stage_failed(p, bc, m, "backward");
  }
  int rc = input_grads(p, m, c, y, ny);
  if (p->remat) dg_ctx_reset(p->rctx);
  if (p->s == 0) b->done = 1;
  return rc;
}

static int send_grad(dg_pipe *p, int m) {
  pipe_mb *b = &p->mb[m];
  b->done = 1;
  size_t off[NT]; /* the gradients' layout from the step's boundary, as the sender's */
  const size_t n = layout(p->shape0, 1, off);
  int owed = 0;
  for (int i = 0; i < b->nin; i++) owed |= b->gin[i] != NULL; /* input_grads: those marked */
  if (!owed) return DG_OK; /* no gradient flows through the boundary */
  size_t slot = 0;
  int rc = their_slot(p, &p->prev, &slot, "sending the gradient", m);
  if (!rc && fits(slot, n)) {
    for (int i = 0; !rc && i < b->nin; i++)
      if (b->gin[i])
        rc = write_ring(p, &p->prev, m, off[i], dg_tensor_data(b->gin[i]),
                        (size_t)dg_tensor_numel(b->gin[i]) * sizeof(float), "the gradient");
    b->note_out = p->step;
    return rc ? rc : post_send(p, &b->note_out, 1, DG_I64, p->s - 1, TAG_GRAD,
                               "sending the gradient's notice", m, S_GRAD);
  }
  for (int i = 0; !rc && i < b->nin; i++) {
    if (!b->gin[i]) continue;
    const size_t k = (size_t)dg_tensor_numel(b->gin[i]);
    p->st.bytes_transport += k * sizeof(float);
    rc = post_send(p, dg_tensor_data(b->gin[i]), k, DG_F32, p->s - 1, TAG_GRAD,
                   "sending the gradient", m, S_GRAD + i);
  }
  return rc;
}

static int run_action(dg_pipe *p, const step_args *a, const dg__pipe_action *act) {
  const int m = act->mb;
  switch (act->op) {
  case DG__PIPE_RECV_ACT: return recv_act(p, m);
  case DG__PIPE_FWD: return forward(p, a, m);
  case DG__PIPE_SEND_ACT: return send_act(p, m);
  case DG__PIPE_RECV_GRAD: return recv_grad(p, m);
  case DG__PIPE_BWD: return backward(p, a, m);
  case DG__PIPE_SEND_GRAD: return send_grad(p, m);
  }
  return FAIL(p, DG_EINVAL, "pipe: bad action %d", act->op);
}

/* The timeline event of an action that began at tr0: its micro-batch and
 * the stage it talks to (this stage for a forward or backward). */
static void trace_action(const dg_pipe *p, const dg__pipe_action *act, uint64_t tr0) {
  static const char *const name[] = {"pipe forward", "pipe backward", "pipe send act",
                                     "pipe recv act", "pipe send grad", "pipe recv grad"};
  static const int dir[] = {0, 0, 1, -1, -1, 1};
  if (act->op < 6)
    DG__TRACE_END(tr0, name[act->op], NULL, "micro_batch", act->mb, "peer", p->s + dir[act->op]);
}

/* ---- a step ---- */

/* Ends a step: every send finished, every context back in the pool. A step
 * that failed after its first action left the stages out of step, and its
 * receives posted ahead wait for messages that may never come: the group
 * is failed first, so that they end and the other stages fail at once with
 * this stage's message instead of at their timeout. */
static int end_step(dg_pipe *p, int rc, int started, int own) {
  if (rc && started) dg__pg_abort(p->pg, rc, p->errmsg, own);
  dg_work_free(p->ahead.hdr);
  p->ahead.hdr = NULL, p->ahead.mb = -1;
  for (int i = 0; i < NT; i++) dg_work_free(p->ahead.data[i]), p->ahead.data[i] = NULL;
  for (int m = 0; m < p->M; m++) {
    int e = retire(p, m);
    if (e && !rc) rc = e;
  }
  dg__pipe_link *l[2] = {&p->prev, &p->next};
  for (int k = 0; k < 2; k++) {
    int e = dg__pipe_link_end(l[k]);
    if (e && !rc)
      rc = FAIL(p, e, "pipe step %lld: stage %d: sending the ring to stage %d did not complete: "
                "%s", (long long)p->step, p->s, l[k]->peer, dg_pg_errmsg(p->pg));
  }
  if (p->rctx) dg_ctx_reset(p->rctx);
  return rc;
}

static int check_inputs(dg_pipe *p, const step_args *a) {
  dg_tensor *t = p->s == 0 ? a->x : p->s == p->K - 1 ? a->targets : NULL;
  const char *fn = p->eval ? "pipe_eval" : "pipe_step";
  if ((p->s == 0 && !a->x) || (p->s == p->K - 1 && (!a->targets || !a->loss_fn)))
    return FAIL(p, DG_EINVAL, "%s: stage %d needs %s", fn, p->s,
                p->s == 0 ? "the batch x" : "the targets and a loss function");
  if (t && dg_tensor_dim(t, 0) % p->M)
    return FAIL(p, DG_ESHAPE, "%s: %lld rows do not split into %d micro-batches", fn,
                (long long)dg_tensor_dim(t, 0), p->M);
  if (p->s == 0 && p->s == p->K - 1 && dg_tensor_dim(a->x, 0) != dg_tensor_dim(a->targets, 0))
    return FAIL(p, DG_ESHAPE, "%s: %lld rows of x, %lld of targets", fn,
                (long long)dg_tensor_dim(a->x, 0), (long long)dg_tensor_dim(a->targets, 0));
  return DG_OK;
}

/* Each neighbour learns the ring it may write this step: the activations'
 * sized as the last step's boundary from stage s - 1, the gradients' as the
 * last one sent to stage s + 1. */
static int begin_step(dg_pipe *p) {
  dg__pipe_link *l[2] = {&p->prev, &p->next};
  const size_t want[2] = {p->in_bytes, p->out_bytes};
  for (int k = 0; k < 2; k++) {
    int rc = dg__pipe_link_begin(l[k], p->pg, p->M, want[k], p->step, TAG_RING);
    if (rc == DG_ENOMEM) return FAIL(p, rc, "pipe: stage %d: out of memory for a ring of %d x "
                                     "%zu bytes", p->s, p->M, want[k]);
    if (rc) return FAIL(p, rc, "pipe step %lld: stage %d: sending the ring to stage %d: %s",
                        (long long)p->step, p->s, l[k]->peer, dg_pg_errmsg(p->pg));
  }
  return DG_OK;
}

/* The mean loss from the last stage to every rank. */
static int share_loss(dg_pipe *p, int rc, float *loss) {
  float l = (float)(p->loss_sum / p->M);
  if (!rc) {
    double t0 = now_s();
    rc = dg_pg_broadcast_sync(p->pg, &l, 1, DG_F32, p->K - 1);
    p->wait += now_s() - t0;
    if (rc) FAIL(p, rc, "pipe step %lld: stage %d: the loss broadcast failed: %s",
                 (long long)p->step, p->s, dg_pg_errmsg(p->pg));
  }
  if (loss) *loss = rc ? NAN : l;
  return rc;
}

/* Whether the groups this stage uses are up: a step that failed while they
 * were failed on its own (its layers, its loss, a peer's header it refused),
 * not because a peer's failure reached it. Read before any abort. */
static int groups_up(const dg_pipe *p) {
  return dg__pg_error(p->pg, NULL, 0) == DG_OK &&
         (!p->dp || dg__pg_error(p->dp, NULL, 0) == DG_OK);
}

static int run(dg_pipe *p, dg_tensor *x, dg_tensor *targets, dg_pipe_loss_fn loss_fn,
               void *user, float *loss, int eval) {
  if (!p) return DG_EINVAL;
  const double t0 = now_s();
  step_args a = {x, targets, loss_fn, user, 0};
  p->errmsg[0] = '\0';
  p->loss_sum = 0, p->wait = 0, p->eval = eval, p->st.arena_peak = 0;
  p->st.bytes_direct = p->st.bytes_transport = 0;
  int rc = check_inputs(p, &a);
  const int started = !rc;
  if (!rc) rc = begin_step(p);
  dg_tensor *rows = p->s == 0 ? x : targets;
  if (!rc && rows) a.mb = dg_tensor_dim(rows, 0) / p->M;
  if (eval) { /* receive, forward, send: each micro-batch in turn */
    for (int m = 0; !rc && m < p->M; m++) {
      if (p->s > 0) rc = recv_act(p, m);
      if (!rc) rc = forward(p, &a, m);
      if (!rc && p->s < p->K - 1) rc = send_act(p, m);
      track_memory(p);
    }
  } else {
    for (int i = p->tab.off[p->s]; !rc && i < p->tab.off[p->s + 1]; i++) {
      uint64_t tr0 = dg__trace_t0();
      rc = run_action(p, &a, &p->tab.act[i]);
      if (tr0) trace_action(p, &p->tab.act[i], tr0);
      track_memory(p);
    }
  }
  /* before any abort fails the groups; a neighbour found gone (DG_EPEER)
   * is not this stage's own failure */
  const int own = rc && rc != DG_EPEER && groups_up(p);
  rc = end_step(p, rc, started, own);
  if (rc && p->dpx) {
    dg__pipe_dp_abort(p->dpx, rc, p->errmsg, started, own);
  } else if (!eval && p->dpx && (rc = dp_sync(p))) {
    /* the other stages wait for the loss */
    dg__pg_abort(p->pg, rc, p->errmsg, rc != DG_EPEER && groups_up(p));
  }
  rc = share_loss(p, rc, loss);
  p->eval = 0;
  p->step++;
  p->st.steps++;
  p->st.step_seconds = now_s() - t0;
  p->st.wait_seconds = p->wait;
  return rc;
}

int dg_pipe_step(dg_pipe *p, dg_tensor *x, dg_tensor *targets, dg_pipe_loss_fn loss_fn,
                 void *user, float *loss) {
  return run(p, x, targets, loss_fn, user, loss, 0);
}

int dg_pipe_set_step(dg_pipe *p, int64_t step) {
  if (!p) return DG_EINVAL;
  if (step < 0) return FAIL(p, DG_EINVAL, "pipe set step: step %lld < 0", (long long)step);
  p->step = step;
  return DG_OK;
}

int64_t dg_pipe_get_step(const dg_pipe *p) { return p ? p->step : -1; }

int dg_pipe_eval(dg_pipe *p, dg_tensor *x, dg_tensor *targets, dg_pipe_loss_fn loss_fn,
                 void *user, float *loss) {
  return run(p, x, targets, loss_fn, user, loss, 1);
}
