/* dgrad/dist.h — process groups and collectives.
 *
 * A process group (dg_pg) connects `world_size` ranks through a transport
 * ("tcp": Gloo's 2022 wire protocol, so dgrad ranks can share a group with
 * torch.distributed gloo ranks or a C++ program linking libgloo). Every
 * collective is asynchronous: it returns a dg_work at once and runs in the
 * group's worker thread, in the order calls were made (all ranks must call
 * collectives in the same order, as with torch). send/recv go straight to
 * the transport and may be in flight together with collectives.
 *
 * Buffers: raw memory of `count` elements of `dtype`. The caller keeps
 * every buffer untouched and alive until the work completes.
 *
 * Failure: an operation that cannot finish fails with a code and a message
 * (dg_work_errmsg, dg_pg_errmsg) naming the operation, its sequence number
 * and the peer: DG_EPEER when a peer died or closed its connection,
 * DG_ETIMEDOUT when a peer stayed silent past the group's timeout,
 * DG_EFORMAT when a peer sent a malformed frame, DG_EMISMATCH when ranks
 * called different collectives (checked for the first ones: check_colls).
 * The first failure also says where every rank stands (flight_records). A
 * failure is sticky: every pending and later operation of the group fails
 * with it. The library never aborts the process.
 *
 * Configuration is dg_pg_opts; the library reads no environment variable
 * except in dg_pg_new_from_env and dg_pg_opts_from_env (torchrun-style
 * set-up): DG_BACKEND, DG_SOCKET_IFNAME / GLOO_SOCKET_IFNAME, DG_SHM,
 * DG_SPIN_US, DG_FLIGHT_DIR, DG_HOST_ID (the fields they fill say what they
 * do).
 * DG_LOG=info logs the address used and the algorithms chosen.
 *
 * Thread-safety: a dg_pg may be used from several threads (calls that post
 * collectives are serialised; order between threads is the caller's
 * business). A dg_work is used by one thread at a time. */
#ifndef DGRAD_DIST_H
#define DGRAD_DIST_H

#include <stddef.h>
#include <stdint.h>

#include "dgrad/common.h"
#include "dgrad/store.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dg_pg dg_pg;
typedef struct dg_work dg_work;

typedef enum {
  DG_RED_SUM = 0,
  DG_RED_AVG = 1, /* sum / world size (integer division for i32/i64) */
  DG_RED_MIN = 2,
  DG_RED_MAX = 3,
  DG_RED_PROD = 4
} dg_redop;

/* Allreduce algorithms. AUTO picks Gloo's ring when any rank is not dgrad
 * (required to interoperate), else dgrad's choice by size. */
typedef enum {
  DG_ALGO_AUTO = 0,
  DG_ALGO_RING = 1,          /* Gloo's ring, message for message */
  DG_ALGO_HALVING_DOUBLING = 2, /* recursive doubling: small messages */
  DG_ALGO_DIRECT = 3,        /* reduce-scatter + allgather, all pairs at once */
  DG_ALGO_CMA = 4,           /* as DIRECT, reading peers' buffers in place with
                                cross-memory attach: ranks on one host only */
  DG_ALGO_SHM = 5,           /* through a shared-memory segment, no messages:
                                ranks on one host only (the default there) */
  /* A group of dg_pg_new over several hosts, one of them with several
   * ranks: the ranks of each host allreduce through shared memory (else
   * cross-memory attach, else the transport); then shard j of S (S: the
   * fewest ranks a host has) is allreduced between hosts over the transport
   * by local rank j of every host; then the shards go back to every rank
   * of the host through shared memory. The default there when every host's
   * ranks share memory or cross-memory attach. Summation order depends on
   * the layout (which ranks on which host) only: the same layout gives the
   * same bits run to run; not the bits of one flat algorithm over the same
   * ranks. Sub-groups (dg_pg_new_group) have none. */
  DG_ALGO_HIER = 6
} dg_algo;

