/* Lending a waiting peer's core: base/lend.c. Not API. */
#ifndef DG_LEND_IMPL_H
#define DG_LEND_IMPL_H

/* The DDP segment installs a probe that says whether a rank of this host
 * has waited a while for this one (arg: its own; cleared with the same
 * arg); installing it starts the lend worker (no probe without one).
 * Clearing waits for a probe call in flight (the owner frees its state).
 * dg__lend_armed: a probe is installed (one atomic load, for hot paths).
 * dg__lend_for: when the probe says so, runs fn(arg, i) for i in [0,
 * ntasks) on the caller and the lend worker, tasks claimed one at a time,
 * and returns 1; 0: it did not run them (the caller runs them itself).
 * dg__lend_count: jobs lent so far. */
typedef int (*dg__lend_probe_fn)(void *arg);
void dg__lend_set_probe(dg__lend_probe_fn fn, void *arg);
void dg__lend_clear_probe(void *arg);
int dg__lend_armed(void);
int dg__lend_for(int ntasks, void (*fn)(void *arg, int i), void *arg);
long dg__lend_count(void);

#endif
