/* dg_prog: runs random op programs through dgrad for the differential test
 * (tests/diff/difftest.py replays them in PyTorch and compares).
 *
 * Usage: dg_prog [FILE]   (stdin when no FILE). One input may hold many
 * programs, so one process runs a whole batch.
 *
 * Input, one directive per line, tokens separated by blanks ('#' lines are
 * comments). Numbers are anything strtod reads (the generator writes exact
 * decimal images of f32 values).
 *   prog NAME                    starts a program
 *   steps K                      K training steps on one context (default 1)
 *   zero_grad 0|1                dg_params_zero_grad before every step
 *   train 0|1                    dg_ctx_set_train (dropout active or identity)
 *   dump all|outs                forward values of every op result, or of the
 *                                'out' ids only (big programs)
 *   optim sgd LR MOM DAMP NESTEROV WD
 *   optim adamw|lamb LR B1 B2 EPS WD
 *   optim lars LR MOM WD TRUST EPS ADAPT_1D [EXCLUDE_SUFFIX]
 *   clip MAX_NORM                dg_clip_grad_norm after backward
 *   sched KIND BASE WARMUP TOTAL STEP_SIZE GAMMA MIN_LR   lr of step s = dg_lr_at(s)
 *   leaf ID KIND DTYPE NAME      KIND: param | frozen (param, not trainable) |
 *                                pers (dg_tensor_new, requires grad) | data
 *                                (arena, per step) | gdata (arena, requires grad)
 *                                DTYPE: the dg_dtype number
 *   val ID STEP NDIM D0.. V0..   values (row-major) of leaf ID at STEP (-1: every
 *                                step); params and pers take the -1 values once
 *   op NAME NOUT OUT.. NIN IN.. NATTR A..   OUT = NAME(IN.., A..); IN -1 = NULL
 *   out ID                       a tensor to dump under 'dump outs'
 *   backward ID [GID]            dg_backward(ID) or dg_backward_with(ID, GID)
 *   end                          runs the program
 *
 * Output per program (values printed %.9g, which round-trips f32):
 *   prog NAME
 *   F STEP ID NDIM D.. : V..     forward value of ID
 *   M STEP ID BITS               dropout keep-mask (from dg_rng_uniform at the
 *                                ctx's RNG state before the op)
 *   G STEP ID none | NDIM D.. : V..   gradient of a leaf after backward
 *   N STEP TOTAL                 dg_clip_grad_norm's total norm
 *   P STEP ID NDIM D.. : V..     a trainable parameter after the optimizer step
 *   L STEP LR                    learning rate set from the schedule
 *   W ID NDIM D.. : V..          parameter values after the last step
 *   E STEP CODE_NAME MESSAGE     dgrad failed (the program stops there)
 *   done NAME
 * Exit status 0 unless the input is malformed (2). */
#include <dgrad.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAXT = 2048, MAXIO = 16, MAXATTR = 24, MAXTOK = 1 << 20 };

typedef enum {
  L_PARAM, L_FROZEN, L_PERS, L_DATA, L_GDATA
} leaf_kind;

typedef struct {
  int id, step, ndim;
  int64_t shape[DG_MAX_DIMS], n;
  double *v;
} val_t;

typedef struct {
  int id;
  leaf_kind kind;
  dg_dtype dt;
  char name[64];
} leaf_t;

typedef struct {
  int code; /* index into op_names */
  int nout, out[MAXIO], nin, in[MAXIO], nattr;
  double a[MAXATTR];
} op_t;

typedef struct {
  char name[128];
  int steps, zero_grad, train, dump_all;
  char optim[16];
  double oargs[8];
  char osuffix[64];
  double clip;
  int has_sched;
  dg_lr_schedule sched;
  leaf_t *leaves;
  int nleaves;
  val_t *vals;
  int nvals;
  op_t *ops;
  int nops;
  int outs[MAXT], nouts;
  int loss, loss_grad;
} prog_t;