/* Rendezvous key layout: torch 1.13's init_process_group (prefixes
 * "default_pg/<group>/0", store-based barrier, sequence number), or plain
 * Gloo connectFullMesh keys on the store as given (a C++ libgloo peer). */
typedef enum { DG_RDZV_TORCH = 0, DG_RDZV_GLOO = 1 } dg_rdzv;

/* A model of a slower link, for benchmarks and tests of overlap on one host
 * (bench/ddp/simlink.c is one; the library has none). The shared-memory
 * paths do their work as usual, then hold each result back until the model
 * says a link would have delivered it, as a NIC's DMA would: no CPU, no
 * thread to wake. Times are CLOCK_MONOTONIC nanoseconds; `state` must
 * outlive the group. A NULL function: no hold on that path. */
typedef struct {
  void *state;
  /* An all-reduce of `bytes` per rank among `world` ranks began at t0:
   * when the link would have finished it. Any of the group's threads. */
  int64_t (*allreduce_end)(void *state, int64_t t0, size_t bytes, int world);
  /* DDP's shared gradients, round `step` (increasing): bucket j of nb holds
   * bytes[j] and was posted by every rank at posted[j] (-1: not yet). When
   * bucket k (posted) finishes its transfer, as far as `now` decides: a time
   * after now means look again then. Called by the thread that waits for
   * the bucket (backward's, or the next forward's in overlap mode). */
  int64_t (*bucket_end)(void *state, uint64_t step, int k, int nb, const size_t *bytes,
                        const int64_t *posted, int world, int64_t now);
} dg_link_model;

/* Every field but rank, world_size and store may be left zero (NULL): the
 * default. dg_pg_opts_from_env fills the configuration from the
 * environment variables named in brackets. */
typedef struct {
  int rank;            /* required */
  int world_size;      /* required */
  dg_store *store;     /* rendezvous store (not owned; must outlive the group) */
  /* "tcp" (NULL: tcp) or "ucx" [DG_BACKEND]. The first UCX group loads
   * libucp.so.0 (DG_EUNSUPPORTED naming the package when it is missing) with
   * UCX's signal handlers off unless UCX_HANDLE_ERRORS / UCX_DEBUG_SIGNO
   * say otherwise; a program that never asks for UCX never maps it. */
  const char *backend;
  int timeout_ms;      /* per-operation deadline; 0: 300000 (torch's default) */
  /* Interface: the address of `iface` [DG_SOCKET_IFNAME, GLOO_SOCKET_IFNAME],
   * else the local address routing to `route_to`, else 127.0.0.1. */
  const char *iface;
  const char *route_to;
  const char *group_name; /* store prefix as torch's first group: "default_pg"
                             then "0"; NULL: those */
  dg_rdzv rendezvous;
  /* 1: no shared-memory segment between the ranks of one host (cross-memory
   * attach or the transport then carry the data; DDP keeps private
   * gradients) [DG_SHM=0]. Where /dev/shm is too small it is off anyway. */
  int no_shm;
  /* How long a transport wait busy-polls before sleeping, in microseconds:
   * 0 the transport's default (tcp 100, ucx 0), negative none (for
   * oversubscribed machines) [DG_SPIN_US, where 0 means none]. */
  int spin_us;
  /* Benchmarks and tests only: a slower link to model (copied; NULL: none). */
  const dg_link_model *link;
  /* Flight recorder: how many of its last operations each rank keeps (seq,
   * op, dtype, count, root or peer, state, times) in a ring allocated with
   * the group: 0: 256, negative: none. On the group's first failure the
   * dgrad ranks compare positions through the store (for at most a quarter
   * of timeout_ms, 100 ms to 1 s) and the error says who is behind and
   * where ("rank 3 is at seq 812 (allreduce f32[1024]); ranks 0-2 wait in
   * seq 813 (allreduce f32[262144])"). Groups with torch ranks: this rank's
   * position only. */
  int flight_records;
  /* Where each rank writes its records when the group fails, as
   * <dir>/rank<R>.txt (sub-groups: rank<R>.group<name>.txt); the directory
   * is created (one level). NULL: no file [DG_FLIGHT_DIR; dgrun sets one]. */
  const char *flight_dir;
  /* Collective fingerprints: the group's first check_colls collectives
   * exchange (op, dtype, count, root, reduction) among the ranks before
   * they run, and a difference fails every rank with DG_EMISMATCH naming
   * both ranks and both calls instead of hanging or corrupting a later
   * operation. 0: 64, negative: none, INT_MAX: every collective (one small
   * message to and from each peer per collective). dgrad-only groups: torch
   * and libgloo ranks cannot carry it, so mixed groups are not checked. */
  int check_colls;
  /* Shared secret of a group whose ranks all run dgrad (NULL or "": none)
   * [DG_AUTH_TOKEN; dg_pg_new_from_env also gives it to the TCPStore, see
   * dg_tcp_store_opts]: each pair of ranks proves it (HMAC-SHA-256 over
   * fresh nonces; never sent) before its first frame, and a listener closes
   * connections that do not, so a process without it cannot open a pair
   * (nor take a peer's place). A peer that is not dgrad (torch, libgloo) is
   * DG_EUNSUPPORTED, and so is the ucx backend; a different token is
   * DG_EMISMATCH. Authentication only: nothing is encrypted
   * (docs/guide-deployment.md says what is and is not protected). */
  const char *auth_token;
  /* This rank's host identity, one word (NULL or "": the host name)
   * [DG_HOST_ID]. Ranks with the same identity count as one host: they try
   * a shared-memory segment and cross-memory attach between them (each
   * falls back to the transport when the peer turns out to be elsewhere),
   * and the hierarchical allreduce (DG_ALGO_HIER) is laid out by it. For
   * tests and benchmarks that fake several hosts on one machine (logged at
   * INFO when set). */
  const char *host_id;
} dg_pg_opts;

