/* TCPStore (PyTorch 1.13 wire protocol) shared definitions. Internal. */
#ifndef DG_TCP_STORE_IMPL_H
#define DG_TCP_STORE_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

enum {
  DG_TS_SET = 0,
  DG_TS_COMPARE_SET = 1,
  DG_TS_GET = 2,
  DG_TS_ADD = 3,
  DG_TS_CHECK = 4,
  DG_TS_WAIT = 5,
  DG_TS_GETNUMKEYS = 6,
  DG_TS_WATCH_KEY = 7,
  DG_TS_DELETE_KEY = 8
};

/* Requests beyond these bounds are treated as garbage: the server drops the
 * connection instead of allocating. */
#define DG_TS_MAX_KEY (1u << 20)
#define DG_TS_MAX_VALUE ((uint64_t)1 << 32)
#define DG_TS_MAX_KEYS 65536

typedef struct dg_ts_server dg_ts_server;

/* Starts the server thread listening on `at` (its port; NULL: every address
 * on *port), port 0: any; *port gets the port. On failure `why` says what
 * (the address, errno, what to do) and *eno the bind's errno (0 when it
 * bound); DG_ESTATE when the port is taken. */
int dg__ts_server_start(dg_ts_server **out, const struct sockaddr_storage *at, int *port,
                        int *eno, char *why, size_t cap);
/* Waits until no client has been connected for quiet_ms, or the absolute
 * deadline (ms); returns the clients still connected. The server keeps
 * serving. */
int dg__ts_server_drain(dg_ts_server *srv, int64_t deadline, int quiet_ms);
void dg__ts_server_stop(dg_ts_server *srv);

#endif
