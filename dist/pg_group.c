/* Sub-groups (dg_pg_new_group), as torch 1.13's new_group makes them, so
 * that dgrad and torch ranks can make them together:
 *   - every rank of the parent calls it (members or not), in the same order;
 *   - the k-th group made from a group of dg_pg_new is named "k" (torch's
 *     _group_count) and keeps its keys under "default_pg/k" ("default_pg/k/0"
 *     for Gloo's rendezvous), then every rank of the parent checks in at
 *     "default_pg/store_based_barrier_key:<k+1>" and the members do the
 *     sequence-number handshake.
 * A group whose members all run dgrad opens no connection: it sends over
 * its ancestor's transport, with its own ranks and its own slots
 * (pg_impl.h: dg__pg_xpeer, dg__pg_xslot). A group with a torch member
 * connects its members as torch's ProcessGroupGloo does (that rank opens
 * its own pairs, which we cannot share). Before any of that, the dgrad
 * ranks of the parent compare their rank lists, so disagreement is an
 * error naming both sides rather than a hang. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dgrad_config.h"
#include "dist/coll_impl.h"
#include "dist/flight.h"
#include "dist/pg_group.h"
#include "dist/net/net_impl.h"
#include "base/common_impl.h"

#define INFO_FMT "dgrad %s world=%d"
#define MAX_GID 4095u

/* Guards nsub and freed of every group (teardown order). */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static dg_pg *root_of(dg_pg *pg) {
  while (pg->parent) pg = pg->parent;
  return pg;
}

/* Where groups made from root keep their keys and barriers: torch's
 * "default_pg" store (the store as given for Gloo's rendezvous). */
static dg_store *base_store(dg_pg *root) { return root->torch_rdzv ? root->s_pg : root->k_grp; }

/* ---- teardown ---- */

static void sub_destroy(dg_pg *pg) {
  dg__pg_stop_worker(pg);
  if (pg->x && !pg->xrank) pg->x->vt->destroy(pg->x); /* its own (torch members) */
  dg__free(pg->scratch);
  dg__free(pg->tmp);
  dg__pg_free_works(pg);
  dg__flight_free(pg->flight);
  dg__free(pg->pids);
  dg__free(pg->members);
  dg__free(pg->xrank);
  dg__shm_free(pg->shm);
  dg_store_free(pg->s_dev);
  dg_store_free(pg->s_grp);
  pthread_cond_destroy(&pg->qcv);
  pthread_cond_destroy(&pg->dcv);
  pthread_mutex_destroy(&pg->mu);
  dg__free(pg);
}

void dg__pg_release(dg_pg *pg) {
  while (pg) {
    pthread_mutex_lock(&g_mu);
    pg->freed = 1;
    int keep = pg->nsub > 0; /* its last sub-group frees it */
    pthread_mutex_unlock(&g_mu);
    if (keep) return;
    dg_pg *parent = pg->parent;
    if (parent) sub_destroy(pg);
    else dg__pg_destroy(pg);
    if (!parent) return;
    pthread_mutex_lock(&g_mu);
    int go = --parent->nsub == 0 && parent->freed;
    pthread_mutex_unlock(&g_mu);
    pg = go ? parent : NULL;
  }
}

/* ---- the rank list ---- */

