/* What the layers above the process group (DDP) see of its internals. No
 * transport type is declared here, so nothing above the group can call a
 * transport: failures, tasks in the group's worker and the shared-memory
 * primitives all go through the group. Internal. */
#ifndef DG_PG_EXT_H
#define DG_PG_EXT_H

#include <stddef.h>
#include <stdint.h>

#include "dgrad/dist.h"

/* A running collective or task (pg_work.h); opaque above the group. */
typedef struct dg_coll dg_coll;

/* ---- the group (pg.c) ---- */

/* The group's sticky failure: DG_OK or its code; the message goes to msg
 * (may be NULL). */
int dg__pg_error(dg_pg *pg, char *msg, size_t cap);
int dg__pg_timeout_ms(const dg_pg *pg);
/* 1 when allreduces of this group go through shared memory by default. */
int dg__pg_local_shm(const dg_pg *pg);
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

/* ---- shared memory between the ranks of one host (coll_shm.c) ---- */

/* Maps one new segment of len bytes on every rank (collective: public
 * allreduces agree on it); *base stays NULL unless every rank mapped it
 * (no segment, or /dev/shm too small). Returns a group failure only.
 * Unmap with munmap. */
int dg__shm_map(dg_pg *pg, size_t len, void **base);
/* After a change that futex waiters of *word look for (and a bump of
 * *word): wakes them when *sleepers counts any. */
void dg__shm_wake(uint32_t *word, uint32_t *sleepers);
/* Waits until ok(arg) holds. Whoever changes what ok reads bumps *word and
 * calls dg__shm_wake; *sleepers counts the futex waiters of *word. Spins
 * briefly, then sleeps on the futex in slices that check the deadline (ms),
 * the group's failure and whether peer processes are alive (blame(arg):
 * the rank waited for, checked first). DG_OK, the group's error, DG_EPEER
 * with *dead = a rank found exited, or DG_ETIMEDOUT. */
int dg__shm_wait(dg_pg *pg, uint32_t *word, uint32_t *sleepers, int (*ok)(void *),
                 int (*blame)(void *), void *arg, int64_t deadline, int *dead);
/* Fails collective or task c after a dg__shm_wait failure rc while it
 * waited for rank p to `what` (in `where`). */
int dg__shm_wait_fail(dg_coll *c, int rc, int p, int dead, const char *what, const char *where);
/* Sleeps until t_ns (ns, monotonic), no later than deadline (ms). */
void dg__sleep_until_ns(int64_t t_ns, int64_t deadline);

/* ---- element-wise reductions (coll_reduce.c) ---- */

/* dst[i] = dst[i] (op) src[i] for n elements; AVG sums. */
void dg__reduce(void *dst, const void *src, size_t n, dg_dtype dt, dg_redop op);
/* dst = (dst + src) / by: AVG's last operand and division, fused where
 * exact (f32, power-of-two `by`). */
void dg__reduce_avg_last(void *dst, const void *src, size_t n, dg_dtype dt, int by);
/* Divides by `by` (AVG's final step). */
void dg__scale_div(void *buf, size_t n, dg_dtype dt, int by);

#endif