/* Creates a group and connects it (blocks until every rank joined or the
 * timeout). On failure *out is NULL and err (cap bytes; may be NULL, then
 * the reason is logged at WARN) says why. */
DG_API int dg_pg_new(dg_pg **out, const dg_pg_opts *opts, char *err, size_t cap);

/* Creates the group from the environment, like torch's env:// init: RANK,
 * WORLD_SIZE, MASTER_ADDR, MASTER_PORT (else SLURM_PROCID/SLURM_NTASKS, or
 * OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE); rank 0 hosts the TCPStore.
 * The group owns that store. timeout_ms 0: 300000. The other options come
 * from dg_pg_opts_from_env. A missing or malformed variable is DG_EINVAL
 * at once, naming each variable and the value found (`RANK=2 is not below
 * WORLD_SIZE=2`); a rendezvous that times out (DG_ETIMEDOUT) names the
 * ranks that never came (`ranks 1, 3 of 4 did not join within 30000 ms`).
 * Shut-down is safe however early it comes: rank 0 returns only once every
 * other dgrad rank is done with the store, and its dg_pg_free keeps serving
 * until every client (torch ranks too) has disconnected, for at most the
 * timeout. */
DG_API int dg_pg_new_from_env(dg_pg **out, int timeout_ms, char *err, size_t cap);
/* Fills the configuration fields of o that are still zero from the
 * environment: backend (DG_BACKEND), iface (DG_SOCKET_IFNAME, else
 * GLOO_SOCKET_IFNAME), no_shm (DG_SHM=0), spin_us (DG_SPIN_US), flight_dir
 * (DG_FLIGHT_DIR). For
 * programs that make their own store and want the same switches as
 * dg_pg_new_from_env. The strings stay the environment's. DG_EINVAL: NULL. */
DG_API int dg_pg_opts_from_env(dg_pg_opts *o);

