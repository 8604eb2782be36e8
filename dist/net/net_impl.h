/* Socket and clock helpers shared by the stores and the TCP transport.
 * Internal. */
#ifndef DG_NET_IMPL_H
#define DG_NET_IMPL_H

#include <stddef.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/socket.h>

/* Monotonic clock in milliseconds / nanoseconds. */
int64_t dg__now_ms(void);
int64_t dg__now_ns(void);
/* pthread_cond_timedwait for at most `ms` milliseconds (waits are sliced
 * so that callers re-check their deadline and failure state). */
void dg__cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t ms);
/* Absolute deadline for a relative timeout (timeout <= 0: `dflt`). */
int64_t dg__deadline(int timeout_ms, int dflt_ms);

int dg__set_nonblock(int fd, int on);
void dg__set_nodelay(int fd);

/* Resolves host:port (numeric or name) to the first IPv4/IPv6 address. */
int dg__resolve(const char *host, int port, struct sockaddr_storage *ss, socklen_t *len);
/* The same; on failure (-EHOSTUNREACH) `why` gets the resolver's reason
 * (gai_strerror), e.g. "Name or service not known". */
int dg__resolve_msg(const char *host, int port, struct sockaddr_storage *ss, socklen_t *len,
                    char *why, size_t cap);
/* 1 when host is an IPv4 or IPv6 address literal (not a name). */
int dg__is_numeric_host(const char *host);
/* Listening TCP socket on host:port (port 0: any); returns fd or -errno. */
int dg__listen_tcp(const struct sockaddr_storage *ss, socklen_t len, int backlog);
/* Connects with a deadline (absolute ms); returns a blocking fd or a negative
 * errno (-ETIMEDOUT at the deadline). Retries refused connections until the
 * deadline when `retry` is set (a server that is not up yet). */
int dg__connect_tcp(const struct sockaddr_storage *ss, socklen_t len,
                    int64_t deadline_ms, int retry);
/* Blocking full send/recv with a deadline, on a socket of any mode.
 * Return 0, -ETIMEDOUT, -EPIPE (peer closed) or another -errno. */
int dg__send_all(int fd, const void *buf, size_t n, int64_t deadline_ms);
int dg__recv_all(int fd, void *buf, size_t n, int64_t deadline_ms);
/* "1.2.3.4:5" / "[::1]:5" into buf. */
const char *dg__addr_str(const struct sockaddr_storage *ss, char *buf, size_t cap);
int dg__sockaddr_port(const struct sockaddr_storage *ss);

#endif
