/* The tape: node recording, saved tensors, gradient buffers, backward and
 * hooks. Nodes are appended in creation order, which is a topological order,
 * so backward is one reverse walk. A parameter's gradient is final once the
 * walk passes the first node that used it; that is when its ready hook
 * fires. */
#include <stdio.h>
#include <string.h>

#include "core/core_impl.h"
#include "autograd/swap_impl.h"
#include "backends/kern_mem.h"
#include "base/trace_impl.h"

/* Grows ts's arrays to n parameters; new entries start unused. */
static int tstore_grow(dg_tape_store *ts, int n) {
  if (n <= ts->cap) return DG_OK;
  int cap = ts->cap ? ts->cap : 16;
  while (cap < n) cap *= 2;
  int *fu = dg__realloc(ts->first_use, (size_t)cap * sizeof *fu);
  if (fu) ts->first_use = fu;
  uint8_t *r = fu ? dg__realloc(ts->reached, (size_t)cap) : NULL;
  if (r) ts->reached = r;
  uint8_t *f = r ? dg__realloc(ts->fired, (size_t)cap) : NULL;
  if (!f) return DG_ENOMEM;
  ts->fired = f;
  for (int i = ts->cap; i < cap; i++) ts->first_use[i] = -1, ts->reached[i] = ts->fired[i] = 0;
  ts->cap = cap;
  return DG_OK;
}

static dg_tape_store *find_store(dg_ctx *ctx, const dg_params *ps) {
  for (int i = 0; i < ctx->nstores; i++)
    if (ctx->stores[i].ps == ps) return &ctx->stores[i];
  return NULL;
}

/* ps's state on ctx's tape, added (cleared) on first use; NULL with the
 * error recorded when there are too many stores or no memory. */
static dg_tape_store *involve_store(dg_ctx *ctx, dg_params *ps) {
  dg_tape_store *ts = find_store(ctx, ps);
  if (!ts) {
    if (ctx->nstores == DG_MAX_STORES) {
      dg__set_error(ctx, DG_EINVAL, "autograd: more than %d parameter stores in one tape",
                    DG_MAX_STORES);
      return NULL;
    }
    ts = &ctx->stores[ctx->nstores];
    if (tstore_grow(ts, ps->n)) goto nomem;
    for (int i = 0; i < ts->cap; i++) ts->first_use[i] = -1, ts->reached[i] = ts->fired[i] = 0;
    ts->ps = ps;
    ctx->nstores++;
  }
  if (tstore_grow(ts, ps->n)) goto nomem; /* parameters added mid-tape */
  return ts;
nomem:
  dg__set_error(ctx, DG_ENOMEM, "autograd: out of memory for the tape's parameter state");
  return NULL;
}

int dg__needs_grad(dg_ctx *ctx, int nin, dg_tensor *const *in) {
  if (!ctx->grad_enabled) return 0;
  for (int i = 0; i < nin; i++)
    if (dg__wants_grad(in[i])) return 1;
  return 0;
}

static int tape_push(dg_ctx *ctx, dg_node *n) {
  if (ctx->ntape == ctx->tape_cap) {
    int cap = ctx->tape_cap ? ctx->tape_cap * 2 : 256;
    dg_node **t = dg__realloc(ctx->tape, (size_t)cap * sizeof *t);
    if (!t) return DG_ENOMEM;
    ctx->tape = t;
    ctx->tape_cap = cap;
  }
  n->index = ctx->ntape;
  ctx->tape[ctx->ntape++] = n;
  return DG_OK;
}

dg_node *dg__record(dg_ctx *ctx, const char *op, dg_backward_fn fn, dg_tensor *out,
                    int nin, dg_tensor *const *in) {
  DG_ASSERT(nin <= DG_NODE_MAX_IN);
  dg_node *n = dg__arena_alloc(&ctx->arena, sizeof *n);
  if (!n || tape_push(ctx, n)) {
    dg__set_error(ctx, DG_ENOMEM, "%s: out of memory recording the tape", op);
    return NULL;
  }
  memset((char *)n + offsetof(dg_node, nin), 0, sizeof *n - offsetof(dg_node, nin));
  n->index = ctx->ntape - 1;
  n->op = op;
  n->backward = fn;
  n->out = out;
  n->nin = nin;
  for (int i = 0; i < nin; i++) {
    dg_tensor *t = in[i];
    n->in[i] = t;
    if (t && t->params && t->param_id >= 0) {
      dg_tape_store *ts = involve_store(ctx, t->params);
      if (!ts) return NULL;
      if (ts->first_use[t->param_id] < 0) ts->first_use[t->param_id] = n->index;
    }
  }
  n->release_out = out->node == NULL; /* several nodes may share one out */
  out->node = n;
  out->flags |= DG_TF_REQUIRES_GRAD;
  return n;
}