static int cmp_int(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

/* ranks (n; NULL: every rank of the parent) sorted into out (parent size). */
static int canon_ranks(const dg_pg *parent, const int *ranks, int n, int *out, int *nout,
                       char *err, size_t cap) {
  int W = parent->size;
  if (!ranks) {
    if (n != 0 && n != W)
      return dg__fail_msg(err, cap, DG_EINVAL, "dg_pg_new_group: ranks is NULL (every rank) "
                          "but n = %d, not 0 or the parent's size %d", n, W);
    for (int r = 0; r < W; r++) out[r] = r;
    *nout = W;
    return DG_OK;
  }
  if (n < 1 || n > W)
    return dg__fail_msg(err, cap, DG_EINVAL, "dg_pg_new_group: %d ranks for a parent of %d",
                        n, W);
  memcpy(out, ranks, (size_t)n * sizeof *out);
  qsort(out, (size_t)n, sizeof *out, cmp_int);
  for (int i = 0; i < n; i++) {
    if (out[i] < 0 || out[i] >= W)
      return dg__fail_msg(err, cap, DG_EINVAL, "dg_pg_new_group: rank %d is not a rank of the "
                          "parent (0 to %d)", out[i], W - 1);
    if (i && out[i] == out[i - 1])
      return dg__fail_msg(err, cap, DG_EINVAL, "dg_pg_new_group: rank %d is listed twice",
                          out[i]);
  }
  *nout = n;
  return DG_OK;
}

/* "[0, 2, 3]" (shortened to what fits cap >= 32). */
static void fmt_ranks(const int *r, int n, char *s, size_t cap) {
  size_t o = (size_t)snprintf(s, cap, "[");
  int i = 0;
  for (; i < n && o + 24 < cap; i++)
    o += (size_t)snprintf(s + o, cap - o, "%s%d", i ? ", " : "", r[i]);
  snprintf(s + o, cap - o, "%s]", i < n ? ", ..." : "");
}

/* ---- what a group is being made as ---- */

typedef struct {
  dg_pg *parent, *root, *pg; /* pg: the new group (members only) */
  int *ranks, n, me;         /* me: this rank's index in ranks, or -1 */
  unsigned char *dgrad;      /* (parent size) 1 for a dgrad rank */
  dg_store *grp;             /* "<base>/<name>" (owned until it moves to pg) */
  char name[48], bkey[96];   /* group name; barrier key */
  char *err;
  size_t cap;
  int internal;              /* dg__pg_new_internal: no worker, no flight */
} mk_ctx;

/* The parent's rank r as a rank of the root (the transport's numbering). */
static int root_rank(const dg_pg *parent, int r) {
  for (const dg_pg *p = parent; p->parent; p = p->parent) r = p->members[r];
  return r;
}

/* Which ranks of the parent run dgrad: all in a dgrad-only group, else
 * those whose "dgrad_info/<r>" the root's rendezvous published. */
static int find_dgrad(mk_ctx *m) {
  int W = m->parent->size;
  for (int r = 0; r < W; r++) {
    m->dgrad[r] = 1;
    if (m->parent->all_dgrad || r == m->parent->rank) continue;
    char key[48];
    const char *k = key;
    int present = 0;
    snprintf(key, sizeof key, "dgrad_info/%d", root_rank(m->parent, r));
    int rc = dg_store_check(m->root->k_grp, &k, 1, &present);
    if (rc != DG_OK)
      return dg__fail_msg(m->err, m->cap, rc, "dg_pg_new_group: store: %s",
                          dg_store_errmsg(m->root->k_grp));
    m->dgrad[r] = (unsigned char)present;
  }
  return DG_OK;
}

/* Every dgrad rank of the parent publishes its list and reads the others':
 * a rank that asks for another group fails everyone, naming both. */
static int agree_ranks(mk_ctx *m) {
  dg_pg *P = m->parent;
  char key[48], mine[1024], theirs[1024];
  size_t ml = 0;
  for (int i = 0; i < m->n && ml + 16 < sizeof mine; i++)
    ml += (size_t)snprintf(mine + ml, sizeof mine - ml, "%d ", m->ranks[i]);
  snprintf(key, sizeof key, "dgrad_ranks/%d", P->rank);
  int rc = dg_store_set(m->grp, key, mine, ml);
  for (int q = 0; q < P->size && rc == DG_OK; q++) {
    if (q == P->rank || !m->dgrad[q]) continue;
    void *v = NULL;
    size_t len = 0;
    snprintf(key, sizeof key, "dgrad_ranks/%d", q);
    rc = dg_store_get(m->grp, key, &v, &len, P->timeout_ms);
    if (rc == DG_ETIMEDOUT)
      return dg__fail_msg(m->err, m->cap, rc, "dg_pg_new_group (sub-group %s): rank %d of the "
                          "parent did not call it within %d ms (every rank of the parent "
                          "must, members or not)", m->name, q, P->timeout_ms);
    if (rc != DG_OK) break;
    int same = len == ml && !memcmp(v, mine, ml);
    snprintf(theirs, sizeof theirs, "%.*s", (int)DG_MIN(len, sizeof theirs - 1), (char *)v);
    dg_store_value_free(v);
    if (same) continue;
    int tr[512], tn = 0, off = 0, k;
    while (tn < 512 && sscanf(theirs + off, "%d%n", &tr[tn], &k) == 1) off += k, tn++;
    char a[160], b[160];
    fmt_ranks(m->ranks, m->n, a, sizeof a);
    fmt_ranks(tr, tn, b, sizeof b);
    return dg__fail_msg(m->err, m->cap, DG_EMISMATCH, "dg_pg_new_group (sub-group %s): rank %d "
                        "of the parent asks for ranks %s but rank %d asks for %s (every rank "
                        "must pass the same list, in the same order of calls)", m->name,
                        P->rank, a, q, b);
  }
  if (rc != DG_OK)
    return dg__fail_msg(m->err, m->cap, rc, "dg_pg_new_group (sub-group %s): store: %s", m->name,
                        dg_store_errmsg(m->grp));
  return DG_OK;
}

/* torch's _store_based_barrier: ADD 1, poll ADD 0 every 10 ms until every
 * rank of the parent (members or not) is there. */
static int store_barrier(mk_ctx *m) {
  dg_store *s = base_store(m->root);
  int W = m->parent->size, T = m->parent->timeout_ms;
  int64_t v = 0, dl = dg__deadline(0, T);
  int rc = dg_store_add(s, m->bkey, 1, &v);
  while (rc == DG_OK && v < W) {
    if (dg__now_ms() >= dl)
      return dg__fail_msg(m->err, m->cap, DG_ETIMEDOUT, "dg_pg_new_group (sub-group %s): "
                          "store-based barrier \"%s\": %lld of %d ranks of the parent after %d "
                          "ms", m->name, m->bkey, (long long)v, W, T);
    usleep(10000);
    rc = dg_store_add(s, m->bkey, 0, &v);
  }
  if (rc != DG_OK)
    return dg__fail_msg(m->err, m->cap, rc, "dg_pg_new_group (sub-group %s): barrier: %s",
                        m->name, dg_store_errmsg(s));
  return DG_OK;
}

/* ProcessGroupGloo::setSequenceNumberForGroup, members only (pg.c's). */
static int seq_handshake(mk_ctx *m) {
  char why[256];
  int rc = dg__pg_seq_handshake(m->pg, m->pg->timeout_ms, why, sizeof why);
  if (rc != DG_OK)
    return dg__fail_msg(m->err, m->cap, rc, "dg_pg_new_group (sub-group %s): %s", m->name, why);
  return DG_OK;
}

/* ---- members: the group object and its transport ---- */

static dg_pg *sub_alloc(mk_ctx *m) {
  dg_pg *P = m->parent, *pg = dg__calloc(1, sizeof *pg);
  if (!pg) return NULL;
  pthread_mutex_init(&pg->mu, NULL);
  pthread_cond_init(&pg->qcv, NULL);
  pthread_cond_init(&pg->dcv, NULL);
  pg->rank = m->me;
  pg->size = m->n;
  pg->local_rank = P->local_rank; /* the host's processes, as the parent's */
  pg->local_size = P->local_size;
  pg->timeout_ms = P->timeout_ms;
  pg->torch_rdzv = P->torch_rdzv;
  pg->no_shm = P->no_shm;
  pg->link = P->link;
  pg->bind = P->bind;
  pg->spin_us = P->spin_us;
  memcpy(pg->host_id, P->host_id, sizeof pg->host_id);
  pg->parent = P;
  snprintf(pg->name, sizeof pg->name, "%.47s", m->name);
  pg->members = dg__calloc((size_t)m->n, sizeof(int));
  pg->pids = dg__calloc((size_t)m->n, sizeof(int));
  /* internal groups record nothing: the root's work is the one recorded,
   * and their ranks' positions are the root's */
  pg->internal = m->internal;
  if (!m->internal) pg->flight = dg__flight_sub(P->flight, m->n);
  if (!pg->members || !pg->pids || (!pg->flight && !m->internal)) {
    sub_destroy(pg);
    return NULL;
  }
  for (int i = 0; i < m->n; i++) {
    pg->members[i] = m->ranks[i];
    pg->pids[i] = P->pids ? P->pids[m->ranks[i]] : 0;
  }
  return pg;
}

/* A dgrad-only group over the ancestor's transport: the transport's rank of
 * each member, and a group number from the root's store (taken by rank 0,
 * read by the others) that keeps its slots apart from every other group's. */
static int share_transport(mk_ctx *m) {
  dg_pg *pg = m->pg, *P = m->parent;
  pg->x = P->x;
  pg->xrank = dg__calloc((size_t)m->n, sizeof(int));
  if (!pg->xrank) return DG_ENOMEM;
  for (int i = 0; i < m->n; i++) pg->xrank[i] = dg__pg_xpeer(P, m->ranks[i]);
  pg->all_dgrad = 1;
  int64_t g = 0;
  int rc;
  if (pg->rank == 0) {
    char v[32];
    rc = dg_store_add(base_store(m->root), "dgrad_group_gid", 1, &g);
    int len = snprintf(v, sizeof v, "%lld", (long long)g);
    if (rc == DG_OK) rc = dg_store_set(pg->s_grp, "dgrad_gid", v, (size_t)len);
  } else {
    void *v = NULL;
    size_t len = 0;
    rc = dg_store_get(pg->s_grp, "dgrad_gid", &v, &len, pg->timeout_ms);
    char s[32];
    if (rc == DG_OK) snprintf(s, sizeof s, "%.*s", (int)DG_MIN(len, sizeof s - 1), (char *)v);
    if (rc == DG_OK) g = strtoll(s, NULL, 10);
    dg_store_value_free(v);
  }
  if (rc != DG_OK)
    return dg__fail_msg(m->err, m->cap, rc, "dg_pg_new_group (sub-group %s): group number%s: %s",
                        m->name, rc == DG_ETIMEDOUT ? " (rank 0 of the sub-group never came)" : "",
                        dg_store_errmsg(pg->s_grp));
  pg->gid = 1 + (uint32_t)((uint64_t)(g - 1) % MAX_GID);
  return DG_OK;
}

/* Transport rendezvous callback of a group with torch members: a dgrad
 * member published "dgrad_info/<r>" first (version and group size). */
static int check_peer(void *arg, int peer) {
  mk_ctx *m = arg;
  char key[48], mine[64], theirs[64];
  snprintf(key, sizeof key, "dgrad_info/%d", peer);
  snprintf(mine, sizeof mine, INFO_FMT, dg_version(), m->n);
  const char *k = key;
  int present = 0;
  if (!m->dgrad[m->ranks[peer]] || dg_store_check(m->pg->s_grp, &k, 1, &present) != DG_OK ||
      !present)
    return 0;
  void *v = NULL;
  size_t n = 0;
  if (dg_store_get(m->pg->s_grp, key, &v, &n, 0) != DG_OK) return 0;
  snprintf(theirs, sizeof theirs, "%.*s", (int)DG_MIN(n, sizeof theirs - 1), (char *)v);
  dg_store_value_free(v);
  if (strcmp(theirs, mine) != 0)
    return dg__fail_msg(m->err, m->cap, DG_EMISMATCH, "sub-group %s: rank %d runs \"%s\" but "
                        "rank %d runs \"%s\"", m->name, m->pg->rank, mine, peer, theirs);
  return 1;
}

/* A group with a torch member: Gloo's connectFullMesh among the members
 * under "<name>/0", as torch's ProcessGroupGloo for that group. */
static int own_transport(mk_ctx *m) {
  dg_pg *pg = m->pg;
  dg_xport_opts xo = {.rank = pg->rank, .size = pg->size, .store = pg->s_dev,
                      .timeout_ms = pg->timeout_ms, .bind_addr = &pg->bind,
                      .check = check_peer, .check_arg = m, .spin_us = pg->spin_us};
  char e[384];
  int rc;
  if ((rc = dg__tcp_xport_new(&pg->x, &xo, e, sizeof e)) != DG_OK)
    return dg__fail_msg(m->err, m->cap, rc, "dg_pg_new_group (sub-group %s, ranks of the parent "
                        "%d..%d): %s", m->name, m->ranks[0], m->ranks[m->n - 1], e);
  pg->all_dgrad = pg->x->all_dgrad;
  return DG_OK;
}

/* Cross-memory attach and the shared segment among the members on one
 * host, agreed over the group (dgrad-only groups). */
static int local_paths(mk_ctx *m) {
  dg_pg *pg = m->pg;
  char **hosts = dg__calloc((size_t)m->n, sizeof *hosts);
  uint64_t *probe = dg__calloc((size_t)m->n, sizeof *probe);
  int rc = hosts && probe ? DG_OK : DG_ENOMEM;
  for (int i = 0; i < m->n && rc == DG_OK; i++) {
    char key[48], s[512], host[300];
    void *v = NULL;
    size_t len = 0;
    unsigned long long pr = 0;
    int pid = 0;
    snprintf(key, sizeof key, "dgrad_host/%d", dg__pg_xpeer(pg, i));
    if (i == pg->rank || dg_store_get(m->root->k_grp, key, &v, &len, pg->timeout_ms) != DG_OK)
      continue;
    snprintf(s, sizeof s, "%.*s", (int)DG_MIN(len, sizeof s - 1), (char *)v);
    dg_store_value_free(v);
    if (sscanf(s, "%299s %d %llx", host, &pid, &pr) == 3) {
      hosts[i] = dg__strdup(host);
      probe[i] = pr;
      if (pid > 0) pg->pids[i] = pid;
    }
  }
  if (rc == DG_OK && (rc = dg__cma_setup(pg, probe, (const char *const *)hosts)) != DG_OK)
    dg__fail_msg(m->err, m->cap, rc, "dg_pg_new_group (sub-group %s): %s", m->name, pg->err);
  for (int i = 0; hosts && i < m->n; i++) dg__free(hosts[i]);
  dg__free(hosts);
  dg__free(probe);
  return rc;
}

/* A member's part before the barrier: the group, its transport, its
 * algorithms, its worker. */
static int make_member(mk_ctx *m) {
  if (!(m->pg = sub_alloc(m))) return DG_ENOMEM;
  m->pg->s_grp = m->grp;
  m->grp = NULL;
  int rc = dg_store_new_prefix(&m->pg->s_dev, m->pg->s_grp, "0");
  m->pg->k_grp = m->pg->s_grp;
  m->pg->k_dev = m->pg->s_dev;
  int all = 1;
  for (int i = 0; i < m->n; i++) all &= m->dgrad[m->ranks[i]];
  /* "dgrad_info/<r>" (version, size) under the group's prefix, as dg_pg_new
   * publishes it: torch members' transport checks it, and a failure's
   * comparison of positions (flight.c) first waits for it to see the store
   * answer (without it every failure in a sub-group waited out that bound
   * and said the store did not answer) */
  char key[48], info[64];
  snprintf(key, sizeof key, "dgrad_info/%d", m->pg->rank);
  snprintf(info, sizeof info, INFO_FMT, dg_version(), m->pg->size);
  if (rc == DG_OK && (rc = dg_store_set(m->pg->s_grp, key, info, strlen(info))) != DG_OK)
    dg__fail_msg(m->err, m->cap, rc, "sub-group %s: %s", m->name,
                 dg_store_errmsg(m->pg->s_grp));
  if (rc == DG_OK) rc = all ? share_transport(m) : own_transport(m);
  if (rc == DG_OK && m->pg->all_dgrad) rc = local_paths(m);
  if (rc == DG_OK && !m->internal) rc = dg__pg_start_worker(m->pg);
  return rc;
}

/* Names the group and its barrier key: the k-th group made from a group of
 * dg_pg_new is "k" with barrier key ":k+1" (torch's numbering); one made
 * from a sub-group "<parent>.<k>" (torch has none such). */
static int name_group(mk_ctx *m) {
  dg_pg *P = m->parent;
  pthread_mutex_lock(&P->mu);
  int k = ++P->ngroups;
  pthread_mutex_unlock(&P->mu);
  if (!P->parent) {
    snprintf(m->name, sizeof m->name, "%d", k);
    snprintf(m->bkey, sizeof m->bkey, "store_based_barrier_key:%d", k + 1);
  } else {
    snprintf(m->name, sizeof m->name, "%.32s.%d", P->name, k);
    snprintf(m->bkey, sizeof m->bkey, "store_based_barrier_key:%s", m->name);
  }
  return dg_store_new_prefix(&m->grp, base_store(m->root), m->name);
}

static int new_group(mk_ctx *m, const int *ranks, int n) {
  dg_pg *P = m->parent;
  int rc = canon_ranks(P, ranks, n, m->ranks, &m->n, m->err, m->cap);
  if (rc != DG_OK) return rc;
  if (P->parent && !P->all_dgrad)
    return dg__fail_msg(m->err, m->cap, DG_EUNSUPPORTED, "dg_pg_new_group: the parent is a "
                        "sub-group with torch ranks (torch makes groups from its default group "
                        "only): make it from the group of dg_pg_new");
  char e[512];
  if ((rc = dg__pg_error(P, e, sizeof e)) != DG_OK)
    return dg__fail_msg(m->err, m->cap, rc, "dg_pg_new_group: the parent has failed: %s", e);
  if ((rc = name_group(m)) != DG_OK)
    return dg__fail_msg(m->err, m->cap, rc, "dg_pg_new_group: out of memory");
  m->me = -1;
  for (int i = 0; i < m->n; i++)
    if (m->ranks[i] == P->rank) m->me = i;
  if ((rc = find_dgrad(m)) == DG_OK) rc = agree_ranks(m);
  for (int i = 0; i < m->n && rc == DG_OK && !m->root->torch_rdzv; i++)
    if (!m->dgrad[m->ranks[i]])
      rc = dg__fail_msg(m->err, m->cap, DG_EUNSUPPORTED, "dg_pg_new_group: rank %d of the parent "
                        "is a libgloo program (rendezvous DG_RDZV_GLOO), which makes no "
                        "sub-groups: only dgrad ranks can be members", m->ranks[i]);
  if (rc == DG_OK && m->me >= 0) rc = make_member(m);
  if (rc == DG_OK) rc = store_barrier(m);
  if (rc == DG_OK && m->me >= 0 && m->pg->torch_rdzv) rc = seq_handshake(m);
  return rc;
}

int dg_pg_new_group(dg_pg **out, dg_pg *parent, const int *ranks, int n, char *err,
                    size_t cap) {
  char tmp[768];
  if (!err || !cap) {
    err = tmp;
    cap = sizeof tmp;
  }
  err[0] = 0;
  if (out) *out = NULL;
  if (!out || !parent)
    return dg__fail_msg(err, cap, DG_EINVAL, "dg_pg_new_group: %s is NULL",
                        out ? "parent" : "out");
  int W = parent->size;
  mk_ctx m = {.parent = parent, .root = root_of(parent), .err = err, .cap = cap,
              .ranks = dg__calloc((size_t)W, sizeof(int)), .dgrad = dg__calloc((size_t)W, 1)};
  int rc = m.ranks && m.dgrad ? new_group(&m, ranks, n) : DG_ENOMEM;
  if (rc == DG_ENOMEM && !err[0]) snprintf(err, cap, "dg_pg_new_group: out of memory");
  if (rc == DG_OK && m.pg) {
    pthread_mutex_lock(&g_mu);
    parent->nsub++;
    pthread_mutex_unlock(&g_mu);
    *out = m.pg;
    DG_LOGI("dist: rank %d: sub-group %s, rank %d of %d (%s)", parent->rank, m.name,
            m.pg->rank, m.pg->size, m.pg->xrank ? "the parent's connections" : "own connections");
  } else if (rc != DG_OK) {
    if (m.pg) sub_destroy(m.pg);
    if (err == tmp) DG_LOGW("dist: rank %d: %s", parent->rank, err);
  }
  dg_store_free(m.grp);
  dg__free(m.ranks);
  dg__free(m.dgrad);
  return rc;
}

/* ---- internal groups (pg_hier.c) ---- */

int dg__pg_new_internal(dg_pg **out, dg_pg *root, const int *ranks, int n, const char *name,
                        char *err, size_t cap) {
  int W = root->size;
  *out = NULL;
  mk_ctx m = {.parent = root, .root = root, .err = err, .cap = cap, .internal = 1, .n = n,
              .me = -1, .ranks = dg__calloc((size_t)W, sizeof(int)),
              .dgrad = dg__calloc((size_t)W, 1)};
  int rc = m.ranks && m.dgrad && n >= 1 && n <= W ? DG_OK : DG_ENOMEM;
  if (rc == DG_OK) {
    memcpy(m.ranks, ranks, (size_t)n * sizeof *ranks);
    memset(m.dgrad, 1, (size_t)W); /* made in dgrad-only root groups only */
    for (int i = 0; i < n; i++)
      if (ranks[i] == root->rank) m.me = i;
    snprintf(m.name, sizeof m.name, "%.47s", name);
    rc = dg_store_new_prefix(&m.grp, base_store(root), m.name);
  }
  if (rc == DG_OK && m.me >= 0) rc = make_member(&m);
  if (rc == DG_OK) *out = m.pg;
  else if (m.pg) sub_destroy(m.pg);
  if (rc == DG_ENOMEM && !err[0]) snprintf(err, cap, "internal group %s: out of memory", name);
  dg_store_free(m.grp);
  dg__free(m.ranks);
  dg__free(m.dgrad);
  return rc;
}

void dg__pg_free_internal(dg_pg *g) {
  if (g) sub_destroy(g);
}
