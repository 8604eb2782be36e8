/* Contexts: step arena, error slot, grad/train mode, RNG stream. */
#include <stdio.h>
#include <string.h>

#include "core/core_impl.h"

int dg_ctx_new(dg_ctx **out, const dg_ctx_opts *opts) {
  if (!out) return DG_EINVAL;
  *out = NULL;
  dg_ctx *c = dg__calloc(1, sizeof *c);
  if (!c) return DG_ENOMEM;
  c->grad_enabled = 1;
  c->train = 1;
  c->rng_seed = (opts && opts->seed) ? opts->seed : 0x5eed;
  size_t first = (opts && opts->arena_bytes) ? opts->arena_bytes : ((size_t)1 << 20);
  c->arena.reserved = first; /* size of the first chunk */
  void *probe = dg__arena_alloc(&c->arena, DG_ALIGN);
  if (!probe) {
    dg__free(c);
    return DG_ENOMEM;
  }
  c->arena.reserved = first;
  dg__arena_reset(&c->arena);
  c->arena.peak = 0;
  c->arena.owner = c;
  c->arena_limit = opts ? opts->arena_limit : 0;
  *out = c;
  return DG_OK;
}

void (*volatile dg__swap_touch)(const dg_tensor *t);

void dg_ctx_free(dg_ctx *ctx) {
  if (!ctx) return;
  if (ctx->swap) ctx->swap_vt->free(ctx->swap); /* before the arena it reads */
  while (ctx->nattached) dg_ctx_detach_params(ctx, ctx->attached[0]);
  for (int s = 0; s < DG_MAX_STORES; s++) {
    dg__free(ctx->stores[s].first_use);
    dg__free(ctx->stores[s].reached);
    dg__free(ctx->stores[s].fired);
  }
  dg__arena_free(&ctx->arena);
  for (int d = 0; d < DG__MAX_DEVICES; d++)
    if (ctx->dev_arena[d]) {
      dg__arena_free(ctx->dev_arena[d]);
      dg__free(ctx->dev_arena[d]);
    }
  dg__free(ctx->tape);
  dg__free(ctx);
}

static void arena_step_end(dg_arena *a) {
  if (a->used > a->step_max) a->step_max = a->used;
}

void dg__ctx_backward_done(dg_ctx *ctx, uint64_t epoch) {
  if (!ctx->backwards_since_reset++ || epoch == ctx->bwd_epoch) { /* same step */
    ctx->bwd_epoch = epoch;
    return;
  }
  ctx->bwd_epoch = epoch;
  if (ctx->steps_since_reset++) return; /* later steps are the leak */
  arena_step_end(&ctx->arena);
  for (int d = 0; d < DG__MAX_DEVICES; d++)
    if (ctx->dev_arena[d]) arena_step_end(ctx->dev_arena[d]);
}

void dg_ctx_reset(dg_ctx *ctx) {
  if (!ctx) return;
  arena_step_end(&ctx->arena);
  for (int d = 0; d < DG__MAX_DEVICES; d++)
    if (ctx->dev_arena[d]) arena_step_end(ctx->dev_arena[d]);
  ctx->backwards_since_reset = ctx->steps_since_reset = 0;
  if (ctx->swap) ctx->swap_vt->reset(ctx->swap); /* no I/O into the arena past here */
  ctx->ntape = 0;
  ctx->nstores = 0; /* the tape's per-store state goes with it */
  memset(ctx->gpool, 0, sizeof ctx->gpool); /* its blocks were arena memory */
  dg__arena_reset(&ctx->arena);
  for (int d = 0; d < DG__MAX_DEVICES; d++)
    if (ctx->dev_arena[d]) dg__arena_reset(ctx->dev_arena[d]);
  ctx->op_device = DG_CPU;
  ctx->err = DG_OK;
  ctx->errmsg[0] = 0;
}

