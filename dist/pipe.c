/* The pipe runtime: one stage per rank, micro-batches driven by the
 * validated action table of dist/pipe_plan.c. Each micro-batch has a
 * context of its own (its tape and activations live there until the step
 * ends), so several can be in flight on a stage; all of them accumulate
 * into the stage's parameter store. Sends are asynchronous works freed at
 * the end of the step; receives wait, bounded by the group's timeout (the
 * table was proven deadlock-free before it ran). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dgrad/autograd.h"
#include "dgrad/ops.h"
#include "dgrad/pipe.h"
#include "core/core_impl.h"
#include "dist/pipe_plan.h"

enum { TAG_ACT = 0x70690001u, TAG_GRAD = 0x70690002u };
#define HDR (2 + DG_MAX_DIMS) /* ndim, shape, step */

struct dg_pipe {
  dg_pg *pg;
  dg_params *ps;
  dg_module *stage;
  int K, s, M, first, last, nlayers;
  dg__pipe_table tab;
  dg_ctx **mctx;      /* per micro-batch */
  dg_tensor **in, **out, **gout;
  int64_t *hdr_out;   /* (M, HDR) headers sent, alive until their sends end */
  int64_t hdr_in[HDR]; /* the header being received (used at once) */
  int64_t shape0[1 + DG_MAX_DIMS]; /* the step's boundary shape (ndim first) */
  dg_work **sends;
  int nsends;
  int64_t step;
  double loss_sum;
  char errmsg[512];
};

#define FAIL(p, code, ...) dg__fail_msg((p)->errmsg, sizeof (p)->errmsg, code, __VA_ARGS__)

dg_pipe_opts dg_pipe_defaults(void) {
  dg_pipe_opts o;
  memset(&o, 0, sizeof o);
  return o;
}

const char *dg_pipe_errmsg(const dg_pipe *p) { return p ? p->errmsg : "no pipe"; }

int dg_pipe_stage(const dg_pipe *p, int *first, int *last) {
  if (!p) return DG_EINVAL;
  if (first) *first = p->first;
  if (last) *last = p->last;
  return p->s;
}

/* Every rank states (layers, M, schedule, balance); all must agree. */
static int agree(dg_pipe *p, const int *bounds, int kind, char *err, size_t cap) {
  const int n = 3 + p->K + 1;
  int64_t mine[3 + DG__PIPE_MAX_STAGES + 1], *all = dg__malloc((size_t)n * p->K * sizeof *all);
  if (!all) return dg__fail_msg(err, cap, DG_ENOMEM, "pipe_new: out of memory");
  mine[0] = p->nlayers, mine[1] = p->M, mine[2] = kind;
  for (int s = 0; s <= p->K; s++) mine[3 + s] = bounds[s];
  dg_work *w;
  int rc = dg_pg_allgather(p->pg, mine, all, (size_t)n, DG_I64, &w);
  if (!rc) rc = dg_work_wait(w, 0);
  if (rc) dg__fail_msg(err, cap, rc, "pipe_new: rank %d: exchanging the configuration: %s",
                       p->s, w ? dg_work_errmsg(w) : dg_pg_errmsg(p->pg));
  dg_work_free(w);
  for (int r = 0; !rc && r < p->K; r++)
    if (memcmp(all + (size_t)r * n, mine, (size_t)n * sizeof *mine)) {
      const int64_t *o = all + (size_t)r * n;
      rc = dg__fail_msg(err, cap, DG_EMISMATCH, "pipe_new: rank %d has %lld layers, %lld "
                        "micro-batches, schedule %s, stage 1 from layer %lld; rank %d has %lld, "
                        "%lld, %s, %lld", p->s, (long long)mine[0], (long long)mine[1],
                        dg__pipe_kind_name((int)mine[2]), (long long)(p->K > 1 ? mine[4] : 0),
                        r, (long long)o[0], (long long)o[1], dg__pipe_kind_name((int)o[2]),
                        (long long)(p->K > 1 ? o[4] : 0));
    }
  dg__free(all);
  return rc;
}

/* Keeps layers [first, last) of seq (bound under their own names), frees
 * the rest. */
static int take_stage(dg_pipe *p, dg_module *seq, uint64_t seed, char *err, size_t cap) {
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
  rc = dg_module_bind(mid, p->ps, "", seed);
  if (rc) return dg__fail_msg(err, cap, rc, "pipe_new: binding stage %d: %s", p->s,
                              dg_params_errmsg(p->ps));
  return DG_OK;
}

