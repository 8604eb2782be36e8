/* What DDP sees of the algorithm layer of the process group: the
 * shared-memory primitives between the ranks of one host and the
 * element-wise reductions (coll_shm.c, coll_reduce.c). Internal. */
#ifndef DG_COLL_EXT_H
#define DG_COLL_EXT_H

#include <stddef.h>
#include <stdint.h>

#include "dist/pg_ext.h"

/* ---- cross-memory attach (coll_cma.c) ---- */

/* Writes n bytes of src to address dst of process pid (a rank of a group
 * where dg__pg_peer_pid gives pids): 0 or -errno. */
int dg__cma_write(int pid, uint64_t dst, const void *src, size_t n);

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
/* A local peer whose process is stopped (SIGSTOP, a debugger: state T or
 * t in /proc/<pid>/stat), or -1: on a timeout it, not the rank a waiter
 * happened to wait for, is the one holding everyone up. */
int dg__shm_stopped_peer(dg_pg *pg);
/* Fails collective or task c after a dg__shm_wait failure rc while it
 * waited for rank p to `what` (in `where`); a timeout names a stopped local
 * peer instead of p when there is one. */
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