static const char *const op_names[] = {
    "reshape", "slice", "transpose", "permute", "contiguous", "matmul", "matmul_t",
    "linear", "linear_add", "add", "sub", "mul", "div", "scale", "add_scalar", "sum",
    "mean", "sum_dim", "mean_dim", "relu", "gelu", "tanh", "sigmoid", "exp", "log",
    "softmax", "log_softmax", "cross_entropy", "mse", "layernorm", "embedding", "dropout",
    "causal_mask", "conv2d", "maxpool2d", "concat", "split", "attention", "mlp_gelu",
    "mlp_gelu_add", "to_dtype", "leaky_relu", "avgpool2d", "global_avgpool2d",
    "batchnorm", "linear_relu", NULL};

enum {
  OP_RESHAPE, OP_SLICE, OP_TRANSPOSE, OP_PERMUTE, OP_CONTIGUOUS, OP_MATMUL, OP_MATMUL_T,
  OP_LINEAR, OP_LINEAR_ADD, OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_SCALE, OP_ADD_SCALAR, OP_SUM,
  OP_MEAN, OP_SUM_DIM, OP_MEAN_DIM, OP_RELU, OP_GELU, OP_TANH, OP_SIGMOID, OP_EXP, OP_LOG,
  OP_SOFTMAX, OP_LOG_SOFTMAX, OP_CROSS_ENTROPY, OP_MSE, OP_LAYERNORM, OP_EMBEDDING,
  OP_DROPOUT, OP_CAUSAL_MASK, OP_CONV2D, OP_MAXPOOL2D, OP_CONCAT, OP_SPLIT, OP_ATTENTION,
  OP_MLP_GELU, OP_MLP_GELU_ADD, OP_TO_DTYPE, OP_LEAKY_RELU, OP_AVGPOOL2D, OP_GLOBAL_AVGPOOL2D,
  OP_BATCHNORM, OP_LINEAR_RELU
};

/* ---- parsing ---- */

static void die(int line, const char *what) {
  fprintf(stderr, "dg_prog: input line %d: %s\n", line, what);
  exit(2);
}

/* Splits s in place into at most max blank-separated tokens. */
static int tokenize(char *s, char **tok, int max) {
  int n = 0;
  for (char *p = strtok(s, " \t\r\n"); p && n < max; p = strtok(NULL, " \t\r\n")) tok[n++] = p;
  return n;
}

static double num(char **tok, int ntok, int i, int line) {
  if (i >= ntok) die(line, "missing number");
  char *end;
  errno = 0;
  double v = strtod(tok[i], &end);
  if (*end) die(line, "bad number");
  return v;
}

static void *grow(void *p, int n, size_t sz) {
  /* capacity doubles at powers of two */
  if (n & (n - 1)) return p;
  void *q = realloc(p, (size_t)(n ? 2 * n : 1) * sz);
  if (!q) die(0, "out of memory");
  return q;
}

static void parse_val(prog_t *p, char **tok, int nt, int line) {
  p->vals = grow(p->vals, p->nvals, sizeof *p->vals);
  val_t *v = &p->vals[p->nvals++];
  memset(v, 0, sizeof *v);
  v->id = (int)num(tok, nt, 1, line);
  v->step = (int)num(tok, nt, 2, line);
  v->ndim = (int)num(tok, nt, 3, line);
  if (v->ndim < 0 || v->ndim > DG_MAX_DIMS) die(line, "bad ndim");
  v->n = 1;
  for (int i = 0; i < v->ndim; i++) v->n *= v->shape[i] = (int64_t)num(tok, nt, 4 + i, line);
  if (nt != 4 + v->ndim + v->n) die(line, "value count does not match the shape");
  v->v = malloc((size_t)(v->n ? v->n : 1) * sizeof *v->v);
  if (!v->v) die(line, "out of memory");
  for (int64_t i = 0; i < v->n; i++) v->v[i] = num(tok, nt, 4 + v->ndim + (int)i, line);
}

