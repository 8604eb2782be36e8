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

/* The shared-secret handshake of dgrad-only groups (a token on the server),
 * framed as torch's CHECK of one key so that a torch server (or a dgrad one
 * without a token) answers it harmlessly, NOT_READY, and the client knows:
 *   client: CHECK 1 key HELLO || client nonce (16)
 *   server: READY (0), server nonce (16), HMAC(token, SERVER, cn, sn) (32)
 *   client: CHECK 1 key PROOF || HMAC(token, CLIENT, cn, sn) (32)
 *   server: READY (0); or, for a wrong proof, closes the connection.
 * Before it, a server with a token closes a connection on any other
 * request. Keys start with a NUL: no torch key collides in practice. */
#define DG_TS_AUTH_HELLO "\0dgrad-auth-hello"
#define DG_TS_AUTH_PROOF "\0dgrad-auth-proof"
#define DG_TS_AUTH_SERVER "dgrad tcp store server"
#define DG_TS_AUTH_CLIENT "dgrad tcp store client"

typedef struct dg_ts_server dg_ts_server;

/* Starts the server thread listening on `at` (its port; NULL: every address
 * on *port), port 0: any; *port gets the port. token NULL or "": none. On
 * failure `why` says what (the address, errno, what to do) and *eno the
 * bind's errno (0 when it bound); DG_ESTATE when the port is taken. */
int dg__ts_server_start(dg_ts_server **out, const struct sockaddr_storage *at, int *port,
                        const char *token, int *eno, char *why, size_t cap);
/* Waits until no client has been connected for quiet_ms, or the absolute
 * deadline (ms); returns the clients still connected. The server keeps
 * serving. */
int dg__ts_server_drain(dg_ts_server *srv, int64_t deadline, int quiet_ms);
void dg__ts_server_stop(dg_ts_server *srv);

/* The server's request parser and state (keys, parked WAITs, handshake)
 * without sockets or a thread: `data` is read as records of one byte
 * (client: value mod DG_TS_REPLAY_CLIENTS; bit 2: it hangs up after this
 * record), one byte length, then that many bytes of that client's stream.
 * Replies are discarded; server nonces are all zero, so a valid handshake
 * can be written down (fuzz/gen_corpus.py). Returns how many clients were
 * dropped for what they sent (DG_ENOMEM if it could not start). For the
 * fuzz harness fuzz/fuzz_store.c and tests. */
#define DG_TS_REPLAY_CLIENTS 4
int dg__ts_server_replay(const uint8_t *data, size_t n, const char *token);

#endif
