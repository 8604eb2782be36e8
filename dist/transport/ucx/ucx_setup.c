/* UCX transport setup and teardown: the ucp context (tag matching, wakeup),
 * a worker, its address published in the store under "ucx/<rank>", an
 * endpoint to every peer with peer-failure handling, the progress thread;
 * and a polite leave (BYE, then endpoints closed within a deadline). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "dist/net/net_impl.h"
#include "dist/transport/ucx/ucx_impl.h"
#include "base/common_impl.h"

/* How long a leaving rank lets its BYE and endpoint closes take (ms). */
#define LEAVE_MS 1000

/* UCX settings dgrad needs unless the user set them: shared-memory
 * transports take part in peer-failure handling, and keepalive runs often
 * enough that a killed peer is noticed within a second. */
static void tune(ucp_config_t *cfg) {
  static const char *const kv[][2] = {{"MM_ERROR_HANDLING", "y"},
                                      {"KEEPALIVE_INTERVAL", "300ms"}};
  for (size_t i = 0; i < sizeof kv / sizeof *kv; i++) {
    char env[64];
    snprintf(env, sizeof env, "UCX_%s", kv[i][0]);
    if (getenv(env)) continue;
    ucs_status_t st = DG_UCX(ucp_config_modify)(cfg, kv[i][0], kv[i][1]);
    if (st != UCS_OK)
      DG_LOGD("ucx transport: cannot set %s=%s: %s", env, kv[i][1],
              DG_UCX(ucs_status_string)(st));
  }
}

/* The ucp context and worker, with `tls` as UCX_TLS (NULL: UCX's own or the
 * user's choice). *st gets UCX's status of the step that failed. */
static int open_ctx_worker(dg_ucx_xport *x, const char *tls, ucs_status_t *st, char *err,
                           size_t cap) {
  ucp_config_t *cfg = NULL;
  *st = DG_UCX(ucp_config_read)(NULL, NULL, &cfg);
  if (*st != UCS_OK) {
    snprintf(err, cap, "ucx: reading the configuration: %s", DG_UCX(ucs_status_string)(*st));
    return DG_ESYS;
  }
  tune(cfg);
  if (tls && (*st = DG_UCX(ucp_config_modify)(cfg, "TLS", tls)) != UCS_OK) {
    DG_UCX(ucp_config_release)(cfg);
    snprintf(err, cap, "ucx: setting TLS=%s: %s", tls, DG_UCX(ucs_status_string)(*st));
    return DG_ESYS;
  }
  ucp_params_t pp = {.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_REQUEST_SIZE |
                                   UCP_PARAM_FIELD_REQUEST_INIT | UCP_PARAM_FIELD_MT_WORKERS_SHARED |
                                   UCP_PARAM_FIELD_ESTIMATED_NUM_EPS,
                     .features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP,
                     .request_size = sizeof(dg_ucx_req),
                     .request_init = dg__ucx_request_init,
                     .mt_workers_shared = 0,
                     .estimated_num_eps = (size_t)x->base.size};
  *st = DG_UCX(ucp_init_version)(UCP_API_MAJOR, UCP_API_MINOR, &pp, cfg, &x->ctx);
  DG_UCX(ucp_config_release)(cfg);
  if (*st != UCS_OK) {
    x->ctx = NULL;
    snprintf(err, cap, "ucx: ucp_init: %s", DG_UCX(ucs_status_string)(*st));
    return DG_ESYS;
  }
  ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                            .thread_mode = UCS_THREAD_MODE_SERIALIZED};
  if ((*st = DG_UCX(ucp_worker_create)(x->ctx, &wp, &x->wk)) != UCS_OK) {
    x->wk = NULL;
    snprintf(err, cap, "ucx: ucp_worker_create: %s", DG_UCX(ucs_status_string)(*st));
    DG_UCX(ucp_cleanup)(x->ctx);
    x->ctx = NULL;
    return DG_ESYS;
  }
  return DG_OK;
}

/* Without resources for its shared-memory transports (a small /dev/shm,
 * e.g. a container's 64 MiB) UCX refuses the whole worker: then try once
 * more without them (UCX_TLS=^shm: tcp and self remain), as dgrad's own
 * segment falls back to the transport, unless the user chose UCX_TLS. */
