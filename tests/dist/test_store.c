/* Stores: in-process, prefix, file (Gloo layout) and TCP (torch 1.13
 * protocol), the same checks on each; TCP with many concurrent clients. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dgrad/store.h"
#include "tests/test.h"

static void check_get(dg_store *s, const char *key, const char *want) {
  void *v = NULL;
  size_t n = 0;
  CHECK_OK(dg_store_get(s, key, &v, &n, 2000));
  CHECK_EQ_INT(n, strlen(want));
  CHECK(v && n == strlen(want) && !memcmp(v, want, n));
  dg_store_value_free(v);
}

static void basic(dg_store *s, const char *name) {
  fprintf(stderr, "-- %s\n", name);
  CHECK_OK(dg_store_set(s, "a", "hello", 5));
  check_get(s, "a", "hello");
  CHECK_OK(dg_store_set(s, "empty", "", 0));
  check_get(s, "empty", "");
  int64_t v = 0;
  CHECK_OK(dg_store_add(s, "cnt", 3, &v));
  CHECK_EQ_INT(v, 3);
  CHECK_OK(dg_store_add(s, "cnt", -5, &v));
  CHECK_EQ_INT(v, -2);
  check_get(s, "cnt", "-2");
  CHECK(dg_store_add(s, "a", 1, &v) != DG_OK); /* not an integer */
  check_get(s, "a", "hello");
  int present = -1;
  const char *ks[] = {"a", "cnt"};
  CHECK_OK(dg_store_check(s, ks, 2, &present));
  CHECK_EQ_INT(present, 1);
  const char *ks2[] = {"a", "nope"};
  CHECK_OK(dg_store_check(s, ks2, 2, &present));
  CHECK_EQ_INT(present, 0);
  CHECK_OK(dg_store_wait(s, ks, 2, 1000));
  int rc = dg_store_wait(s, ks2, 2, 100);
  CHECK_EQ_INT(rc, DG_ETIMEDOUT);
  CHECK_STR_HAS(dg_store_errmsg(s), "nope");
  void *val = NULL;
  size_t len = 0;
  CHECK_EQ_INT(dg_store_get(s, "missing", &val, &len, 50), DG_ETIMEDOUT);
  CHECK_STR_HAS(dg_store_errmsg(s), "missing");
  /* The handle still works after a timeout. */
  check_get(s, "a", "hello");
  void *cur = NULL;
  size_t cl = 0;
  CHECK_OK(dg_store_compare_set(s, "cas", "", 0, "x", 1, &cur, &cl));
  CHECK(cl == 1 && !memcmp(cur, "x", 1));
  dg_store_value_free(cur);
  CHECK_OK(dg_store_compare_set(s, "cas", "y", 1, "z", 1, &cur, &cl));
  CHECK(cl == 1 && !memcmp(cur, "x", 1));
  dg_store_value_free(cur);
  CHECK_OK(dg_store_compare_set(s, "cas", "x", 1, "zz", 2, &cur, &cl));
  CHECK(cl == 2 && !memcmp(cur, "zz", 2));
  dg_store_value_free(cur);
  int64_t nk = 0;
  CHECK_OK(dg_store_num_keys(s, &nk));
  CHECK(nk >= 4);
  int deleted = 0;
  CHECK_OK(dg_store_delete(s, "cas", &deleted));
  CHECK_EQ_INT(deleted, 1);
  CHECK_OK(dg_store_delete(s, "cas", &deleted));
  CHECK_EQ_INT(deleted, 0);
  CHECK_OK(dg_store_set(s, "", "x", 1)); /* the empty key, as torch takes it */
  check_get(s, "", "x");
  CHECK_EQ_INT(dg_store_set(s, NULL, "x", 1), DG_EINVAL);
}

typedef struct {
  int port, id, n;
} cl_arg;

/* A client thread: adds to a shared counter, publishes its key, waits for
 * the key of the next client (so all must be served concurrently). */
