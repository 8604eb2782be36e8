/* IDX reader (the MNIST file format): magic 00 00 <type> <ndim>, ndim
 * big-endian u32 dims, then the elements big-endian. Raw or gzip (zlib). */
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "data/data_impl.h"
#include "dgrad_config.h"
#if DG_HAVE_ZLIB
#include <zlib.h>
#endif

#define IDX_MAX_BYTES ((size_t)1 << 40)


const char *dg_idx_type_name(int type) {
  switch (type) {
  case DG_IDX_U8: return "u8";
  case DG_IDX_I8: return "i8";
  case DG_IDX_I16: return "i16";
  case DG_IDX_I32: return "i32";
  case DG_IDX_F32: return "f32";
  case DG_IDX_F64: return "f64";
  default: return "?";
  }
}

static size_t type_size(int type) {
  switch (type) {
  case DG_IDX_U8: case DG_IDX_I8: return 1;
  case DG_IDX_I16: return 2;
  case DG_IDX_I32: case DG_IDX_F32: return 4;
  case DG_IDX_F64: return 8;
  default: return 0;
  }
}

void dg_idx_free(dg_idx_array *a) {
  if (!a) return;
  dg__free(a->data);
  memset(a, 0, sizeof *a);
}

/* A byte source: stdio for raw files, zlib for gzip. */
typedef struct {
  const char *path;
  FILE *f;
#if DG_HAVE_ZLIB
  gzFile gz;
#endif
  int is_gz;
  char *err;
  size_t errcap;
} src;

/* Reads up to n bytes; *got receives the count. Fails only on a read error
 * or corrupt compressed data (a short read is the caller's to judge). */
static int src_read(src *s, void *buf, size_t n, size_t *got) {
  *got = 0;
  if (!s->is_gz) {
    *got = fread(buf, 1, n, s->f);
    if (*got < n && ferror(s->f))
      return dg__fail_msg(s->err, s->errcap, DG_EIO, "%s: read error: %s", s->path,
                          strerror(errno));
    return DG_OK;
  }
#if DG_HAVE_ZLIB
  while (*got < n) {
    size_t want = DG_MIN(n - *got, (size_t)1 << 30);
    int r = gzread(s->gz, (char *)buf + *got, (unsigned)want);
    int zerr = Z_OK;
    const char *msg = r < 0 || (size_t)r < want ? gzerror(s->gz, &zerr) : "";
    if (r > 0) *got += (size_t)r;
    size_t pl = strlen(s->path); /* zlib prefixes its message with the path */
    if (msg && !strncmp(msg, s->path, pl) && !strncmp(msg + pl, ": ", 2)) msg += pl + 2;
    if (r < 0 || (zerr != Z_OK && zerr != Z_BUF_ERROR))
      return dg__fail_msg(s->err, s->errcap, DG_EFORMAT, "%s: corrupt gzip data (%s)",
                          s->path, msg && *msg ? msg : "zlib error");
    if (zerr == Z_BUF_ERROR)
      return dg__fail_msg(s->err, s->errcap, DG_EFORMAT,
                          "%s: truncated gzip stream (%s) after %zu bytes of data", s->path,
                          msg, *got);
    if (r == 0 || (size_t)r < want) break;
  }
#endif
  return DG_OK;
}

static int src_open(src *s, const char *path, char *err, size_t errcap) {
  memset(s, 0, sizeof *s);
  s->path = path;
  s->err = err;
  s->errcap = errcap;
  s->f = fopen(path, "rb");
  if (!s->f)
    return dg__fail_msg(err, errcap, DG_EIO, "%s: cannot open: %s", path, strerror(errno));
  unsigned char m[2] = {0, 0};
  size_t k = fread(m, 1, 2, s->f);
  size_t len = strlen(path);
  int gz_name = len > 3 && !strcmp(path + len - 3, ".gz");
  s->is_gz = k == 2 && m[0] == 0x1f && m[1] == 0x8b;
  if (gz_name && !s->is_gz)
    return dg__fail_msg(err, errcap, DG_EFORMAT,
                        "%s: named .gz but does not start with the gzip magic 1f 8b", path);
  if (!s->is_gz) {
    rewind(s->f);
    return DG_OK;
  }
#if DG_HAVE_ZLIB
  fclose(s->f);
  s->f = NULL;
  s->gz = gzopen(path, "rb");
  if (!s->gz)
    return dg__fail_msg(err, errcap, DG_EIO, "%s: cannot open: %s", path, strerror(errno));
  return DG_OK;
#else
  return dg__fail_msg(err, errcap, DG_EUNSUPPORTED,
                      "%s: gzip-compressed, but dgrad was built without zlib", path);
#endif
}

static void src_close(src *s) {
  if (s->f) fclose(s->f);
#if DG_HAVE_ZLIB
  if (s->gz) gzclose(s->gz);
#endif
}

