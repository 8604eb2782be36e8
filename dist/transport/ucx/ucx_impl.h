/* UCX transport internals. Internal.
 *
 * One ucp context and worker per process group; an endpoint per peer with
 * UCP_ERR_HANDLING_MODE_PEER; tagged send/recv. A ucp tag is (64 bits):
 *
 *   63..48  source rank
 *   47..44  kind: 0 point-to-point (user tag in 31..0), 1..14 a collective
 *           (the slot's ProcessGroupGloo prefix), 15 control
 *   43..12  collectives: the slot's tag counter (slot bits 55..24)
 *   11..0   collectives: the slot's low bits
 *
 * Receives match the full tag, and UCX matches FIFO among equal tags, so
 * ops match FIFO per (peer, slot) as the vtable requires. Control messages
 * (ABORT naming the rank to blame, BYE for a clean leave) go on kind 15
 * and are received by one standing receive from any source.
 *
 * Locking: one mutex guards the worker (created UCS_THREAD_MODE_SERIALIZED)
 * and all transport state; completion callbacks run inside
 * ucp_worker_progress, so with the mutex held. */
#ifndef DG_UCX_IMPL_H
#define DG_UCX_IMPL_H

#include <pthread.h>

#include "dist/transport/transport_impl.h"
#include "dist/transport/ucx/ucx_dl.h" /* UCX's headers; its functions as DG_UCX(name) */

#define DG_UCX_KIND_SHIFT 44
#define DG_UCX_KIND_CTL 15ULL
#define DG_UCX_SRC_SHIFT 48
#define DG_UCX_MAX_RANKS 65536

enum { DG_UCX_CTL_ABORT = 1, DG_UCX_CTL_BYE = 2 };
/* OK; BYE: said it leaves; CLOSED: left cleanly; FAILED: its endpoint
 * failed (the transport fails once the blame is settled). */
enum { DG_UCX_PEER_OK, DG_UCX_PEER_BYE, DG_UCX_PEER_CLOSED, DG_UCX_PEER_FAILED };
/* How long an endpoint failure waits for an ABORT naming the root cause
 * (UCX may report a failure on the endpoint of a live rank that is itself
 * failing because of another). */
#define DG_UCX_GRACE_MS 200

/* The user area of every ucp request (ucp_params.request_size). */
typedef struct dg_ucx_req {
  struct dg_ucx_xport *x;
  dg_xop *op; /* NULL: nobody waits for it (control, or already failed) */
  struct dg_ucx_req *prev, *next;
  int ctl;    /* the standing control receive */
} dg_ucx_req;

typedef struct {
  ucp_ep_h ep;
  int state;
  int closing; /* ep close in progress (destroy) */
} dg_ucx_peer;

typedef struct dg_ucx_xport {
  dg_xport base;
  pthread_mutex_t mu;
  pthread_cond_t cv; /* broadcast whenever an op completes */
  ucp_context_h ctx;
  ucp_worker_h wk;
  int efd;   /* the worker's event fd */
  int wakefd; /* eventfd: kicks the progress thread */
  int ep;    /* epoll over both */
  pthread_t thr;
  int thr_started, stop, sleeping;
  int armed; /* the worker's event fd is armed and nobody progressed since */
  dg_ucx_peer *peers; /* (size) */
  dg_ucx_req *pend;   /* requests of pending ops */
  dg_xop *orphans;    /* pending ops whose UCX request failed, until blame is settled */
  int suspect;        /* peer whose endpoint failed (-1: none) */
  ucs_status_t suspect_st;
  int64_t suspect_until; /* ms: then the transport fails blaming it */
  dg_ucx_req *ctl_req;
  int64_t ctl_in[3];  /* type, rank, code of the control message being received */
  int64_t ctl_out[3]; /* what this rank sends (ABORT) */
  int64_t ctl_bye[3];
  int err;
  char errmsg[512];
  int timeout_ms;
  int spin_us;
} dg_ucx_xport;

/* ucx.c */
extern const dg_xport_vt dg__ucx_vt;
uint64_t dg__ucx_tag(uint64_t slot, int src);
void dg__ucx_xfail(dg_ucx_xport *x, int code, int blame, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void dg__ucx_ep_error(void *arg, ucp_ep_h ep, ucs_status_t st);
int dg__ucx_ctl_post(dg_ucx_xport *x);
void dg__ucx_request_init(void *req);
void *dg__ucx_progress_main(void *arg);
/* Drives the worker until nothing is left to do (lock held). */
void dg__ucx_progress(dg_ucx_xport *x);
/* Fails the transport once a suspect's grace period is over (lock held). */
void dg__ucx_settle(dg_ucx_xport *x);

/* ucx_setup.c */
void dg__ucx_destroy(dg_xport *xp);

#endif