static int alloc_state(dg_pipe *p, char *err, size_t cap) {
  const size_t M = (size_t)p->M;
  p->mctx = dg__calloc(M, sizeof *p->mctx);
  p->in = dg__calloc(3 * M, sizeof *p->in);
  p->hdr_out = dg__calloc(M * HDR, sizeof *p->hdr_out);
  p->sends = dg__calloc(3 * M, sizeof *p->sends); /* header, activation, gradient */
  if (!p->mctx || !p->in || !p->hdr_out || !p->sends)
    return dg__fail_msg(err, cap, DG_ENOMEM, "pipe_new: out of memory");
  p->out = p->in + M, p->gout = p->in + 2 * M;
  for (size_t m = 0; m < M; m++)
    if (dg_ctx_new(&p->mctx[m], NULL))
      return dg__fail_msg(err, cap, DG_ENOMEM, "pipe_new: out of memory");
  return DG_OK;
}

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
  p->pg = pg, p->ps = ps, p->K = dg_pg_size(pg), p->s = dg_pg_rank(pg);
  p->M = o.micro_batches ? o.micro_batches : 1;
  p->nlayers = dg_sequential_len(seq);
  int bounds[DG__PIPE_MAX_STAGES + 1], rc = DG_OK;
  if (p->nlayers < 0 || p->M < 1 || p->K > DG__PIPE_MAX_STAGES)
    rc = dg__fail_msg(err, cap, DG_EINVAL, "pipe_new: need a Sequential, micro_batches >= 1 "
                      "and at most %d ranks (got %d micro-batches, %d ranks)",
                      DG__PIPE_MAX_STAGES, p->M, p->K);
  else if (o.balance)
    rc = dg__pipe_balance_check(o.balance, p->K, p->nlayers, err, cap);
  else if (p->nlayers < p->K)
    rc = dg__fail_msg(err, cap, DG_EINVAL, "pipe_new: %d layers cannot fill %d stages",
                      p->nlayers, p->K);
  for (int s = 0; !rc && s <= p->K; s++)
    bounds[s] = o.balance ? (s ? bounds[s - 1] + o.balance[s - 1] : 0)
                          : (int)((int64_t)s * p->nlayers / p->K);
  if (!rc) rc = agree(p, bounds, (int)o.schedule, err, cap);
  if (!rc) rc = dg__pipe_schedule(&p->tab, (int)o.schedule, p->K, p->M, err, cap);
  if (!rc) rc = dg__pipe_validate(&p->tab, NULL, err, cap);
  if (!rc) p->first = bounds[p->s], p->last = bounds[p->s + 1];
  if (!rc) rc = take_stage(p, seq, seed, err, cap);
  else dg_module_free(seq);
  if (!rc) rc = alloc_state(p, err, cap);
  if (rc) {
    dg_pipe_free(p);
    return rc;
  }
  *out = p;
  return DG_OK;
}

void dg_pipe_free(dg_pipe *p) {
  if (!p) return;
  for (int i = 0; i < p->nsends; i++) dg_work_free(p->sends[i]);
  for (int m = 0; p->mctx && m < p->M; m++) dg_ctx_free(p->mctx[m]);
  dg__free(p->mctx), dg__free(p->in), dg__free(p->hdr_out), dg__free(p->sends);
  dg__pipe_table_free(&p->tab);
  dg_module_free(p->stage);
  dg__free(p);
}

/* ---- a step ---- */

typedef struct {
  dg_tensor *x, *targets;
  dg_pipe_loss_fn loss_fn;
  void *user;
  int64_t mb; /* rows per micro-batch */
} step_args;

/* Receives n elements from src and waits (bounded by the group's timeout). */
static int recv_wait(dg_pipe *p, void *buf, size_t n, dg_dtype dt, int src, uint32_t tag,
                     const char *what, int m) {
  dg_work *w = NULL;
  int rc = dg_pg_recv(p->pg, buf, n, dt, src, tag, &w);
  if (!rc) rc = dg_work_wait(w, 0);
  if (rc)
    FAIL(p, rc, "pipe step %lld: stage %d: %s of micro-batch %d from stage %d: %s",
         (long long)p->step, p->s, what, m, src, w ? dg_work_errmsg(w) : dg_pg_errmsg(p->pg));
  dg_work_free(w);
  return rc;
}

static int post_send(dg_pipe *p, const void *buf, size_t n, dg_dtype dt, int dst, uint32_t tag,
                     const char *what, int m) {
  dg_work *w = NULL;
  int rc = dg_pg_send(p->pg, buf, n, dt, dst, tag, &w);
  if (rc)
    return FAIL(p, rc, "pipe step %lld: stage %d: %s of micro-batch %d to stage %d: %s",
                (long long)p->step, p->s, what, m, dst, dg_pg_errmsg(p->pg));
  p->sends[p->nsends++] = w;
  return DG_OK;
}

