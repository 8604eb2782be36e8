/* dgrad ranks compare version and world size at init: a rank started with
 * another world size, or a peer running another dgrad version, fails init
 * with DG_EMISMATCH and a message naming both sides. */
#include <pthread.h>
#include <string.h>

#include "dgrad/dist.h"
#include "tests/test.h"

typedef struct {
  dg_store *st;
  int rank, world, rc;
  char err[512];
} arg_t;

static void *rank_main(void *p) {
  arg_t *a = p;
  dg_pg *pg = NULL;
  dg_pg_opts o = {.rank = a->rank, .world_size = a->world, .store = a->st, .timeout_ms = 5000};
  dg_pg_opts_from_env(&o); /* DG_BACKEND, DG_SHM of the meson cases */
  a->rc = dg_pg_new(&pg, &o, a->err, sizeof a->err);
  dg_pg_free(pg);
  return NULL;
}

int main(void) {
  dg_store *st = NULL, *st2 = NULL;
  CHECK_OK(dg_store_new_mem(&st, 5000));
  CHECK_OK(dg_store_clone(&st2, st));
  arg_t a[2] = {{st, 0, 2, 0, ""}, {st2, 1, 3, 0, ""}};
  pthread_t t[2];
  for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, rank_main, &a[i]);
  for (int i = 0; i < 2; i++) {
    pthread_join(t[i], NULL);
    fprintf(stderr, "world mismatch, rank %d: %s: %s\n", i, dg_err_name(a[i].rc), a[i].err);
    CHECK_EQ_INT(a[i].rc, DG_EMISMATCH);
    CHECK_STR_HAS(a[i].err, "world=2");
    CHECK_STR_HAS(a[i].err, "world=3");
  }
  dg_store_free(st2);
  dg_store_free(st);

  /* A "rank 1" that announces another version. */
  CHECK_OK(dg_store_new_mem(&st, 5000));
  const char *info = "dgrad 9.9.9 world=2";
  unsigned char blob[136] = {2, 0, 0x30, 0x39, 127, 0, 0, 1};
  CHECK_OK(dg_store_set(st, "default_pg/0/dgrad_info/1", info, strlen(info)));
  CHECK_OK(dg_store_set(st, "default_pg/0/0/rank_1", "x", 1));
  CHECK_OK(dg_store_set(st, "default_pg/0/0/1", blob, sizeof blob));
  arg_t v = {st, 0, 2, 0, ""};
  rank_main(&v);
  fprintf(stderr, "version mismatch: %s: %s\n", dg_err_name(v.rc), v.err);
  CHECK_EQ_INT(v.rc, DG_EMISMATCH);
  CHECK_STR_HAS(v.err, "9.9.9");
  CHECK_STR_HAS(v.err, "rank 1");
  CHECK_STR_HAS(v.err, "rank 0");
  dg_store_free(st);
  return TEST_DONE();
}