static void parse_op(prog_t *p, char **tok, int nt, int line) {
  p->ops = grow(p->ops, p->nops, sizeof *p->ops);
  op_t *o = &p->ops[p->nops++];
  memset(o, 0, sizeof *o);
  o->code = -1;
  for (int k = 0; op_names[k]; k++)
    if (nt > 1 && !strcmp(tok[1], op_names[k])) o->code = k;
  if (o->code < 0) die(line, "unknown op");
  int i = 2;
  o->nout = (int)num(tok, nt, i++, line);
  if (o->nout < 1 || o->nout > MAXIO) die(line, "bad output count");
  for (int k = 0; k < o->nout; k++) o->out[k] = (int)num(tok, nt, i++, line);
  o->nin = (int)num(tok, nt, i++, line);
  if (o->nin < 0 || o->nin > MAXIO) die(line, "bad input count");
  for (int k = 0; k < o->nin; k++) o->in[k] = (int)num(tok, nt, i++, line);
  o->nattr = (int)num(tok, nt, i++, line);
  if (o->nattr < 0 || o->nattr > MAXATTR) die(line, "bad attribute count");
  for (int k = 0; k < o->nattr; k++) o->a[k] = num(tok, nt, i++, line);
  for (int k = 0; k < o->nout; k++)
    if (o->out[k] < 0 || o->out[k] >= MAXT) die(line, "id out of range");
  for (int k = 0; k < o->nin; k++)
    if (o->in[k] < -1 || o->in[k] >= MAXT) die(line, "id out of range");
}

static void parse_setting(prog_t *p, char **tok, int nt, int line) {
  const char *k = tok[0];
  if (!strcmp(k, "steps")) p->steps = (int)num(tok, nt, 1, line);
  else if (!strcmp(k, "zero_grad")) p->zero_grad = (int)num(tok, nt, 1, line);
  else if (!strcmp(k, "train")) p->train = (int)num(tok, nt, 1, line);
  else if (!strcmp(k, "dump")) p->dump_all = nt > 1 && !strcmp(tok[1], "all");
  else if (!strcmp(k, "clip")) p->clip = num(tok, nt, 1, line);
  else if (!strcmp(k, "out") && p->nouts < MAXT) p->outs[p->nouts++] = (int)num(tok, nt, 1, line);
  else if (!strcmp(k, "backward")) {
    p->loss = (int)num(tok, nt, 1, line);
    p->loss_grad = nt > 2 ? (int)num(tok, nt, 2, line) : -1;
  } else if (!strcmp(k, "optim")) {
    if (nt < 2 || nt > 10) die(line, "bad optim");
    snprintf(p->optim, sizeof p->optim, "%s", tok[1]);
    for (int i = 2; i < nt; i++) {
      if (!strcmp(p->optim, "lars") && i == 8) snprintf(p->osuffix, sizeof p->osuffix, "%s", tok[i]);
      else p->oargs[i - 2] = num(tok, nt, i, line);
    }
  } else if (!strcmp(k, "sched")) {
    p->has_sched = 1;
    p->sched = (dg_lr_schedule){(dg_lr_kind)num(tok, nt, 1, line), (float)num(tok, nt, 2, line),
                                (int64_t)num(tok, nt, 3, line), (int64_t)num(tok, nt, 4, line),
                                (int64_t)num(tok, nt, 5, line), (float)num(tok, nt, 6, line),
                                (float)num(tok, nt, 7, line)};
  } else die(line, "unknown directive");
}

static void parse_leaf(prog_t *p, char **tok, int nt, int line) {
  static const char *const kinds[] = {"param", "frozen", "pers", "data", "gdata"};
  p->leaves = grow(p->leaves, p->nleaves, sizeof *p->leaves);
  leaf_t *l = &p->leaves[p->nleaves++];
  l->id = (int)num(tok, nt, 1, line);
  if (l->id < 0 || l->id >= MAXT || nt < 5) die(line, "bad leaf");
  l->kind = (leaf_kind)-1;
  for (int k = 0; k < 5; k++)
    if (!strcmp(tok[2], kinds[k])) l->kind = (leaf_kind)k;
  if ((int)l->kind < 0) die(line, "bad leaf kind");
  l->dt = (dg_dtype)num(tok, nt, 3, line);
  snprintf(l->name, sizeof l->name, "%s", tok[4]);
}

static void prog_free(prog_t *p) {
  for (int i = 0; i < p->nvals; i++) free(p->vals[i].v);
  free(p->vals);
  free(p->leaves);
  free(p->ops);
  memset(p, 0, sizeof *p);
}