/* Leaves the group: waits for queued work (bounded by the timeout), tells
 * dgrad peers it is leaving, closes connections; the rank hosting the store
 * of dg_pg_new_from_env then serves it until its clients have disconnected
 * (bounded by the timeout). NULL: no-op. */
DG_API void dg_pg_free(dg_pg *pg);

/* Sub-groups, as torch.distributed.new_group: makes a group of the parent's
 * ranks `ranks` (n of them; NULL: every rank, n 0 or the parent's size).
 * Collective over the parent: EVERY rank of the parent calls it, members
 * or not, with the same list and in the same order as its other
 * dg_pg_new_group calls. The list is sorted (as torch does), so rank i of
 * the sub-group is the i-th smallest parent rank; dg_pg_rank/dg_pg_size
 * and every collective (allreduce, broadcast roots, allgather order,
 * send/recv peers, DDP) use that numbering. A member gets the group in
 * *out; a rank not in `ranks` gets *out = NULL and DG_OK, as torch's
 * NON_GROUP_MEMBER.
 *
 * Keys and numbering follow torch 1.13, so torch ranks of a mixed group
 * calling new_group(ranks) make the same group with dgrad ranks: the k-th
 * group made from a group of dg_pg_new is named "k" (store prefix
 * "default_pg/k"), then every rank of the parent checks in at
 * "default_pg/store_based_barrier_key:<k+1>". Sub-groups of sub-groups
 * (dgrad-only parents; torch has none) are named "<parent>.<k>".
 *
 * Connections: when every member runs dgrad, the group opens none: it
 * shares its ancestor's connections (TCP or UCX), with its own ranks and
 * message slots, so its traffic never mixes with the parent's or another
 * group's, and its collectives run concurrently with theirs
 * (a 12-bit group number from a counter in the store tells them apart: the
 * 4096th such group made over one store takes the first one's number, so
 * free groups you no longer use before making thousands more). It also gets
 * its own shared-memory segment where all members share a host (else
 * cross-memory attach or the transport). A group with a torch member
 * connects its members as torch's ProcessGroupGloo does (Gloo's
 * algorithms, as any mixed group).
 *
 * Failure: bad ranks (out of range, listed twice) are DG_EINVAL at once;
 * dgrad ranks of the parent that pass different lists all fail with
 * DG_EMISMATCH naming both ranks and both lists; a rank of the parent that
 * never calls fails the others at the parent's timeout, naming it. A group
 * sharing its ancestor's connections shares their fate: a dead or silent
 * member fails that group, its ancestors and their other sub-groups (the
 * message names the rank in the sub-group's and the parent's numbering),
 * as a dead rank would the parent's own collectives. A failed parent
 * cannot make groups (its error).
 *
 * Freeing: any order. A parent freed before its sub-groups stays connected
 * (idle) until the last of them is freed, then goes; free each group's
 * works before that group. The group's timeout, options, link model and
 * local rank/size (this host's processes) are the parent's. */
DG_API int dg_pg_new_group(dg_pg **out, dg_pg *parent, const int *ranks, int n, char *err,
                           size_t cap);

DG_API int dg_pg_rank(const dg_pg *pg);
DG_API int dg_pg_size(const dg_pg *pg);
/* From LOCAL_RANK / LOCAL_WORLD_SIZE (env groups); else rank / world size. */
DG_API int dg_pg_local_rank(const dg_pg *pg);
DG_API int dg_pg_local_size(const dg_pg *pg);
/* 1 when every rank runs dgrad (own algorithms allowed). */
DG_API int dg_pg_all_dgrad(const dg_pg *pg);
/* Last failure of the group (sticky transport error, or "no error"). */
DG_API const char *dg_pg_errmsg(const dg_pg *pg);
/* Forces an allreduce algorithm (DG_ALGO_AUTO restores the default). Only
 * RING is valid in a group with non-dgrad ranks; CMA needs every rank on
 * this host with process_vm_readv allowed, SHM every rank on this host with
 * a POSIX shared-memory segment and no opts.no_shm (DG_EUNSUPPORTED
 * otherwise); HIER a group with the hierarchy (see DG_ALGO_HIER). Call it
 * on every rank. */