const char *dg_ctx_errmsg(const dg_ctx *ctx) { return ctx ? ctx->errmsg : "no context"; }
int dg_ctx_errcode(const dg_ctx *ctx) { return ctx ? ctx->err : DG_EINVAL; }

void dg_ctx_clear_error(dg_ctx *ctx) {
  if (!ctx) return;
  ctx->err = DG_OK;
  ctx->errmsg[0] = 0;
}

size_t dg_ctx_arena_used(const dg_ctx *ctx) { return ctx ? ctx->arena.used : 0; }
size_t dg_ctx_arena_peak(const dg_ctx *ctx) { return ctx ? ctx->arena.peak : 0; }
size_t dg_ctx_arena_reserved(const dg_ctx *ctx) { return ctx ? ctx->arena.reserved : 0; }

void dg_ctx_set_train(dg_ctx *ctx, int train) {
  if (ctx) ctx->train = !!train;
}
int dg_ctx_is_train(const dg_ctx *ctx) { return ctx ? ctx->train : 0; }

int dg__set_error(dg_ctx *ctx, int code, const char *fmt, ...) {
  if (!ctx || ctx->err) return code; /* first error wins */
  ctx->err = code;
  va_list ap;
  va_start(ap, fmt);
  dg__vfmt(ctx->errmsg, sizeof ctx->errmsg, fmt, ap);
  va_end(ap);
  return code;
}

int dg__null_input(dg_ctx *ctx, const char *op, const char *what, const dg_tensor *t) {
  if (t) return 0;
  if (ctx && !ctx->err) dg__set_error(ctx, DG_EINVAL, "%s: input %s is NULL", op, what);
  return 1;
}

int dg__check_f32(dg_ctx *ctx, const char *op, const char *what, const dg_tensor *t) {
  if (t->dtype == DG_F32) return 1; /* the device is dg__op_begin's to check */
  char b[96];
  dg__set_error(ctx, DG_EDTYPE, "%s: %s must be f32, got %s %s", op, what,
                dg__shape_str(t, b, sizeof b), dg_dtype_name(t->dtype));
  return 0;
}

const dg__backend *dg__op_begin(dg_ctx *ctx, const char *op, int n, dg_tensor *const *in,
                                const char *const *names, unsigned optional) {
  if (!ctx) return NULL;
  int dev = -1, first = -1;
  for (int k = 0; k < n; k++) {
    const dg_tensor *t = in[k];
    if (!t) {
      if (k < 32 && (optional & DG__OPT(k))) continue; /* inputs past 32 are required */
      dg__null_input(ctx, op, names[k], t);
      return NULL;
    }
    if ((t->flags & DG_TF_PENDING) && dg__fence(ctx, op, t)) return NULL;
    if (dev < 0) {
      dev = t->device, first = k;
    } else if (t->device != dev) {
      char a[24], b[24];
      dg__set_error(ctx, DG_EDEVICE, "%s: %s is on %s but %s is on %s (move them to one device)",
                    op, names[first], dg__device_name(dev, a, sizeof a), names[k],
                    dg__device_name(t->device, b, sizeof b));
      return NULL;
    }
  }
  if (dev < 0) dev = DG_CPU;
  if (ctx->swap && ctx->swap_vt->op_begin(ctx->swap, op, n, in)) return NULL;
  const dg__backend *be = dg__backend_get(dev);
  if (!be) {
    char a[24];
    dg__set_error(ctx, DG_EDEVICE, "%s: this build has no backend for %s", op,
                  dg__device_name(dev, a, sizeof a));
    return NULL;
  }
  ctx->op_device = dev;
  return be;
}