static void prog_init(prog_t *p, const char *name) {
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "%s", name);
  p->steps = 1;
  p->train = 1;
  p->dump_all = 1;
  p->loss = p->loss_grad = -1;
}

/* ---- running ---- */

typedef struct {
  dg_ctx *ctx;
  dg_params *ps;
  dg_optim *opt;
  dg_tensor *t[MAXT];   /* tensors of the current step by id */
  dg_tensor *keep[MAXT]; /* params and persistent leaves by id */
  int step;
} run_t;

static void print_tensor(const char *tag, int step, int id, const dg_tensor *t) {
  if (step >= 0) printf("%s %d %d %d", tag, step, id, dg_tensor_ndim(t));
  else printf("%s %d %d", tag, id, dg_tensor_ndim(t));
  for (int i = 0; i < dg_tensor_ndim(t); i++) printf(" %lld", (long long)dg_tensor_dim(t, i));
  printf(" :");
  int64_t n = dg_tensor_numel(t);
  for (int64_t i = 0; i < n; i++) printf(" %.9g", dg_tensor_get(t, i));
  putchar('\n');
}

static int report(run_t *r, int rc) {
  if (!rc) rc = dg_ctx_errcode(r->ctx);
  printf("E %d %s %s\n", r->step, dg_err_name(rc ? rc : DG_EINVAL), dg_ctx_errmsg(r->ctx));
  return rc ? rc : DG_EINVAL;
}

static const val_t *find_val(const prog_t *p, int id, int step) {
  const val_t *any = NULL;
  for (int i = 0; i < p->nvals; i++) {
    if (p->vals[i].id != id) continue;
    if (p->vals[i].step == step) return &p->vals[i];
    if (p->vals[i].step == -1) any = &p->vals[i];
  }
  return any;
}

/* An arena tensor of leaf l with the values of this step. */
static dg_tensor *make_data(run_t *r, const leaf_t *l, const val_t *v) {
  size_t es = dg_dtype_size(l->dt);
  char *buf = malloc((size_t)(v->n ? v->n : 1) * es);
  if (!buf) return NULL;
  for (int64_t i = 0; i < v->n; i++) {
    if (l->dt == DG_I32) ((int32_t *)buf)[i] = (int32_t)v->v[i];
    else if (l->dt == DG_I64) ((int64_t *)buf)[i] = (int64_t)v->v[i];
    else if (l->dt == DG_F64) ((double *)buf)[i] = v->v[i];
    else ((float *)buf)[i] = (float)v->v[i];
  }
  dg_tensor *t = dg_from_data(r->ctx, l->dt, v->ndim, v->shape, buf);
  free(buf);
  if (t && l->kind == L_GDATA) dg_tensor_set_requires_grad(t, 1);
  return t;
}

static void fill_f32(dg_tensor *t, const val_t *v) {
  float *d = dg_tensor_data(t);
  for (int64_t i = 0; i < v->n; i++) d[i] = (float)v->v[i];
}

/* Params (all added before any value is written: data pointers move while
 * the store grows) and persistent leaves. */
static int make_persistent(run_t *r, const prog_t *p) {
  for (int i = 0; i < p->nleaves; i++) {
    const leaf_t *l = &p->leaves[i];
    const val_t *v = find_val(p, l->id, -1);
    if (l->kind == L_DATA || l->kind == L_GDATA) continue;
    if (!v) return DG_EINVAL;
    int rc = l->kind == L_PERS ? dg_tensor_new(&r->keep[l->id], DG_F32, v->ndim, v->shape, NULL, 0)
                               : dg_params_add(r->ps, l->name, v->ndim, v->shape, &r->keep[l->id]);
    if (rc) return rc;
    if (l->kind == L_PERS) dg_tensor_set_requires_grad(r->keep[l->id], 1);
    if (l->kind == L_FROZEN) dg_params_set_trainable(r->ps, dg_tensor_param_index(r->keep[l->id]), 0);
  }
  for (int i = 0; i < p->nleaves; i++) {
    const leaf_t *l = &p->leaves[i];
    if (r->keep[l->id]) fill_f32(r->keep[l->id], find_val(p, l->id, -1));
  }
  return DG_OK;
}

