/* Process group creation: stores and key names as torch 1.13's
 * init_process_group (so a dgrad rank can join a torch gloo group), the
 * interface choice, version/world-size checks between dgrad ranks, and
 * torch's store-based barrier and sequence-number handshake. */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <stdarg.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dgrad_config.h"
#include "dist/coll_impl.h"
#include "dist/flight.h"
#include "dist/pg_group.h"
#include "dist/net/net_impl.h"
#include "dist/store/store_impl.h"
#include "base/common_impl.h"

#define INFO_FMT "dgrad %s world=%d"


static int iface_addr(const char *name, struct sockaddr_storage *ss) {
  struct ifaddrs *ifs = NULL;
  if (getifaddrs(&ifs) < 0) return -1;
  int found = -1;
  for (int want = AF_INET; want && found < 0; want = want == AF_INET ? AF_INET6 : 0)
    for (struct ifaddrs *i = ifs; i && found < 0; i = i->ifa_next)
      if (i->ifa_addr && i->ifa_addr->sa_family == want && !strcmp(i->ifa_name, name)) {
        memset(ss, 0, sizeof *ss);
        memcpy(ss, i->ifa_addr, want == AF_INET ? sizeof(struct sockaddr_in)
                                                : sizeof(struct sockaddr_in6));
        found = 0;
      }
  freeifaddrs(ifs);
  return found;
}

/* The local address the kernel would use to reach `host` (UDP connect sends
 * nothing). */