int dg__save(dg_ctx *ctx, dg_node *node, dg_tensor *t) {
  DG_ASSERT(node->nsaved < DG_NODE_MAX_SAVED);
  void *h = t;
  if (ctx->pack && t) {
    h = ctx->pack(ctx->pack_user, ctx, t);
    if (!h) return dg__set_error(ctx, DG_ENOMEM, "%s: saved-tensor pack hook failed", node->op);
  }
  node->saved[node->nsaved++] = h;
  return DG_OK;
}

dg_tensor *dg__saved(dg_ctx *ctx, dg_node *node, int k) {
  DG_ASSERT(k < node->nsaved);
  void *h = node->saved[k];
  if (!ctx->unpack || !h) return h;
  dg_tensor *t = ctx->unpack(ctx->pack_user, ctx, h);
  if (!t) dg__set_error(ctx, DG_ENOMEM, "%s: saved-tensor unpack hook failed", node->op);
  return t;
}

/* ---- gradient buffer pool (per step, arena memory) ---- */

static int gpool_slot(dg_ctx *ctx, size_t bytes, int create) {
  /* an empty block cannot hold the free-list link, and size 0 is what an
   * unused slot reads: without this a 0-byte scratch (an op with an empty
   * dim) joined an unused slot's list and was later handed out, 64 bytes
   * long, for a larger size */
  if (bytes < sizeof(void *)) return -1;
  for (int i = 0; i < 32; i++) {
    if (ctx->gpool[i].bytes == bytes) return i;
    if (!ctx->gpool[i].bytes) {
      if (!create) return -1;
      ctx->gpool[i].bytes = bytes;
      return i;
    }
  }
  return -1;
}

static void *gpool_take(dg_ctx *ctx, size_t bytes) {
  int i = gpool_slot(ctx, bytes, 0);
  void *p = i >= 0 ? ctx->gpool[i].head : NULL;
  if (p) ctx->gpool[i].head = *(void **)p;
  return p;
}

static void gpool_give(dg_ctx *ctx, dg_tensor *t) {
  size_t bytes = (size_t)dg__numel(t) * sizeof(float);
  int i = bytes >= sizeof(void *) && t->grad->device == DG_CPU ? gpool_slot(ctx, bytes, 1) : -1;
  if (i < 0) return; /* tiny or too many sizes: left to the arena */
  *(void **)t->grad->data = ctx->gpool[i].head;
  ctx->gpool[i].head = t->grad->data;
  t->grad = NULL;
}

void *dg__scratch_take(dg_ctx *ctx, size_t bytes) {
  bytes = (bytes + DG_ALIGN - 1) & ~(size_t)(DG_ALIGN - 1);
  const int dev = ctx->op_device; /* the running op's device; the pool is host memory */
  void *p = dev == DG_CPU ? gpool_take(ctx, bytes) : NULL;
  if (!p) p = dg__arena_data(ctx, dev, bytes);
  if (!p) dg__set_error(ctx, DG_ENOMEM, "out of memory for %zu bytes of scratch", bytes);
  return p;
}

void dg__scratch_give(dg_ctx *ctx, void *p, size_t bytes) {
  bytes = (bytes + DG_ALIGN - 1) & ~(size_t)(DG_ALIGN - 1);
  int i = p && ctx->op_device == DG_CPU ? gpool_slot(ctx, bytes, 1) : -1;
  if (i < 0) return; /* too many sizes: left to the arena */
  *(void **)p = ctx->gpool[i].head;
  ctx->gpool[i].head = p;
}

/* A new f32 arena tensor of t's shape for t's gradient, from the pool when a
 * dead buffer of the same size is available. */