static const char *g_suffix; /* LARS exclusion suffix for the constructor */

static int make_optim(run_t *r, const prog_t *p) {
  const double *a = p->oargs;
  if (!p->optim[0] || !strcmp(p->optim, "none")) return DG_OK;
  if (!strcmp(p->optim, "sgd")) {
    dg_sgd_opts o = {(float)a[0], (float)a[1], (float)a[2], (int)a[3], (float)a[4]};
    return dg_optim_new_sgd(&r->opt, r->ps, &o, NULL, 0);
  }
  if (!strcmp(p->optim, "adamw") || !strcmp(p->optim, "lamb")) {
    dg_adamw_opts o = {(float)a[0], (float)a[1], (float)a[2], (float)a[3], (float)a[4]};
    return !strcmp(p->optim, "adamw") ? dg_optim_new_adamw(&r->opt, r->ps, &o, NULL, 0)
                                      : dg_optim_new_lamb(&r->opt, r->ps, &o, NULL, 0);
  }
  if (!strcmp(p->optim, "lars")) {
    dg_lars_opts o = dg_lars_defaults();
    o.lr = (float)a[0], o.momentum = (float)a[1], o.weight_decay = (float)a[2];
    o.trust_coef = (float)a[3], o.eps = (float)a[4], o.adapt_1d = (int)a[5];
    g_suffix = p->osuffix;
    if (p->osuffix[0]) o.exclude_suffixes = &g_suffix, o.n_exclude_suffixes = 1;
    return dg_optim_new_lars(&r->opt, r->ps, &o, NULL, 0);
  }
  return DG_EINVAL;
}

/* ---- op dispatch, by family ---- */

static dg_tensor *in_t(run_t *r, const op_t *o, int k) {
  return k < o->nin && o->in[k] >= 0 ? r->t[o->in[k]] : NULL;
}

static dg_tensor *run_view(run_t *r, const op_t *o) {
  dg_tensor *x = in_t(r, o, 0);
  int64_t shape[DG_MAX_DIMS];
  int perm[DG_MAX_DIMS];
  switch (o->code) {
  case OP_RESHAPE:
    for (int i = 0; i < (int)o->a[0] && i < DG_MAX_DIMS; i++) shape[i] = (int64_t)o->a[1 + i];
    return dg_reshape(r->ctx, x, (int)o->a[0], shape);
  case OP_SLICE: return dg_slice(r->ctx, x, (int64_t)o->a[0], (int64_t)o->a[1]);
  case OP_TRANSPOSE: return dg_transpose(r->ctx, x, (int)o->a[0], (int)o->a[1]);
  case OP_PERMUTE:
    for (int i = 0; i < o->nattr && i < DG_MAX_DIMS; i++) perm[i] = (int)o->a[i];
    return dg_permute(r->ctx, x, perm);
  case OP_CONTIGUOUS: return dg_contiguous(r->ctx, x);
  case OP_TO_DTYPE: return dg_to_dtype(r->ctx, x, (dg_dtype)o->a[0]);
  default: return NULL;
  }
}

static dg_tensor *run_math(run_t *r, const op_t *o) {
  dg_ctx *c = r->ctx;
  dg_tensor *a = in_t(r, o, 0), *b = in_t(r, o, 1);
  float s = o->nattr ? (float)o->a[0] : 0.0f;
  switch (o->code) {
  case OP_MATMUL: return dg_matmul(c, a, b);
  case OP_MATMUL_T: return dg_matmul_t(c, a, b, (int)o->a[0], (int)o->a[1]);
  case OP_LINEAR: return dg_linear(c, a, b, in_t(r, o, 2));
  case OP_LINEAR_ADD: return dg_linear_add(c, a, b, in_t(r, o, 2), in_t(r, o, 3));
  case OP_ADD: return dg_add(c, a, b);
  case OP_SUB: return dg_sub(c, a, b);
  case OP_MUL: return dg_mul(c, a, b);
  case OP_DIV: return dg_div(c, a, b);
  case OP_SCALE: return dg_scale(c, a, s);
  case OP_ADD_SCALAR: return dg_add_scalar(c, a, s);
  case OP_SUM: return dg_sum(c, a);
  case OP_MEAN: return dg_mean(c, a);
  case OP_SUM_DIM: return dg_sum_dim(c, a, (int)o->a[0], (int)o->a[1]);
  case OP_MEAN_DIM: return dg_mean_dim(c, a, (int)o->a[0], (int)o->a[1]);
  case OP_RELU: return dg_relu(c, a);
  case OP_GELU: return dg_gelu(c, a);
  case OP_TANH: return dg_tanh(c, a);
  case OP_SIGMOID: return dg_sigmoid(c, a);
  case OP_EXP: return dg_exp(c, a);
  case OP_LOG: return dg_log(c, a);
  case OP_SOFTMAX: return dg_softmax(c, a);
  case OP_LOG_SOFTMAX: return dg_log_softmax(c, a);
  case OP_CROSS_ENTROPY: return dg_cross_entropy(c, a, b);
  case OP_MSE: return dg_mse(c, a, b);
  default: return NULL;
  }
}

