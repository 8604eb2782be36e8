/* The char-GPT trained as a pipeline (train_gpt.c --pipe K): K stages per
 * replica, world size / K replicas (DP x PP), under dgrun or torchrun. */
#ifndef DG_EXAMPLE_PIPE_RUN_H
#define DG_EXAMPLE_PIPE_RUN_H

#include <dgrad.h>

typedef struct {
  const char *text;
  long steps, batch, eval_every, eval_batches, log_every, warmup;
  long layers, heads, dim, context;
  int lamb;
  double lr, wd, clip;
  unsigned long long seed;
  int stages;       /* K: ranks per pipeline */
  int micro;        /* M micro-batches per step (per replica) */
  int one_f_one_b;  /* 1F1B, else GPipe */
  int remat;        /* recompute each stage in backward */
  int balance_time; /* split by measured time, else evenly by layers */
  const dg_swap_opts *swap; /* activation swapping on each stage, or NULL */
  const char *swap_name;    /* how --swap named it, for the report */
} gpt_pipe_opts;

/* Trains and prints as the single-process path does (rank 0 prints); the
 * loss is the global batch's mean, so the curve matches the unpipelined
 * run's. 0 on success, 1 on failure (the message printed). */
int gpt_pipe_run(const gpt_pipe_opts *o);

#endif
