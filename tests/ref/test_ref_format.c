/* The fixture reader: accepts the committed fixtures, and rejects a wrong
 * magic, a wrong version, truncation, trailing bytes and a missing file, each
 * with a message that says which. argv[1]: the fixtures directory. */
#include "ref_fixture.h"

static unsigned char *slurp(const char *path, size_t *len) {
  FILE *fp = fopen(path, "rb");
  if (!fp) return NULL;
  fseek(fp, 0, SEEK_END);
  long n = ftell(fp);
  fseek(fp, 0, SEEK_SET);
  unsigned char *b = malloc((size_t)n);
  if (b && fread(b, 1, (size_t)n, fp) != (size_t)n) {
    free(b);
    b = NULL;
  }
  fclose(fp);
  *len = (size_t)n;
  return b;
}

static void expect_reject(const char *what, const unsigned char *buf, size_t len,
                          const char *msg_has) {
  ref_fixture f;
  char err[512] = "";
  int rc = ref_parse(buf, len, &f, err, sizeof err);
  CHECK_EQ_INT(rc, -1);
  CHECK_STR_HAS(err, msg_has);
  printf("%-16s rejected: %s\n", what, err);
}

/* Every fixture: inputs, parameters, output and loss, one gradient per parameter. */
static void check_fixture(const char *dir, const char *name) {
  char path[1024], err[1024], g[300];
  ref_fixture f;
  snprintf(path, sizeof path, "%s/%s.dgref", dir, name);
  if (ref_load(path, &f, err, sizeof err)) {
    T_FAIL_("%s", err);
    return;
  }
  int nin = 0, np = 0, nout = 0;
  for (int i = 0; i < f.count; i++) {
    const char *n = f.t[i].name;
    nin += !strncmp(n, "in.", 3);
    nout += !strncmp(n, "out.", 4);
    if (!strncmp(n, "p.", 2)) {
      np++;
      snprintf(g, sizeof g, "g.%s", n + 2);
      const ref_tensor *gt = ref_find(&f, g);
      CHECK(gt != NULL);
      CHECK(gt && gt->numel == f.t[i].numel);
    }
  }
  CHECK(nin >= 2);
  CHECK(np >= 4);
  CHECK_EQ_INT(nout, 2);
  const ref_tensor *loss = ref_find(&f, "out.loss");
  CHECK(loss && loss->ndim == 0 && loss->numel == 1);
  printf("%-16s %d tensors: %d inputs, %d parameters\n", path, f.count, nin, np);
  ref_fixture_free(&f);
}

int main(int argc, char **argv) {
  REQUIRE(argc > 1);
  const char *dir = argv[1];
  static const char *const models[] = {"mlp", "conv", "gpt", "mse"};
  for (int i = 0; i < 4; i++) check_fixture(dir, models[i]);

  char path[1024], err[1024];
  snprintf(path, sizeof path, "%s/mse.dgref", dir);
  size_t len = 0;
  unsigned char *good = slurp(path, &len);
  REQUIRE(good != NULL && len > 64);
  unsigned char *b = malloc(len + 8);
  REQUIRE(b != NULL);

  memcpy(b, good, len);
  b[0] = 'X';
  expect_reject("bad magic", b, len, "bad magic");
  expect_reject("empty", b, 0, "bad magic");
  memcpy(b, good, len);
  b[8] = 2; /* version 2 */
  expect_reject("version 2", b, len, "version 2");
  memcpy(b, good, len);
  b[8] = 0;
  expect_reject("version 0", b, len, "version 0");
  memcpy(b, good, len);
  expect_reject("truncated", b, len - 3, "truncated");
  expect_reject("header only", b, 20, "truncated");
  memset(b + len, 0, 8);
  expect_reject("trailing bytes", b, len + 8, "trailing");
  memcpy(b, good, len);
  b[16 + 4 + 4] = 9; /* first tensor: u32 name_len, "in.x", then the dtype */
  expect_reject("bad dtype", b, len, "dtype");

  ref_fixture f;
  snprintf(path, sizeof path, "%s/no-such-model.dgref", dir);
  CHECK_EQ_INT(ref_load(path, &f, err, sizeof err), -1);
  CHECK_STR_HAS(err, "cannot open");
  printf("%-16s rejected: %s\n", "missing file", err);

  free(b);
  free(good);
  return TEST_DONE();
}