static dg_tensor *grad_tensor_new(dg_ctx *ctx, const dg_tensor *t) {
  /* the pool links its blocks through their first bytes: host memory only */
  void *d = t->device == DG_CPU ? gpool_take(ctx, (size_t)dg__numel(t) * sizeof(float)) : NULL;
  if (!d) {
    const int keep = ctx->op_device;
    ctx->op_device = t->device;
    dg_tensor *g = dg__new(ctx, "backward", DG_F32, t->ndim, t->shape);
    ctx->op_device = keep;
    return g;
  }
  dg_tensor *g = dg__arena_alloc(&ctx->arena, sizeof *g);
  if (!g) {
    dg__set_error(ctx, DG_ENOMEM, "backward: out of memory for a gradient header");
    return NULL;
  }
  return dg__tensor_init(g, d, DG_CPU, DG_F32, t->ndim, t->shape, DG_TF_ARENA);
}

float *dg__grad_buf_w(dg_ctx *ctx, dg_tensor *t, int *overwrite) {
  *overwrite = 0;
  if (!dg__wants_grad(t)) return NULL;
  t->flags &= ~(uint32_t)DG_TF_GRAD_RELU; /* another contribution, maybe unmasked */
  if (!t->grad) {
    dg_tensor *g;
    if (t->flags & DG_TF_ARENA) {
      g = grad_tensor_new(ctx, t);
      if (!g) return NULL;
    } else if (dg_tensor_new(&g, DG_F32, t->ndim, t->shape, NULL, 0)) {
      dg__set_error(ctx, DG_ENOMEM, "backward: out of memory for a leaf gradient");
      return NULL;
    }
    t->grad = g;
    t->flags |= DG_TF_GRAD_STALE; /* fresh memory: logically zero */
  }
  if (t->flags & DG_TF_GRAD_STALE) {
    t->flags &= ~(uint32_t)DG_TF_GRAD_STALE;
    *overwrite = 1;
  }
  return t->grad->data;
}

float *dg__grad_buf(dg_ctx *ctx, dg_tensor *t) {
  int overwrite;
  float *g = dg__grad_buf_w(ctx, t, &overwrite);
  if (g && overwrite) dg__be_of(t)->mem->zero(g, (size_t)dg__numel(t) * sizeof(float));
  return g;
}

/* ---- hooks ---- */

static int add_hook(dg_ctx *ctx, dg_hook *list, int *n, dg_hook h) {
  if (*n == DG_MAX_HOOKS) return DG_EINVAL;
  h.id = ++ctx->next_hook_id;
  list[*n] = h;
  return list[(*n)++].id;
}

int dg_ctx_add_grad_ready_hook(dg_ctx *ctx, dg_grad_ready_fn fn, void *user) {
  if (!ctx || !fn) return DG_EINVAL;
  dg_hook h = {0, fn, NULL, user};
  return add_hook(ctx, ctx->ready_hooks, &ctx->nready_hooks, h);
}

int dg_ctx_add_backward_end_hook(dg_ctx *ctx, dg_backward_end_fn fn, void *user) {
  if (!ctx || !fn) return DG_EINVAL;
  dg_hook h = {0, NULL, fn, user};
  return add_hook(ctx, ctx->end_hooks, &ctx->nend_hooks, h);
}

int dg_ctx_set_saved_tensor_hooks(dg_ctx *ctx, dg_pack_fn pack, dg_unpack_fn unpack,
                                  void *user) {
  if (!ctx || (!pack) != (!unpack)) return DG_EINVAL;
  if (ctx->swap) /* swapping owns the pair (autograd/swap.c) */
    return dg__set_error(ctx, DG_ESTATE, "set_saved_tensor_hooks: activation swapping is on "
                                         "(dg_ctx_set_swap(ctx, NULL) first)");
  ctx->pack = pack;
  ctx->unpack = unpack;
  ctx->pack_user = user;
  if (!pack) return ctx->pack_id = 0;
  return ctx->pack_id = ++ctx->next_hook_id;
}

static int remove_from(dg_hook *list, int *n, int id) {
  for (int i = 0; i < *n; i++) {
    if (list[i].id != id) continue;
    memmove(&list[i], &list[i + 1], (size_t)(*n - i - 1) * sizeof *list);
    (*n)--;
    return 1;
  }
  return 0;
}

