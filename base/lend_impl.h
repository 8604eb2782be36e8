/* Lending a waiting peer's core: base/lend.c. Not API. */
#ifndef DG_LEND_IMPL_H
#define DG_LEND_IMPL_H

/* The DDP segment installs a probe that says whether a rank of this host
 * has waited a while for this one (arg: its own; cleared with the same
 * arg); installing it starts the lend worker (no probe without one).
 * dg__lend_armed: a probe is installed. dg__lend_ready: the probe says so
 * (for a caller computing on one thread: with more, nothing is lent).
 * dg__lend_for runs fn(arg, i)
 * for i in [0, ntasks) on the caller and the lend worker, tasks claimed one
 * at a time; 0: it did not run them (the caller runs them itself).
 * dg__lend_count: jobs lent so far. */
typedef int (*dg__lend_probe_fn)(void *arg);
void dg__lend_set_probe(dg__lend_probe_fn fn, void *arg);
void dg__lend_clear_probe(void *arg);
int dg__lend_armed(void);
int dg__lend_ready(void);
int dg__lend_for(int ntasks, void (*fn)(void *arg, int i), void *arg);
long dg__lend_count(void);

#endif
