/* The group's flight recorder and collective fingerprints (issue #17,
 * items 1-2). Part of the group's runtime (layer dist.work): pg_work.c
 * calls it at each post, start and end of an operation; pg.c and
 * pg_group.c make and free it with the group.
 *
 * Flight recorder: the last N operations (seq, op, dtype, count, root or
 * peer, state, times) in a ring allocated with the group, so recording
 * allocates nothing. On the group's first timeout or failure, each dgrad
 * rank publishes where it stands ("dgrad_flight/<rank>" in the group's
 * store), reads the others' for a bounded time and appends to the error who
 * is behind and where; it also writes its ring to
 * <dir>/rank<R>.txt (opts.flight_dir or DG_FLIGHT_DIR).
 *
 * Fingerprints: the group's first K collectives (opts.check_colls) are
 * preceded by an exchange of (op, dtype, count, root, reduction) among the
 * ranks, small eager messages on their own slot; a difference fails every
 * rank with DG_EMISMATCH naming both ranks and both calls, before any data
 * moves. dgrad-only groups: torch and libgloo ranks know no such message.
 * Internal. */
#ifndef DG_FLIGHT_H
#define DG_FLIGHT_H

#include <stddef.h>

#include "dist/pg_work.h"

/* Records kept when opts.flight_records is 0, and collectives checked when
 * opts.check_colls is 0. */
#define DG_FLIGHT_DEFAULT_RECORDS 256
#define DG_FLIGHT_DEFAULT_CHECKS 64

typedef struct dg__flight dg__flight;

/* Allocates the group's ring (nrec < 0: no recorder; 0: the default) and
 * fingerprint state (checks < 0: none; 0: the default). dir may be NULL
 * (no file; copied). NULL when out of memory. */
dg__flight *dg__flight_new(int size, int nrec, int checks, const char *dir);
/* A sub-group's, with its parent's options (parent NULL: the defaults). */
dg__flight *dg__flight_sub(const dg__flight *parent, int size);
void dg__flight_free(dg__flight *f);
/* As dg__flight_free, but when the failure's comparison is still waiting
 * on the store (an unreachable store host holds a reconnection for the
 * store's timeout), it takes `stores` (n <= 4: the group's own chain, down
 * to the base it owns), frees them and itself when done, and returns 1:
 * the caller must not free them. 0: freed, stores still the caller's. */
int dg__flight_free_handing(dg__flight *f, dg_store *const *stores, int n);

/* Recording (no allocation; each takes the ring's lock for a few stores).
 * post: the work got its seq (and tag); start/end: it runs / finished
 * with status rc. */
void dg__flight_post(dg_pg *pg, const dg_work *w);
void dg__flight_start(dg_pg *pg, const dg_work *w);
void dg__flight_end(dg_pg *pg, const dg_work *w, int rc);

/* Before a collective runs: the fingerprint exchange while checks are left
 * (DG_OK at once otherwise, in tasks and in groups with torch ranks).
 * DG_EMISMATCH (the group failed, message on the work) on a difference. */
int dg__flight_check(dg_coll *c);

/* The group's first failure, on this rank: compares positions with the
 * other ranks through the store (bounded wait; `dead` is a rank known gone,
 * not waited for, -1 none), appends the summary to msg (cap bytes) and
 * writes the ring's file. Later calls (the group's other pending works)
 * append the same summary, waiting for it no longer than the first. */
void dg__flight_failed(dg_pg *pg, const dg_work *w, int code, int dead, char *msg, size_t cap);

/* This rank fails the group (dg__pg_abort): publishes, from the
 * comparison's thread and without waiting for it, `why` as its position
 * when the failure is its own (own 1: the others read "rank R failed:
 * <why>"), else its usual position (it passes a peer's failure on), so that
 * the others' comparison has an answer from it at once instead of waiting
 * out its bound for a rank that runs no failing operation. Later failures
 * of the group on this rank add no comparison. */
void dg__flight_aborted(dg_pg *pg, const char *why, int own);

/* The length of msg before the comparison a failure appended to it
 * (" [where: ..."), or all of it. */
size_t dg__flight_cut(const char *msg);

#endif
