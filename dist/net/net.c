/* Socket and clock helpers shared by the stores and the TCP transport. */
#include "dist/net/net_impl.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int64_t dg__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t dg__now_ms(void) { return dg__now_ns() / 1000000; }

void dg__cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t ms) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  int64_t ns = ts.tv_nsec + ms * 1000000;
  ts.tv_sec += ns / 1000000000;
  ts.tv_nsec = ns % 1000000000;
  pthread_cond_timedwait(cv, mu, &ts);
}

int64_t dg__deadline(int timeout_ms, int dflt_ms) {
  return dg__now_ms() + (timeout_ms > 0 ? timeout_ms : dflt_ms);
}

int dg__set_nonblock(int fd, int on) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0) return -errno;
  fl = on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK);
  return fcntl(fd, F_SETFL, fl) < 0 ? -errno : 0;
}

void dg__set_nodelay(int fd) {
  int one = 1;
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int dg__resolve_msg(const char *host, int port, struct sockaddr_storage *ss, socklen_t *len,
                    char *why, size_t cap) {
  struct addrinfo hints, *res = NULL;
  char ps[16];
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  snprintf(ps, sizeof ps, "%d", port);
  int g = getaddrinfo(host && *host ? host : "127.0.0.1", ps, &hints, &res);
  if (g != 0 || !res) {
    if (why && cap)
      snprintf(why, cap, "%s", g == EAI_SYSTEM ? strerror(errno) : g ? gai_strerror(g)
                                                                     : "no address");
    if (res) freeaddrinfo(res);
    return -EHOSTUNREACH;
  }
  memset(ss, 0, sizeof *ss);
  memcpy(ss, res->ai_addr, res->ai_addrlen);
  *len = res->ai_addrlen;
  freeaddrinfo(res);
  return 0;
}

int dg__resolve(const char *host, int port, struct sockaddr_storage *ss, socklen_t *len) {
  return dg__resolve_msg(host, port, ss, len, NULL, 0);
}

int dg__is_numeric_host(const char *host) {
  unsigned char b[sizeof(struct in6_addr)];
  return host && (inet_pton(AF_INET, host, b) == 1 || inet_pton(AF_INET6, host, b) == 1);
}

int dg__listen_tcp(const struct sockaddr_storage *ss, socklen_t len, int backlog) {
  int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  int one = 1;
  (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, (const struct sockaddr *)ss, len) < 0 || listen(fd, backlog) < 0) {
    int e = errno;
    close(fd);
    return -e;
  }
  return fd;
}

static int wait_fd(int fd, short ev, int64_t deadline_ms) {
  for (;;) {
    int64_t left = deadline_ms - dg__now_ms();
    if (left <= 0) return -ETIMEDOUT;
    struct pollfd p = {.fd = fd, .events = ev};
    int r = poll(&p, 1, left > 1000 ? 1000 : (int)left);
    if (r > 0) return 0;
    if (r < 0 && errno != EINTR) return -errno;
  }
}

static int connect_once(const struct sockaddr_storage *ss, socklen_t len, int64_t deadline_ms) {
  int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -errno;
  int rc = 0;
  if (connect(fd, (const struct sockaddr *)ss, len) < 0) {
    if (errno != EINPROGRESS) {
      rc = -errno;
    } else if ((rc = wait_fd(fd, POLLOUT, deadline_ms)) == 0) {
      int err = 0;
      socklen_t el = sizeof err;
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
      rc = -err;
    }
  }
  if (rc == 0) rc = dg__set_nonblock(fd, 0);
  if (rc < 0) {
    close(fd);
    return rc;
  }
  dg__set_nodelay(fd);
  return fd;
}

int dg__connect_tcp(const struct sockaddr_storage *ss, socklen_t len,
                    int64_t deadline_ms, int retry) {
  int delay = 10;
  for (;;) {
    int fd = connect_once(ss, len, deadline_ms);
    if (fd >= 0 || !retry || fd == -ETIMEDOUT) return fd;
    if (fd != -ECONNREFUSED && fd != -ECONNRESET && fd != -EHOSTUNREACH &&
        fd != -ENETUNREACH && fd != -ECONNABORTED)
      return fd;
    if (dg__now_ms() + delay >= deadline_ms) return -ETIMEDOUT;
    usleep((useconds_t)delay * 1000);
    if (delay < 200) delay *= 2;
  }
}

int dg__send_all(int fd, const void *buf, size_t n, int64_t deadline_ms) {
  const char *p = buf;
  while (n > 0) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      p += w;
      n -= (size_t)w;
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      int rc = wait_fd(fd, POLLOUT, deadline_ms);
      if (rc < 0) return rc;
      continue;
    }
    return w < 0 ? -errno : -EPIPE;
  }
  return 0;
}

int dg__recv_all(int fd, void *buf, size_t n, int64_t deadline_ms) {
  char *p = buf;
  while (n > 0) {
    ssize_t r = recv(fd, p, n, MSG_DONTWAIT);
    if (r > 0) {
      p += r;
      n -= (size_t)r;
      continue;
    }
    if (r == 0) return -EPIPE;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      int rc = wait_fd(fd, POLLIN, deadline_ms);
      if (rc < 0) return rc;
      continue;
    }
    return -errno;
  }
  return 0;
}

int dg__sockaddr_port(const struct sockaddr_storage *ss) {
  if (ss->ss_family == AF_INET) return ntohs(((const struct sockaddr_in *)ss)->sin_port);
  if (ss->ss_family == AF_INET6) return ntohs(((const struct sockaddr_in6 *)ss)->sin6_port);
  return 0;
}

const char *dg__addr_str(const struct sockaddr_storage *ss, char *buf, size_t cap) {
  char ip[INET6_ADDRSTRLEN] = "?";
  if (ss->ss_family == AF_INET) {
    inet_ntop(AF_INET, &((const struct sockaddr_in *)ss)->sin_addr, ip, sizeof ip);
    snprintf(buf, cap, "%s:%d", ip, dg__sockaddr_port(ss));
  } else if (ss->ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)ss)->sin6_addr, ip, sizeof ip);
    snprintf(buf, cap, "[%s]:%d", ip, dg__sockaddr_port(ss));
  } else {
    snprintf(buf, cap, "(family %d)", ss->ss_family);
  }
  return buf;
}