static int open_worker(dg_ucx_xport *x, char *err, size_t cap) {
  ucs_status_t st;
  int rc = open_ctx_worker(x, NULL, &st, err, cap);
  /* which of the two depends on the step that ran out (ranks race for it) */
  int shm_short = st == UCS_ERR_NO_RESOURCE || st == UCS_ERR_NO_MEMORY;
  if (rc != DG_OK && shm_short && !getenv("UCX_TLS")) {
    DG_LOGW("rank %d: %s (is /dev/shm full or small?); retrying without UCX's shared-memory "
            "transports (UCX_TLS=^shm)", x->base.rank, err);
    rc = open_ctx_worker(x, "^shm", &st, err, cap);
    if (rc != DG_OK) {
      char first[256];
      snprintf(first, sizeof first, "%s", err);
      snprintf(err, cap, "%s (also without its shared-memory transports, UCX_TLS=^shm)", first);
    }
  }
  if (rc != DG_OK) return rc;
  if ((st = DG_UCX(ucp_worker_get_efd)(x->wk, &x->efd)) != UCS_OK) {
    snprintf(err, cap, "ucx: ucp_worker_get_efd: %s", DG_UCX(ucs_status_string)(st));
    return DG_ESYS;
  }
  return DG_OK;
}

static int publish(dg_ucx_xport *x, dg_store *store, char *err, size_t cap) {
  ucp_address_t *a = NULL;
  size_t n = 0;
  ucs_status_t st = DG_UCX(ucp_worker_get_address)(x->wk, &a, &n);
  if (st != UCS_OK) {
    snprintf(err, cap, "ucx: ucp_worker_get_address: %s", DG_UCX(ucs_status_string)(st));
    return DG_ESYS;
  }
  char key[32];
  snprintf(key, sizeof key, "ucx/%d", x->base.rank);
  int rc = dg_store_set(store, key, a, n);
  DG_UCX(ucp_worker_release_address)(x->wk, a);
  if (rc != DG_OK) snprintf(err, cap, "ucx rendezvous: publishing the worker address: %s",
                            dg_store_errmsg(store));
  return rc;
}

/* Waits for peer i's "ucx/<i>". A peer that publishes Gloo's "rank_<i>"
 * instead (torch, libgloo, or dgrad over tcp) never will: fail at once,
 * saying why, rather than at the timeout. 1: it is there; else a code. */
static int wait_ucx_addr(const dg_xport_opts *o, int i, char *err, size_t cap) {
  char key[32], gk[32];
  snprintf(key, sizeof key, "ucx/%d", i);
  snprintf(gk, sizeof gk, "rank_%d", i);
  const char *k = key, *g = gk;
  int64_t dl = dg__deadline(o->timeout_ms, 300000);
  for (int ms = 1; dg__now_ms() < dl; ms = ms < 50 ? ms * 2 : 50) {
    int here = 0, gloo = 0;
    int rc = dg_store_check(o->store, &k, 1, &here);
    if (rc == DG_OK && !here) rc = dg_store_check(o->store, &g, 1, &gloo);
    if (rc != DG_OK || here) return rc == DG_OK ? 1 : rc;
    if (gloo) {
      int dg = o->check ? o->check(o->check_arg, i) : 0;
      if (dg < 0) return dg;
      snprintf(err, cap, dg ? "ucx rendezvous: rank %d runs dgrad over the tcp backend "
                              "(DG_BACKEND must be the same on every rank)"
                            : "ucx rendezvous: rank %d is a torch or libgloo rank: the UCX "
                              "backend needs every rank to run dgrad (use the tcp backend "
                              "in a mixed group)", i);
      return dg ? DG_EMISMATCH : DG_EUNSUPPORTED;
    }
    usleep((useconds_t)ms * 1000);
  }
  snprintf(err, cap, "ucx rendezvous: rank %d published no address (key \"%s\") within %d ms",
           i, key, o->timeout_ms > 0 ? o->timeout_ms : 300000);
  /* A peer that never published: say so if it runs a mismatching dgrad. */
  int c = o->check ? o->check(o->check_arg, i) : 1;
  return c < 0 ? c : DG_ETIMEDOUT;
}

/* Reads peer i's worker address, checks it is a matching dgrad rank, and
 * creates the endpoint to it. */