int dg_ctx_remove_hook(dg_ctx *ctx, int id) {
  if (!ctx || id <= 0) return DG_EINVAL;
  if (remove_from(ctx->ready_hooks, &ctx->nready_hooks, id)) return DG_OK;
  if (remove_from(ctx->end_hooks, &ctx->nend_hooks, id)) return DG_OK;
  if (ctx->pack_id == id) return dg_ctx_set_saved_tensor_hooks(ctx, NULL, NULL, NULL);
  return DG_ENOTFOUND;
}

int dg_ctx_attach_params(dg_ctx *ctx, dg_params *ps) {
  if (!ctx || !ps) return DG_EINVAL;
  for (int i = 0; i < ctx->nattached; i++)
    if (ctx->attached[i] == ps) return DG_OK;
  if (ctx->nattached == DG_MAX_STORES)
    return dg__set_error(ctx, DG_EINVAL, "attach_params: already %d stores attached",
                         DG_MAX_STORES);
  if (ps->nattached_to == DG_MAX_STORES)
    return dg__set_error(ctx, DG_EINVAL, "attach_params: the store is attached to %d contexts",
                         DG_MAX_STORES);
  ctx->attached[ctx->nattached++] = ps;
  ps->attached_to[ps->nattached_to++] = ctx;
  return DG_OK;
}

static int remove_ptr(void **list, int *n, const void *p) {
  for (int i = 0; i < *n; i++) {
    if (list[i] != p) continue;
    list[i] = list[--*n];
    return 1;
  }
  return 0;
}

int dg_ctx_detach_params(dg_ctx *ctx, dg_params *ps) {
  if (!ctx || !ps) return DG_EINVAL;
  if (ctx->in_backward)
    return dg__set_error(ctx, DG_ESTATE, "detach_params: called from a backward hook");
  if (!remove_ptr((void **)ctx->attached, &ctx->nattached, ps)) return DG_ENOTFOUND;
  remove_ptr((void **)ps->attached_to, &ps->nattached_to, ctx);
  return DG_OK;
}

void dg__params_detach_all(dg_params *ps) {
  while (ps->nattached_to) {
    dg_ctx *ctx = ps->attached_to[0];
    remove_ptr((void **)ctx->attached, &ctx->nattached, ps);
    remove_ptr((void **)ps->attached_to, &ps->nattached_to, ctx);
  }
}

int dg_ctx_set_grad_enabled(dg_ctx *ctx, int on) {
  if (!ctx) return 0;
  int prev = ctx->grad_enabled;
  ctx->grad_enabled = !!on;
  return prev;
}
int dg_ctx_is_grad_enabled(const dg_ctx *ctx) { return ctx ? ctx->grad_enabled : 0; }
int dg_ctx_tape_size(const dg_ctx *ctx) { return ctx ? ctx->ntape : 0; }

int dg_params_reached(const dg_params *ps, int i) {
  return (ps && i >= 0 && i < ps->n) ? ps->reached[i] : 0;
}
int dg_params_unreached_count(const dg_params *ps) { return ps ? ps->unreached : 0; }

/* ---- backward ---- */

/* Gradient buffers with several writers in one node. An op's backward may
 * overwrite (=) a stale (logically zero) input gradient instead of adding,
 * which is right only for its single writer: when one tensor fills two input
 * slots (a residual into its own input, tied weights), its buffer is zeroed
 * first so that every slot adds. A node whose output has no elements
 * contributes exactly zero to every input: its backward is not run (an op
 * that loops over no rows would leave an overwriting first writer's buffer
 * unwritten) and its inputs' gradients read as zero. Returns 1 to skip the
 * node's backward, 0 to run it, or an error code. */
static int prepare_inputs(dg_ctx *ctx, dg_node *n) {
  int empty = dg__numel(n->out) == 0;
  for (int k = 0; k < n->nin; k++) {
    dg_tensor *t = n->in[k];
    if (!dg__wants_grad(t)) continue;
    int shared = empty;
    for (int j = 0; j < k && !shared; j++) shared = n->in[j] == t;
    if (shared && !dg__grad_buf(ctx, t)) return ctx->err ? ctx->err : DG_ENOMEM;
  }
  return empty;
}

static void fire_ready(dg_ctx *ctx, dg_tape_store *ts, int id, int reached) {
  dg_params *ps = ts->ps;
  if (ts->fired[id] || !ps->trainable[id]) return;
  dg__param_grad_materialize(ps->t[id]); /* stale = nothing was written */
  ts->fired[id] = 1;
  for (int h = 0; h < ctx->nready_hooks; h++)
    ctx->ready_hooks[h].ready(ctx->ready_hooks[h].user, ps, id, reached);
}

