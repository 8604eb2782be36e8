/* Internal: the optimizer object shared by the files of optim/. Not API. */
#ifndef DG_OPTIM_IMPL_H
#define DG_OPTIM_IMPL_H

#include "dgrad/optim.h"
#include "backends/backend.h"
#include "base/common_impl.h"

#define DG_OPTIM_MAX_STATE 2

typedef enum { DG__OPT_SGD, DG__OPT_ADAMW, DG__OPT_LAMB, DG__OPT_LARS } dg__optim_kind;

struct dg_optim;

/* What a parameter's update uses of its group: lr (the optimizer's times the
 * group's scale) and weight decay. */
typedef struct {
  float lr, wd;
} dg__optim_hyper;

/* A parameter group (dg_optim_set_group). */
typedef struct {
  float weight_decay, lr_scale;
} dg__optim_group;

/* Element-wise update of [lo, hi) of the flat buffers w, g (SGD, AdamW; the
 * backend's kernel splits a long range over the device). */
typedef void (*dg__optim_range_fn)(struct dg_optim *o, dg__optim_hyper h, float *w,
                                   const float *g, size_t lo, size_t hi);
/* Update of parameter i over its range [lo, hi) (LAMB, LARS: norms first). */
typedef void (*dg__optim_param_fn)(struct dg_optim *o, dg__optim_hyper h, int i, float *w,
                                   const float *g, size_t lo, size_t hi);

struct dg_optim {
  dg__optim_kind kind;
  const char *name;
  dg_params *ps;
  /* the backend of the store's device, whose kernels (backends/kern_optim.h)
   * apply the updates */
  const dg__backend *be;
  size_t n;      /* flat length when created */
  int nparams;   /* parameter count when created */
  float lr;
  int64_t step;
  dg_sgd_opts sgd;
  dg_adamw_opts adam; /* AdamW and LAMB */
  dg_lars_opts lars;  /* pointers cleared: exclusions are in `excluded` */
  unsigned char *excluded; /* (nparams) LARS: 1 = no adaptation, no decay */
  float wd;           /* the default group's weight decay (the options') */
  /* parameter groups: group_of[i] is 0 (default) or k for groups[k - 1];
   * NULL until the first dg_optim_set_group */
  uint16_t *group_of; /* (nparams) */
  dg__optim_group *groups;
  int ngroups;
  int mixed; /* some parameter's group differs from the default (set_group keeps it) */
  int nstate;
  const char *state_name[DG_OPTIM_MAX_STATE];
  float *state[DG_OPTIM_MAX_STATE]; /* (n) each, layout of the flat buffer */
  dg__optim_range_fn range; /* element-wise kinds, else NULL */
  dg__optim_param_fn param; /* per-parameter kinds, else NULL */
  /* fused into backward (dg_optim_fuse_backward) */
  dg_ctx *fused_ctx;
  int fused_ready_id, fused_end_id, fused_in_step;
  int ddp_owned; /* a DDP applies its steps (dg_ddp_overlap_optimizer) */
  void (*owner_release)(void *owner); /* called by dg_optim_free: the owner
                                         applies what is pending, lets go */
  void *owner;
  char errmsg[256]; /* the last failing call on the optimizer */
};

/* Records the detail of a failing call on o for dg_optim_errmsg; returns code. */
#define dg__optim_fail(o, code, ...) \
  dg__fail_msg((o)->errmsg, sizeof (o)->errmsg, code, __VA_ARGS__)


/* Parameter i's lr and weight decay under the optimizer's lr `lr`. */
static inline dg__optim_hyper dg__optim_hyper_of(const struct dg_optim *o, int i, float lr) {
  dg__optim_hyper h = {lr, o->wd};
  if (o->group_of && o->group_of[i]) {
    const dg__optim_group *g = &o->groups[o->group_of[i] - 1];
    h.lr = lr * g->lr_scale;
    h.wd = g->weight_decay;
  }
  return h;
}

/* Allocates the object and `nstate` zeroed state buffers of the store's flat
 * length, and finds the backend of the store's device. Names are static
 * strings. */
int dg__optim_alloc(dg_optim **out, dg_params *ps, dg__optim_kind kind, const char *name,
                    int nstate, const char *const *state_names, char *err, size_t cap);

/* AdamW/LAMB hyperparameters in range. */
int dg__adam_opts_ok(const dg_adamw_opts *a);
/* The constructor's DG_EINVAL naming the options, into err. */
int dg__adam_opts_fail(const dg_adamw_opts *a, const char *name, char *err, size_t cap);

/* A step taken piecewise (DDP updating each bucket when its average lands):
 * begin checks the store and counts the step, as dg_optim_step does; span
 * applies it to the trainable parameters lying in [lo, hi) of the flat
 * buffers (no frozen parameter among them), with learning rate lr (times
 * each parameter's group scale). The pieces of one step give exactly
 * dg_optim_step's result. */
int dg__optim_begin_step(struct dg_optim *o);
void dg__optim_step_span(struct dg_optim *o, size_t lo, size_t hi, float lr);

/* A DDP sharding the update over the ranks (each rank updates the blocks
 * it averages, in one shared copy of the values and the state): */
/* 1 when the update is element-wise with one setting for every parameter
 * (SGD or AdamW without parameter groups), so any block can be updated
 * alone. */
int dg__optim_shardable(const struct dg_optim *o);
/* Applies a step's update to [lo, lo + n) of the flat buffers with gradient
 * g (n floats), learning rate lr and step count `step` (what
 * dg__optim_step_span would apply there at that step, bit for bit). */
void dg__optim_update_at(struct dg_optim *o, float lr, int64_t step, size_t lo, const float *g,
                         size_t n);
/* The update's settings but lr, hashed: equal on ranks that update alike. */
uint64_t dg__optim_fingerprint(const struct dg_optim *o);
/* Points state buffer k (and its companion entry) at buf, which the caller
 * filled; returns the previous buffer, which the caller keeps and swaps
 * back before the optimizer is freed. */
float *dg__optim_swap_state(struct dg_optim *o, int k, float *buf);

/* Hands the optimizer's steps to an owner (a DDP applying them bucket by
 * bucket), or takes them back with owner NULL. release(owner) runs when the
 * optimizer is freed first. DG_ESTATE (message in err) when another owner
 * or a fused backward already steps it, DG_EINVAL when it updates a store
 * other than ps. */
int dg__optim_set_owner(struct dg_optim *o, dg_params *ps, void *owner,
                        void (*release)(void *owner), char *err, size_t cap);

/* 1 when s ends with suf (LARS's exclude_suffixes, dg_param_filter_suffix). */
int dg__has_suffix(const char *s, const char *suf);

/* Element range [lo, hi) of parameter i in the flat buffers. */
void dg__optim_param_range(const dg_optim *o, int i, size_t *lo, size_t *hi);

#endif