static int route_addr(const char *host, struct sockaddr_storage *ss) {
  struct sockaddr_storage dst;
  socklen_t dl;
  if (dg__resolve(host, 9, &dst, &dl) < 0) return -1;
  int fd = socket(dst.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  socklen_t l = sizeof *ss;
  int rc = connect(fd, (struct sockaddr *)&dst, dl) < 0 ||
                   getsockname(fd, (struct sockaddr *)ss, &l) < 0 ? -1 : 0;
  close(fd);
  return rc;
}

static int pick_addr(const dg_pg_opts *o, struct sockaddr_storage *ss, char *err, size_t cap) {
  const char *ifn = o->iface;
  const char *how;
  char what[300];
  if (ifn && *ifn) {
    if (iface_addr(ifn, ss) < 0)
      return dg__fail_msg(err, cap, DG_EINVAL, "interface \"%s\" has no IP address", ifn);
    how = "interface";
    snprintf(what, sizeof what, "%s", ifn);
  } else if (o->route_to && *o->route_to && route_addr(o->route_to, ss) == 0) {
    how = "route to";
    snprintf(what, sizeof what, "%s", o->route_to);
  } else {
    struct sockaddr_in lo = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    memset(ss, 0, sizeof *ss);
    memcpy(ss, &lo, sizeof lo);
    how = "default";
    snprintf(what, sizeof what, "loopback");
  }
  char a[64];
  DG_LOGI("dist: rank %d listens on %s (%s %s)", o->rank, dg__addr_str(ss, a, sizeof a), how,
          what);
  return DG_OK;
}

typedef struct {
  dg_pg *pg;
  int ndgrad;
  char *err;
  size_t cap;
  char **hosts;     /* (size) hostnames of dgrad peers */
  uint64_t *probe;  /* (size) their cross-memory-attach probe addresses */
  unsigned char *dgrad; /* (size) 1 for the dgrad peers */
} check_ctx;

/* "dgrad_host/<r>" = "<hostname> <pid> <probe address>": lets dgrad ranks
 * on one host read each other's buffers (coll_cma.c). */
static void read_host(check_ctx *cc, int peer) {
  char key[48];
  void *v = NULL;
  size_t n = 0;
  snprintf(key, sizeof key, "dgrad_host/%d", peer);
  if (dg_store_get(cc->pg->k_grp, key, &v, &n, 0) != DG_OK) return;
  char s[512], host[300];
  int pid = 0;
  unsigned long long probe = 0;
  snprintf(s, sizeof s, "%.*s", (int)DG_MIN(n, sizeof s - 1), (char *)v);
  dg_store_value_free(v);
  if (sscanf(s, "%299s %d %llx", host, &pid, &probe) == 3) {
    cc->hosts[peer] = dg__strdup(host);
    cc->pg->pids[peer] = pid;
    cc->probe[peer] = probe;
  }
}

/* Called once peer i's addresses are published: a dgrad peer published its
 * info before them, so its absence means a non-dgrad (torch/libgloo) rank. */
static int check_peer(void *arg, int peer) {
  check_ctx *cc = arg;
  char key[48], mine[64];
  snprintf(key, sizeof key, "dgrad_info/%d", peer);
  snprintf(mine, sizeof mine, INFO_FMT, dg_version(), cc->pg->size);
  int present = 0;
  const char *k = key;
  if (dg_store_check(cc->pg->k_grp, &k, 1, &present) != DG_OK || !present) return 0;
  void *v = NULL;
  size_t n = 0;
  if (dg_store_get(cc->pg->k_grp, key, &v, &n, 0) != DG_OK) return 0;
  char theirs[64];
  snprintf(theirs, sizeof theirs, "%.*s", (int)DG_MIN(n, sizeof theirs - 1), (char *)v);
  dg_store_value_free(v);
  if (strcmp(theirs, mine) != 0)
    return dg__fail_msg(cc->err, cc->cap, DG_EMISMATCH,
                "rank %d runs \"%s\" but rank %d runs \"%s\": versions and world sizes must "
                "match", cc->pg->rank, mine, peer, theirs);
  cc->ndgrad++;
  cc->dgrad[peer] = 1;
  read_host(cc, peer);
  return 1;
}

/* torch's _store_based_barrier after init: ADD 1, then poll ADD 0 every
 * 10 ms until the world is there. */
static int store_barrier(dg_pg *pg, char *err, size_t cap) {
  const char *key = "store_based_barrier_key:1";
  int64_t v = 0, dl = dg__deadline(0, pg->timeout_ms);
  int rc = dg_store_add(pg->s_pg, key, 1, &v);
  while (rc == DG_OK && v < pg->size) {
    if (dg__now_ms() >= dl)
      return dg__fail_msg(err, cap, DG_ETIMEDOUT, "store-based barrier: %lld of %d ranks after %d ms",
                  (long long)v, pg->size, pg->timeout_ms);
    usleep(10000);
    rc = dg_store_add(pg->s_pg, key, 0, &v);
  }
  if (rc != DG_OK) return dg__fail_msg(err, cap, rc, "store-based barrier: %s", dg_store_errmsg(pg->s_pg));
  return DG_OK;
}

/* ProcessGroupGloo::setSequenceNumberForGroup: rank 0 sets 8 LE bytes (also
 * for sub-groups, pg_group.c). */
int dg__pg_seq_handshake(dg_pg *pg, int timeout_ms, char *err, size_t cap) {
  const char *key = "SEQ_NUM_STORE_KEY";
  int rc;
  if (pg->rank == 0) {
    uint64_t seq = 1 + (uint64_t)(dg__now_ns() & 0x7fffffff);
    unsigned char b[8];
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(seq >> (8 * i));
    rc = dg_store_set(pg->s_grp, key, b, 8);
  } else {
    void *v = NULL;
    size_t n = 0;
    rc = dg_store_get(pg->s_grp, key, &v, &n, timeout_ms);
    dg_store_value_free(v);
  }
  if (rc != DG_OK) return dg__fail_msg(err, cap, rc, "sequence number: %s", dg_store_errmsg(pg->s_grp));
  return DG_OK;
}

static int make_stores(dg_pg *pg, dg_store *base, const char *group) {
  if (!pg->torch_rdzv) {
    pg->k_grp = pg->k_dev = base;
    return DG_OK;
  }
  int rc = dg_store_new_prefix(&pg->s_pg, base, "default_pg");
  if (rc == DG_OK) rc = dg_store_new_prefix(&pg->s_grp, pg->s_pg, group);
  if (rc == DG_OK) rc = dg_store_new_prefix(&pg->s_dev, pg->s_grp, "0");
  pg->k_grp = pg->s_grp;
  pg->k_dev = pg->s_dev;
  return rc;
}

static int connect_transport(dg_pg *pg, const dg_pg_opts *o, struct sockaddr_storage *bind,
                             check_ctx *cc, char *err, size_t cap);

/* This rank's host identity: opts.host_id [DG_HOST_ID] (said at INFO: it decides which
 * ranks share memory and how the hierarchical allreduce is laid out) or
 * the host name. One word: it travels in "dgrad_host/<r>". */
static int host_id(dg_pg *pg, char *host, size_t cap, char *err, size_t ecap) {
  if (!dg__host_id(pg, host, cap)) return DG_OK;
  char real[256] = "";
  gethostname(real, sizeof real - 1);
  for (const char *p = host; *p; p++)
    if (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
      return dg__fail_msg(err, ecap, DG_EINVAL, "rank %d: host identity \"%.64s\" "
                          "(opts.host_id, DG_HOST_ID) holds whitespace: it must be one word",
                          pg->rank, host);
  DG_LOGI("dist: rank %d: host identity \"%s\" from opts.host_id / DG_HOST_ID (the host "
          "name is \"%s\"): ranks with the same identity count as one host (shared memory, "
          "hierarchical allreduce)", pg->rank, host, real);
  return DG_OK;
}

/* "dgrad_info/<r>" (version, world size) and "dgrad_host/<r>" (host, pid,
 * probe): what tells dgrad peers apart from torch and libgloo ones. */
static int publish_self(dg_pg *pg, char *err, size_t cap) {
  char key[48], info[64];
  snprintf(key, sizeof key, "dgrad_info/%d", pg->rank);
  snprintf(info, sizeof info, INFO_FMT, dg_version(), pg->size);
  int rc = dg_store_set(pg->k_grp, key, info, strlen(info));
  if (rc != DG_OK)
    return dg__fail_msg(err, cap, rc, "publishing version: %s", dg_store_errmsg(pg->k_grp));
  char hv[512], host[256];
  if ((rc = host_id(pg, host, sizeof host, err, cap)) != DG_OK) return rc;
  snprintf(key, sizeof key, "dgrad_host/%d", pg->rank);
  snprintf(hv, sizeof hv, "%s %d %llx", host, (int)getpid(),
           (unsigned long long)(uintptr_t)dg__cma_probe());
  if ((rc = dg_store_set(pg->k_grp, key, hv, strlen(hv))) != DG_OK)
    return dg__fail_msg(err, cap, rc, "publishing host: %s", dg_store_errmsg(pg->k_grp));
  return DG_OK;
}

/* The end of rendezvous, acknowledged, in a group that owns its store
 * (dg_pg_new_from_env; rank 0 hosts it): every other dgrad rank's last
 * store request sets "dgrad_done/<r>", and rank 0 returns only once all of
 * them have, so it may stop serving (even exit without dg_pg_free) without
 * cutting a rank off mid-rendezvous. Torch ranks send no such key: rank 0's
 * drain in dg_pg_free waits for them to disconnect. Every rank then drops
 * its connection, which that drain waits for. */
static int finish_rdzv(dg_pg *pg, const check_ctx *cc, char *err, size_t cap) {
  char key[48];
  int rc = DG_OK;
  if (pg->rank != 0) {
    snprintf(key, sizeof key, "dgrad_done/%d", pg->rank);
    if ((rc = dg_store_set(pg->k_grp, key, "1", 1)) != DG_OK)
      return dg__fail_msg(err, cap, rc, "end of rendezvous: %s", dg_store_errmsg(pg->k_grp));
  } else {
    char **keys = dg__calloc((size_t)pg->size, sizeof *keys);
    int n = 0;
    if (!keys) return DG_ENOMEM;
    for (int r = 1; r < pg->size && rc == DG_OK; r++) {
      if (!cc->dgrad[r]) continue;
      if (!(keys[n] = dg__malloc(sizeof key))) rc = DG_ENOMEM;
      else snprintf(keys[n++], sizeof key, "dgrad_done/%d", r);
    }
    if (rc == DG_OK && (rc = dg_store_wait(pg->k_grp, (const char *const *)keys, n, 0)))
      dg__fail_msg(err, cap, rc, "end of rendezvous: waiting for the other dgrad ranks: %s",
                   dg_store_errmsg(pg->k_grp));
    for (int i = 0; i < n; i++) dg__free(keys[i]);
    dg__free(keys);
  }
  if (rc == DG_OK) dg__store_release(pg->own_store);
  return rc;
}

/* The hierarchy over several hosts (pg_hier.c), from every rank's host. */
static int hier_setup(dg_pg *pg, check_ctx *cc, char *err, size_t cap) {
  char me[256];
  dg__host_id(pg, me, sizeof me);
  if (!(cc->hosts[pg->rank] = dg__strdup(me))) return DG_ENOMEM;
  return dg__hier_setup(pg, (const char *const *)cc->hosts, err, cap);
}

static int connect_group(dg_pg *pg, const dg_pg_opts *o, char *err, size_t cap) {
  struct sockaddr_storage bind;
  int rc = pick_addr(o, &bind, err, cap);
  pg->bind = bind; /* sub-groups with torch members connect from there */
  if (rc == DG_OK) rc = publish_self(pg, err, cap);
  if (rc != DG_OK) return rc;
  size_t W = (size_t)pg->size;
  check_ctx cc = {pg, 0, err, cap, dg__calloc(W, sizeof(char *)), dg__calloc(W, sizeof(uint64_t)),
                  dg__calloc(W, 1)};
  pg->pids = dg__calloc(W, sizeof(int));
  if (!cc.hosts || !cc.probe || !cc.dgrad || !pg->pids) rc = DG_ENOMEM;
  if (rc == DG_OK) rc = connect_transport(pg, o, &bind, &cc, err, cap);
  if (rc == DG_OK && pg->all_dgrad) rc = hier_setup(pg, &cc, err, cap);
  if (rc == DG_OK && pg->torch_rdzv) rc = store_barrier(pg, err, cap);
  if (rc == DG_OK && pg->torch_rdzv) rc = dg__pg_seq_handshake(pg, 0, err, cap);
  if (rc == DG_OK && pg->own_store) rc = finish_rdzv(pg, &cc, err, cap);
  for (size_t i = 0; cc.hosts && i < W; i++) dg__free(cc.hosts[i]);
  dg__free(cc.hosts);
  dg__free(cc.probe);
  dg__free(cc.dgrad);
  if (rc != DG_OK) return rc;
  DG_LOGI("dist: rank %d of %d connected (%s)", pg->rank, pg->size,
          pg->all_dgrad ? "all ranks dgrad" : "mixed group: Gloo algorithms");
  return dg__pg_start_worker(pg);
}

static int connect_transport(dg_pg *pg, const dg_pg_opts *o, struct sockaddr_storage *bind,
                             check_ctx *cc, char *err, size_t cap) {
  int rc;
  dg_xport_opts xo = {.rank = pg->rank, .size = pg->size, .store = pg->k_dev,
                      .timeout_ms = pg->timeout_ms, .bind_addr = bind,
                      .check = check_peer, .check_arg = cc, .spin_us = o->spin_us,
                      .auth_token = o->auth_token};
  const char *be = o->backend;
  int ucx = be && !strcmp(be, "ucx");
  if (be && *be && strcmp(be, "tcp") != 0 && !(ucx && DG_HAVE_UCX))
    return dg__fail_msg(err, cap, DG_EUNSUPPORTED, "backend \"%s\" is not available (have: tcp%s)", be,
                DG_HAVE_UCX ? ", ucx" : "");
  if (ucx && o->auth_token && *o->auth_token)
    return dg__fail_msg(err, cap, DG_EUNSUPPORTED, "rank %d: an auth token (DG_AUTH_TOKEN) is "
                        "implemented by the tcp backend only, not ucx", pg->rank);
#if DG_HAVE_UCX
  if (ucx) rc = dg__ucx_xport_new(&pg->x, &xo, err, cap);
  else
#endif
    rc = dg__tcp_xport_new(&pg->x, &xo, err, cap);
  if (rc != DG_OK) return rc;
  pg->all_dgrad = pg->x->all_dgrad;
  if (pg->all_dgrad && (rc = dg__cma_setup(pg, cc->probe, (const char *const *)cc->hosts)))
    return dg__fail_msg(err, cap, rc, "%s", pg->err);
  return DG_OK;
}

/* After a failed init, the store host keeps serving for up to
 * FAIL_DRAIN_MS, until no client has been connected for FAIL_QUIET_MS:
 * ranks that time out on the same missing peer at about the same moment
 * (their timed-out waits drop the connection, then they reconnect) still
 * find the store to say which ranks never came. */
#define FAIL_DRAIN_MS 2000
#define FAIL_QUIET_MS 200

/* A group hosting its store (rank 0 of dg_pg_new_from_env) keeps serving
 * it until every client has disconnected (and none came back for quiet_ms),
 * for at most drain_ms: a rank still in rendezvous, or a torch rank
 * (connected until it exits), must not lose the store under it. Peers see
 * the transport close first. */
static void pg_destroy(dg_pg *pg, int drain_ms, int quiet_ms) {
  dg__pg_stop_worker(pg);
  dg__hier_free(pg); /* its internal groups run on the transport */
  if (pg->x) pg->x->vt->destroy(pg->x);
  dg__free(pg->scratch);
  dg__free(pg->tmp);
  dg__pg_free_works(pg);
  /* a client's stores (environment groups, not the host) may go with a
   * flight comparison still waiting on them: teardown does not wait */
  dg_store *chain[4] = {pg->s_dev, pg->s_grp, pg->s_pg, pg->own_store};
  if (!pg->own_store || pg->rank == 0) dg__flight_free(pg->flight);
  else if (dg__flight_free_handing(pg->flight, chain, 4))
    pg->s_dev = pg->s_grp = pg->s_pg = pg->own_store = NULL;
  dg__free(pg->pids);
  dg__shm_free(pg->shm);
  dg_store_free(pg->s_dev);
  dg_store_free(pg->s_grp);
  dg_store_free(pg->s_pg);
  if (pg->own_store) {
    int left = dg__store_drain(pg->own_store, dg__deadline(drain_ms, 1), quiet_ms);
    if (left)
      DG_LOGW("dist: rank %d: stopped serving the TCPStore with %d connection(s) still open "
              "after %d ms", pg->rank, left, drain_ms);
  }
  dg_store_free(pg->own_store);
  pthread_cond_destroy(&pg->qcv);
  pthread_cond_destroy(&pg->dcv);
  pthread_mutex_destroy(&pg->mu);
  dg__free(pg);
}

/* Whether rank r published anything: dgrad's "dgrad_info/<r>" or Gloo's
 * "rank_<r>" (the first key of a torch or libgloo rank). */
static int rank_came(dg_pg *pg, int r, int *came) {
  char k1[48], k2[48];
  const char *a = k1, *b = k2;
  snprintf(k1, sizeof k1, "dgrad_info/%d", r);
  snprintf(k2, sizeof k2, "rank_%d", r);
  int rc = dg_store_check(pg->k_grp, &a, 1, came);
  if (rc == DG_OK && !*came) rc = dg_store_check(pg->k_dev, &b, 1, came);
  return rc;
}

/* A rendezvous timed out: put the ranks that never came ahead of the
 * detail, e.g. "ranks 1, 3 of 4 did not join within 30000 ms (...)". The
 * detail stays alone when every rank came or the store cannot tell. */
static void name_absent(dg_pg *pg, char *err, size_t cap) {
  char list[448] = "";
  size_t o = 0;
  int n = 0;
  for (int r = 0; r < pg->size; r++) {
    int came = 1;
    if (r == pg->rank) continue;
    if (rank_came(pg, r, &came) != DG_OK) return;
    if (came || ++n > 32) continue; /* 32 numbers of 10 digits fit */
    o += (size_t)snprintf(list + o, sizeof list - o, "%s%d", n > 1 ? ", " : "", r);
  }
  if (!n) return;
  if (n > 32) snprintf(list + o, sizeof list - o, " and %d more", n - 32);
  char detail[512];
  snprintf(detail, sizeof detail, "%s", err);
  dg__fail_msg(err, cap, DG_ETIMEDOUT, "rank%s %s of %d did not join within %d ms (%s)",
               n > 1 ? "s" : "", list, pg->size, pg->timeout_ms, detail);
}

static dg_pg *pg_alloc(const dg_pg_opts *o, dg_store *own) {
  dg_pg *pg = dg__calloc(1, sizeof *pg);
  if (!pg) return NULL;
  pthread_mutex_init(&pg->mu, NULL);
  pthread_cond_init(&pg->qcv, NULL);
  pthread_cond_init(&pg->dcv, NULL);
  pg->rank = o->rank;
  pg->size = o->world_size;
  pg->local_rank = o->rank;
  pg->local_size = o->world_size;
  pg->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 300000;
  pg->own_store = own;
  pg->torch_rdzv = o->rendezvous != DG_RDZV_GLOO;
  pg->no_shm = o->no_shm;
  pg->spin_us = o->spin_us;
  if (o->host_id) snprintf(pg->host_id, sizeof pg->host_id, "%s", o->host_id);
  if (o->link) pg->link = *o->link;
  if (!(pg->flight = dg__flight_new(o->world_size, o->flight_records, o->check_colls,
                                    o->flight_dir))) {
    pg->own_store = NULL; /* new_pg frees it */
    pg_destroy(pg, 0, 0);
    return NULL;
  }
  return pg;
}

static int new_pg(dg_pg **out, const dg_pg_opts *o, dg_store *own, char *err, size_t cap) {
  char tmp[512];
  if (!err || !cap) {
    err = tmp;
    cap = sizeof tmp;
  }
  err[0] = 0;
  if (!out || !o || !o->store || o->world_size < 1 || o->rank < 0 ||
      o->rank >= o->world_size) {
    dg_store_free(own);
    return dg__fail_msg(err, cap, DG_EINVAL, "dg_pg_new: need a store, 0 <= rank < world_size");
  }
  *out = NULL;
  if (o->host_id && strlen(o->host_id) >= sizeof ((dg_pg *)0)->host_id) {
    dg_store_free(own);
    return dg__fail_msg(err, cap, DG_EINVAL, "dg_pg_new: host identity (opts.host_id, "
                        "DG_HOST_ID) longer than %zu bytes", sizeof ((dg_pg *)0)->host_id - 1);
  }
  dg_pg *pg = pg_alloc(o, own);
  if (!pg) {
    dg_store_free(own);
    return DG_ENOMEM;
  }
  int rc = make_stores(pg, o->store, o->group_name ? o->group_name : "0");
  if (rc == DG_OK) rc = connect_group(pg, o, err, cap);
  if (rc != DG_OK) {
    if (rc == DG_ETIMEDOUT) name_absent(pg, err, cap);
    if (tmp == err) DG_LOGW("dist: rank %d: init failed: %s", o->rank, err);
    pg_destroy(pg, DG_MIN(pg->timeout_ms, FAIL_DRAIN_MS), FAIL_QUIET_MS);
    return rc;
  }
  *out = pg;
  return DG_OK;
}

int dg_pg_new(dg_pg **out, const dg_pg_opts *o, char *err, size_t cap) {
  return new_pg(out, o, NULL, err, cap);
}

/* Problems found in the environment, joined by "; ". */
typedef struct {
  char msg[768];
  size_t o;
  int bad, unset;
} env_report;

__attribute__((format(printf, 2, 3)))
static void env_bad(env_report *er, const char *fmt, ...) {
  if (er->o + 3 >= sizeof er->msg) return;
  if (er->bad++) er->o += (size_t)snprintf(er->msg + er->o, sizeof er->msg - er->o, "; ");
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(er->msg + er->o, sizeof er->msg - er->o, fmt, ap);
  va_end(ap);
  if (n > 0) er->o = DG_MIN(er->o + (size_t)n, sizeof er->msg - 1);
}

#define MAX_RANKS ((1L << 30) - 1)

/* The first of names[0..n) set to a non-empty value, as an integer in
 * [lo, hi]: 1 with *v and *which; 0 when none is set (required: reported);
 * -1 when the value is no such integer (reported, naming it). */
static int env_int(env_report *er, const char *const *names, int n, long lo, long hi,
                   int required, int *v, const char **which) {
  for (int i = 0; i < n; i++) {
    const char *s = getenv(names[i]);
    if (!s || !*s) continue;
    char *end;
    errno = 0;
    long x = strtol(s, &end, 10);
    *which = names[i];
    if (end == s || *end || errno == ERANGE) {
      env_bad(er, "%s=\"%.64s\" is not an integer", names[i], s);
      return -1;
    }
    if (x < lo || x > hi) {
      env_bad(er, "%s=%ld is out of range (%ld to %ld)", names[i], x, lo, hi);
      return -1;
    }
    *v = (int)x;
    return 1;
  }
  if (required) {
    er->unset = 1;
    env_bad(er, n == 1 ? "%s is not set" : n == 2 ? "none of %s, %s is set"
                                                  : "none of %s, %s, %s is set",
            names[0], n > 1 ? names[1] : "", n > 2 ? names[2] : "");
  }
  return 0;
}

typedef struct {
  int rank, world, port, local_rank, local_size;
  const char *addr;
} env_cfg;

static const char *const RANK_VARS[] = {"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"};
static const char *const WORLD_VARS[] = {"WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"};
static const char *const PORT_VARS[] = {"MASTER_PORT"};
static const char *const LRANK_VARS[] = {"LOCAL_RANK", "SLURM_LOCALID",
                                         "OMPI_COMM_WORLD_LOCAL_RANK"};
static const char *const LSIZE_VARS[] = {"LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE",
                                         "OMPI_COMM_WORLD_LOCAL_SIZE"};

/* torchrun's variables (else SLURM's, else Open MPI's). Every problem is
 * reported, each naming the variable and the value found. */
static int read_env(env_cfg *c, char *err, size_t cap) {
  env_report er = {.o = 0};
  const char *rn = "", *wn = "", *pn = "", *ln = "";
  int hr = env_int(&er, RANK_VARS, 3, 0, MAX_RANKS, 1, &c->rank, &rn);
  int hw = env_int(&er, WORLD_VARS, 3, 1, MAX_RANKS, 1, &c->world, &wn);
  if (hr == 1 && hw == 1 && c->rank >= c->world)
    env_bad(&er, "%s=%d is not below %s=%d", rn, c->rank, wn, c->world);
  c->port = 29500;
  if (env_int(&er, PORT_VARS, 1, 0, 65535, 0, &c->port, &pn) == 1 && c->port == 0 &&
      hw == 1 && c->world > 1)
    env_bad(&er, "MASTER_PORT=0 (any free port) cannot be found by the other ranks of "
            "%s=%d", wn, c->world);
  c->local_rank = c->rank;
  c->local_size = c->world;
  env_int(&er, LRANK_VARS, 3, 0, MAX_RANKS, 0, &c->local_rank, &ln);
  env_int(&er, LSIZE_VARS, 3, 1, MAX_RANKS, 0, &c->local_size, &ln);
  c->addr = getenv("MASTER_ADDR");
  if (!c->addr || !*c->addr) c->addr = "127.0.0.1";
  if (!er.bad) return DG_OK;
  return dg__fail_msg(err, cap, DG_EINVAL, "environment: %s%s", er.msg,
                      er.unset ? " (dgrun and torchrun set RANK and WORLD_SIZE)" : "");
}

/* The TCPStore of an environment group: rank 0 hosts it and does not wait
 * for the anonymous "init/" count (the rendezvous then names the ranks that
 * never came); the others add to that count for a torch host. */
static int env_store(dg_store **st, const env_cfg *c, int timeout_ms, char *err, size_t cap) {
  dg_tcp_store_opts so = {.host = c->addr, .port = c->port, .is_server = c->rank == 0,
                          .world_size = c->world, .wait_workers = c->rank != 0,
                          .timeout_ms = timeout_ms, .auth_token = getenv("DG_AUTH_TOKEN")};
  char serr[384];
  int rc = dg_store_new_tcp(st, &so, serr, sizeof serr);
  if (rc == DG_ETIMEDOUT && c->rank != 0)
    return dg__fail_msg(err, cap, rc, "rank %d: rank 0 did not come up within %d ms (%s; "
                        "MASTER_ADDR/MASTER_PORT)", c->rank, timeout_ms > 0 ? timeout_ms : 300000,
                        serr);
  if (rc != DG_OK)
    return dg__fail_msg(err, cap, rc, "rank %d: TCPStore %s:%d (%s, from MASTER_ADDR/MASTER_PORT): %s",
                        c->rank, c->addr, c->port, c->rank == 0 ? "hosting" : "client", serr);
  return DG_OK;
}

int dg_pg_new_from_env(dg_pg **out, int timeout_ms, char *err, size_t cap) {
  char tmp[1024];
  char *e = err && cap ? err : tmp;
  size_t ecap = err && cap ? cap : sizeof tmp;
  if (!out) return dg__fail_msg(err, cap, DG_EINVAL, "dg_pg_new_from_env: out is NULL");
  *out = NULL;
  env_cfg c;
  dg_store *st = NULL;
  int rc = read_env(&c, e, ecap);
  if (rc == DG_OK) rc = env_store(&st, &c, timeout_ms, e, ecap);
  if (rc != DG_OK) {
    if (e == tmp) DG_LOGW("dg_pg_new_from_env: %s", tmp);
    return rc;
  }
  dg_pg_opts o = {.rank = c.rank, .world_size = c.world, .store = st, .timeout_ms = timeout_ms,
                  .route_to = c.addr};
  dg_pg_opts_from_env(&o);
  rc = new_pg(out, &o, st, err, cap);
  if (rc != DG_OK) return rc; /* new_pg freed the store with the group */
  (*out)->local_rank = c.local_rank;
  (*out)->local_size = c.local_size;
  return DG_OK;
}

int dg_pg_opts_from_env(dg_pg_opts *o) {
  if (!o) return DG_EINVAL;
  const char *v;
  if (!o->backend && (v = getenv("DG_BACKEND")) && *v) o->backend = v;
  if (!o->iface && (v = getenv("DG_SOCKET_IFNAME")) && *v) o->iface = v;
  if (!o->iface && (v = getenv("GLOO_SOCKET_IFNAME")) && *v) o->iface = v;
  if (!o->no_shm && (v = getenv("DG_SHM")) && !strcmp(v, "0")) o->no_shm = 1;
  if (!o->spin_us && (v = getenv("DG_SPIN_US")) && *v) o->spin_us = atoi(v) > 0 ? atoi(v) : -1;
  if (!o->auth_token && (v = getenv("DG_AUTH_TOKEN")) && *v) o->auth_token = v;
  if (!o->flight_dir && (v = getenv("DG_FLIGHT_DIR")) && *v) o->flight_dir = v;
  if (!o->host_id && (v = getenv("DG_HOST_ID")) && *v) o->host_id = v;
  return DG_OK;
}

/* A group with live sub-groups goes once the last of them is freed. */
void dg_pg_free(dg_pg *pg) { dg__pg_release(pg); }

void dg__pg_destroy(dg_pg *pg) { pg_destroy(pg, pg->timeout_ms, 0); }

int dg_pg_rank(const dg_pg *pg) { return pg ? pg->rank : DG_EINVAL; }
int dg_pg_size(const dg_pg *pg) { return pg ? pg->size : DG_EINVAL; }
int dg_pg_local_rank(const dg_pg *pg) { return pg ? pg->local_rank : DG_EINVAL; }
int dg_pg_local_size(const dg_pg *pg) { return pg ? pg->local_size : DG_EINVAL; }
int dg_pg_all_dgrad(const dg_pg *pg) { return pg ? pg->all_dgrad : 0; }

const char *dg_pg_errmsg(const dg_pg *pg) {
  if (!pg) return "no process group";
  dg_pg *p = (dg_pg *)pg;
  pthread_mutex_lock(&p->mu);
  if (!p->err[0] && p->x && p->x->vt->error(p->x, NULL, 0) != DG_OK)
    p->x->vt->error(p->x, p->err, sizeof p->err);
  pthread_mutex_unlock(&p->mu);
  return p->err[0] ? p->err : "no error";
}

int dg_pg_set_algo(dg_pg *pg, dg_algo algo) {
  if (!pg || algo < DG_ALGO_AUTO || algo > DG_ALGO_HIER) return DG_EINVAL;
  if (!pg->all_dgrad && algo != DG_ALGO_AUTO && algo != DG_ALGO_RING) return DG_EUNSUPPORTED;
  if (algo == DG_ALGO_CMA && !pg->cma) return DG_EUNSUPPORTED;
  if (algo == DG_ALGO_SHM && !pg->shm) return DG_EUNSUPPORTED;
  if (algo == DG_ALGO_HIER && !pg->hier) return DG_EUNSUPPORTED;
  pthread_mutex_lock(&pg->mu);
  pg->algo = algo;
  pthread_mutex_unlock(&pg->mu);
  return DG_OK;
}