static int connect_peer(dg_ucx_xport *x, const dg_xport_opts *o, int i, char *err, size_t cap) {
  char key[32];
  void *v = NULL;
  size_t n = 0;
  snprintf(key, sizeof key, "ucx/%d", i);
  int rc = wait_ucx_addr(o, i, err, cap);
  if (rc != 1) return rc;
  rc = dg_store_get(o->store, key, &v, &n, o->timeout_ms);
  if (rc != DG_OK) {
    snprintf(err, cap, "ucx rendezvous: waiting for the address of rank %d: %s", i,
             dg_store_errmsg(o->store));
    /* A peer that never published: say so if it runs a mismatching dgrad. */
    int c = o->check ? o->check(o->check_arg, i) : 1;
    return c < 0 ? c : rc;
  }
  int dg = o->check ? o->check(o->check_arg, i) : 1;
  if (dg <= 0) {
    dg_store_value_free(v);
    if (dg == 0)
      snprintf(err, cap, "ucx rendezvous: rank %d does not run dgrad (the UCX backend needs "
               "every rank to)", i);
    return dg < 0 ? dg : DG_EMISMATCH;
  }
  ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
                        .address = v,
                        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                        .err_handler = {.cb = dg__ucx_ep_error, .arg = x}};
  pthread_mutex_lock(&x->mu);
  ucs_status_t st = DG_UCX(ucp_ep_create)(x->wk, &ep, &x->peers[i].ep);
  pthread_mutex_unlock(&x->mu);
  dg_store_value_free(v);
  if (st != UCS_OK) {
    x->peers[i].ep = NULL;
    snprintf(err, cap, "ucx rendezvous: endpoint to rank %d: %s", i,
             DG_UCX(ucs_status_string)(st));
    return DG_EPEER;
  }
  return DG_OK;
}

static int start_loop(dg_ucx_xport *x) {
  x->ep = epoll_create1(EPOLL_CLOEXEC);
  x->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (x->ep < 0 || x->wakefd < 0) return DG_ESYS;
  struct epoll_event ev = {.events = EPOLLIN, .data.fd = x->wakefd};
  if (epoll_ctl(x->ep, EPOLL_CTL_ADD, x->wakefd, &ev) < 0) return DG_ESYS;
  ev = (struct epoll_event){.events = EPOLLIN, .data.fd = x->efd};
  if (epoll_ctl(x->ep, EPOLL_CTL_ADD, x->efd, &ev) < 0) return DG_ESYS;
  if (pthread_create(&x->thr, NULL, dg__ucx_progress_main, x) != 0) return DG_ESYS;
  x->thr_started = 1;
  return DG_OK;
}

/* Progresses (lock held) while busy(x) and before the deadline. */
static void progress_until(dg_ucx_xport *x, int (*busy)(dg_ucx_xport *), int64_t dl) {
  while (busy(x) && dg__now_ms() < dl) {
    dg__ucx_progress(x);
    if (busy(x)) {
      pthread_mutex_unlock(&x->mu);
      usleep(200);
      pthread_mutex_lock(&x->mu);
    }
  }
}

static int closing_busy(dg_ucx_xport *x) {
  for (int i = 0; i < x->base.size; i++)
    if (x->peers[i].closing) return 1;
  return 0;
}

static int peers_here(dg_ucx_xport *x) {
  for (int i = 0; i < x->base.size; i++)
    if (x->peers[i].ep && x->peers[i].state == DG_UCX_PEER_OK) return 1;
  return 0;
}

static void close_cb(void *req, ucs_status_t st, void *ud) {
  dg_ucx_peer *p = ud;
  (void)st;
  p->closing = 0;
  DG_UCX(ucp_request_free)(req);
}

/* BYE to every peer still there (unless failed), then closes endpoints. */
static void leave(dg_ucx_xport *x) {
  pthread_mutex_lock(&x->mu);
  int64_t dl = dg__now_ms() + LEAVE_MS;
  x->ctl_bye[0] = DG_UCX_CTL_BYE;
  void **bye = dg__calloc((size_t)x->base.size, sizeof *bye);
  for (int i = 0; bye && !x->err && i < x->base.size; i++) {
    if (!x->peers[i].ep || x->peers[i].state != DG_UCX_PEER_OK) continue;
    ucp_request_param_t p = {.op_attr_mask = 0};
    uint64_t tag = ((uint64_t)(unsigned)x->base.rank << DG_UCX_SRC_SHIFT) |
                   (DG_UCX_KIND_CTL << DG_UCX_KIND_SHIFT);
    bye[i] = DG_UCX(ucp_tag_send_nbx)(x->peers[i].ep, x->ctl_bye, sizeof x->ctl_bye, tag, &p);
  }
  for (int i = 0; bye && i < x->base.size; i++) {
    while (bye[i] && !UCS_PTR_IS_ERR(bye[i]) && dg__now_ms() < dl &&
           DG_UCX(ucp_request_check_status)(bye[i]) == UCS_INPROGRESS)
      dg__ucx_progress(x);
    if (bye[i] && !UCS_PTR_IS_ERR(bye[i])) {
      if (DG_UCX(ucp_request_check_status)(bye[i]) == UCS_INPROGRESS)
        DG_UCX(ucp_request_cancel)(x->wk, bye[i]);
      DG_UCX(ucp_request_free)(bye[i]);
    }
  }
  dg__free(bye);
  /* Peers leaving at about the same time: take their BYEs before the
   * control receive goes (no unmatched messages left in the worker). */
  if (!x->err) progress_until(x, peers_here, dl);
  for (int i = 0; i < x->base.size; i++) {
    dg_ucx_peer *p = &x->peers[i];
    if (!p->ep) continue;
    p->closing = 1;
    ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS |
                                              UCP_OP_ATTR_FIELD_CALLBACK |
                                              UCP_OP_ATTR_FIELD_USER_DATA,
                              .flags = UCP_EP_CLOSE_FLAG_FORCE, .cb.send = close_cb,
                              .user_data = p};
    ucs_status_ptr_t s = DG_UCX(ucp_ep_close_nbx)(p->ep, &cp);
    if (s == NULL || UCS_PTR_IS_ERR(s)) p->closing = 0;
    p->ep = NULL;
  }
  progress_until(x, closing_busy, dl + LEAVE_MS);
  pthread_mutex_unlock(&x->mu);
}