/* Runs n's backward when the loss reaches its output; *ran says whether. */
static int run_node(dg_ctx *ctx, dg_node *n, int *ran) {
  *ran = n->out->grad != NULL;
  if (!*ran) return DG_OK; /* not reached from the loss */
  int rc = prepare_inputs(ctx, n);
  if (rc < 0) return rc;
  ctx->op_device = n->out->device; /* the node's gradients and scratch live there */
  rc = rc ? DG_OK : n->backward(ctx, n);
  if (rc) return rc;
  if (ctx->err) return ctx->err;
  /* an intermediate's gradient is dead now (as torch's non-leaf .grad) */
  if (n->release_out && (n->out->flags & DG_TF_ARENA) && n->out->grad &&
      (n->out->grad->flags & DG_TF_ARENA))
    gpool_give(ctx, n->out);
  return DG_OK;
}

/* Fires the hooks of parameters backward never reached and publishes the
 * outcome on each store (dg_params_reached). */
static void finish_stores(dg_ctx *ctx) {
  for (int s = 0; s < ctx->nstores; s++) {
    dg_tape_store *ts = &ctx->stores[s];
    dg_params *ps = ts->ps;
    ps->unreached = 0;
    for (int i = 0; i < ps->n; i++) {
      ps->reached[i] = ts->reached[i];
      if (!ps->trainable[i]) continue;
      if (!ts->fired[i]) fire_ready(ctx, ts, i, 0);
      if (!ts->reached[i]) ps->unreached++;
    }
  }
}

/* Reverse walk: each node's backward, then for its parameter inputs the
 * reached mark and, at their first use, the ready hook. */
static int walk(dg_ctx *ctx) {
  for (int i = ctx->ntape - 1; i >= 0; i--) {
    dg_node *n = ctx->tape[i];
    if (ctx->swap && dg__swap_backward_node(ctx->swap, i)) return ctx->err; /* prefetch */
    int ran, rc = run_node(ctx, n, &ran);
    if (rc) return rc;
    for (int k = 0; k < n->nin; k++) {
      dg_tensor *t = n->in[k];
      if (!t || !t->params || t->param_id < 0) continue;
      dg_tape_store *ts = find_store(ctx, t->params);
      int id = t->param_id;
      if (ran && t->params->trainable[id]) ts->reached[id] = 1;
      if (ts->first_use[id] == i) fire_ready(ctx, ts, id, ts->reached[id]);
    }
  }
  return DG_OK;
}

/* An arena tensor handed to backward must be live in this context: its
 * header and its node in the part of the arena used since the last reset
 * (checked before either is read: a stale header's bytes may belong to
 * another tensor by now), and the node on the tape or consumed by an
 * earlier backward of this step. */
static int from_this_step(const dg_ctx *ctx, const dg_tensor *t) {
  int live = dg__arena_live(&ctx->arena, t);
  if (live < 0) return 0;
  if (!live) return !(t->flags & DG_TF_ARENA) && !t->node; /* a persistent leaf */
  const dg_node *n = t->node;
  if (!n) return 1;
  if (dg__arena_live(&ctx->arena, n) != 1) return 0;
  return n->consumed || (n->index >= 0 && n->index < ctx->ntape && ctx->tape[n->index] == n);
}

/* Output k of a backward (k < 0: the only one) with its gradient: refused
 * before anything is written. */
static int check_root(dg_ctx *ctx, int k, dg_tensor *out, dg_tensor *grad_out) {
  char w[32] = "";
  if (k >= 0) snprintf(w, sizeof w, " %d", k);
  if (!out) return dg__set_error(ctx, DG_EINVAL, "backward: output%s is NULL", w);
  if (!from_this_step(ctx, out)) /* first: nothing of out is read before it */
    return dg__set_error(ctx, DG_ESTATE,
                         "backward: output%s is not a tensor of this context's current step "
                         "(made before the last dg_ctx_reset, or by another context)", w);
  if (!dg__wants_grad(out))
    return dg__set_error(ctx, DG_EINVAL,
                         "backward: output%s does not require grad (no parameter or "
                         "grad-requiring input reaches it, or grad mode was off)", w);
  if (out->node && out->node->consumed)
    return dg__set_error(ctx, DG_ESTATE,
                         "backward: the tape that produced output%s was already consumed by "
                         "an earlier backward (run the forward again)", w);
  if (grad_out && grad_out->dtype != DG_F32)
    return dg__set_error(ctx, DG_EDTYPE, "backward: grad_out%s must be f32, got %s", w,
                         dg_dtype_name(grad_out->dtype));
  if (grad_out && !dg__same_shape(out, grad_out)) {
    char a[96], b[96];
    return dg__set_error(ctx, DG_ESHAPE, "backward: grad_out%s %s does not match output %s", w,
                         dg__shape_str(grad_out, b, sizeof b), dg__shape_str(out, a, sizeof a));
  }
  return DG_OK;
}

