/* Loader (seeded shuffling, batching, sharding, resume, no per-batch
 * allocation) on a synthetic dataset, and the character-level text dataset. */
#include <dgrad.h>
#include <dgrad/data.h>

#include "test.h"

uint64_t dg__alloc_count(void); /* internal counter, linked from the static lib */

/* Sample i: field 0 = i (i64), field 1 = (2i, 2i+1) f32. */
static int synth_get(void *self, int64_t i, void *const *dst) {
  (void)self;
  *(int64_t *)dst[0] = i;
  ((float *)dst[1])[0] = (float)(2 * i);
  ((float *)dst[1])[1] = (float)(2 * i + 1);
  return DG_OK;
}

static dg_dataset synth(int64_t n) {
  dg_dataset d;
  memset(&d, 0, sizeof d);
  d.size = n;
  d.nfields = 2;
  d.field[0].dtype = DG_I64;
  d.field[0].numel = 1;
  d.field[1].dtype = DG_F32;
  d.field[1].ndim = 1;
  d.field[1].shape[0] = 2;
  d.field[1].numel = 2;
  d.get = synth_get;
  return d;
}

/* Reads one epoch of indices into out; returns the count. */
static int64_t epoch_indices(dg_loader *l, int64_t *out) {
  int64_t k = 0, rows;
  int rc;
  while ((rc = dg_loader_next(l, NULL, &rows)) == DG_OK && rows > 0) {
    const int64_t *idx = dg_loader_buffer(l, 0);
    const float *v = dg_loader_buffer(l, 1);
    for (int64_t r = 0; r < rows; r++) {
      CHECK_EQ_INT(v[2 * r], 2 * idx[r]);
      out[k++] = idx[r];
    }
  }
  CHECK_OK(rc);
  CHECK_EQ_INT(rows, 0); /* the end of the epoch */
  return k;
}

static void test_shuffle(void) {
  enum { N = 1000 };
  dg_dataset d = synth(N);
  dg_loader_opts op = {32, 1, 42, 0, 0, 1, 0};
  dg_loader *a, *b, *c;
  CHECK_OK(dg_loader_new(&a, &d, &op, NULL, 0));
  CHECK_OK(dg_loader_new(&b, &d, &op, NULL, 0));
  op.seed = 43;
  CHECK_OK(dg_loader_new(&c, &d, &op, NULL, 0));
  static int64_t e0[N], e1[N], f0[N], g0[N];
  int seen[N];
  CHECK_EQ_INT(dg_loader_batches_per_epoch(a), 32);
  uint64_t before = dg__alloc_count();
  CHECK_EQ_INT(epoch_indices(a, e0), N);
  CHECK_EQ_INT(epoch_indices(a, e1), N);
  CHECK_EQ_INT(dg__alloc_count() - before, 0);
  CHECK_EQ_INT(epoch_indices(b, f0), N);
  CHECK_EQ_INT(epoch_indices(c, g0), N);
  CHECK(!memcmp(e0, f0, sizeof e0));         /* reproducible from the seed */
  CHECK(memcmp(e0, e1, sizeof e0) != 0);     /* different across epochs */
  CHECK(memcmp(e0, g0, sizeof e0) != 0);     /* different across seeds */
  memset(seen, 0, sizeof seen);
  int fixed = 0;
  for (int i = 0; i < N; i++) {
    seen[e1[i]]++;
    fixed += e1[i] == i;
  }
  for (int i = 0; i < N; i++) CHECK_EQ_INT(seen[i], 1); /* a permutation */
  CHECK(fixed < 10);
  int64_t ep, bt;
  dg_loader_position(a, &ep, &bt);
  CHECK_EQ_INT(ep, 2);
  CHECK_EQ_INT(bt, 0);
  dg_loader_free(a);
  dg_loader_free(b);
  dg_loader_free(c);
  dg_loader_free(NULL);
}

/* Save the position mid-epoch, continue in a fresh loader: same batches. */
static void test_resume(void) {
  dg_dataset d = synth(103);
  dg_loader_opts op = {10, 1, 7, 0, 0, 1, 0};
  dg_loader *a, *b;
  CHECK_OK(dg_loader_new(&a, &d, &op, NULL, 0));
  CHECK_OK(dg_loader_new(&b, &d, &op, NULL, 0));
  int64_t idx[16], rows, ep, bt;
  for (int i = 0; i < 15; i++) dg_loader_next(a, NULL, &rows); /* into epoch 1 */
  dg_loader_position(a, &ep, &bt);
  CHECK_EQ_INT(ep, 1);
  CHECK_EQ_INT(bt, 3);
  CHECK_OK(dg_loader_seek(b, ep, bt));
  for (int i = 0; i < 12; i++) {
    int64_t r2;
    void *dst[2] = {idx, idx + 10}; /* caller buffers for b */
    float vals[20];
    dst[1] = vals;
    int ra = dg_loader_next(a, NULL, &rows), rb = dg_loader_next(b, dst, &r2);
    CHECK_EQ_INT(ra, rb);
    CHECK_EQ_INT(rows, r2);
    if (ra == DG_OK) CHECK(!memcmp(dg_loader_buffer(a, 0), idx, (size_t)rows * 8));
  }
  CHECK_EQ_INT(dg_loader_seek(a, 0, 999), DG_EINVAL);
  dg_loader_free(a);
  dg_loader_free(b);
}

/* World 3 over 10 samples: padded (4 each, every sample covered) or dropped
 * (3 each, disjoint); same batch count on every rank. */
