/* The device seam without a GPU: a stand-in device registered at DG_CUDA
 * whose memory is ordinary host memory (so the CPU kernel tables can run on
 * it) but comes only from its own raw_alloc, with a canary in every block,
 * and whose core loops (backends/kern_mem.h) and copies are counted. It
 * checks what a CUDA backend will rely on:
 *   - the caching allocator keeps its bookkeeping on the host: a cached
 *     device block is never written (the canary survives free/alloc);
 *   - a context gives each device its own arena: an op on device tensors
 *     puts its output, its gradients and its scratch in device blocks, the
 *     headers stay on the host, and a reset keeps the device memory;
 *   - core's own loops (zeroing, seeding, packing, conversion, element
 *     reads) go through the device's backend, and tensors move between
 *     devices with dg_tensor_copy;
 *   - a forward and backward on the device gives the CPU's numbers. */
#include <dgrad.h>
#include <stdint.h>

#include "backends/backend.h"
#include "backends/kern_mem.h"
#include "core/core_impl.h"
#include "test.h"

#define DEV DG_CUDA
#define MAXBLK 256
#define CANARY 0x5a5aa5a5deadbeefull

static struct {
  char *p[MAXBLK];
  size_t n[MAXBLK];
  int nblk, allocs, frees, copies, zero, fill, add, mcopy;
} g;

static void *fake_alloc(int dev, size_t bytes) {
  CHECK_EQ_INT(dev, DEV);
  if (g.nblk == MAXBLK) return NULL;
  char *p = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
  if (!p) return NULL;
  for (size_t i = 0; i + 8 <= bytes && i < 64; i += 8) memcpy(p + i, &(uint64_t){CANARY}, 8);
  g.p[g.nblk] = p;
  g.n[g.nblk++] = bytes;
  g.allocs++;
  return p;
}

static void fake_free(int dev, void *p, size_t bytes) {
  (void)dev, (void)bytes;
  for (int i = 0; i < g.nblk; i++)
    if (g.p[i] == p) {
      g.p[i] = g.p[--g.nblk];
      g.n[i] = g.n[g.nblk];
      g.frees++;
      free(p);
      return;
    }
  T_FAIL_("raw_free of %p: not a block of the device", p);
}

/* 1 when [p, p + bytes) lies in one block of the stand-in device. */
static int on_device(const void *p, size_t bytes) {
  for (int i = 0; i < g.nblk; i++)
    if ((const char *)p >= g.p[i] && (const char *)p + bytes <= g.p[i] + g.n[i]) return 1;
  return 0;
}

static int fake_copy(void *dst, int ddev, const void *src, int sdev, size_t bytes) {
  CHECK(ddev == DEV || sdev == DEV);
  CHECK(ddev != DEV || on_device(dst, bytes));
  CHECK(sdev != DEV || on_device(src, bytes));
  g.copies++;
  memmove(dst, src, bytes);
  return DG_OK;
}

static const struct dg__kern_mem *cpu_mem;
static void fake_zero(void *p, size_t bytes) {
  CHECK(on_device(p, bytes));
  g.zero++;
  cpu_mem->zero(p, bytes);
}
static void fake_fill(float *p, int64_t n, float v) {
  g.fill++;
  cpu_mem->fill_f32(p, n, v);
}
static void fake_add(float *y, const float *x, int64_t n) {
  CHECK(on_device(y, (size_t)n * sizeof *y));
  g.add++;
  cpu_mem->add_f32(y, x, n);
}
static void fake_mcopy(const dg__mem_copy_args *a) {
  g.mcopy++;
  cpu_mem->copy(a);
}

static struct dg__kern_mem fake_mem;
static dg__backend fake;

static void register_fake(void) {
  cpu_mem = dg__cpu_backend.mem;
  fake_mem = (struct dg__kern_mem){fake_zero, fake_fill, fake_add, fake_mcopy};
  fake = dg__cpu_backend; /* the CPU's kernel tables: the memory is host-addressable */
  fake.name = "stand-in";
  fake.raw_alloc = fake_alloc;
  fake.raw_free = fake_free;
  fake.copy = fake_copy;
  fake.mem = &fake_mem;
  REQUIRE(dg__backend_register(DEV, &fake) == DG_OK);
  CHECK_EQ_INT(dg__backend_register(DG_CPU, &fake), DG_EINVAL);
}

