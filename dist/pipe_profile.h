/* Balance by time: per-layer costs measured on the ranks of a pipe's group
 * and the exact partition chosen from them (dist/pipe_plan.c). Not API. */
#ifndef DG_PIPE_PROFILE_H
#define DG_PIPE_PROFILE_H

#include "dgrad/dist.h"
#include "dgrad/nn.h"

typedef struct {
  dg_module *seq;        /* the whole model, not yet bound */
  dg_pg *pg;             /* the pipe's group: K ranks */
  dg_tensor *sample;     /* one micro-batch for layer 0, equal on every rank */
  uint64_t seed;         /* the model's initialisation */
  int M, kind;           /* micro-batches and schedule (activations in flight) */
  double mem_cap;        /* bytes per stage, 0: none */
  double optim_factor;   /* optimizer state per parameter byte */
} dg__pipe_profile_args;

/* Collective over a->pg: layer i is timed (forward and backward, best of a
 * few runs) on rank i % K, the costs summed over the group into cost[n];
 * the link between neighbouring ranks is timed (a ping-pong of a small and
 * a large message) and cut[i] (n - 1 entries) receives what a boundary
 * after layer i costs each of its two stages (its activation forward and,
 * for floats, its gradient back); bounds[K + 1] receives the min-max
 * partition of both. seq is bound to a scratch store while it runs (the
 * caller binds it again). DG_OK, or a code with err naming the layer or
 * the collective that failed. */
int dg__pipe_profile(const dg__pipe_profile_args *a, double *cost, double *cut, int *bounds,
                     char *err, size_t cap);

#endif /* DG_PIPE_PROFILE_H */
