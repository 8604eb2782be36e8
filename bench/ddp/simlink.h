/* A simulated slow link for the overlap benchmark (bench/ddp/ddp_mlp.c,
 * run_ddp.py --link sim) and its tests (tests/ddp): a dg_link_model
 * (dgrad/dist.h) that the program installs through dg_pg_opts.link. The
 * library's shared-memory paths then behave like a link of R Gbit/s: a NIC
 * with DMA and a priority queue, whose transfers cost no CPU and need no
 * thread to wake up. Compiled into those programs only, never into the
 * library. */
#ifndef DG_BENCH_SIMLINK_H
#define DG_BENCH_SIMLINK_H

#include <dgrad/dist.h>

/* The model for DG_SIM_LINK_GBIT=R (> 0) in the environment, else NULL.
 * One model per process (its schedule serves one DDP). */
const dg_link_model *simlink_from_env(void);

#endif