/* Dropout, printing the keep-mask the op drew so that the replay can apply
 * the same one (the identity cases draw nothing and print nothing). */
static dg_tensor *run_dropout(run_t *r, const op_t *o) {
  dg_tensor *x = in_t(r, o, 0);
  uint64_t seed, off;
  dg_ctx_rng_state(r->ctx, &seed, &off);
  float p = (float)o->a[0];
  dg_tensor *y = dg_dropout(r->ctx, x, p);
  if (!y || y == x) return y;
  int64_t n = dg_tensor_numel(x);
  float *u = malloc((size_t)(n ? n : 1) * sizeof *u);
  char *bits = malloc((size_t)n + 1);
  if (!u || !bits) {
    free(u);
    free(bits);
    return NULL;
  }
  dg_rng_uniform(seed, off, u, (size_t)n);
  for (int64_t i = 0; i < n; i++) bits[i] = u[i] >= p ? '1' : '0';
  bits[n] = 0;
  printf("M %d %d %s\n", r->step, o->out[0], n ? bits : "-");
  free(u);
  free(bits);
  return y;
}

static dg_tensor *run_nn(run_t *r, const op_t *o) {
  dg_ctx *c = r->ctx;
  dg_tensor *x = in_t(r, o, 0);
  dg_tensor *xs[MAXIO];
  switch (o->code) {
  case OP_LAYERNORM: return dg_layernorm(c, x, in_t(r, o, 1), in_t(r, o, 2), (float)o->a[0]);
  case OP_EMBEDDING: return dg_embedding(c, x, in_t(r, o, 1));
  case OP_DROPOUT: return run_dropout(r, o);
  case OP_CAUSAL_MASK: return dg_causal_mask(c, x);
  case OP_CONV2D: return dg_conv2d(c, x, in_t(r, o, 1), in_t(r, o, 2), (int)o->a[0], (int)o->a[1]);
  case OP_MAXPOOL2D: return dg_maxpool2d(c, x, (int)o->a[0], (int)o->a[1]);
  case OP_AVGPOOL2D: return dg_avgpool2d(c, x, (int)o->a[0], (int)o->a[1]);
  case OP_GLOBAL_AVGPOOL2D: return dg_global_avgpool2d(c, x);
  case OP_LEAKY_RELU: return dg_leaky_relu(c, x, (float)o->a[0]);
  case OP_LINEAR_RELU: return dg_linear_relu(c, x, in_t(r, o, 1), in_t(r, o, 2));
  case OP_BATCHNORM: /* a: train, eps; running statistics (eval) are data leaves */
    return dg_batchnorm(c, x, in_t(r, o, 1), in_t(r, o, 2), in_t(r, o, 3), in_t(r, o, 4),
                        (int)o->a[0], 0.1f, (float)o->a[1]);
  case OP_CONCAT:
    for (int k = 0; k < o->nin; k++) xs[k] = in_t(r, o, k);
    return dg_concat(c, o->nin, xs, (int)o->a[0]);
  case OP_ATTENTION: return dg_attention(c, x, (int)o->a[0], (int)o->a[1], (float)o->a[2]);
  case OP_MLP_GELU:
    return dg_mlp_gelu(c, x, in_t(r, o, 1), in_t(r, o, 2), in_t(r, o, 3), in_t(r, o, 4));
  case OP_MLP_GELU_ADD:
    return dg_mlp_gelu_add(c, x, in_t(r, o, 1), in_t(r, o, 2), in_t(r, o, 3), in_t(r, o, 4),
                           in_t(r, o, 5));
  default: return NULL;
  }
}

