/* The process group's algorithms (coll_*.c), run by the runtime
 * (pg_work.h) for the collectives API (pg_coll.c) and group creation
 * (pg.c). The element-wise reductions (coll_reduce.c) and the shared-memory
 * primitives DDP uses are declared in dist/pg_ext.h. Internal. */
#ifndef DG_COLL_IMPL_H
#define DG_COLL_IMPL_H

#include "dist/pg_work.h"
#include "dist/coll_ext.h"

/* coll_gloo.c: Gloo's algorithms, message for message. */
int dg__gloo_allreduce_ring(dg_coll *c, void *buf, size_t count, dg_dtype dt, dg_redop op);
int dg__gloo_barrier(dg_coll *c);
int dg__gloo_broadcast(dg_coll *c, void *buf, size_t bytes, int root);
int dg__gloo_allgather(dg_coll *c, const void *in, void *out, size_t bytes);

/* coll_fast.c: dgrad-only algorithms (every rank runs dgrad). */
int dg__allreduce_rd(dg_coll *c, void *buf, size_t count, dg_dtype dt, dg_redop op);
int dg__allreduce_direct(dg_coll *c, void *buf, size_t count, dg_dtype dt, dg_redop op);
int dg__reduce_scatter(dg_coll *c, const void *in, void *out, size_t count, dg_dtype dt,
                       dg_redop op);

/* coll_cma.c: this rank's host identity (what tells hosts apart):
 * opts.host_id when set (returns 1; DG_HOST_ID: several "hosts" on one
 * machine), else the host name (returns 0). */
int dg__host_id(const dg_pg *pg, char *out, size_t cap);

/* coll_cma.c: cross-memory attach between ranks on one host. */
int dg__allreduce_cma(dg_coll *c, void *buf, size_t count, dg_dtype dt, dg_redop op);
/* The word whose address a rank publishes for peers to probe. */
const uint64_t *dg__cma_probe(void);
/* Agrees on cross-memory attach and the shared segment at init (every rank
 * probed every peer). */
int dg__cma_setup(dg_pg *pg, const uint64_t *probe_addr, const char *const *hosts);

/* coll_hier.c: a group over several hosts (pg->hier): allreduce inside
 * each host, then between hosts by shard, then back inside each host. */
int dg__allreduce_hier(dg_coll *c, void *buf, size_t count, dg_dtype dt, dg_redop op);
/* pg_coll.c: the allreduce DG_ALGO_AUTO picks on c's group, c's slot as
 * set (coll_hier.c's steps on its internal groups). */
int dg__allreduce_auto(dg_coll *c, void *buf, size_t count, dg_dtype dt, dg_redop op);
/* coll_cma.c: a collective over pg at its creation (before the worker
 * runs), on a slot outside ProcessGroupGloo's prefixes, deadline the
 * group's timeout: the agreements of coll_cma.c and pg_hier.c. */
void dg__setup_coll(dg_pg *pg, dg_work *w, dg_coll *c);

/* coll_shm.c: allreduce through a segment shared by all ranks on a host. */
int dg__allreduce_shm(dg_coll *c, void *buf, size_t count, dg_dtype dt, dg_redop op);
/* Creates/maps the segment (collective); pg->shm stays NULL when any rank
 * cannot. Returns a transport error only. */
int dg__shm_setup(dg_pg *pg, dg_coll *c);
void dg__shm_free(dg__shm *s);

#endif
