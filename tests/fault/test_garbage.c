/* Malformed frames on a pair (garbage, data nobody asked for, data longer
 * than the posted receive) and garbage to the TCPStore port: the pair is
 * closed with an error naming the peer, the process survives, the store
 * server keeps serving. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "dgrad/dist.h"
#include "tests/fault/fake_peer.h"
#include "tests/test.h"

typedef struct {
  dg_store *st;
  int rc;
  char msg[512];
  int delay_ms;
} r0_arg;

/* Real rank 0: init, optionally wait, then one allreduce of one float. */
static void *rank0(void *p) {
  r0_arg *a = p;
  dg_pg *pg = NULL;
  char err[256];
  dg_pg_opts o = {.rank = 0, .world_size = 2, .store = a->st, .timeout_ms = 5000};
  dg_pg_opts_from_env(&o); /* DG_SHM of the meson case */
  a->rc = dg_pg_new(&pg, &o, err, sizeof err);
  if (a->rc != DG_OK) {
    snprintf(a->msg, sizeof a->msg, "init: %s", err);
    return NULL;
  }
  usleep((useconds_t)a->delay_ms * 1000);
  float v = 1;
  dg_work *w;
  a->rc = dg_pg_allreduce(pg, &v, 1, DG_F32, DG_RED_SUM, &w);
  if (a->rc == DG_OK) a->rc = dg_work_wait(w, 0);
  snprintf(a->msg, sizeof a->msg, "%s", dg_work_errmsg(w));
  dg_work_free(w);
  dg_pg_free(pg);
  return NULL;
}

static void scenario(int kind) {
  dg_store *st = NULL;
  CHECK_OK(dg_store_new_mem(&st, 10000));
  r0_arg a = {.st = st, .delay_ms = kind == 0 || kind == 1 ? 300 : 0};
  pthread_t t;
  pthread_create(&t, NULL, rank0, &a);
  int fd = fake_rank1(st);
  REQUIRE(fd >= 0);
  uint64_t h[6];
  if (kind == 0) { /* plain garbage */
    unsigned char junk[100];
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (unsigned char)(i * 37 + 11);
    CHECK(send(fd, junk, sizeof junk, 0) == (ssize_t)sizeof junk);
  } else if (kind == 1) { /* data on a slot nobody posted */
    uint64_t d[7] = {56, 1, 12345, 0, 8, 0, 0};
    CHECK(send(fd, d, sizeof d, 0) == (ssize_t)sizeof d);
  } else { /* more data than rank 0 asked for */
    CHECK(fake_read_until(fd, 3, h) == 0);
    uint64_t d[8] = {48 + h[4] + 8, 1, h[2], 0, h[4] + 8, 0, 0, 0};
    CHECK(send(fd, d, 48 + h[4] + 8, 0) == (ssize_t)(48 + h[4] + 8));
  }
  pthread_join(t, NULL);
  fprintf(stderr, "scenario %d: %s: %s\n", kind, dg_err_name(a.rc), a.msg);
  CHECK_EQ_INT(a.rc, DG_EFORMAT);
  CHECK_STR_HAS(a.msg, "rank 1");
  CHECK_STR_HAS(a.msg, "malformed");
  close(fd);
  dg_store_free(st);
}

static int raw_conn(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  return connect(fd, (struct sockaddr *)&a, sizeof a) < 0 ? -1 : fd;
}

/* 1 when the server closed the connection within 2 s. */
static int closed_by_server(int fd) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  char b[64];
  return poll(&p, 1, 2000) == 1 && recv(fd, b, sizeof b, 0) <= 0;
}

static void store_garbage(void) {
  dg_tcp_store_opts so = {.host = "127.0.0.1", .is_server = 1, .timeout_ms = 5000};
  dg_store *srv = NULL;
  CHECK_OK(dg_store_new_tcp(&srv, &so, NULL, 0));
  REQUIRE(srv);
  int port = dg_store_port(srv);
  unsigned char huge_key[9] = {0}; /* SET with a 2^40-byte key */
  huge_key[0] = 0;
  uint64_t kl = (uint64_t)1 << 40;
  memcpy(huge_key + 1, &kl, 8);
  unsigned char bad_q[1] = {99};
  unsigned char get_missing[1 + 8 + 4] = {2, 4, 0, 0, 0, 0, 0, 0, 0, 'n', 'o', 'p', 'e'};
  struct { const void *p; size_t n; int must_close; } cases[] = {
      {huge_key, sizeof huge_key, 1}, {bad_q, 1, 1}, {get_missing, sizeof get_missing, 1},
      {"\x05\x01\x00", 3, 0} /* a partial WAIT, then hang up */};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    int fd = raw_conn(port);
    REQUIRE(fd >= 0);
    CHECK(send(fd, cases[i].p, cases[i].n, 0) == (ssize_t)cases[i].n);
    if (cases[i].must_close) CHECK(closed_by_server(fd));
    close(fd);
  }
  int fd = raw_conn(port); /* 64 KiB of noise */
  unsigned char *noise = malloc(65536);
  for (int i = 0; i < 65536; i++) noise[i] = (unsigned char)(rand() & 0xff);
  CHECK(send(fd, noise, 65536, MSG_NOSIGNAL) >= 0);
  free(noise);
  close(fd);
  /* The server still serves. */
  CHECK_OK(dg_store_set(srv, "after", "ok", 2));
  void *v = NULL;
  size_t n = 0;
  CHECK_OK(dg_store_get(srv, "after", &v, &n, 2000));
  CHECK(n == 2 && v && !memcmp(v, "ok", 2));
  dg_store_value_free(v);
  dg_store_free(srv);
}

int main(void) {
  for (int k = 0; k < 3; k++) scenario(k);
  store_garbage();
  return TEST_DONE();
}
