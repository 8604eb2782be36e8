/* Status codes, dtypes, half-precision conversion, logging and the
 * allocator hook. */
#include <stdatomic.h>
#include <string.h>

#include "base/common_impl.h"

const char *dg_version(void) { return "0.1.0"; }
unsigned dg_version_hex(void) { return DG_VERSION_HEX; }

const char *dg_strerror(int code) {
  switch (code) {
    case DG_OK: return "ok";
#define DG__ERR_STR(name, val, msg) \
  case DG_##name: return msg;
    DG_ERRNO_MAP(DG__ERR_STR)
#undef DG__ERR_STR
    default: return "unknown error";
  }
}

const char *dg_err_name(int code) {
  switch (code) {
    case DG_OK: return "DG_OK";
#define DG__ERR_NAME(name, val, msg) \
  case DG_##name: return "DG_" #name;
    DG_ERRNO_MAP(DG__ERR_NAME)
#undef DG__ERR_NAME
    default: return "DG_UNKNOWN";
  }
}

size_t dg_dtype_size(dg_dtype dt) {
  static const size_t sz[DG_NDTYPES] = {4, 2, 2, 4, 8, 8};
  return (unsigned)dt < DG_NDTYPES ? sz[dt] : 0;
}

const char *dg_dtype_name(dg_dtype dt) {
  static const char *nm[DG_NDTYPES] = {"f32", "f16", "bf16", "i32", "i64", "f64"};
  return (unsigned)dt < DG_NDTYPES ? nm[dt] : "?";
}

/* ---- half precision (round to nearest even) ---- */

static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

uint16_t dg_f32_to_bf16(float f) {
  uint32_t u = f2u(f);
  /* NaN: the canonical quiet NaN, sign kept, payload dropped (one rule for
   * every path; see common.h) */
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(((u >> 16) & 0x8000u) | 0x7fc0u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

float dg_bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

uint16_t dg_f32_to_f16(float f) {
  uint32_t u = f2u(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) /* inf, or NaN as the canonical quiet NaN with its sign */
    return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0));
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow -> inf */
  if (a < 0x38800000u) { /* subnormal or zero in f16 */
    /* add magic so the FPU rounds the mantissa for us */
    float r = u2f(a) + 0.5f;
    return (uint16_t)(sign | (f2u(r) - 0x3f000000u));
  }
  uint32_t mant_odd = (a >> 13) & 1u;
  a += ((uint32_t)(15 - 127) << 23) + 0xfffu + mant_odd;
  return (uint16_t)(sign | (a >> 13));
}

float dg_f16_to_f32(uint16_t h) {
  uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) { /* zero / subnormal: m * 2^-24 */
    float r = (float)m * (1.0f / 16777216.0f);
    return u2f(f2u(r) | sign);
  }
  if (e == 31) return u2f(sign | 0x7f800000u | (m << 13));
  return u2f(sign | ((e + 112u) << 23) | (m << 13));
}

/* ---- allocator hook ---- */

static dg_malloc_fn g_malloc = malloc;
static dg_realloc_fn g_realloc = realloc;
static dg_free_fn g_free = free;
static atomic_ullong g_nalloc;

int dg_set_allocator(dg_malloc_fn m, dg_realloc_fn r, dg_free_fn f) {
  if (!m && !r && !f) {
    g_malloc = malloc, g_realloc = realloc, g_free = free;
    return DG_OK;
  }
  if (!m || !r || !f) return DG_EINVAL;
  g_malloc = m, g_realloc = r, g_free = f;
  return DG_OK;
}

void *dg__malloc(size_t n) {
  atomic_fetch_add_explicit(&g_nalloc, 1, memory_order_relaxed);
  return g_malloc(n ? n : 1);
}

void *dg__calloc(size_t count, size_t n) {
  if (n && count > SIZE_MAX / n) return NULL;
  void *p = dg__malloc(count * n);
  if (p) memset(p, 0, count * n);
  return p;
}

void *dg__realloc(void *p, size_t n) {
  atomic_fetch_add_explicit(&g_nalloc, 1, memory_order_relaxed);
  return g_realloc(p, n ? n : 1);
}

void dg__free(void *p) {
  if (p) g_free(p);
}

char *dg__strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = dg__malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

uint64_t dg__alloc_count(void) {
  return atomic_load_explicit(&g_nalloc, memory_order_relaxed);
}

/* ---- logging ---- */

static dg_log_fn g_log_fn;
static void *g_log_user;
static atomic_int g_log_level = -1;

void dg_set_log_fn(dg_log_fn fn, void *user) {
  g_log_fn = fn;
  g_log_user = user;
}

void dg_set_log_level(dg_log_level level) { atomic_store(&g_log_level, (int)level); }

dg_log_level dg_get_log_level(void) {
  int lv = atomic_load(&g_log_level);
  if (lv >= 0) return (dg_log_level)lv;
  const char *e = getenv("DG_LOG");
  lv = DG_LOG_WARN;
  if (e) {
    if (!strcmp(e, "error")) lv = DG_LOG_ERROR;
    else if (!strcmp(e, "info")) lv = DG_LOG_INFO;
    else if (!strcmp(e, "debug")) lv = DG_LOG_DEBUG;
  }
  atomic_store(&g_log_level, lv);
  return (dg_log_level)lv;
}

void dg__vfmt(char *buf, size_t cap, const char *fmt, va_list ap) {
  if (!cap) return;
  int n = vsnprintf(buf, cap, fmt, ap);
  if (n < 0) buf[0] = 0;
}

int dg__fail_msg(char *err, size_t cap, int code, const char *fmt, ...) {
  if (err && cap) {
    va_list ap;
    va_start(ap, fmt);
    dg__vfmt(err, cap, fmt, ap);
    va_end(ap);
  }
  return code;
}

void dg__log(dg_log_level level, const char *fmt, ...) {
  if (level > dg_get_log_level()) return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  dg__vfmt(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (g_log_fn) {
    g_log_fn(g_log_user, level, msg);
    return;
  }
  static const char *names[] = {"error", "warn", "info", "debug"};
  fprintf(stderr, "dgrad %s: %s\n", names[level], msg);
}

_Noreturn void dg__assert_fail(const char *expr, const char *file, int line) {
  fprintf(stderr, "dgrad: internal invariant failed: %s (%s:%d)\n", expr, file, line);
  abort();
}