static void test_sharding(void) {
  dg_dataset d = synth(10);
  for (int drop = 0; drop < 2; drop++) {
    int count[10] = {0};
    int64_t nb = -1;
    for (int r = 0; r < 3; r++) {
      dg_loader_opts op = {3, 1, 5, 0, r, 3, drop};
      dg_loader *l;
      CHECK_OK(dg_loader_new(&l, &d, &op, NULL, 0));
      CHECK_EQ_INT(dg_loader_samples_per_rank(l), drop ? 3 : 4);
      if (nb < 0) nb = dg_loader_batches_per_epoch(l);
      CHECK_EQ_INT(dg_loader_batches_per_epoch(l), nb);
      int64_t idx[8];
      CHECK_EQ_INT(epoch_indices(l, idx), drop ? 3 : 4);
      for (int k = 0; k < (drop ? 3 : 4); k++) count[idx[k]]++;
      dg_loader_free(l);
    }
    int total = 0, covered = 0;
    for (int i = 0; i < 10; i++) total += count[i], covered += count[i] > 0;
    CHECK_EQ_INT(total, drop ? 9 : 12);
    CHECK_EQ_INT(covered, drop ? 9 : 10);
  }
  /* drop_last drops the partial batch */
  dg_loader_opts op = {4, 0, 0, 1, 0, 1, 0};
  dg_loader *l;
  CHECK_OK(dg_loader_new(&l, &d, &op, NULL, 0));
  CHECK_EQ_INT(dg_loader_batches_per_epoch(l), 2);
  int64_t idx[10];
  CHECK_EQ_INT(epoch_indices(l, idx), 8);
  CHECK_EQ_INT(idx[5], 5); /* no shuffle: in order */
  dg_loader_free(l);
  dg_loader_opts bad = {4, 0, 0, 0, 3, 3, 0};
  char err[256] = "";
  CHECK_EQ_INT(dg_loader_new(&l, &d, &bad, err, sizeof err), DG_EINVAL);
  CHECK(strstr(err, "rank 3 of world_size 3") != NULL); /* names what is wrong */
  CHECK(l == NULL);
  CHECK_EQ_INT(dg_loader_new(&l, &d, &op, NULL, 0), DG_OK);
  int64_t rows = -1;
  CHECK_EQ_INT(dg_loader_next(l, NULL, NULL), DG_EINVAL); /* rows is required */
  CHECK(strstr(dg_loader_errmsg(l), "rows") != NULL);
  CHECK_OK(dg_loader_next(l, NULL, &rows));
  CHECK(rows > 0);
  CHECK_EQ_INT(dg_loader_errmsg(l)[0], 0);
  dg_loader_free(l);
}

static void test_text(void) {
  char path[] = "/tmp/dg_test_text_XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  const char *txt = "hello world, hello dgrad\n";
  FILE *f = fdopen(fd, "w");
  fputs(txt, f);
  fclose(f);
  dg_text *t = NULL;
  char err[512];
  dg_text_opts op = {0.2};
  CHECK_OK(dg_text_open(&t, path, &op, err, sizeof err));
  REQUIRE(t);
  /* distinct bytes: \n space , a d e g h l o r w */
  CHECK_EQ_INT(dg_text_vocab_size(t), 12);
  CHECK_EQ_INT(dg_text_byte(t, 0), '\n');
  CHECK_EQ_INT(dg_text_id(t, 'w'), 11);
  CHECK_EQ_INT(dg_text_id(t, 'z'), -1);
  size_t ntr, nva;
  dg_text_tokens(t, DG_SPLIT_TRAIN, &ntr);
  dg_text_tokens(t, DG_SPLIT_VAL, &nva);
  CHECK_EQ_INT(ntr + nva, strlen(txt));
  CHECK_EQ_INT(nva, 5);
  dg_dataset d;
  CHECK_OK(dg_text_dataset(t, DG_SPLIT_TRAIN, 4, 1, &d));
  CHECK_EQ_INT(d.size, (int64_t)ntr - 4);
  int64_t x[4], y[4];
  void *dst[2] = {x, y};
  CHECK_OK(d.get(d.self, 6, dst));
  char s[8];
  dg_text_decode(t, x, 4, s, sizeof s);
  CHECK(!strcmp(s, "worl"));
  dg_text_decode(t, y, 4, s, sizeof s);
  CHECK(!strcmp(s, "orld"));
  CHECK_EQ_INT(dg_text_dataset(t, DG_SPLIT_VAL, 5, 1, &d), DG_EINVAL);
  dg_text_free(t);
  dg_text_free(NULL);
  remove(path);
  CHECK_EQ_INT(dg_text_open(&t, "/nonexistent/corpus", NULL, err, sizeof err), DG_EIO);
  CHECK_STR_HAS(err, "/nonexistent/corpus");
  /* the default corpus, when installed */
  if (dg_text_open(&t, NULL, NULL, err, sizeof err) == DG_OK) {
    dg_text_tokens(t, DG_SPLIT_TRAIN, &ntr);
    fprintf(stderr, "fortunes: %zu train tokens, vocab %d\n", ntr, dg_text_vocab_size(t));
    CHECK(ntr > 100000);
    CHECK(dg_text_vocab_size(t) > 60 && dg_text_vocab_size(t) <= 256);
    dg_text_free(t);
  } else {
    fprintf(stderr, "fortunes corpus not installed: %s\n", err);
  }
}

int main(void) {
  test_shuffle();
  test_resume();
  test_sharding();
  test_text();
  return TEST_DONE();
}