static uint32_t be32(const unsigned char *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static int read_header(src *s, dg_idx_array *a) {
  unsigned char h[4 + 4 * DG_IDX_MAX_DIMS];
  size_t got;
  int rc = src_read(s, h, 4, &got);
  if (rc) return rc;
  if (got < 4)
    return dg__fail_msg(s->err, s->errcap, DG_EFORMAT,
                        "%s: truncated: %zu bytes, too short for an IDX header", s->path, got);
  if (h[0] || h[1] || !type_size(h[2]) || h[3] == 0 || h[3] > DG_IDX_MAX_DIMS)
    return dg__fail_msg(s->err, s->errcap, DG_EFORMAT,
                        "%s: bad IDX magic %02x %02x %02x %02x (expected 00 00, a type byte "
                        "08/09/0b/0c/0d/0e, 1..%d dims)",
                        s->path, h[0], h[1], h[2], h[3], DG_IDX_MAX_DIMS);
  a->type = (dg_idx_type)h[2];
  a->ndim = h[3];
  a->elem_size = type_size(h[2]);
  rc = src_read(s, h + 4, 4 * (size_t)a->ndim, &got);
  if (rc) return rc;
  if (got < 4 * (size_t)a->ndim)
    return dg__fail_msg(s->err, s->errcap, DG_EFORMAT,
                        "%s: truncated inside the header (%d dims declared)", s->path, a->ndim);
  a->count = 1;
  for (int i = 0; i < a->ndim; i++) {
    a->dims[i] = be32(h + 4 + 4 * i);
    if (a->dims[i] && a->count > IDX_MAX_BYTES / (size_t)a->dims[i])
      return dg__fail_msg(s->err, s->errcap, DG_EFORMAT, "%s: header declares an absurd size",
                          s->path);
    a->count *= (size_t)a->dims[i];
  }
  if (a->count > IDX_MAX_BYTES / a->elem_size)
    return dg__fail_msg(s->err, s->errcap, DG_EFORMAT, "%s: header declares an absurd size",
                        s->path);
  return DG_OK;
}

/* "60000 x 28 x 28 u8" */
static void shape_str(const dg_idx_array *a, char *buf, size_t cap) {
  size_t k = 0;
  buf[0] = 0;
  for (int i = 0; i < a->ndim && k < cap; i++)
    k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? " x " : "", (long long)a->dims[i]);
  if (k < cap) snprintf(buf + k, cap - k, " %s", dg_idx_type_name(a->type));
}

/* Reads exactly `bytes` of data (growing the buffer as data actually
 * arrives, so a corrupt header cannot make us allocate more than twice what
 * the file holds), then checks that nothing follows. */
static int read_data(src *s, dg_idx_array *a, size_t bytes) {
  char shp[160];
  size_t cap = DG_MIN(bytes, (size_t)1 << 24), have = 0, got;
  unsigned char *buf = dg__malloc(cap ? cap : 1);
  if (!buf) return dg__fail_msg(s->err, s->errcap, DG_ENOMEM, "%s: out of memory", s->path);
  int rc = DG_OK;
  while (have < bytes) {
    if (have == cap) {
      size_t ncap = DG_MIN(bytes, cap * 2);
      unsigned char *nb = dg__realloc(buf, ncap);
      if (!nb) {
        rc = dg__fail_msg(s->err, s->errcap, DG_ENOMEM, "%s: out of memory", s->path);
        break;
      }
      buf = nb;
      cap = ncap;
    }
    size_t want = cap - have;
    rc = src_read(s, buf + have, want, &got);
    have += got;
    if (rc || got < want) break; /* error or end of file */
  }
  if (!rc && have < bytes) {
    shape_str(a, shp, sizeof shp);
    rc = dg__fail_msg(s->err, s->errcap, DG_EFORMAT,
                      "%s: truncated: the header declares %s (%zu bytes of data) but only "
                      "%zu bytes follow it", s->path, shp, bytes, have);
  }
  unsigned char extra;
  if (!rc && (rc = src_read(s, &extra, 1, &got)) == DG_OK && got)
    rc = dg__fail_msg(s->err, s->errcap, DG_EFORMAT,
                      "%s: corrupt: data continues past the %zu bytes the header declares",
                      s->path, bytes);
  if (rc) {
    dg__free(buf);
    return rc;
  }
  a->data = buf;
  return DG_OK;
}

/* Big-endian elements to host order, in place. */
static void decode_be(dg_idx_array *a) {
  const uint16_t probe = 1;
  if (a->elem_size == 1 || *(const unsigned char *)&probe == 0) return;
  unsigned char *p = a->data;
  for (size_t i = 0; i < a->count; i++, p += a->elem_size)
    for (size_t j = 0; j < a->elem_size / 2; j++) {
      unsigned char t = p[j];
      p[j] = p[a->elem_size - 1 - j];
      p[a->elem_size - 1 - j] = t;
    }
}

int dg_idx_read(dg_idx_array *out, const char *path, char *err, size_t errcap) {
  if (err && errcap) err[0] = 0;
  if (!out) return dg__fail_msg(err, errcap, DG_EINVAL, "idx_read: NULL output");
  memset(out, 0, sizeof *out);
  if (!path) return dg__fail_msg(err, errcap, DG_EINVAL, "idx_read: NULL path");
  src s;
  int rc = src_open(&s, path, err, errcap);
  dg_idx_array a;
  memset(&a, 0, sizeof a);
  if (!rc) rc = read_header(&s, &a);
  size_t bytes = a.count * a.elem_size;
  if (!rc && !s.is_gz) { /* raw: check the size before allocating */
    struct stat st;
    size_t hdr = 4 + 4 * (size_t)a.ndim;
    if (fstat(fileno(s.f), &st) == 0 && (size_t)st.st_size < hdr + bytes) {
      char shp[160];
      shape_str(&a, shp, sizeof shp);
      rc = dg__fail_msg(err, errcap, DG_EFORMAT,
                        "%s: truncated: the header declares %s (%zu bytes of data) but only "
                        "%zu bytes follow it", path, shp, bytes, (size_t)st.st_size - hdr);
    }
  }
  if (!rc) rc = read_data(&s, &a, bytes);
  src_close(&s);
  if (rc) return rc;
  decode_be(&a);
  *out = a;
  return DG_OK;
}