static int canary_ok(const void *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v == CANARY;
}

static void test_cache_host_bookkeeping(void) {
  dg_mem_stats s0, s1, c0, c1;
  CHECK_OK(dg_mem_get_stats(DEV, &s0));
  CHECK_OK(dg_mem_get_stats(DG_CPU, &c0));
  void *a = dg__dev_alloc(DEV, 1000), *b = dg__dev_alloc(DEV, 1000);
  REQUIRE(a && b && on_device(a, 1000) && on_device(b, 1000));
  dg__dev_free(DEV, a, 1000);
  dg__dev_free(DEV, b, 1000);
  /* the old cache linked free blocks through their first bytes */
  CHECK(canary_ok(a) && canary_ok(b));
  int allocs = g.allocs;
  void *a2 = dg__dev_alloc(DEV, 1000), *b2 = dg__dev_alloc(DEV, 900);
  CHECK((a2 == a && b2 == b) || (a2 == b && b2 == a)); /* served from the cache */
  CHECK_EQ_INT(g.allocs, allocs);
  CHECK(canary_ok(a2) && canary_ok(b2));
  CHECK_OK(dg_mem_get_stats(DEV, &s1));
  CHECK_EQ_INT(s1.current_bytes - s0.current_bytes, 2048); /* two 1 KiB classes */
  CHECK_EQ_INT(s1.system_allocs - s0.system_allocs, 2);
  CHECK_OK(dg_mem_get_stats(DG_CPU, &c1));
  CHECK_EQ_INT(c1.current_bytes, c0.current_bytes); /* per-device statistics */
  dg__dev_free(DEV, a2, 1000);
  dg__dev_free(DEV, b2, 900);
  int frees = g.frees;
  dg_mem_empty_cache(DEV);
  CHECK_EQ_INT(g.frees - frees, 2);
  CHECK_OK(dg_mem_get_stats(DEV, &s1));
  CHECK_EQ_INT(s1.cached_bytes, 0);
}

/* A device arena tensor holding host values (through the backend's copy). */
static dg_tensor *to_dev(dg_ctx *ctx, int ndim, const int64_t *shape, const float *v) {
  ctx->op_device = DEV;
  dg_tensor *t = dg__new(ctx, "to_dev", DG_F32, ndim, shape);
  REQUIRE(t != NULL);
  dg_tensor *h = NULL;
  REQUIRE(dg_tensor_new(&h, DG_F32, ndim, shape, NULL, 0) == DG_OK);
  memcpy(dg_tensor_data(h), v, (size_t)dg_tensor_numel(h) * sizeof *v);
  int copies = g.copies;
  CHECK_OK(dg_tensor_copy(t, h, NULL, 0));
  CHECK_EQ_INT(g.copies - copies, 1);
  dg_tensor_free(h);
  return t;
}

/* loss = sum(gelu(x w^T + b) * x2) on `dev` tensors; returns loss and the
 * gradients of w and x (host copies). */
