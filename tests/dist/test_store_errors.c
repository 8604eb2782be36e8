/* TCPStore failures a new user meets, each with the detail in the returned
 * err (not only the code), and keys as torch writes them:
 *   - MASTER_PORT held by another program: "failed to bind 127.0.0.1:P
 *     (errno 98: Address already in use)" and what to do (was DG_ESTATE with
 *     "cannot listen on port P");
 *   - an unresolvable MASTER_ADDR: the host and the resolver's reason;
 *   - no server: "connect timed out after N ms" to host:port; a server
 *     whose clients never come: "waiting for clients: 1/2 joined";
 *   - keys holding NUL bytes (WAIT and CHECK cut them at the NUL, so the
 *     reply never came) and the empty key (was DG_EINVAL);
 *   - a server given an IP address of this host listens there only, not on
 *     every interface (item 8 of issue #17). */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dgrad/dist.h"
#include "dgrad/store.h"
#include "tests/fault/fork_util.h"
#include "tests/test.h"

/* A socket bound on 127.0.0.1 to a port of the kernel's choice (listening
 * or not): a port certainly taken, with no race; connecting to one that
 * does not listen is refused. */
static int hold_port(int *port, int listening) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t l = sizeof a;
  REQUIRE(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
  REQUIRE(!listening || listen(fd, 4) == 0);
  getsockname(fd, (struct sockaddr *)&a, &l);
  *port = ntohs(a.sin_port);
  return fd;
}

static void env_rank(int rank, int world, const char *addr, int port) {
  char b[32];
  snprintf(b, sizeof b, "%d", rank);
  setenv("RANK", b, 1);
  snprintf(b, sizeof b, "%d", world);
  setenv("WORLD_SIZE", b, 1);
  setenv("MASTER_ADDR", addr, 1);
  snprintf(b, sizeof b, "%d", port);
  setenv("MASTER_PORT", b, 1);
}

static void port_in_use(void) {
  int port, fd = hold_port(&port, 1);
  char err[1024] = "", want[64];
  dg_store *s = NULL;
  dg_tcp_store_opts o = {.host = "127.0.0.1", .port = port, .is_server = 1, .timeout_ms = 500};
  CHECK_EQ_INT(dg_store_new_tcp(&s, &o, err, sizeof err), DG_ESTATE);
  CHECK(s == NULL);
  snprintf(want, sizeof want, "failed to bind 127.0.0.1:%d", port);
  CHECK_STR_HAS(err, want);
  CHECK_STR_HAS(err, "errno 98: Address already in use");
  CHECK_STR_HAS(err, "another process holds this port");
  CHECK_STR_HAS(err, "MASTER_PORT");
  /* the same through the environment, as rank 0 of a job */
  env_rank(0, 2, "127.0.0.1", port);
  dg_pg *pg = NULL;
  err[0] = 0;
  CHECK_EQ_INT(dg_pg_new_from_env(&pg, 500, err, sizeof err), DG_ESTATE);
  CHECK(pg == NULL);
  CHECK_STR_HAS(err, want);
  CHECK_STR_HAS(err, "Address already in use");
  fprintf(stderr, "port in use: %s\n", err);
  close(fd);
}

static void bad_host(void) {
  const char *host = "no-such-host.invalid";
  for (int server = 0; server < 2; server++) {
    char err[1024] = "";
    dg_store *s = NULL;
    dg_tcp_store_opts o = {.host = host, .port = 29999, .is_server = server, .timeout_ms = 500};
    CHECK_EQ_INT(dg_store_new_tcp(&s, &o, err, sizeof err), DG_EINVAL);
    CHECK_STR_HAS(err, "cannot resolve host \"no-such-host.invalid\": ");
    /* the resolver's reason follows, not an empty or placeholder text */
    const char *why = strstr(err, "\": ");
    CHECK(why && strlen(why) > 6 && !strstr(err, "no error"));
    if (server) fprintf(stderr, "bad host: %s\n", err);
  }
}

static void detail_kept(void) {
  int port, fd = hold_port(&port, 0); /* held, nobody listens: refused */
  char err[1024] = "", want[64];
  dg_store *s = NULL;
  dg_tcp_store_opts o = {.host = "127.0.0.1", .port = port, .timeout_ms = 300};
  CHECK_EQ_INT(dg_store_new_tcp(&s, &o, err, sizeof err), DG_ETIMEDOUT);
  snprintf(want, sizeof want, "127.0.0.1:%d", port);
  CHECK_STR_HAS(err, want);
  CHECK_STR_HAS(err, "connect timed out after ");
  env_rank(1, 2, "127.0.0.1", port);
  dg_pg *pg = NULL;
  err[0] = 0;
  CHECK_EQ_INT(dg_pg_new_from_env(&pg, 300, err, sizeof err), DG_ETIMEDOUT);
  CHECK_STR_HAS(err, want);
  CHECK_STR_HAS(err, "connect timed out after ");
  fprintf(stderr, "no server: %s\n", err);
  /* a server whose second client never comes */
  dg_tcp_store_opts so = {.host = "127.0.0.1", .port = 0, .is_server = 1, .world_size = 2,
                          .wait_workers = 1, .timeout_ms = 300};
  err[0] = 0;
  CHECK_EQ_INT(dg_store_new_tcp(&s, &so, err, sizeof err), DG_ETIMEDOUT);
  CHECK_STR_HAS(err, "waiting for clients: 1/2 joined");
  close(fd);
}

/* ---- raw TCPStore requests, as a torch client sends them ---- */

static void put_u64(unsigned char **p, uint64_t v) {
  memcpy(*p, &v, 8);
  *p += 8;
}