/* Runs one op into r->t; DG_OK or an error code. */
static int run_op(run_t *r, const op_t *o) {
  if (o->code == OP_SPLIT) {
    int64_t sizes[MAXIO];
    int n = (int)o->a[1];
    if (n != o->nout || n > MAXIO || o->nattr != 2 + n) return DG_EINVAL;
    for (int k = 0; k < n; k++) sizes[k] = (int64_t)o->a[2 + k];
    dg_tensor *parts[MAXIO];
    int rc = dg_split(r->ctx, in_t(r, o, 0), (int)o->a[0], n, sizes, parts);
    for (int k = 0; !rc && k < n; k++) r->t[o->out[k]] = parts[k];
    return rc;
  }
  dg_tensor *y;
  if (o->code <= OP_CONTIGUOUS || o->code == OP_TO_DTYPE) y = run_view(r, o);
  else if (o->code <= OP_MSE) y = run_math(r, o);
  else y = run_nn(r, o);
  r->t[o->out[0]] = y;
  return y ? DG_OK : (dg_ctx_errcode(r->ctx) ? dg_ctx_errcode(r->ctx) : DG_EINVAL);
}

/* ---- one step ---- */

static int step_inputs(run_t *r, const prog_t *p) {
  memset(r->t, 0, sizeof r->t);
  for (int i = 0; i < p->nleaves; i++) {
    const leaf_t *l = &p->leaves[i];
    if (r->keep[l->id]) {
      r->t[l->id] = r->keep[l->id];
      continue;
    }
    const val_t *v = find_val(p, l->id, r->step);
    if (!v) return DG_EINVAL;
    r->t[l->id] = make_data(r, l, v);
    if (!r->t[l->id]) return dg_ctx_errcode(r->ctx) ? dg_ctx_errcode(r->ctx) : DG_ENOMEM;
  }
  return DG_OK;
}

static void dump_forward(run_t *r, const prog_t *p) {
  if (p->dump_all) {
    for (int i = 0; i < p->nops; i++)
      for (int k = 0; k < p->ops[i].nout; k++)
        print_tensor("F", r->step, p->ops[i].out[k], r->t[p->ops[i].out[k]]);
  } else {
    for (int i = 0; i < p->nouts; i++)
      if (r->t[p->outs[i]]) print_tensor("F", r->step, p->outs[i], r->t[p->outs[i]]);
  }
}

static void dump_grads(run_t *r, const prog_t *p) {
  for (int i = 0; i < p->nleaves; i++) {
    const leaf_t *l = &p->leaves[i];
    if (l->kind == L_DATA || l->kind == L_FROZEN) continue;
    dg_tensor *g = dg_tensor_grad(r->t[l->id]);
    if (g) print_tensor("G", r->step, l->id, g);
    else printf("G %d %d none\n", r->step, l->id);
  }
}

static int update(run_t *r, const prog_t *p) {
  if (p->clip > 0) {
    double total = 0;
    int rc = dg_clip_grad_norm(r->ps, p->clip, &total);
    if (rc) return rc;
    printf("N %d %.17g\n", r->step, total);
  }
  if (!r->opt) return DG_OK;
  int rc = dg_optim_step(r->opt);
  /* every step's parameters: the replay checks each update from dgrad's own
   * parameters and gradients, so rounding is not amplified across steps */
  for (int i = 0; !rc && i < p->nleaves; i++)
    if (p->leaves[i].kind == L_PARAM) print_tensor("P", r->step, p->leaves[i].id, r->t[p->leaves[i].id]);
  return rc;
}