static void *client(void *p) {
  cl_arg *a = p;
  dg_tcp_store_opts o = {.host = "127.0.0.1", .port = a->port, .timeout_ms = 10000};
  dg_store *s = NULL;
  if (dg_store_new_tcp(&s, &o, NULL, 0) != DG_OK) return (void *)1;
  char key[32], next[32], want[32];
  snprintf(key, sizeof key, "k%d", a->id);
  snprintf(next, sizeof next, "k%d", (a->id + 1) % a->n);
  snprintf(want, sizeof want, "v%d", (a->id + 1) % a->n);
  int64_t v;
  long bad = 0;
  bad |= dg_store_add(s, "counter", 1, &v) != DG_OK;
  bad |= dg_store_set(s, key, want + 0, 0) != DG_OK; /* placeholder, replaced below */
  char val[32];
  snprintf(val, sizeof val, "v%d", a->id);
  bad |= dg_store_set(s, key, val, strlen(val)) != DG_OK;
  void *got = NULL;
  size_t n = 0;
  const char *nk = next;
  bad |= dg_store_wait(s, &nk, 1, 10000) != DG_OK;
  bad |= dg_store_get(s, next, &got, &n, 10000) != DG_OK;
  dg_store_value_free(got);
  dg_store_free(s);
  return (void *)bad;
}

static void tcp_many(void) {
  dg_tcp_store_opts so = {.host = "127.0.0.1", .port = 0, .is_server = 1, .timeout_ms = 10000};
  dg_store *srv = NULL;
  CHECK_OK(dg_store_new_tcp(&srv, &so, NULL, 0));
  REQUIRE(srv);
  enum { N = 32 };
  pthread_t th[N];
  cl_arg args[N];
  for (int i = 0; i < N; i++) {
    args[i] = (cl_arg){dg_store_port(srv), i, N};
    pthread_create(&th[i], NULL, client, &args[i]);
  }
  for (int i = 0; i < N; i++) {
    void *r;
    pthread_join(th[i], &r);
    CHECK(r == NULL);
  }
  check_get(srv, "counter", "32");
  dg_store_free(srv);
}

/* wait_workers: torch's "init/" counter; the server returns once all joined. */
static void *worker(void *p) {
  int port = *(int *)p;
  dg_tcp_store_opts o = {.port = port, .world_size = 3, .wait_workers = 1, .timeout_ms = 5000};
  dg_store *s = NULL;
  int rc = dg_store_new_tcp(&s, &o, NULL, 0);
  dg_store_free(s);
  return (void *)(long)rc;
}

static void tcp_workers(void) {
  dg_tcp_store_opts so = {.port = 0, .is_server = 1, .timeout_ms = 5000};
  dg_store *probe = NULL;
  /* Pick a port by starting and stopping a server. */
  CHECK_OK(dg_store_new_tcp(&probe, &so, NULL, 0));
  int port = dg_store_port(probe);
  dg_store_free(probe);
  pthread_t t[2];
  for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, worker, &port);
  dg_tcp_store_opts mo = {.port = port, .is_server = 1, .world_size = 3, .wait_workers = 1,
                          .timeout_ms = 5000};
  dg_store *m = NULL;
  CHECK_OK(dg_store_new_tcp(&m, &mo, NULL, 0));
  for (int i = 0; i < 2; i++) {
    void *r;
    pthread_join(t[i], &r);
    CHECK_EQ_INT((long)r, 0);
  }
  dg_store_free(m);
}

int main(void) {
  dg_store *m = NULL, *m2 = NULL, *p = NULL, *f = NULL, *t = NULL;
  CHECK_OK(dg_store_new_mem(&m, 5000));
  basic(m, "mem");
  CHECK_OK(dg_store_clone(&m2, m));
  check_get(m2, "a", "hello");
  CHECK_OK(dg_store_new_prefix(&p, m2, "pfx"));
  basic(p, "prefix");
  check_get(m, "pfx/a", "hello");
  dg_store_free(p);
  dg_store_free(m2);
  dg_store_free(m);

  char dir[] = "/tmp/dg_fstoreXXXXXX";
  REQUIRE(mkdtemp(dir));
  CHECK_OK(dg_store_new_file(&f, dir, 5000, NULL, 0));
  basic(f, "file");
  CHECK_EQ_INT(dg_store_set(f, "a", "again", 5), DG_ESTATE); /* Gloo: set once */
  dg_store_free(f);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  CHECK(system(cmd) == 0);

  dg_tcp_store_opts so = {.host = "127.0.0.1", .port = 0, .is_server = 1, .timeout_ms = 5000};
  CHECK_OK(dg_store_new_tcp(&t, &so, NULL, 0));
  REQUIRE(t);
  CHECK(dg_store_port(t) > 0);
  basic(t, "tcp");
  dg_store_free(t);
  tcp_many();
  tcp_workers();
  dg_store_free(NULL);
  return TEST_DONE();
}
