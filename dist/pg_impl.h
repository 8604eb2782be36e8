/* Process group internals shared by pg*.c and coll_*.c. Internal. */
#ifndef DG_PG_IMPL_H
#define DG_PG_IMPL_H

#include <pthread.h>

#include "dgrad/dist.h"
#include "dist/transport/transport_impl.h"

typedef struct dg__shm dg__shm;

typedef enum {
  DG_W_ALLREDUCE,
  DG_W_BROADCAST,
  DG_W_ALLGATHER,
  DG_W_REDUCE_SCATTER,
  DG_W_BARRIER,
  DG_W_SEND,
  DG_W_RECV,
  DG_W_SHMGRAD /* DDP bucket average in the gradient segment */
} dg_wkind;

/* Slot prefixes of ProcessGroupGloo (gloo/types.h). */
enum {
  DG_SLOT_ALLGATHER = 2,
  DG_SLOT_ALLREDUCE = 4,
  DG_SLOT_BROADCAST = 6,
  DG_SLOT_BARRIER = 7
};

struct dg_work {
  dg_pg *pg;
  dg_wkind kind;
  uint64_t seq;  /* per group, every operation */
  uint32_t tag;  /* collectives: ProcessGroupGloo's collectiveCounter_ */
  void *buf;
  void *seg;  /* DG_W_SHMGRAD: the segment */
  int caller_runs; /* run by the thread that waits for it, never the worker */
  const void *in;
  void *out;
  size_t count;
  dg_dtype dt;
  dg_redop op;
  int root, peer;
  dg_algo algo;
  int64_t deadline; /* ms, monotonic; set when it starts */
  int status;       /* DG_XOP_PENDING, DG_OK or a code */
  char err[512];
  dg_xop xop; /* send/recv */
  struct dg_work *next;
};

struct dg_pg {
  int rank, size, local_rank, local_size;
  int timeout_ms, all_dgrad;
  dg_algo algo;
  dg_store *own_store;         /* created from the environment */
  dg_store *s_pg, *s_grp, *s_dev; /* owned "default_pg", "<group>", "0" prefixes */
  dg_store *k_grp, *k_dev;        /* where group / Gloo keys go (may be the base) */
  int torch_rdzv;
  int cma;   /* every rank on this host and process_vm_readv works both ways */
  dg__shm *shm; /* segment shared by every rank (all on this host), or NULL */
  int *pids; /* (size) process ids of dgrad peers */
  dg_xport *x;
  pthread_mutex_t mu;
  pthread_cond_t qcv, dcv; /* work queued / work done */
  dg_work *qhead, *qtail;
  int stop;
  int busy; /* a collective is running (worker or a waiting caller) */
  int nwaiting; /* callers blocked in dg_work_wait (atomic): their cores are
                   free, so a collective may spin rather than sleep */
  void *scratch; /* grow-only, used by the running collective only */
  size_t scratch_cap;
  void *tmp; /* grow-only, the running collective's op arrays */
  size_t tmp_cap;
  dg_work *wfree; /* freed works, reused by the next post (under mu) */
  pthread_t worker;
  int worker_started;
  uint32_t tag;
  uint64_t seq;
  char err[512];
};

/* What an algorithm runs with. */
typedef struct {
  dg_pg *pg;
  dg_work *w;
  dg_xport *x;
  int rank, size;
  uint64_t slot;
  int64_t deadline;
  int eager; /* dgrad's own algorithms: small messages skip RECV_READY */
} dg_coll;

/* Scratch for the running collective (kept between calls: no page faults
 * on the hot path); NULL when out of memory. */
void *dg__coll_scratch(dg_coll *c, size_t bytes);
/* A second such buffer, zeroed, for the running collective's op arrays
 * (steady-state collectives allocate nothing). */
void *dg__coll_tmp(dg_coll *c, size_t bytes);

/* Frees the pool of freed works (group teardown). */
void dg__pg_free_works(dg_pg *pg);

const char *dg__work_name(const dg_work *w);
/* Post / wait with the work's deadline; on failure the work's message is
 * set (op, seq, peer) and the error code returned. A timeout aborts the
 * transport, so no late message lands in a buffer the caller reuses. */
int dg__coll_send(dg_coll *c, dg_xop *op, int peer, const void *buf, size_t n);
int dg__coll_recv(dg_coll *c, dg_xop *op, int peer, void *buf, size_t n);
int dg__coll_wait(dg_coll *c, dg_xop *op);
/* Fails the work with a transport-level error (_peer: blaming that rank,
 * whom the transport then names to the other ranks). */