/* Header then data; the receiver checks the shape against the step's first. */
static int recv_act(dg_pipe *p, int m) {
  int64_t *h = p->hdr_in;
  int rc = recv_wait(p, h, HDR, DG_I64, p->s - 1, TAG_ACT, "receiving the activation header", m);
  if (rc) return rc;
  if (h[0] < 1 || h[0] > DG_MAX_DIMS || h[HDR - 1] != p->step)
    return FAIL(p, DG_EPEER, "pipe step %lld: stage %d: micro-batch %d: a malformed activation "
                "header from stage %d (ndim %lld, step %lld)", (long long)p->step, p->s, m,
                p->s - 1, (long long)h[0], (long long)h[HDR - 1]);
  if (m == 0) memcpy(p->shape0, h, sizeof p->shape0);
  else if (memcmp(p->shape0, h, sizeof p->shape0)) {
    char a[96], b[96];
    return FAIL(p, DG_ESHAPE, "pipe step %lld: stage %d: micro-batch %d arrives as %s, micro-"
                "batch 0 as %s: a boundary's shape must not change within a step",
                (long long)p->step, p->s, m, dg__dims_str((int)h[0], h + 1, a, sizeof a),
                dg__dims_str((int)p->shape0[0], p->shape0 + 1, b, sizeof b));
  }
  dg_tensor *x = dg_empty(p->mctx[m], DG_F32, (int)h[0], h + 1);
  if (!x) return FAIL(p, DG_ENOMEM, "pipe: stage %d: %s", p->s, dg_ctx_errmsg(p->mctx[m]));
  rc = recv_wait(p, dg_tensor_data(x), (size_t)dg_tensor_numel(x), DG_F32, p->s - 1, TAG_ACT,
                 "receiving the activation", m);
  dg_tensor_set_requires_grad(x, 1);
  p->in[m] = x;
  return rc;
}

static int send_act(dg_pipe *p, int m) {
  dg_tensor *y = p->out[m];
  int64_t *h = p->hdr_out + (size_t)m * HDR;
  memset(h, 0, HDR * sizeof *h);
  h[0] = dg_tensor_ndim(y);
  memcpy(h + 1, dg_tensor_shape(y), (size_t)h[0] * sizeof *h);
  h[HDR - 1] = p->step;
  int rc = post_send(p, h, HDR, DG_I64, p->s + 1, TAG_ACT, "sending the activation header", m);
  return rc ? rc : post_send(p, dg_tensor_data(y), (size_t)dg_tensor_numel(y), DG_F32, p->s + 1,
                             TAG_ACT, "sending the activation", m);
}

static int forward(dg_pipe *p, const step_args *a, int m) {
  dg_ctx *c = p->mctx[m];
  if (p->s == 0) {
    p->in[m] = dg_slice(c, a->x, m * a->mb, (m + 1) * a->mb);
  }
  dg_tensor *y = dg_module_forward(p->stage, c, p->in[m]);
  if (p->s == p->K - 1) {
    dg_tensor *t = dg_slice(c, a->targets, m * a->mb, (m + 1) * a->mb);
    dg_tensor *l = y && t ? a->loss_fn(a->user, c, y, t) : NULL;
    if (l && dg_tensor_numel(l) != 1)
      return FAIL(p, DG_ESHAPE, "pipe step %lld: the loss function returned %lld elements, "
                  "want 1", (long long)p->step, (long long)dg_tensor_numel(l));
    if (l) p->loss_sum += dg_tensor_item(l);
    y = l ? dg_scale(c, l, 1.0f / (float)p->M) : NULL; /* mean over micro-batches */
  } else if (y) {
    y = dg_contiguous(c, y);
  }
  if (!y)
    return FAIL(p, dg_ctx_errcode(c) ? dg_ctx_errcode(c) : DG_EINVAL, "pipe step %lld: stage "
                "%d (layers %d-%d), micro-batch %d: %s", (long long)p->step, p->s, p->first,
                p->last - 1, m, dg_ctx_errmsg(c));
  p->out[m] = y;
  return DG_OK;
}

static int backward(dg_pipe *p, int m) {
  dg_ctx *c = p->mctx[m];
  int rc = p->s == p->K - 1 ? dg_backward(c, p->out[m]) : dg_backward_with(c, p->out[m], p->gout[m]);
  if (rc)
    return FAIL(p, rc, "pipe step %lld: stage %d, backward of micro-batch %d: %s",
                (long long)p->step, p->s, m, dg_ctx_errmsg(c));
  return DG_OK;
}

