/* Process group creation: stores and key names as torch 1.13's
 * init_process_group (so a dgrad rank can join a torch gloo group), the
 * interface choice, version/world-size checks between dgrad ranks, and
 * torch's store-based barrier and sequence-number handshake. */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dgrad_config.h"
#include "dist/coll_impl.h"
#include "dist/net/net_impl.h"
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

/* ProcessGroupGloo::setSequenceNumberForGroup: rank 0 sets 8 LE bytes. */
static int seq_handshake(dg_pg *pg, char *err, size_t cap) {
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
    rc = dg_store_get(pg->s_grp, key, &v, &n, 0);
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

static int connect_group(dg_pg *pg, const dg_pg_opts *o, char *err, size_t cap) {
  struct sockaddr_storage bind;
  int rc = pick_addr(o, &bind, err, cap);
  if (rc != DG_OK) return rc;
  char key[48], info[64];
  snprintf(key, sizeof key, "dgrad_info/%d", pg->rank);
  snprintf(info, sizeof info, INFO_FMT, dg_version(), pg->size);
  if ((rc = dg_store_set(pg->k_grp, key, info, strlen(info))) != DG_OK)
    return dg__fail_msg(err, cap, rc, "publishing version: %s", dg_store_errmsg(pg->k_grp));
  char hk[48], hv[512], host[256] = "";
  gethostname(host, sizeof host - 1);
  snprintf(hk, sizeof hk, "dgrad_host/%d", pg->rank);
  snprintf(hv, sizeof hv, "%s %d %llx", host, (int)getpid(),
           (unsigned long long)(uintptr_t)dg__cma_probe());
  if ((rc = dg_store_set(pg->k_grp, hk, hv, strlen(hv))) != DG_OK)
    return dg__fail_msg(err, cap, rc, "publishing host: %s", dg_store_errmsg(pg->k_grp));
  check_ctx cc = {pg, 0, err, cap, dg__calloc((size_t)pg->size, sizeof(char *)),
                  dg__calloc((size_t)pg->size, sizeof(uint64_t))};
  pg->pids = dg__calloc((size_t)pg->size, sizeof(int));
  if (!cc.hosts || !cc.probe || !pg->pids) rc = DG_ENOMEM;
  if (rc == DG_OK) rc = connect_transport(pg, o, &bind, &cc, err, cap);
  for (int i = 0; cc.hosts && i < pg->size; i++) dg__free(cc.hosts[i]);
  dg__free(cc.hosts);
  dg__free(cc.probe);
  if (rc != DG_OK) return rc;
  if (pg->torch_rdzv && (rc = store_barrier(pg, err, cap)) != DG_OK) return rc;
  if (pg->torch_rdzv && (rc = seq_handshake(pg, err, cap)) != DG_OK) return rc;
  DG_LOGI("dist: rank %d of %d connected (%s)", pg->rank, pg->size,
          pg->all_dgrad ? "all ranks dgrad" : "mixed group: Gloo algorithms");
  return dg__pg_start_worker(pg);
}

static int connect_transport(dg_pg *pg, const dg_pg_opts *o, struct sockaddr_storage *bind,
                             check_ctx *cc, char *err, size_t cap) {
  int rc;
  dg_xport_opts xo = {.rank = pg->rank, .size = pg->size, .store = pg->k_dev,
                      .timeout_ms = pg->timeout_ms, .bind_addr = bind,
                      .check = check_peer, .check_arg = cc, .spin_us = o->spin_us};
  const char *be = o->backend;
  int ucx = be && !strcmp(be, "ucx");
  if (be && *be && strcmp(be, "tcp") != 0 && !(ucx && DG_HAVE_UCX))
    return dg__fail_msg(err, cap, DG_EUNSUPPORTED, "backend \"%s\" is not available (have: tcp%s)", be,
                DG_HAVE_UCX ? ", ucx" : "");
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

static void pg_destroy(dg_pg *pg) {
  dg__pg_stop_worker(pg);
  if (pg->x) pg->x->vt->destroy(pg->x);
  dg__free(pg->scratch);
  dg__free(pg->tmp);
  dg__pg_free_works(pg);
  dg__free(pg->pids);
  dg__shm_free(pg->shm);
  dg_store_free(pg->s_dev);
  dg_store_free(pg->s_grp);
  dg_store_free(pg->s_pg);
  dg_store_free(pg->own_store);
  pthread_cond_destroy(&pg->qcv);
  pthread_cond_destroy(&pg->dcv);
  pthread_mutex_destroy(&pg->mu);
  dg__free(pg);
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
  dg_pg *pg = dg__calloc(1, sizeof *pg);
  if (!pg) {
    dg_store_free(own);
    return DG_ENOMEM;
  }
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
  if (o->link) pg->link = *o->link;
  int rc = make_stores(pg, o->store, o->group_name ? o->group_name : "0");
  if (rc == DG_OK) rc = connect_group(pg, o, err, cap);
  if (rc != DG_OK) {
    if (tmp == err) DG_LOGW("dist: rank %d: init failed: %s", o->rank, err);
    pg_destroy(pg);
    return rc;
  }
  *out = pg;
  return DG_OK;
}

int dg_pg_new(dg_pg **out, const dg_pg_opts *o, char *err, size_t cap) {
  return new_pg(out, o, NULL, err, cap);
}

static int env_int(const char *a, const char *b, const char *c, int dflt) {
  const char *names[3] = {a, b, c};
  for (int i = 0; i < 3; i++) {
    const char *v = names[i] ? getenv(names[i]) : NULL;
    if (v && *v) {
      char *end;
      long x = strtol(v, &end, 10);
      if (!*end && x >= 0 && x < (1L << 30)) return (int)x;
      return -2;
    }
  }
  return dflt;
}

int dg_pg_new_from_env(dg_pg **out, int timeout_ms, char *err, size_t cap) {
  int rank = env_int("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", -1);
  int world = env_int("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", -1);
  int port = env_int("MASTER_PORT", NULL, NULL, 29500);
  const char *addr = getenv("MASTER_ADDR");
  if (!addr || !*addr) addr = "127.0.0.1";
  if (!out) return DG_EINVAL;
  if (rank < 0 || world < 1 || rank >= world || port < 0 || port > 65535)
    return dg__fail_msg(err, cap, DG_EINVAL,
                "environment: need RANK and WORLD_SIZE (or SLURM_PROCID/SLURM_NTASKS, "
                "OMPI_COMM_WORLD_RANK/SIZE) with 0 <= RANK < WORLD_SIZE, and a valid "
                "MASTER_PORT");
  dg_tcp_store_opts so = {.host = addr, .port = port, .is_server = rank == 0,
                          .world_size = world, .wait_workers = 1, .timeout_ms = timeout_ms};
  dg_store *st = NULL;
  char serr[384];
  int rc = dg_store_new_tcp(&st, &so, serr, sizeof serr);
  if (rc != DG_OK)
    return dg__fail_msg(err, cap, rc, "rank %d: TCPStore %s:%d (%s, from MASTER_ADDR/MASTER_PORT): %s",
                        rank, addr, port, rank == 0 ? "hosting" : "client", serr);
  dg_pg_opts o = {.rank = rank, .world_size = world, .store = st, .timeout_ms = timeout_ms,
                  .route_to = addr};
  dg_pg_opts_from_env(&o);
  rc = new_pg(out, &o, st, err, cap);
  if (rc != DG_OK) return rc; /* new_pg freed the store with the group */
  (*out)->local_rank = env_int("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", rank);
  (*out)->local_size = env_int("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE",
                               "OMPI_COMM_WORLD_LOCAL_SIZE", world);
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
  return DG_OK;
}

void dg_pg_free(dg_pg *pg) {
  if (pg) pg_destroy(pg);
}

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
  if (!pg || algo < DG_ALGO_AUTO || algo > DG_ALGO_SHM) return DG_EINVAL;
  if (!pg->all_dgrad && algo != DG_ALGO_AUTO && algo != DG_ALGO_RING) return DG_EUNSUPPORTED;
  if (algo == DG_ALGO_CMA && !pg->cma) return DG_EUNSUPPORTED;
  if (algo == DG_ALGO_SHM && !pg->shm) return DG_EUNSUPPORTED;
  pthread_mutex_lock(&pg->mu);
  pg->algo = algo;
  pthread_mutex_unlock(&pg->mu);
  return DG_OK;
}