#define dg__coll_fail(c, code, ...) dg__coll_fail_peer(c, code, -1, __VA_ARGS__)
int dg__coll_fail_peer(dg_coll *c, int code, int peer, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* coll_reduce.c: dst[i] = dst[i] (op) src[i] for n elements; AVG sums. */
void dg__reduce(void *dst, const void *src, size_t n, dg_dtype dt, dg_redop op);
/* dst = (dst + src) / by: AVG's last operand and division, fused where
 * exact (f32, power-of-two `by`). */
void dg__reduce_avg_last(void *dst, const void *src, size_t n, dg_dtype dt, int by);
/* Divides by `by` (AVG's final step). */
void dg__scale_div(void *buf, size_t n, dg_dtype dt, int by);

/* coll_gloo.c: Gloo's algorithms, message for message. */
int dg__gloo_allreduce_ring(dg_coll *c, void *buf, size_t count, dg_dtype dt, dg_redop op);
int dg__gloo_barrier(dg_coll *c);
int dg__gloo_broadcast(dg_coll *c, void *buf, size_t bytes, int root);
int dg__gloo_allgather(dg_coll *c, const void *in, void *out, size_t bytes);

/* coll_fast.c: dgrad-only algorithms (every rank runs dgrad). */
int dg__allreduce_rd(dg_coll *c, void *buf, size_t count, dg_dtype dt, dg_redop op);
int dg__allreduce_direct(dg_coll *c, void *buf, size_t count, dg_dtype dt, dg_redop op);
int dg__allreduce_cma(dg_coll *c, void *buf, size_t count, dg_dtype dt, dg_redop op);
/* Agrees on cross-memory attach at init (every rank probed every peer). */
int dg__cma_setup(dg_pg *pg, const uint64_t *probe_addr, const char *const *hosts);
/* 1 when allreduces of this group go through shared memory by default. */
int dg__pg_local_shm(const dg_pg *pg);
/* coll_shm.c: allreduce through a segment shared by all ranks on a host. */
int dg__allreduce_shm(dg_coll *c, void *buf, size_t count, dg_dtype dt, dg_redop op);
/* Creates/maps the segment (collective); pg->shm stays NULL when any rank
 * cannot. Returns a transport error only. */
int dg__shm_setup(dg_pg *pg, dg_coll *c);
void dg__shm_free(dg__shm *s);
/* DDP's gradient segment: every rank's flat gradient buffer (nfloat) in
 * one shared mapping, averaged bucket by bucket (at most nbmax buckets; the
 * protocol is described in coll_shm.c). Collective (public allreduces);
 * *out stays NULL when the group has no shared memory or a rank cannot map
 * it. Called by the thread that runs backward, except _run (an engine:
 * the group's worker, or a caller that needs a bucket). */
typedef struct dg__shmgrad dg__shmgrad;
int dg__shmgrad_new(dg_pg *pg, size_t nfloat, int nbmax, dg__shmgrad **out, float **mine);
void dg__shmgrad_free(dg__shmgrad *s);
/* Bucket k of nb: elements [off, off + n) of every buffer. */
void dg__shmgrad_bucket(dg__shmgrad *s, int k, int nb, size_t off, size_t n);
/* A new step; `count` (DDP's ranks-with-data) is summed over ranks. */
void dg__shmgrad_begin(dg__shmgrad *s, int32_t count);
/* This rank's gradients of bucket k are final. */
void dg__shmgrad_ready(dg__shmgrad *s, int k);
/* The step's count summed over ranks (valid once any bucket is complete). */
int32_t dg__shmgrad_count(dg__shmgrad *s);
/* Averages this rank's blocks of the buckets ready everywhere, as far as the
 * (simulated) link allows, without waiting; returns how many. */
int dg__shmgrad_progress(dg__shmgrad *s);
/* Queues an engine on pg (the group's worker): progress until this rank has
 * done every bucket. */
int dg__pg_shmgrad_post(dg_pg *pg, dg__shmgrad *s, dg_work **w);
int dg__shmgrad_run(dg_coll *c, dg__shmgrad *s);
/* Makes progress until bucket k is complete, or until the engine `eng`
 * (may be NULL) fails; a failure's message goes to err. */
int dg__shmgrad_wait(dg_pg *pg, dg__shmgrad *s, int k, const dg_work *eng, char *err,
                     size_t cap);
int dg__reduce_scatter(dg_coll *c, const void *in, void *out, size_t count, dg_dtype dt,
                       dg_redop op);

#endif