static int run_action(dg_pipe *p, const step_args *a, const dg__pipe_action *act) {
  const int m = act->mb;
  switch (act->op) {
  case DG__PIPE_RECV_ACT: return recv_act(p, m);
  case DG__PIPE_FWD: return forward(p, a, m);
  case DG__PIPE_SEND_ACT: return send_act(p, m);
  case DG__PIPE_RECV_GRAD: {
    dg_tensor *g = dg_empty(p->mctx[m], DG_F32, dg_tensor_ndim(p->out[m]),
                            dg_tensor_shape(p->out[m]));
    if (!g) return FAIL(p, DG_ENOMEM, "pipe: stage %d: %s", p->s, dg_ctx_errmsg(p->mctx[m]));
    p->gout[m] = g;
    return recv_wait(p, dg_tensor_data(g), (size_t)dg_tensor_numel(g), DG_F32, p->s + 1,
                     TAG_GRAD, "receiving the gradient", m);
  }
  case DG__PIPE_BWD: return backward(p, m);
  case DG__PIPE_SEND_GRAD: {
    dg_tensor *g = dg_tensor_grad(p->in[m]);
    if (!g) return FAIL(p, DG_ESTATE, "pipe step %lld: stage %d: micro-batch %d: the stage's "
                        "input got no gradient", (long long)p->step, p->s, m);
    return post_send(p, dg_tensor_data(g), (size_t)dg_tensor_numel(g), DG_F32, p->s - 1,
                     TAG_GRAD, "sending the gradient", m);
  }
  }
  return FAIL(p, DG_EINVAL, "pipe: bad action %d", act->op);
}

/* Ends a step: every send finished, every micro-batch's context reset. */
static int end_step(dg_pipe *p, int rc) {
  for (int i = 0; i < p->nsends; i++) {
    int e = dg_work_wait(p->sends[i], 0);
    if (e && !rc)
      rc = FAIL(p, e, "pipe step %lld: stage %d: a send did not complete: %s", (long long)p->step,
                p->s, dg_work_errmsg(p->sends[i]));
    dg_work_free(p->sends[i]);
  }
  p->nsends = 0;
  for (int m = 0; m < p->M; m++) {
    dg_ctx_reset(p->mctx[m]);
    p->in[m] = p->out[m] = p->gout[m] = NULL;
  }
  return rc;
}

static int check_inputs(dg_pipe *p, const step_args *a) {
  dg_tensor *t = p->s == 0 ? a->x : p->s == p->K - 1 ? a->targets : NULL;
  if ((p->s == 0 && !a->x) || (p->s == p->K - 1 && (!a->targets || !a->loss_fn)))
    return FAIL(p, DG_EINVAL, "pipe_step: stage %d needs %s", p->s,
                p->s == 0 ? "the batch x" : "the targets and a loss function");
  if (t && dg_tensor_dim(t, 0) % p->M)
    return FAIL(p, DG_ESHAPE, "pipe_step: %lld rows do not split into %d micro-batches",
                (long long)dg_tensor_dim(t, 0), p->M);
  return DG_OK;
}

int dg_pipe_step(dg_pipe *p, dg_tensor *x, dg_tensor *targets, dg_pipe_loss_fn loss_fn,
                 void *user, float *loss) {
  if (!p) return DG_EINVAL;
  step_args a = {x, targets, loss_fn, user, 0};
  p->errmsg[0] = '\0';
  p->loss_sum = 0;
  int rc = check_inputs(p, &a);
  dg_tensor *rows = p->s == 0 ? x : targets;
  if (!rc && rows) a.mb = dg_tensor_dim(rows, 0) / p->M;
  for (int i = p->tab.off[p->s]; !rc && i < p->tab.off[p->s + 1]; i++)
    rc = run_action(p, &a, &p->tab.act[i]);
  rc = end_step(p, rc);
  /* the mean loss from the last stage to every rank */
  float l = (float)(p->loss_sum / p->M);
  if (!rc) {
    dg_work *w = NULL;
    rc = dg_pg_broadcast(p->pg, &l, 1, DG_F32, p->K - 1, &w);
    if (!rc) rc = dg_work_wait(w, 0);
    if (rc) FAIL(p, rc, "pipe step %lld: stage %d: the loss broadcast failed: %s",
                 (long long)p->step, p->s, w ? dg_work_errmsg(w) : dg_pg_errmsg(p->pg));
    dg_work_free(w);
  }
  if (loss) *loss = rc ? NAN : l;
  p->step++;
  return rc;
}