void dg__ucx_destroy(dg_xport *xp) {
  dg_ucx_xport *x = (dg_ucx_xport *)xp;
  if (!x) return;
  if (x->thr_started) {
    pthread_mutex_lock(&x->mu);
    x->stop = 1;
    pthread_mutex_unlock(&x->mu);
    uint64_t one = 1;
    ssize_t w = write(x->wakefd, &one, sizeof one);
    (void)w;
    pthread_join(x->thr, NULL);
  }
  if (x->wk && x->peers) leave(x);
  if (x->wk) {
    pthread_mutex_lock(&x->mu);
    if (!x->err) x->err = DG_ECLOSED;
    for (dg_ucx_req *r = x->pend; r; r = r->next) /* nobody may wait on them now */
      __atomic_store_n(&r->op->status, DG_ECLOSED, __ATOMIC_RELEASE);
    for (dg_xop *o = x->orphans; o; o = o->next)
      __atomic_store_n(&o->status, DG_ECLOSED, __ATOMIC_RELEASE);
    if (x->ctl_req) {
      void *r = x->ctl_req;
      x->ctl_req = NULL;
      DG_UCX(ucp_request_cancel)(x->wk, r);
    }
    dg__ucx_progress(x);
    pthread_mutex_unlock(&x->mu);
    DG_UCX(ucp_worker_destroy)(x->wk);
  }
  if (x->ctx) DG_UCX(ucp_cleanup)(x->ctx);
  if (x->ep >= 0) close(x->ep);
  if (x->wakefd >= 0) close(x->wakefd);
  dg__free(x->peers);
  pthread_cond_destroy(&x->cv);
  pthread_mutex_destroy(&x->mu);
  dg__free(x);
}

int dg__ucx_xport_new(dg_xport **out, const dg_xport_opts *o, char *err, size_t cap) {
  if (!out || !o || !o->store || o->size < 1 || o->size > DG_UCX_MAX_RANKS || o->rank < 0 ||
      o->rank >= o->size)
    return DG_EINVAL;
  *out = NULL;
  int rc = dg__ucx_load(NULL, err, cap); /* the first UCX group loads UCX */
  if (rc != DG_OK) return rc;
  dg_ucx_xport *x = dg__calloc(1, sizeof *x);
  if (!x) return DG_ENOMEM;
  x->base.vt = &dg__ucx_vt;
  x->base.rank = o->rank;
  x->base.size = o->size;
  x->base.all_dgrad = 1; /* checked per peer below */
  x->base.eager_max = 0;
  x->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 300000;
  /* default none: busy polling starves peers sharing the cores */
  x->spin_us = o->spin_us > 0 ? o->spin_us : 0;
  x->ep = x->wakefd = x->efd = -1;
  x->suspect = -1;
  pthread_mutex_init(&x->mu, NULL);
  pthread_cond_init(&x->cv, NULL);
  x->peers = dg__calloc((size_t)o->size, sizeof *x->peers);
  rc = x->peers ? open_worker(x, err, cap) : DG_ENOMEM;
  if (rc == DG_OK) rc = publish(x, o->store, err, cap);
  for (int i = 0; rc == DG_OK && i < o->size; i++)
    if (i != o->rank) rc = connect_peer(x, o, i, err, cap);
  if (rc == DG_OK && dg__ucx_ctl_post(x) != DG_OK) {
    snprintf(err, cap, "ucx: posting the control receive failed");
    rc = DG_ESYS;
  }
  if (rc == DG_OK && (rc = start_loop(x)) != DG_OK) snprintf(err, cap, "ucx: epoll setup failed");
  if (rc != DG_OK) {
    x->err = rc; /* no goodbyes on a failed init */
    dg__ucx_destroy(&x->base);
    return rc;
  }
  *out = &x->base;
  return DG_OK;
}