/* Seeds each root's gradient (+=: a root given twice gets both), then
 * walks the tape once. */
static int backward_roots(dg_ctx *ctx, int n, dg_tensor *const *outs, dg_tensor *const *grads) {
  if (!ctx) return DG_EINVAL;
  if (ctx->in_backward) return dg__set_error(ctx, DG_ESTATE, "backward: called from a hook");
  /* an earlier op error the caller moved past must not fail this backward:
   * backward reports only its own errors */
  dg_ctx_clear_error(ctx);
  if (n < 1 || !outs)
    return dg__set_error(ctx, DG_EINVAL, "backward: %d outputs%s", n, outs ? "" : " (NULL)");
  for (int k = 0; k < n; k++) {
    int e = check_root(ctx, n > 1 ? k : -1, outs[k], grads ? grads[k] : NULL);
    if (e) return e;
  }
  for (int i = 0; i < ctx->nattached; i++)
    if (!involve_store(ctx, ctx->attached[i])) return ctx->err;
  for (int s = 0; s < ctx->nstores; s++) {
    /* pending updates read the gradients this backward will overwrite */
    int e = dg__params_flush(ctx->stores[s].ps, DG__SETTLE_BACKWARD);
    if (e) return dg__set_error(ctx, e, "backward: a pending parameter update failed (%s)",
                                dg_strerror(e));
  }
  for (int k = 0; k < n; k++) {
    float *g = dg__grad_buf(ctx, outs[k]);
    if (!g) return ctx->err ? ctx->err : DG_ENOMEM;
    dg_tensor *go_t = grads ? grads[k] : NULL;
    const float *go = go_t ? dg__contig_data(ctx, "backward", go_t) : NULL;
    if (go_t && !go) return ctx->err;
    dg__be_of(outs[k])->mem->add_f32(g, go, dg__numel(outs[k]));
  }

  int prev = dg_ctx_set_grad_enabled(ctx, 0);
  ctx->in_backward = 1;
  uint64_t tr0 = dg__trace_t0();
  int rc = walk(ctx);
  if (ctx->swap) dg__swap_backward_end(ctx->swap);
  if (!rc) finish_stores(ctx);
  for (int h = 0; !rc && h < ctx->nend_hooks; h++)
    rc = ctx->end_hooks[h].end(ctx->end_hooks[h].user, ctx);
  ctx->in_backward = 0;
  DG__TRACE_END(tr0, "backward", NULL, "nodes", ctx->ntape, NULL, 0);
  dg_ctx_set_grad_enabled(ctx, prev);
  uint64_t epoch = 0; /* step boundaries of the stores involved */
  for (int st = 0; st < ctx->nstores; st++) epoch += ctx->stores[st].ps->zero_grads;
  ctx->nstores = 0;
  for (int i = 0; i < ctx->ntape; i++) ctx->tape[i]->consumed = 1;
  ctx->ntape = 0;
  dg__ctx_backward_done(ctx, epoch);
  if (rc && !ctx->err) dg__set_error(ctx, rc, "backward: a backward-end hook failed (%s)",
                                     dg_strerror(rc));
  return rc;
}

int dg_backward_with(dg_ctx *ctx, dg_tensor *out, dg_tensor *grad_out) {
  return backward_roots(ctx, 1, &out, grad_out ? &grad_out : NULL);
}

int dg_backward_multi(dg_ctx *ctx, int n, dg_tensor *const *outs, dg_tensor *const *grads) {
  return backward_roots(ctx, n, outs, grads);
}

int dg_backward(dg_ctx *ctx, dg_tensor *loss) { return dg_backward_with(ctx, loss, NULL); }
