/* What the layers above the process group (DDP) see of its runtime: its
 * failure, deadline and options, and tasks in its worker. Everything here
 * is implemented in pg_work.c, the layer of this header; the shared-memory
 * primitives and reductions of the algorithm layer are in coll_ext.h. No
 * transport type is declared, so nothing above the group can call a
 * transport. Internal. */
#ifndef DG_PG_EXT_H
#define DG_PG_EXT_H

#include <stddef.h>
#include <stdint.h>

#include "dgrad/dist.h"

/* A running collective or task (pg_work.h); opaque above the group. */
typedef struct dg_coll dg_coll;

/* ---- the group (pg_work.c) ---- */

/* The group's sticky failure: DG_OK or its code; the message goes to msg
 * (may be NULL). */
int dg__pg_error(dg_pg *pg, char *msg, size_t cap);
int dg__pg_timeout_ms(const dg_pg *pg);
/* Fails the group (sticky, as a failed collective does): every pending
 * work completes with code and peers are told msg. For a layer that posted
 * receives it can no longer wait for (the pipe after a failed step). own:
 * msg is this rank's own failure, not a peer's passed on; the others'
 * failure messages then quote it ("rank R failed: msg", flight.h). */
void dg__pg_abort(dg_pg *pg, int code, const char *msg, int own);
/* 1 when allreduces of this group go through shared memory by default. */
int dg__pg_local_shm(const dg_pg *pg);
/* rank's process id where this group's ranks can write each other's
 * memory (every one on this host, cross-memory attach allowed), else 0. */
int dg__pg_peer_pid(const dg_pg *pg, int rank);
/* The link model of dg_pg_opts.link (benchmarks), or NULL. */
const dg_link_model *dg__pg_link(const dg_pg *pg);

/* ---- tasks (pg_work.c): work the group's worker runs in queue order ---- */

typedef int (*dg__task_fn)(dg_coll *c, void *arg);
/* Queues fn(c, arg) behind the collectives posted before it; it runs with
 * the group's deadline and fails like a collective (dg__coll_fail_peer),
 * named `name` (a literal) in messages. Wait for and free *w as any work. */
int dg__pg_post_task(dg_pg *pg, const char *name, dg__task_fn fn, void *arg, dg_work **w);
int64_t dg__coll_deadline(const dg_coll *c); /* ms, monotonic */
/* Fails the running work with a group-level error (sticky: the transport
 * aborts); `peer` is the rank to blame, whom the other ranks are told
 * about (-1: none). Returns code (or the failure already there). */
#define dg__coll_fail(c, code, ...) dg__coll_fail_peer(c, code, -1, __VA_ARGS__)
int dg__coll_fail_peer(dg_coll *c, int code, int peer, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
