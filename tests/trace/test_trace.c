/* The timeline recorder (dgrad/trace.h, base/trace.c): the ring keeps the
 * newest events and allocates nothing while recording; misuse is refused;
 * threads beyond max_threads are counted; off records nothing; stop while
 * other threads record is safe (run under ASan / TSan). The JSON it writes
 * is parsed by check_trace.py in trace_unit.sh. Usage: test_trace [OUT.json] */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dgrad.h"
#include "base/common_impl.h"
#include "base/trace_impl.h"
#include "tests/test.h"

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc((size_t)n + 1);
  if (b && fread(b, 1, (size_t)n, f) != (size_t)n) n = 0;
  if (b) b[n] = 0;
  fclose(f);
  return b;
}

static int count(const char *s, const char *sub) {
  int n = 0;
  for (const char *p = s; (p = strstr(p, sub)); p++) n++;
  return n;
}

/* 10 rings' worth of events into a ring of 64: the newest 64 stay, and
 * nothing is allocated after the first event claimed the ring (it does not
 * allocate either: start did). */
static void test_ring_overwrites(const char *dir) {
  dg_trace_opts o = {.events_per_thread = 50, .max_threads = 4}; /* rounded up to 64 */
  CHECK_OK(dg_trace_start(&o));
  CHECK_EQ_INT(dg_trace_enabled(), 1);
  uint64_t a0 = dg__alloc_count();
  for (int i = 0; i < 640; i++) {
    uint64_t t0 = dg__trace_t0();
    CHECK(t0 != 0);
    DG__TRACE_END(t0, "work", i % 2 ? "layer.with\"quote" : NULL, "seq", i, NULL, 0);
  }
  CHECK_EQ_INT(dg__alloc_count() - a0, 0);
  dg_trace_stats st;
  CHECK_OK(dg_trace_get_stats(&st));
  CHECK_EQ_INT(st.recorded, 640);
  CHECK_EQ_INT(st.overwritten, 640 - 64);
  CHECK_EQ_INT(st.threads, 1);
  CHECK_EQ_INT(st.dropped, 0);
  char err[256] = "", path[512];
  snprintf(path, sizeof path, "%s/ring.json", dir);
  CHECK_EQ_INT(dg_trace_write(path, 0, err, sizeof err), DG_ESTATE); /* on: stop first */
  CHECK_STR_HAS(err, "dg_trace_stop");
  CHECK_OK(dg_trace_stop());
  CHECK_OK(dg_trace_write(path, 3, err, sizeof err));
  char *j = slurp(path);
  REQUIRE(j);
  CHECK_EQ_INT(count(j, "\"name\":\"work\""), 64);
  CHECK(!strstr(j, "\"seq\":575}"));
  CHECK(strstr(j, "\"seq\":576}") && strstr(j, "\"seq\":639}"));
  CHECK(strstr(j, "\"module\":\"layer.with\\\"quote\""));
  CHECK(strstr(j, "\"pid\":3,"));
  CHECK(strstr(j, "\"overwritten\":576"));
  free(j);
}

static void test_misuse(const char *dir) {
  char err[256] = "", path[512];
  CHECK_EQ_INT(dg_trace_stop(), DG_ESTATE); /* not on */
  dg_trace_opts big = {.events_per_thread = ((size_t)1 << 24) + 1};
  CHECK_EQ_INT(dg_trace_start(&big), DG_EINVAL);
  dg_trace_opts many = {.max_threads = 5000};
  CHECK_EQ_INT(dg_trace_start(&many), DG_EINVAL);
  CHECK_EQ_INT(dg_trace_write(NULL, 0, err, sizeof err), DG_EINVAL);
  snprintf(path, sizeof path, "%s/x.json", dir);
  CHECK_EQ_INT(dg_trace_write(path, -1, err, sizeof err), DG_EINVAL);
  CHECK_STR_HAS(err, "pid");
  CHECK_OK(dg_trace_start(NULL));
  CHECK_EQ_INT(dg_trace_start(NULL), DG_ESTATE); /* already on */
  CHECK_EQ_INT(dg_trace_clear(), DG_ESTATE);
  CHECK_OK(dg_trace_stop());
  snprintf(path, sizeof path, "%s/no/such/dir/t.json", dir);
  CHECK_EQ_INT(dg_trace_write(path, 0, err, sizeof err), DG_EIO);
  CHECK_STR_HAS(err, path);
  CHECK_OK(dg_trace_clear());
  snprintf(path, sizeof path, "%s/y.json", dir);
  CHECK_EQ_INT(dg_trace_write(path, 0, err, sizeof err), DG_ESTATE); /* nothing started */
  CHECK_EQ_INT(dg_trace_get_stats(NULL), DG_EINVAL);
}