static int run_step(run_t *r, const prog_t *p) {
  if (p->zero_grad) dg_params_zero_grad(r->ps);
  if (p->has_sched && r->opt) {
    float lr = dg_lr_at(&p->sched, r->step);
    dg_optim_set_lr(r->opt, lr);
    printf("L %d %.9g\n", r->step, lr);
  }
  int rc = step_inputs(r, p);
  for (int i = 0; !rc && i < p->nops; i++) rc = run_op(r, &p->ops[i]);
  if (rc) return report(r, rc);
  dump_forward(r, p);
  if (p->loss >= 0) {
    dg_tensor *loss = r->t[p->loss];
    rc = p->loss_grad >= 0 ? dg_backward_with(r->ctx, loss, r->t[p->loss_grad])
                           : dg_backward(r->ctx, loss);
    if (rc) return report(r, rc);
    dump_grads(r, p);
  }
  rc = update(r, p);
  if (rc) return report(r, rc);
  dg_ctx_reset(r->ctx);
  return DG_OK;
}

static void run_prog(const prog_t *p) {
  run_t *r = calloc(1, sizeof *r);
  if (!r) die(0, "out of memory");
  printf("prog %s\n", p->name);
  int rc = dg_ctx_new(&r->ctx, NULL);
  if (!rc) rc = dg_params_new(&r->ps);
  if (!rc) dg_ctx_set_train(r->ctx, p->train);
  if (!rc) rc = make_persistent(r, p);
  if (!rc) rc = make_optim(r, p);
  if (rc) printf("E -1 %s setup failed\n", dg_err_name(rc));
  for (r->step = 0; !rc && r->step < p->steps; r->step++) rc = run_step(r, p);
  for (int i = 0; !rc && i < p->nleaves; i++)
    if (p->leaves[i].kind == L_PARAM || p->leaves[i].kind == L_FROZEN)
      print_tensor("W", -1, p->leaves[i].id, r->keep[p->leaves[i].id]);
  printf("done %s\n", p->name);
  fflush(stdout);
  dg_optim_free(r->opt);
  for (int i = 0; i < p->nleaves; i++)
    if (p->leaves[i].kind == L_PERS) dg_tensor_free(r->keep[p->leaves[i].id]);
  dg_params_free(r->ps);
  dg_ctx_free(r->ctx);
  free(r);
}

/* Reads one line of any length into *buf. */
static int read_line(FILE *f, char **buf, size_t *cap) {
  size_t n = 0;
  int c;
  while ((c = fgetc(f)) != EOF && c != '\n') {
    if (n + 2 > *cap) {
      *cap = *cap ? 2 * *cap : 4096;
      char *b = realloc(*buf, *cap);
      if (!b) die(0, "out of memory");
      *buf = b;
    }
    (*buf)[n++] = (char)c;
  }
  if (c == EOF && n == 0) return 0;
  if (!*buf) *buf = calloc(1, 1);
  (*buf)[n] = 0;
  return 1;
}

static void dispatch(prog_t *p, int *inprog, char **tok, int nt, int line) {
  if (!strcmp(tok[0], "prog")) {
    if (*inprog) prog_free(p);
    prog_init(p, nt > 1 ? tok[1] : "?");
    *inprog = 1;
    return;
  }
  if (!*inprog) die(line, "directive outside a program");
  if (!strcmp(tok[0], "end")) {
    run_prog(p);
    prog_free(p);
    *inprog = 0;
  } else if (!strcmp(tok[0], "leaf")) parse_leaf(p, tok, nt, line);
  else if (!strcmp(tok[0], "val")) parse_val(p, tok, nt, line);
  else if (!strcmp(tok[0], "op")) parse_op(p, tok, nt, line);
  else parse_setting(p, tok, nt, line);
}

int main(int argc, char **argv) {
  FILE *f = argc > 1 ? fopen(argv[1], "r") : stdin;
  if (!f) {
    perror(argv[1]);
    return 2;
  }
  static char *tok[MAXTOK];
  static prog_t p;
  char *buf = NULL;
  size_t cap = 0;
  int line = 0, inprog = 0;
  while (read_line(f, &buf, &cap)) {
    line++;
    int nt = tokenize(buf, tok, MAXTOK);
    if (nt == 0 || tok[0][0] == '#') continue;
    dispatch(&p, &inprog, tok, nt, line);
  }
  if (inprog) prog_free(&p);
  free(buf);
  if (f != stdin) fclose(f);
  return 0;
}