static void put_b(unsigned char **p, const void *b, size_t n) {
  put_u64(p, n);
  memcpy(*p, b, n);
  *p += n;
}

static int raw_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  REQUIRE(fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
  struct timeval tv = {.tv_sec = 5};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

static int send_all(int fd, const void *b, size_t n) {
  return send(fd, b, n, MSG_NOSIGNAL) == (ssize_t)n ? 0 : -1;
}

/* One CHECK or WAIT of a single key; returns the reply byte, -1 on none. */
static int check_or_wait(int fd, int q, const void *key, size_t kl) {
  unsigned char b[256], *p = b;
  *p++ = (unsigned char)q;
  put_u64(&p, 1);
  put_b(&p, key, kl);
  unsigned char r;
  if (send_all(fd, b, (size_t)(p - b)) < 0 || recv(fd, &r, 1, MSG_WAITALL) != 1) return -1;
  return r;
}

static void nul_keys(void) {
  dg_store *s = NULL;
  char err[512] = "";
  dg_tcp_store_opts o = {.host = "127.0.0.1", .port = 0, .is_server = 1, .timeout_ms = 5000};
  REQUIRE(dg_store_new_tcp(&s, &o, err, sizeof err) == DG_OK);
  int port = dg_store_port(s), fd = raw_connect(port), fd2 = raw_connect(port);
  const char k1[] = "/a\0b", k2[] = "/a\0c"; /* 4 bytes each, NUL inside */
  unsigned char b[256], *p = b;
  *p++ = 0; /* SET */
  put_b(&p, k1, 4);
  put_b(&p, "v1", 2);
  REQUIRE(send_all(fd, b, (size_t)(p - b)) == 0);
  CHECK_EQ_INT(check_or_wait(fd, 4, k1, 4), 0); /* CHECK: READY */
  CHECK_EQ_INT(check_or_wait(fd, 4, k2, 4), 1); /* NOT_READY: "/a" is not "/a\0c" */
  CHECK_EQ_INT(check_or_wait(fd, 4, "/a", 2), 1);
  CHECK_EQ_INT(check_or_wait(fd, 5, k1, 4), 0); /* WAIT: STOP_WAITING at once */
  /* a WAIT on a missing NUL key is released by the SET of that very key */
  p = b;
  *p++ = 5;
  put_u64(&p, 1);
  put_b(&p, k2, 4);
  REQUIRE(send_all(fd2, b, (size_t)(p - b)) == 0);
  p = b;
  *p++ = 0;
  put_b(&p, k2, 4);
  put_b(&p, "v2", 2);
  REQUIRE(send_all(fd, b, (size_t)(p - b)) == 0);
  unsigned char r = 0xff;
  CHECK(recv(fd2, &r, 1, MSG_WAITALL) == 1 && r == 0);
  /* GET returns the value of the whole key */
  p = b;
  *p++ = 2;
  put_b(&p, k1, 4);
  REQUIRE(send_all(fd, b, (size_t)(p - b)) == 0);
  uint64_t n = 0;
  char v[8] = "";
  CHECK(recv(fd, &n, 8, MSG_WAITALL) == 8 && n == 2 && recv(fd, v, 2, MSG_WAITALL) == 2 &&
        !memcmp(v, "v1", 2));
  close(fd);
  close(fd2);
  /* the empty key, as torch accepts it: "/" on the wire */
  CHECK_OK(dg_store_set(s, "", "e", 1));
  void *val = NULL;
  size_t len = 0;
  CHECK_OK(dg_store_get(s, "", &val, &len, 1000));
  CHECK(len == 1 && val && !memcmp(val, "e", 1));
  dg_store_value_free(val);
  const char *ek = "";
  int present = 0;
  CHECK_OK(dg_store_check(s, &ek, 1, &present));
  CHECK_EQ_INT(present, 1);
  CHECK_EQ_INT(dg_store_set(s, NULL, "e", 1), DG_EINVAL);
  dg_store_free(s);
}

/* A non-loopback IPv4 address of this host, if any. */
static int other_addr(struct sockaddr_in *out) {
  struct ifaddrs *ifs = NULL;
  int found = 0;
  if (getifaddrs(&ifs) < 0) return 0;
  for (struct ifaddrs *i = ifs; i && !found; i = i->ifa_next)
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET) {
      struct sockaddr_in *a = (struct sockaddr_in *)i->ifa_addr;
      if ((ntohl(a->sin_addr.s_addr) >> 24) != 127) *out = *a, found = 1;
    }
  freeifaddrs(ifs);
  return found;
}

static void bound_to_addr(void) {
  struct sockaddr_in other;
  if (!other_addr(&other)) {
    fprintf(stderr, "bound_to_addr: no non-loopback IPv4 address here: part skipped\n");
    return;
  }
  dg_store *s = NULL;
  char err[512] = "";
  dg_tcp_store_opts o = {.host = "127.0.0.1", .port = 0, .is_server = 1, .timeout_ms = 2000};
  REQUIRE(dg_store_new_tcp(&s, &o, err, sizeof err) == DG_OK);
  other.sin_port = htons((uint16_t)dg_store_port(s));
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  int rc = connect(fd, (struct sockaddr *)&other, sizeof other);
  char a[32];
  inet_ntop(AF_INET, &other.sin_addr, a, sizeof a);
  if (rc == 0) T_FAIL_("a store given 127.0.0.1 accepted a connection on %s", a);
  else CHECK_EQ_INT(errno, ECONNREFUSED);
  close(fd);
  dg_store_free(s);
}

int main(void) {
  port_in_use();
  bad_host();
  detail_kept();
  nul_keys();
  bound_to_addr();
  return TEST_DONE();
}
