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

#endif