DG_API int dg_pg_set_algo(dg_pg *pg, dg_algo algo);
/* The algorithm an allreduce of count elements of dt would run now (the
 * forced one, or what DG_ALGO_AUTO picks; never AUTO itself); DG_ALGO_AUTO
 * for a NULL group or a bad dtype. DG_LOG=info says at creation whether a
 * group has the hierarchy and what carries it inside each host. */
DG_API dg_algo dg_pg_allreduce_algo(dg_pg *pg, size_t count, dg_dtype dt);

/* Collectives. `w` receives the work (free it with dg_work_free); on a
 * failed post (bad arguments) *w is NULL. Works belong to their group:
 * dg_work_free returns one to the group's pool, where the next post reuses
 * it (a steady-state training step allocates nothing), and dg_pg_free
 * releases the pool. So free every work before its group; a work not
 * freed by then is leaked. */
DG_API int dg_pg_allreduce(dg_pg *pg, void *buf, size_t count, dg_dtype dt, dg_redop op,
                           dg_work **w);
DG_API int dg_pg_broadcast(dg_pg *pg, void *buf, size_t count, dg_dtype dt, int root, dg_work **w);
/* out: (world_size * count) elements; rank r's `in` lands at out + r*count. */
DG_API int dg_pg_allgather(dg_pg *pg, const void *in, void *out, size_t count, dg_dtype dt,
                           dg_work **w);
/* in: (world_size * count) elements; out: (count) = reduction of block r.
 * In a group with torch or libgloo ranks the work fails at once with
 * DG_EUNSUPPORTED (torch 1.13's gloo has no reduce_scatter; dg_work_errmsg
 * says so) and the group stays usable. */
DG_API int dg_pg_reduce_scatter(dg_pg *pg, const void *in, void *out, size_t count, dg_dtype dt,
                                dg_redop op, dg_work **w);
DG_API int dg_pg_barrier(dg_pg *pg, dg_work **w);
/* Point to point with a user tag (matched FIFO per (peer, tag)); a receive
 * may be longer than the matching send (see dg_work_count). */
DG_API int dg_pg_send(dg_pg *pg, const void *buf, size_t count, dg_dtype dt, int dst, uint32_t tag,
                      dg_work **w);
DG_API int dg_pg_recv(dg_pg *pg, void *buf, size_t count, dg_dtype dt, int src, uint32_t tag,
                      dg_work **w);

/* Waits up to timeout_ms (<= 0: until the work finishes or fails at its
 * deadline). DG_OK, the work's error, or DG_EAGAIN when this wait ran out
 * while the work is still running (wait again or test later). */
DG_API int dg_work_wait(dg_work *w, int timeout_ms);
/* *done = 1 when finished; returns the work's status then (DG_OK until). */
DG_API int dg_work_test(dg_work *w, int *done);
/* Elements received (recv works), else count. */
DG_API size_t dg_work_count(const dg_work *w);
DG_API const char *dg_work_errmsg(const dg_work *w);
/* Waits for a running work (bounded by its deadline), then gives it back
 * to its group (which must still exist). NULL: no-op. */
DG_API void dg_work_free(dg_work *w);

/* Convenience: post, wait, free (a failure's detail: dg_pg_errmsg). */
DG_API int dg_pg_allreduce_sync(dg_pg *pg, void *buf, size_t count, dg_dtype dt, dg_redop op);
DG_API int dg_pg_broadcast_sync(dg_pg *pg, void *buf, size_t count, dg_dtype dt, int root);
DG_API int dg_pg_allgather_sync(dg_pg *pg, const void *in, void *out, size_t count, dg_dtype dt);
DG_API int dg_pg_barrier_sync(dg_pg *pg);

#ifdef __cplusplus
}
#endif
#endif /* DGRAD_DIST_H */