void *dg__arena_data(dg_ctx *ctx, int device, size_t bytes) {
  if (device == DG_CPU) return dg__arena_alloc(&ctx->arena, bytes);
  if (device < 0 || device >= DG__MAX_DEVICES || !dg__backend_get(device)) return NULL;
  dg_arena *a = ctx->dev_arena[device];
  if (!a) {
    if (!(a = dg__calloc(1, sizeof *a))) return NULL;
    a->device = device;
    a->owner = ctx;
    ctx->dev_arena[device] = a;
  }
  return dg__arena_alloc(a, bytes);
}

/* ---- growth watch ---- */

#define MIB(x) ((double)(x) / (1 << 20))

/* What most likely holds the memory, for the warning and the limit error. */
static const char *grow_cause(const dg_ctx *ctx, char *buf, size_t cap) {
  if (ctx->steps_since_reset > 0)
    snprintf(buf, cap, "%d training steps (dg_params_zero_grad calls between backwards) since "
             "the last dg_ctx_reset: call dg_ctx_reset(ctx) once per step, after the optimizer "
             "step", ctx->steps_since_reset + 1);
  else if (ctx->ntape > 0 && ctx->grad_enabled)
    snprintf(buf, cap, "the tape holds %d nodes of forwards with no backward: evaluate with "
             "grad off (dg_ctx_set_grad_enabled(ctx, 0)) and dg_ctx_reset(ctx) after each batch",
             ctx->ntape);
  else
    snprintf(buf, cap, "no dg_ctx_reset since the step that used the most: call dg_ctx_reset(ctx) "
             "once per step or batch");
  return buf;
}

int dg__ctx_arena_grow(dg_ctx *ctx, dg_arena *a, size_t n, size_t *cap) {
  char why[256];
  if (ctx->arena_limit && a->reserved + *cap > ctx->arena_limit) {
    if (a->reserved + n > ctx->arena_limit) {
      char dev[24];
      dg__set_error(ctx, DG_ENOMEM, "arena limit of %.1f MiB on %s reached (%.1f MiB in use, "
                    "%.1f MiB more asked for): %s", MIB(ctx->arena_limit),
                    dg__device_name(a->device, dev, sizeof dev), MIB(a->used), MIB(n),
                    grow_cause(ctx, why, sizeof why));
      return DG_ENOMEM;
    }
    *cap = ctx->arena_limit - a->reserved; /* the last chunk fits under the limit */
  }
  /* 4x, and 16 MiB of slack so small models that vary a little stay quiet */
  size_t step = a->step_max, bound = 4 * step;
  if (bound < step + ((size_t)16 << 20)) bound = step + ((size_t)16 << 20);
  size_t after = a->reserved + *cap; /* chunks double: judge what it will hold */
  if (!ctx->grow_warned && step && after > bound) {
    ctx->grow_warned = 1;
    DG_LOGW("step arena grows to %.1f MiB (%.1f MiB in use), %.1fx the largest step seen "
            "(%.1f MiB), with no dg_ctx_reset: %s (warned once per context)", MIB(after),
            MIB(a->used), (double)after / (double)step, MIB(step),
            grow_cause(ctx, why, sizeof why));
  }
  return DG_OK;
}

/* ---- RNG stream ---- */

void dg_ctx_seed(dg_ctx *ctx, uint64_t seed) {
  if (!ctx) return;
  ctx->rng_seed = seed;
  ctx->rng_offset = 0;
}

void dg_ctx_rng_state(const dg_ctx *ctx, uint64_t *seed, uint64_t *offset) {
  if (!ctx) return;
  if (seed) *seed = ctx->rng_seed;
  if (offset) *offset = ctx->rng_offset;
}

void dg_ctx_set_rng_state(dg_ctx *ctx, uint64_t seed, uint64_t offset) {
  if (!ctx) return;
  ctx->rng_seed = seed;
  ctx->rng_offset = offset;
}

void dg__ctx_uniform(dg_ctx *ctx, float *out, size_t n) {
  dg_rng_uniform(ctx->rng_seed, ctx->rng_offset, out, n);
  ctx->rng_offset += (n + 3) & ~(size_t)3;
}
