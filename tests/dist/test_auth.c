/* Shared-secret authentication (dgrad-only groups, DG_AUTH_TOKEN): SHA-256
 * and HMAC against published vectors; the TCPStore with the right, a wrong
 * and no token, a token against a server without one, garbage and
 * unauthenticated clients (the server closes them and keeps serving); pairs
 * with a wrong token, a stranger on a pair's listener (rejected, the real
 * rank then accepted), a non-dgrad peer (DG_EUNSUPPORTED). Groups with the
 * right token through DG_AUTH_TOKEN: test_procs and ddp_equiv (meson.build). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dgrad.h"
#include "dist/net/auth_impl.h"
#include "dist/net/net_impl.h"
#include "dist/store/tcp_store_impl.h"
#include "tests/test.h"

static void hex(const uint8_t *p, size_t n, char *out) {
  for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", p[i]);
}

static void test_vectors(void) {
  uint8_t d[32];
  char h[65];
  dg__sha256("", 0, d);
  hex(d, 32, h);
  CHECK(!strcmp(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"));
  dg__sha256("abc", 3, d);
  hex(d, 32, h);
  CHECK(!strcmp(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"));
  const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"; /* 2 blocks */
  dg__sha256(two, strlen(two), d);
  hex(d, 32, h);
  CHECK(!strcmp(h, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"));
  dg_hmac m; /* RFC 4231 case 2, and case 6 (a key longer than a block) */
  dg__hmac_init(&m, "Jefe", 4);
  dg__hmac_update(&m, "what do ya want ", 16);
  dg__hmac_update(&m, "for nothing?", 12);
  dg__hmac_final(&m, d);
  hex(d, 32, h);
  CHECK(!strcmp(h, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"));
  uint8_t key[131];
  memset(key, 0xaa, sizeof key);
  const char *msg = "Test Using Larger Than Block-Size Key - Hash Key First";
  dg__hmac_init(&m, key, sizeof key);
  dg__hmac_update(&m, msg, strlen(msg));
  dg__hmac_final(&m, d);
  hex(d, 32, h);
  CHECK(!strcmp(h, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"));
  CHECK(dg__auth_equal("abcd", "abcd", 4) && !dg__auth_equal("abcd", "abce", 4));
}

/* Log lines of the library, for the server's "failed authentication". */
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static char log_buf[8192];
static void log_fn(void *u, dg_log_level l, const char *msg) {
  (void)u, (void)l;
  pthread_mutex_lock(&log_mu);
  size_t n = strlen(log_buf);
  snprintf(log_buf + n, sizeof log_buf - n, "%s\n", msg);
  pthread_mutex_unlock(&log_mu);
}
static void log_clear(void) {
  pthread_mutex_lock(&log_mu);
  log_buf[0] = 0;
  pthread_mutex_unlock(&log_mu);
}
static int log_has(const char *s) {
  pthread_mutex_lock(&log_mu);
  int r = strstr(log_buf, s) != NULL;
  pthread_mutex_unlock(&log_mu);
  return r;
}

static int client(dg_store **c, int port, const char *tok, char *err, size_t cap) {
  dg_tcp_store_opts o = {.host = "127.0.0.1", .port = port, .timeout_ms = 3000,
                         .auth_token = tok};
  return dg_store_new_tcp(c, &o, err, cap);
}

/* A raw connection to the server that sends `n` bytes and reads until the
 * server closes it: 1 when it was closed (within 3 s). */
static int raw_closed(int port, const void *p, size_t n) {
  struct sockaddr_storage ss;
  socklen_t l;
  if (dg__resolve("127.0.0.1", port, &ss, &l) < 0) return 0;
  int fd = dg__connect_tcp(&ss, l, dg__now_ms() + 3000, 0);
  if (fd < 0) return 0;
  int e = dg__send_all(fd, p, n, dg__now_ms() + 3000);
  char b[256];
  while (!e) e = dg__recv_all(fd, b, 1, dg__now_ms() + 3000);
  close(fd);
  return e == -EPIPE || e == -ECONNRESET;
}

static void test_store(void) {
  char err[512];
  dg_store *srv = NULL, *c = NULL, *plain = NULL;
  dg_tcp_store_opts so = {.host = "127.0.0.1", .port = 0, .is_server = 1, .timeout_ms = 3000,
                          .auth_token = "s3cret"};
  CHECK_OK(dg_store_new_tcp(&srv, &so, err, sizeof err));
  int port = dg_store_port(srv);
  CHECK_OK(dg_store_set(srv, "k", "v", 1)); /* its own client authenticates too */

  CHECK_OK(client(&c, port, "s3cret", err, sizeof err));
  void *v = NULL;
  size_t n = 0;
  CHECK_OK(dg_store_get(c, "k", &v, &n, 0));
  CHECK(n == 1 && !memcmp(v, "v", 1));
  dg_store_value_free(v);

  dg_store *bad = NULL;
  CHECK_EQ_INT(client(&bad, port, "wrong", err, sizeof err), DG_EMISMATCH);
  CHECK_STR_HAS(err, "different auth token");
  /* no token: connecting sends nothing; the first request is refused */
  CHECK_OK(client(&bad, port, NULL, err, sizeof err));
  int64_t cnt = 0; /* (SET expects no reply: it would not notice) */
  CHECK_EQ_INT(dg_store_add(bad, "x", 1, &cnt), DG_EPEER);
  CHECK_STR_HAS(dg_store_errmsg(bad), "DG_AUTH_TOKEN");
  dg_store_free(bad);
  CHECK(log_has("before authenticating"));

  /* Garbage, torch-style requests without the handshake, a wrong proof: each
   * closed, the server still serves. */
  uint8_t junk[300];
  for (size_t i = 0; i < sizeof junk; i++) junk[i] = (uint8_t)(i * 37 + 11);
  CHECK(raw_closed(port, junk, sizeof junk));
  uint8_t set[] = {DG_TS_SET, 2, 0, 0, 0, 0, 0, 0, 0, '/', 'x', 1, 0, 0, 0, 0, 0, 0, 0, 'y'};
  CHECK(raw_closed(port, set, sizeof set));
  uint8_t check_many[1 + 8] = {DG_TS_CHECK, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f};
  CHECK(raw_closed(port, check_many, sizeof check_many));
  uint8_t proof[1 + 8 + 8 + 17 + 32] = {DG_TS_CHECK, 1};
  proof[9] = 17 + 32;
  memcpy(proof + 17, DG_TS_AUTH_PROOF, 17);
  CHECK(raw_closed(port, proof, sizeof proof)); /* a proof without a hello */
  CHECK(log_has("failed authentication") || log_has("before authenticating"));
  CHECK_OK(dg_store_set(c, "after", "1", 1));
  int present = 0;
  const char *k = "after";
  CHECK_OK(dg_store_check(srv, &k, 1, &present));
  CHECK(present == 1);
  dg_store_free(c);

  /* A token against a server that has none: DG_EUNSUPPORTED, and that
   * server (torch's protocol as is) is not disturbed. */
  dg_tcp_store_opts po = {.host = "127.0.0.1", .port = 0, .is_server = 1, .timeout_ms = 3000};
  CHECK_OK(dg_store_new_tcp(&plain, &po, err, sizeof err));
  CHECK_EQ_INT(client(&bad, dg_store_port(plain), "s3cret", err, sizeof err), DG_EUNSUPPORTED);
  CHECK_STR_HAS(err, "does not authenticate");
  CHECK_OK(dg_store_set(plain, "still", "1", 1));
  dg_store_free(plain);
  dg_store_free(srv);
}

/* Random streams through the server's parser, with and without a token:
 * never a crash (the fuzz harness does this at scale). */
static void test_replay_garbage(void) {
  uint64_t x = 88172645463325252ULL;
  uint8_t buf[2048];
  for (int it = 0; it < 2000; it++) {
    size_t n = 1 + (size_t)(x % sizeof buf);
    for (size_t i = 0; i < n; i++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      buf[i] = (uint8_t)(i % 3 == 0 ? x % 9 : x); /* many valid query bytes */
    }
    CHECK(dg__ts_server_replay(buf, n, it & 1 ? "t" : NULL) >= 0);
  }
}

/* ---- pairs: ranks as threads over one in-memory store ---- */

typedef struct {
  dg_store *st;
  int rank, world, rc;
  const char *token;
  char err[512];
  dg_pg *pg;
} rank_arg;

static void *rank_thread(void *p) {
  rank_arg *a = p;
  dg_pg_opts o = {.rank = a->rank, .world_size = a->world, .store = a->st,
                  .timeout_ms = a->token && strcmp(a->token, "tok") ? 1000 : 5000,
                  .rendezvous = DG_RDZV_GLOO, .auth_token = a->token};
  a->rc = dg_pg_new(&a->pg, &o, a->err, sizeof a->err);
  if (a->rc == DG_OK) {
    float v[4] = {1, 2, 3, (float)a->rank};
    a->rc = dg_pg_allreduce_sync(a->pg, v, 4, DG_F32, DG_RED_SUM);
    if (a->rc == DG_OK && v[3] != (float)(a->world * (a->world - 1) / 2)) a->rc = -100;
  }
  return NULL;
}

static void run_ranks(int W, const char *const *tokens, rank_arg *a) {
  dg_store *base;
  REQUIRE(dg_store_new_mem(&base, 5000) == DG_OK);
  pthread_t t[4];
  for (int r = 0; r < W; r++) {
    a[r] = (rank_arg){.rank = r, .world = W, .token = tokens[r]};
    REQUIRE(dg_store_clone(&a[r].st, base) == DG_OK);
    pthread_create(&t[r], NULL, rank_thread, &a[r]);
  }
  for (int r = 0; r < W; r++) pthread_join(t[r], NULL);
  for (int r = 0; r < W; r++) {
    dg_pg_free(a[r].pg);
    dg_store_free(a[r].st);
  }
  dg_store_free(base);
}

static void test_pairs(void) {
  rank_arg a[4];
  log_clear();
  const char *good[] = {"tok", "tok", "tok", "tok"};
  run_ranks(4, good, a);
  for (int r = 0; r < 4; r++) CHECK_EQ_INT(a[r].rc, DG_OK);
  /* rank 1 with a different token: the dialing side of the pair names the
   * mismatch; the accepting side rejects it (logged) and times out */
  const char *wrong[] = {"tok", "other"};
  run_ranks(2, wrong, a);
  CHECK(a[0].rc != DG_OK && a[1].rc != DG_OK);
  CHECK(a[0].rc == DG_EMISMATCH || a[1].rc == DG_EMISMATCH);
  CHECK_STR_HAS(a[a[0].rc == DG_EMISMATCH ? 0 : 1].err, "different auth token");
  CHECK(log_has("failed authentication"));
  /* a rank without a token against one with: refused as well */
  const char *none[] = {"no-token", NULL};
  run_ranks(2, none, a);
  CHECK(a[0].rc != DG_OK && a[1].rc != DG_OK);
}

/* A peer that publishes Gloo's keys but no dgrad info (what a torch or
 * libgloo rank looks like): a rank with a token refuses it. */
static void test_non_dgrad_peer(void) {
  dg_store *st;
  REQUIRE(dg_store_new_mem(&st, 3000) == DG_OK);
  uint8_t blob[136] = {0};
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(1),
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  memcpy(blob, &sa, sizeof sa);
  CHECK_OK(dg_store_set(st, "rank_1", "torchhost", 9));
  CHECK_OK(dg_store_set(st, "1", blob, sizeof blob));
  dg_pg_opts o = {.rank = 0, .world_size = 2, .store = st, .timeout_ms = 3000,
                  .rendezvous = DG_RDZV_GLOO, .auth_token = "tok"};
  dg_pg *pg = NULL;
  char err[512];
  CHECK_EQ_INT(dg_pg_new(&pg, &o, err, sizeof err), DG_EUNSUPPORTED);
  CHECK_STR_HAS(err, "does not run dgrad");
  dg_store_free(st);
}

int main(void) {
  dg_set_log_fn(log_fn, NULL);
  test_vectors();
  test_store();
  test_replay_garbage();
  test_pairs();
  test_non_dgrad_peer();
  return TEST_DONE();
}
