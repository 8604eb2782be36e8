/* The process group object, shared by the group's runtime (pg_work.c), its
 * algorithms (coll_*.c), its collectives API (pg_coll.c) and its creation
 * (pg.c). Layers above see dist/pg_ext.h only. Internal. */
#ifndef DG_PG_IMPL_H
#define DG_PG_IMPL_H

#include <pthread.h>

#include "dgrad/dist.h"
#include "dist/pg_ext.h"
#include "dist/transport/transport_impl.h"

typedef struct dg__shm dg__shm;

struct dg_pg {
  int rank, size, local_rank, local_size;
  int timeout_ms, all_dgrad;
  dg_algo algo;
  dg_store *own_store;         /* created from the environment */
  dg_store *s_pg, *s_grp, *s_dev; /* owned "default_pg", "<group>", "0" prefixes */
  dg_store *k_grp, *k_dev;        /* where group / Gloo keys go (may be the base) */
  int torch_rdzv;
  int cma;   /* every rank on this host and process_vm_readv works both ways */
  int no_shm; /* opts.no_shm: no segment even where every rank could map one */
  dg__shm *shm; /* segment shared by every rank (all on this host), or NULL */
  dg_link_model link; /* opts.link (benchmarks); no functions: none */
  int *pids; /* (size) process ids of dgrad peers */
  dg_xport *x;
  pthread_mutex_t mu;
  pthread_cond_t qcv, dcv; /* work queued / work done */
  struct dg_work *qhead, *qtail;
  int stop;
  int busy; /* a collective is running (worker or a waiting caller) */
  int nwaiting; /* callers blocked in dg_work_wait (atomic): their cores are
                   free, so a collective may spin rather than sleep */
  void *scratch; /* grow-only, used by the running collective only */
  size_t scratch_cap;
  void *tmp; /* grow-only, the running collective's op arrays */
  size_t tmp_cap;
  struct dg_work *wfree; /* freed works, reused by the next post (under mu) */
  pthread_t worker;
  int worker_started;
  uint32_t tag;
  uint64_t seq;
  char err[512];
};

#endif
