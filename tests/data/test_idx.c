/* IDX reader and MNIST-style dataset on small files this test writes itself:
 * valid raw and gzip files of every IDX type, and each way a file can be
 * broken (truncated, bad magic, count mismatch, label out of range, corrupt or
 * truncated gzip): each must fail with a message naming the file. */
#include <dgrad.h>
#include <dgrad/data.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dgrad_config.h"
#include "test.h"
#if DG_HAVE_ZLIB
#include <zlib.h>
#endif

static char dir[256];
static char errbuf[1024];

static void path_of(char *out, size_t cap, const char *name) {
  snprintf(out, cap, "%s/%s", dir, name);
}

static void write_bytes(const char *name, const void *p, size_t n) {
  char path[512];
  path_of(path, sizeof path, name);
  FILE *f = fopen(path, "wb");
  REQUIRE(f && fwrite(p, 1, n, f) == n);
  fclose(f);
}

/* IDX header + payload in a buffer (payload already big-endian). */
static size_t idx_bytes(unsigned char *out, int type, int ndim, const uint32_t *dims,
                        const void *payload, size_t plen) {
  size_t k = 0;
  out[k++] = 0, out[k++] = 0, out[k++] = (unsigned char)type, out[k++] = (unsigned char)ndim;
  for (int i = 0; i < ndim; i++) {
    out[k++] = (unsigned char)(dims[i] >> 24), out[k++] = (unsigned char)(dims[i] >> 16);
    out[k++] = (unsigned char)(dims[i] >> 8), out[k++] = (unsigned char)dims[i];
  }
  memcpy(out + k, payload, plen);
  return k + plen;
}

#define N_IMG 6
static unsigned char img_file[4096], lbl_file[256];
static size_t img_len, lbl_len;

static void make_valid(void) {
  unsigned char px[N_IMG * 4 * 3], lb[N_IMG];
  for (size_t i = 0; i < sizeof px; i++) px[i] = (unsigned char)(i * 7);
  for (int i = 0; i < N_IMG; i++) lb[i] = (unsigned char)(i % 10);
  uint32_t d3[3] = {N_IMG, 4, 3}, d1[1] = {N_IMG};
  img_len = idx_bytes(img_file, DG_IDX_U8, 3, d3, px, sizeof px);
  lbl_len = idx_bytes(lbl_file, DG_IDX_U8, 1, d1, lb, sizeof lb);
}

/* Writes a dataset directory <dir>/<sub> holding the train pair. */
static void make_set(const char *sub, const void *img, size_t ni, const void *lbl, size_t nl) {
  char p[512];
  path_of(p, sizeof p, sub);
  mkdir(p, 0700);
  snprintf(p, sizeof p, "%s/train-images-idx3-ubyte", sub);
  write_bytes(p, img, ni);
  snprintf(p, sizeof p, "%s/train-labels-idx1-ubyte", sub);
  write_bytes(p, lbl, nl);
}

static void expect_fail(const char *sub, int code, const char *file, const char *what) {
  char p[512];
  dg_mnist *ds = (dg_mnist *)1;
  path_of(p, sizeof p, sub);
  int rc = dg_mnist_open(&ds, p, 1, errbuf, sizeof errbuf);
  CHECK_EQ_INT(rc, code);
  CHECK(ds == NULL);
  CHECK_STR_HAS(errbuf, file);
  CHECK_STR_HAS(errbuf, what);
  fprintf(stderr, "  %s: %s\n", sub, errbuf);
}

static void test_mnist_valid(void) {
  make_set("ok", img_file, img_len, lbl_file, lbl_len);
  char p[512];
  path_of(p, sizeof p, "ok");
  dg_mnist *ds = NULL;
  dg_mnist_opts op = {DG_MNIST_NORM_UNIT, 0, 0, 0};
  CHECK_OK(dg_mnist_open_opts(&ds, p, 1, &op, errbuf, sizeof errbuf));
  REQUIRE(ds);
  CHECK_EQ_INT(dg_mnist_count(ds), N_IMG);
  CHECK_EQ_INT(dg_mnist_rows(ds), 4);
  CHECK_EQ_INT(dg_mnist_cols(ds), 3);
  float im[12];
  CHECK_OK(dg_mnist_image(ds, 2, im));
  CHECK_NEAR(im[5], (unsigned char)((24 + 5) * 7) / 255.0, 1e-6);
  CHECK_EQ_INT(dg_mnist_labels(ds)[5], 5);
  dg_dataset d;
  CHECK_OK(dg_mnist_dataset(ds, &d));
  CHECK_EQ_INT(d.size, N_IMG);
  CHECK_EQ_INT(d.field[0].numel, 12);
  dg_mnist_free(ds);
  /* default normalisation: Fashion-MNIST mean/std */
  CHECK_OK(dg_mnist_open(&ds, p, 1, errbuf, sizeof errbuf));
  CHECK_OK(dg_mnist_image(ds, 0, im));
  CHECK_NEAR(im[1], (7 / 255.0 - 0.2860) / 0.3530, 1e-5);
  dg_mnist_free(ds);
  dg_mnist_free(NULL);
  /* test split missing: a clear "cannot open" */
  CHECK_EQ_INT(dg_mnist_open(&ds, p, 0, errbuf, sizeof errbuf), DG_EIO);
  CHECK_STR_HAS(errbuf, "t10k-images-idx3-ubyte");
  CHECK_STR_HAS(errbuf, "cannot open");
}

