/* The process group object, shared by the group's runtime (pg_work.c), its
 * algorithms (coll_*.c), its collectives API (pg_coll.c) and its creation
 * (pg.c). Layers above see dist/pg_ext.h only. Internal. */
#ifndef DG_PG_IMPL_H
#define DG_PG_IMPL_H

#include <pthread.h>
#include <sys/socket.h>

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
  char err[768]; /* as a work's (pg_work.h) */
  /* sub-groups (pg_group.c) */
  dg_pg *parent;   /* NULL: a group of dg_pg_new */
  int *members;    /* (size) sub-group: each rank's rank in the parent */
  int *xrank;      /* (size) each rank's rank in x when x is an ancestor's
                      (shared: no connections of its own); NULL: x is ours */
  uint32_t gid;    /* with xrank: the group's number in x's slots (1..4095) */
  int nsub, freed; /* live sub-groups; dg_pg_free called (pg_group.c's lock) */
  int ngroups;     /* sub-groups created from it (torch's _group_count - 1) */
  char name[48];   /* store prefix of a sub-group ("1", "2", "1.1") */
  struct sockaddr_storage bind; /* where this rank listens (new connections) */
  int spin_us;     /* opts.spin_us */
  struct dg__flight *flight; /* flight recorder, fingerprints (flight.c) */
  /* hierarchical allreduce (coll_hier.c; made by pg_hier.c): a root group
   * over several hosts, one with more than one rank */
  int hier;        /* 0: none; 1: available (forced); 2: AUTO picks it */
  int hier_shards; /* S: shards of the buffer (the fewest ranks of a host) */
  int hier_lrank;  /* my rank among my host's ranks (the shard I carry if < S) */
  dg_pg *hier_local; /* my host's ranks (NULL: alone on my host) */
  dg_pg *hier_cross; /* local rank hier_lrank of every host (NULL: >= S) */
  int internal;      /* an internal group (pg_hier.c): no worker, no flight */
  char host_id[256]; /* opts.host_id (sub-groups: the root's); "": host name */
};

/* A sub-group sharing an ancestor's transport tells its messages apart by
 * slot: collectives add the group number in the low bits (ProcessGroupGloo
 * leaves them zero), point-to-point ops move the user tag under prefix 10
 * (unused by Gloo's and dgrad's slots). 12 bits: what UCX's tag keeps. */
#define DG_GROUP_P2P_PREFIX 10ULL
static inline int dg__pg_xpeer(const dg_pg *pg, int r) {
  return pg->xrank && r >= 0 && r < pg->size ? pg->xrank[r] : r;
}
static inline uint64_t dg__pg_xslot(const dg_pg *pg, uint64_t slot) {
  return pg->xrank ? slot | pg->gid : slot;
}
static inline uint64_t dg__pg_xslot_p2p(const dg_pg *pg, uint32_t tag) {
  return pg->xrank ? (DG_GROUP_P2P_PREFIX << 56) | ((uint64_t)tag << 24) | pg->gid : tag;
}

#endif
