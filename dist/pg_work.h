/* The process group's runtime (pg_work.c): works, the queue and the worker
 * thread that runs collectives and tasks in call order, waits, the pool of
 * freed works, point-to-point ops, and what a running collective uses to
 * move data (dg_coll). The algorithms (coll_*.c) sit on it; it knows none
 * of them: each work carries the function that runs it. Internal. */
#ifndef DG_PG_WORK_H
#define DG_PG_WORK_H

#include "dist/pg_impl.h"

typedef enum {
  DG_W_ALLREDUCE,
  DG_W_BROADCAST,
  DG_W_ALLGATHER,
  DG_W_REDUCE_SCATTER,
  DG_W_BARRIER,
  DG_W_SEND,
  DG_W_RECV,
  DG_W_TASK /* dg__pg_post_task */
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
  dg__task_fn run; /* collectives and tasks: what the worker runs */
  void *arg;       /* its argument */
  const char *name; /* tasks: for messages */
  void *buf;
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
  char err[768]; /* the op, the cause, and the comparison of positions (flight.h) */
  dg_xop xop; /* send/recv */
  struct dg_work *next;
};

/* What an algorithm runs with. */
struct dg_coll {
  dg_pg *pg;
  dg_work *w;
  dg_xport *x;
  int rank, size;
  uint64_t slot;
  int64_t deadline;
  int eager; /* dgrad's own algorithms: small messages skip RECV_READY */
};

/* ---- works ---- */

/* A work of kind k from the group's pool (a steady-state post allocates
 * nothing); NULL when pg is NULL, dt invalid or memory is out. */
dg_work *dg__work_new(dg_pg *pg, dg_wkind k, dg_dtype dt);
/* Takes the work's tag and sequence number and queues it; the worker (or
 * a waiting caller) runs run(c, w->arg). *out = w. */
int dg__work_post(dg_pg *pg, dg_work *w, dg__task_fn run, dg_work **out);
/* While on, works posted by this thread are run by the thread that waits
 * for them, never handed to the worker (the _sync wrappers: two thread
 * wake-ups saved, tens of microseconds each on an idle VM). */
void dg__work_caller_runs(int on);
const char *dg__work_name(const dg_work *w);
/* Starts / stops the worker (stopping runs what is queued, bounded by each
 * work's deadline). */
int dg__pg_start_worker(dg_pg *pg);
void dg__pg_stop_worker(dg_pg *pg);
/* Frees the pool of freed works (group teardown). */
void dg__pg_free_works(dg_pg *pg);

/* ---- a running collective ---- */

/* Scratch for the running collective (kept between calls: no page faults
 * on the hot path); NULL when out of memory. */
void *dg__coll_scratch(dg_coll *c, size_t bytes);
/* A second such buffer, zeroed, for the running collective's op arrays
 * (steady-state collectives allocate nothing). */
void *dg__coll_tmp(dg_coll *c, size_t bytes);
/* Post / wait with the work's deadline; on failure the work's message is
 * set (op, seq, peer) and the error code returned. A timeout aborts the
 * transport, so no late message lands in a buffer the caller reuses. */
int dg__coll_send(dg_coll *c, dg_xop *op, int peer, const void *buf, size_t n);
int dg__coll_recv(dg_coll *c, dg_xop *op, int peer, void *buf, size_t n);
int dg__coll_wait(dg_coll *c, dg_xop *op);

#endif