static void test_mnist_broken(void) {
  make_set("trunc", img_file, img_len - 5, lbl_file, lbl_len);
  expect_fail("trunc", DG_EFORMAT, "trunc/train-images-idx3-ubyte", "truncated");
  make_set("trunchdr", img_file, 10, lbl_file, lbl_len);
  expect_fail("trunchdr", DG_EFORMAT, "trunchdr/train-images-idx3-ubyte", "truncated");
  unsigned char bad[4096];
  memcpy(bad, img_file, img_len);
  bad[2] = 0x42;
  make_set("magic", bad, img_len, lbl_file, lbl_len);
  expect_fail("magic", DG_EFORMAT, "magic/train-images-idx3-ubyte", "bad IDX magic");
  unsigned char lb[256];
  uint32_t d1[1] = {N_IMG - 1};
  unsigned char five[N_IMG - 1] = {1, 2, 3, 4, 5};
  size_t ln = idx_bytes(lb, DG_IDX_U8, 1, d1, five, sizeof five);
  make_set("count", img_file, img_len, lb, ln);
  expect_fail("count", DG_EFORMAT, "count/train-labels-idx1-ubyte", "counts must match");
  memcpy(lb, lbl_file, lbl_len);
  lb[lbl_len - 2] = 12;
  make_set("label", img_file, img_len, lb, lbl_len);
  expect_fail("label", DG_EFORMAT, "label/train-labels-idx1-ubyte", "label 12 at index 4");
  memcpy(bad, img_file, img_len);
  bad[img_len] = 9;
  make_set("trailing", bad, img_len + 1, lbl_file, lbl_len);
  expect_fail("trailing", DG_EFORMAT, "trailing/train-images-idx3-ubyte", "past the");
  make_set("swapped", img_file, img_len, img_file, img_len);
  expect_fail("swapped", DG_EFORMAT, "swapped/train-labels-idx1-ubyte", "1 dim");
}

#if DG_HAVE_ZLIB
static size_t gzip_mem(const unsigned char *in, size_t n, unsigned char *out, size_t cap) {
  z_stream z;
  memset(&z, 0, sizeof z);
  REQUIRE(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK);
  z.next_in = (unsigned char *)in;
  z.avail_in = (unsigned)n;
  z.next_out = out;
  z.avail_out = (unsigned)cap;
  REQUIRE(deflate(&z, Z_FINISH) == Z_STREAM_END);
  size_t len = z.total_out;
  deflateEnd(&z);
  return len;
}

static void test_gzip(void) {
  unsigned char gz[8192], gl[1024];
  size_t n = gzip_mem(img_file, img_len, gz, sizeof gz);
  size_t nl = gzip_mem(lbl_file, lbl_len, gl, sizeof gl);
  char p[512];
  path_of(p, sizeof p, "gz");
  mkdir(p, 0700);
  write_bytes("gz/train-images-idx3-ubyte.gz", gz, n);
  write_bytes("gz/train-labels-idx1-ubyte.gz", gl, nl);
  dg_mnist *ds = NULL;
  CHECK_OK(dg_mnist_open(&ds, p, 1, errbuf, sizeof errbuf));
  CHECK_EQ_INT(dg_mnist_count(ds), N_IMG);
  CHECK(ds && !memcmp(dg_mnist_pixels(ds), img_file + 16, N_IMG * 12));
  dg_mnist_free(ds);
  /* gzip magic without a .gz name is detected too */
  write_bytes("plain_named", gz, n);
  dg_idx_array a;
  path_of(p, sizeof p, "plain_named");
  CHECK_OK(dg_idx_read(&a, p, errbuf, sizeof errbuf));
  CHECK_EQ_INT(a.count, N_IMG * 12);
  dg_idx_free(&a);
  /* corrupt deflate data after a valid gzip header */
  unsigned char bad[8192];
  memcpy(bad, gz, n);
  for (size_t i = 12; i < n - 8; i++) bad[i] ^= 0x5a;
  path_of(p, sizeof p, "gzc");
  mkdir(p, 0700);
  write_bytes("gzc/train-images-idx3-ubyte.gz", bad, n);
  write_bytes("gzc/train-labels-idx1-ubyte.gz", gl, nl);
  expect_fail("gzc", DG_EFORMAT, "gzc/train-images-idx3-ubyte.gz", "gzip");
  /* intact deflate data, wrong CRC in the gzip trailer */
  memcpy(bad, gz, n);
  bad[n - 6] ^= 0xff;
  write_bytes("gzc/train-images-idx3-ubyte.gz", bad, n);
  expect_fail("gzc", DG_EFORMAT, "gzc/train-images-idx3-ubyte.gz", "corrupt gzip");
  /* truncated gzip stream */
  path_of(p, sizeof p, "gzt");
  mkdir(p, 0700);
  write_bytes("gzt/train-images-idx3-ubyte.gz", gz, n / 2);
  write_bytes("gzt/train-labels-idx1-ubyte.gz", gl, nl);
  expect_fail("gzt", DG_EFORMAT, "gzt/train-images-idx3-ubyte.gz", "truncated");
  /* named .gz but not gzip */
  path_of(p, sizeof p, "gzn");
  mkdir(p, 0700);
  write_bytes("gzn/train-images-idx3-ubyte.gz", img_file, img_len);
  write_bytes("gzn/train-labels-idx1-ubyte.gz", gl, nl);
  expect_fail("gzn", DG_EFORMAT, "gzn/train-images-idx3-ubyte.gz", "gzip magic");
}
#endif