static float run_model(int dev, float *gw, float *gx) {
  static const float xv[12] = {0.5f, -1, 2, 0.25f, 1, -0.5f, 0, 3, -2, 1.5f, 0.75f, -0.25f};
  static const float wv[8] = {0.1f, -0.2f, 0.3f, 0.05f, -0.4f, 0.2f, 0.15f, -0.1f};
  static const float bv[2] = {0.01f, -0.02f};
  dg_ctx *ctx;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  dg_tensor *x, *w, *b;
  int64_t xs[2] = {3, 4}, ws[2] = {2, 4}, bs[1] = {2};
  if (dev == DEV) {
    x = to_dev(ctx, 2, xs, xv), w = to_dev(ctx, 2, ws, wv), b = to_dev(ctx, 1, bs, bv);
  } else {
    x = dg_from_data(ctx, DG_F32, 2, xs, xv), w = dg_from_data(ctx, DG_F32, 2, ws, wv);
    b = dg_from_data(ctx, DG_F32, 1, bs, bv);
  }
  dg_tensor_set_requires_grad(x, 1);
  dg_tensor_set_requires_grad(w, 1);
  dg_tensor *h = dg_gelu(ctx, dg_linear(ctx, x, w, b)); /* (3, 2) */
  dg_tensor *ht = dg_transpose(ctx, h, 0, 1);           /* strided: packed by the op */
  dg_tensor *loss = dg_sum(ctx, dg_mul(ctx, dg_contiguous(ctx, ht), dg_contiguous(ctx, ht)));
  REQUIRE(loss != NULL);
  CHECK_EQ_INT(dg_tensor_device(loss), dev);
  CHECK_EQ_INT(dg_tensor_device(h), dev);
  if (dev == DEV) CHECK(on_device(dg_tensor_data(h), 6 * sizeof(float)));
  REQUIRE(dg_backward(ctx, loss) == DG_OK);
  float l = dg_tensor_item(loss); /* an element read through the device's copy */
  dg_tensor *g_w = dg_tensor_grad(w), *g_x = dg_tensor_grad(x);
  REQUIRE(g_w && g_x);
  CHECK_EQ_INT(dg_tensor_device(g_w), dev);
  if (dev == DEV) CHECK(on_device(dg_tensor_data(g_w), 8 * sizeof(float)));
  for (int i = 0; i < 8; i++) gw[i] = (float)dg_tensor_get(g_w, i);
  for (int i = 0; i < 12; i++) gx[i] = (float)dg_tensor_get(g_x, i);
  /* a conversion on the device stays there */
  dg_tensor *xb = dg_to_dtype(ctx, x, DG_BF16);
  REQUIRE(xb != NULL);
  CHECK_EQ_INT(dg_tensor_device(xb), dev);
  CHECK(fabs(dg_tensor_get(xb, 3) - 0.25) < 1e-6);
  if (dev == DEV) {
    /* a device tensor does not mix with a host one */
    dg_tensor *hcpu = dg_zeros(ctx, DG_F32, 2, (int64_t[]){3, 2});
    CHECK(dg_add(ctx, h, hcpu) == NULL);
    CHECK_EQ_INT(dg_ctx_errcode(ctx), DG_EDEVICE);
    CHECK_STR_HAS(dg_ctx_errmsg(ctx), "cuda:0");
    CHECK_STR_HAS(dg_ctx_errmsg(ctx), "cpu");
    /* the second step reuses the device arena: no new device memory */
    dg_ctx_reset(ctx);
    size_t host_reserved = dg_ctx_arena_reserved(ctx);
    int allocs = g.allocs;
    dg_tensor *y = to_dev(ctx, 2, xs, xv);
    dg_tensor *z = dg_relu(ctx, y);
    REQUIRE(z != NULL);
    CHECK_EQ_INT(g.allocs, allocs);
    CHECK_EQ_INT(dg_ctx_arena_reserved(ctx), host_reserved);
  }
  dg_ctx_free(ctx);
  return l;
}

static void test_ops_on_device(void) {
  float gw_c[8], gx_c[12], gw_d[8], gx_d[12];
  float lc = run_model(DG_CPU, gw_c, gx_c);
  int zero = g.zero, add = g.add, mcopy = g.mcopy;
  float ld = run_model(DEV, gw_d, gx_d);
  CHECK(lc == ld);
  for (int i = 0; i < 8; i++) CHECK(gw_c[i] == gw_d[i]);
  for (int i = 0; i < 12; i++) CHECK(gx_c[i] == gx_d[i]);
  CHECK(g.add > add);     /* the loss gradient was seeded by the device */
  CHECK(g.zero >= zero);  /* zeroing (when a gradient starts stale) is the device's */
  CHECK(g.mcopy > mcopy); /* packing, conversion and element reads too */
}

int main(void) {
  register_fake();
  test_cache_host_bookkeeping();
  test_ops_on_device();
  dg__backend_register(DEV, NULL);
  return TEST_DONE();
}
