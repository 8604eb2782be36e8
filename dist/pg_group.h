/* Sub-groups (pg_group.c) and the teardown of groups they outlive:
 * dg_pg_free goes through dg__pg_release, which frees a group once it and
 * every sub-group made from it are freed. Internal. */
#ifndef DG_PG_GROUP_H
#define DG_PG_GROUP_H

#include "dist/pg_impl.h"

/* dg_pg_free: frees pg now, or once its last sub-group is freed (and then
 * its parent, if that was freed before). NULL: no-op. */
void dg__pg_release(dg_pg *pg);
/* pg.c: Gloo's sequence-number handshake on pg's group store (members of a
 * torch-numbered group); timeout_ms 0: the store's. */
int dg__pg_seq_handshake(dg_pg *pg, int timeout_ms, char *err, size_t cap);
/* pg.c: tears down a group of dg_pg_new (no sub-group left). */
void dg__pg_destroy(dg_pg *pg);

/* An internal group of root (pg_hier.c): the members `ranks` (n, sorted,
 * the same list on every member) over root's connections, with its own
 * slots and local paths (shared segment, cross-memory attach), named
 * `name` (unique per store: no number of torch's is taken), made by its
 * members only (non-members: *out NULL, nothing done), with no worker
 * (the root's worker runs it) and no flight recorder. */
int dg__pg_new_internal(dg_pg **out, dg_pg *root, const int *ranks, int n, const char *name,
                        char *err, size_t cap);
void dg__pg_free_internal(dg_pg *g);
/* pg_hier.c: the hierarchy of a dgrad-only root group (collective over the
 * group at creation; hosts: every rank's host identity, NULL if unknown);
 * and its teardown (after the worker stopped, before the transport). */
int dg__hier_setup(dg_pg *pg, const char *const *hosts, char *err, size_t cap);
void dg__hier_free(dg_pg *pg);

#endif