/* Off: the sites record nothing and t0 is 0. */
static void test_off(void) {
  CHECK_EQ_INT(dg_trace_enabled(), 0);
  CHECK_EQ_INT(dg__trace_t0(), 0);
  DG__TRACE_INSTANT("never", NULL, 0, NULL, 0);
  dg_trace_opts o = {.events_per_thread = 16, .max_threads = 1};
  CHECK_OK(dg_trace_start(&o));
  CHECK_OK(dg_trace_stop());
  DG__TRACE_INSTANT("after stop", NULL, 0, NULL, 0);
  dg_trace_stats st;
  CHECK_OK(dg_trace_get_stats(&st));
  CHECK_EQ_INT(st.recorded, 0);
}

static atomic_int go, quit;

static void *recorder(void *arg) {
  (void)arg;
  while (!atomic_load(&go)) usleep(100);
  long n = 0;
  while (!atomic_load(&quit)) {
    uint64_t t0 = dg__trace_t0();
    DG__TRACE_END(t0, "thread work", NULL, "n", n++, NULL, 0);
    DG__TRACE_ASYNC(t0, "span", n, "n", n, NULL, 0);
  }
  return NULL;
}

/* 3 threads on 2 rings: one is dropped. Stop while they record, write,
 * restart (the rings are freed and handed out again) and stop again. */
static void test_threads(const char *dir) {
  dg_trace_opts o = {.events_per_thread = 256, .max_threads = 2};
  CHECK_OK(dg_trace_start(&o));
  pthread_t th[3];
  atomic_store(&go, 0);
  atomic_store(&quit, 0);
  for (int i = 0; i < 3; i++) REQUIRE(!pthread_create(&th[i], NULL, recorder, NULL));
  atomic_store(&go, 1);
  usleep(20000);
  CHECK_OK(dg_trace_stop());
  dg_trace_stats st;
  CHECK_OK(dg_trace_get_stats(&st));
  CHECK_EQ_INT(st.threads, 2);
  CHECK(st.dropped > 0);
  CHECK(st.recorded > 0);
  char err[256] = "", path[512];
  snprintf(path, sizeof path, "%s/threads.json", dir);
  CHECK_OK(dg_trace_write(path, 1, err, sizeof err));
  CHECK_OK(dg_trace_start(&o)); /* the threads still run: claim the new rings */
  usleep(20000);
  CHECK_OK(dg_trace_stop());
  CHECK_OK(dg_trace_get_stats(&st));
  CHECK(st.recorded > 0);
  atomic_store(&quit, 1);
  for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
  CHECK_OK(dg_trace_clear());
}

int main(int argc, char **argv) {
  char dir[] = "/tmp/dg_trace_test_XXXXXX";
  REQUIRE(mkdtemp(dir));
  test_misuse(dir);
  test_off();
  test_ring_overwrites(dir);
  test_threads(dir);
  if (argc > 1) { /* a small nested trace for check_trace.py */
    CHECK_OK(dg_trace_start(NULL));
    uint64_t outer = dg__trace_t0();
    for (int i = 0; i < 3; i++) {
      uint64_t inner = dg__trace_t0();
      DG__TRACE_INSTANT("bucket ready", "bucket", i, NULL, 0);
      DG__TRACE_END(inner, "forward", "layers.0", NULL, 0, NULL, 0);
    }
    DG__TRACE_ASYNC(outer, "allreduce", 0, "bucket", 0, "bytes", 64);
    DG__TRACE_END(outer, "backward", NULL, NULL, 0, NULL, 0);
    char err[256] = "";
    CHECK_OK(dg_trace_stop());
    CHECK_OK(dg_trace_write(argv[1], 0, err, sizeof err));
    CHECK_OK(dg_trace_clear());
  }
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  CHECK(system(cmd) == 0);
  return TEST_DONE();
}