/* Every IDX element type decodes from big-endian. */
static void test_types(void) {
  unsigned char f[64];
  uint32_t d[2] = {1, 2};
  const unsigned char i16[] = {0x01, 0x02, 0xff, 0xfe};
  const unsigned char i32[] = {0, 1, 0, 0, 0xff, 0xff, 0xff, 0xfd};
  const unsigned char f32[] = {0x3f, 0xc0, 0, 0, 0xc0, 0x20, 0, 0};       /* 1.5, -2.5 */
  const unsigned char f64[] = {0x40, 0x09, 0x21, 0xfb, 0x54, 0x44, 0x2d, 0x18,
                               0xbf, 0xf0, 0, 0, 0, 0, 0, 0};               /* pi, -1 */
  const unsigned char i8[] = {0x80, 0x7f};
  struct { int type; const unsigned char *p; size_t n; double v0, v1; } c[] = {
      {DG_IDX_I16, i16, 4, 258, -2}, {DG_IDX_I32, i32, 8, 65536, -3},
      {DG_IDX_F32, f32, 8, 1.5, -2.5}, {DG_IDX_F64, f64, 16, 3.141592653589793, -1},
      {DG_IDX_I8, i8, 2, -128, 127}};
  for (size_t k = 0; k < sizeof c / sizeof c[0]; k++) {
    size_t n = idx_bytes(f, c[k].type, 2, d, c[k].p, c[k].n);
    write_bytes("typed", f, n);
    char p[512];
    path_of(p, sizeof p, "typed");
    dg_idx_array a;
    CHECK_OK(dg_idx_read(&a, p, errbuf, sizeof errbuf));
    CHECK_EQ_INT(a.type, c[k].type);
    CHECK_EQ_INT(a.ndim, 2);
    CHECK_EQ_INT(a.dims[1], 2);
    double v[2];
    for (int i = 0; i < 2; i++) {
      const char *q = (const char *)a.data + (size_t)i * a.elem_size;
      switch (a.type) {
      case DG_IDX_I8: v[i] = *(const int8_t *)q; break;
      case DG_IDX_I16: v[i] = *(const int16_t *)q; break;
      case DG_IDX_I32: v[i] = *(const int32_t *)q; break;
      case DG_IDX_F32: v[i] = *(const float *)q; break;
      default: v[i] = *(const double *)q; break;
      }
    }
    CHECK_NEAR(v[0], c[k].v0, 1e-12);
    CHECK_NEAR(v[1], c[k].v1, 1e-12);
    dg_idx_free(&a);
  }
  dg_idx_free(NULL);
  dg_idx_array a;
  CHECK_EQ_INT(dg_idx_read(&a, "/nonexistent/x-idx1-ubyte", errbuf, sizeof errbuf), DG_EIO);
  CHECK_STR_HAS(errbuf, "/nonexistent/x-idx1-ubyte");
  /* absurd dims in a tiny file: refused before allocating */
  uint32_t huge[3] = {0xffffffffu, 0xffffffffu, 0xffffffffu};
  size_t n = idx_bytes(f, DG_IDX_U8, 3, huge, "", 0);
  write_bytes("huge", f, n);
  char p[512];
  path_of(p, sizeof p, "huge");
  CHECK_EQ_INT(dg_idx_read(&a, p, errbuf, sizeof errbuf), DG_EFORMAT);
  CHECK_STR_HAS(errbuf, "huge");
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/dg_test_idx_XXXXXX");
  REQUIRE(mkdtemp(dir));
  make_valid();
  test_mnist_valid();
  test_mnist_broken();
#if DG_HAVE_ZLIB
  test_gzip();
#endif
  test_types();
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
  return TEST_DONE();
}
