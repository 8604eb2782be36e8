/* Checkpoints in the safetensors format: atomic save, validating streaming
 * load. See include/dgrad/checkpoint.h for the layout. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dgrad/checkpoint.h"
#include "base/common_impl.h"

#define CK_MAX_HEADER (100u << 20) /* as the safetensors reference reader */
#define CK_MAX_DIMS 8
#define CK_VERSION "1"


static int host_is_le(void) {
  const uint16_t one = 1;
  return *(const uint8_t *)&one == 1;
}

static void swap32(void *p, size_t n) { /* n 4-byte words in place */
  uint8_t *b = p;
  for (size_t i = 0; i < n; i++, b += 4) {
    uint8_t t = b[0];
    b[0] = b[3], b[3] = t, t = b[1], b[1] = b[2], b[2] = t;
  }
}

static void shape_str(char *buf, size_t cap, int ndim, const int64_t *shape) {
  size_t k = (size_t)snprintf(buf, cap, "(");
  for (int d = 0; d < ndim && k < cap; d++)
    k += (size_t)snprintf(buf + k, cap - k, d ? ", %" PRId64 : "%" PRId64, shape[d]);
  if (k < cap) snprintf(buf + k, cap - k, ndim == 1 ? ",)" : ")");
}

/* ---- growable string (header writer) ---- */

typedef struct {
  char *p;
  size_t n, cap;
  int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < b->n + n + 1) cap *= 2;
    char *p = dg__realloc(b->p, cap);
    if (!p) {
      b->oom = 1;
      return;
    }
    b->p = p, b->cap = cap;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
  char tmp[256];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= sizeof tmp) b->oom = 1; /* only short numbers go here */
  else sb_put(b, tmp, (size_t)n);
}

/* A JSON string literal. */
static void sb_str(sbuf *b, const char *s) {
  sb_put(b, "\"", 1);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') {
      char e[2] = {'\\', (char)c};
      sb_put(b, e, 2);
    } else if (c < 0x20) {
      sb_printf(b, "\\u%04x", c);
    } else {
      sb_put(b, (const char *)&c, 1);
    }
  }
  sb_put(b, "\"", 1);
}

/* ---- save ---- */

/* One tensor of the file: where its data live in memory. */
static void hdr_tensor(sbuf *b, const char *prefix, const dg_tensor *t, uint64_t *off) {
  char name[512];
  snprintf(name, sizeof name, "%s%s", prefix, dg_tensor_name(t));
  uint64_t bytes = (uint64_t)dg_tensor_numel(t) * 4;
  sb_put(b, b->n > 1 ? "," : "", b->n > 1);
  sb_str(b, name);
  sb_put(b, ":{\"dtype\":\"F32\",\"shape\":[", 25);
  for (int d = 0; d < dg_tensor_ndim(t); d++)
    sb_printf(b, d ? ",%" PRId64 : "%" PRId64, dg_tensor_dim(t, d));
  sb_printf(b, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", *off, *off + bytes);
  *off += bytes;
}

static void hdr_meta_kv(sbuf *b, const char *k, const char *v, int *first) {
  sb_put(b, *first ? "" : ",", !*first);
  *first = 0;
  sb_str(b, k);
  sb_put(b, ":", 1);
  sb_str(b, v);
}

static void hdr_meta(sbuf *b, const dg_checkpoint *c) {
  char v[64];
  int first = 1;
  if (b->n > 1) sb_put(b, ",", 1);
  sb_put(b, "\"__metadata__\":{", 16);
  hdr_meta_kv(b, "format", "dgrad", &first);
  hdr_meta_kv(b, "dgrad_ckpt_version", CK_VERSION, &first);
  hdr_meta_kv(b, "dgrad_version", dg_version(), &first);
  snprintf(v, sizeof v, "%" PRId64, c->step);
  hdr_meta_kv(b, "step", v, &first);
  if (c->ctx) {
    uint64_t seed, off;
    dg_ctx_rng_state(c->ctx, &seed, &off);
    snprintf(v, sizeof v, "%" PRIu64, seed);
    hdr_meta_kv(b, "rng_seed", v, &first);
    snprintf(v, sizeof v, "%" PRIu64, off);
    hdr_meta_kv(b, "rng_offset", v, &first);
  }
  if (c->loader) {
    int64_t ep, bt;
    dg_loader_position(c->loader, &ep, &bt);
    snprintf(v, sizeof v, "%" PRId64, ep);
    hdr_meta_kv(b, "data_epoch", v, &first);
    snprintf(v, sizeof v, "%" PRId64, bt);
    hdr_meta_kv(b, "data_batch", v, &first);
    dg_loader_tell(c->loader, &ep, &bt); /* any world size resumes from it */
    snprintf(v, sizeof v, "%" PRId64, bt);
    hdr_meta_kv(b, "data_samples", v, &first);
  }
  if (c->optim) {
    hdr_meta_kv(b, "optim", dg_optim_name(c->optim), &first);
    snprintf(v, sizeof v, "%.9g", (double)dg_optim_lr(c->optim));
    hdr_meta_kv(b, "optim_lr", v, &first);
    snprintf(v, sizeof v, "%" PRId64, dg_optim_step_count(c->optim));
    hdr_meta_kv(b, "optim_step", v, &first);
  }
  for (int i = 0; i < c->nextra; i++) hdr_meta_kv(b, c->extra_keys[i], c->extra_vals[i], &first);
  sb_put(b, "}}", 2);
}

static int optim_state_name(dg_optim *o, int k, char *buf, size_t cap) {
  const char *name;
  float *sb;
  size_t n;
  int rc = dg_optim_state_get(o, k, &name, &sb, &n);
  if (!rc) snprintf(buf, cap, "optim.%s.", name);
  return rc;
}

/* Header JSON padded with spaces to a multiple of 8. */
static int build_header(const dg_checkpoint *c, sbuf *b) {
  dg_params *ps = c->params;
  uint64_t off = 0;
  sb_put(b, "{", 1);
  for (int i = 0; i < dg_params_count(ps); i++) hdr_tensor(b, "", dg_params_get(ps, i), &off);
  for (int i = 0; i < dg_params_buffer_count(ps); i++) /* buffers: by name, as torch's */
    hdr_tensor(b, "", dg_params_buffer_get(ps, i), &off);
  int ns = c->optim ? dg_optim_state_count(c->optim) : 0;
  for (int k = 0; k < ns; k++) {
    char pre[128];
    int rc = optim_state_name(c->optim, k, pre, sizeof pre);
    if (rc) return rc;
    for (int i = 0; i < dg_params_count(ps); i++) hdr_tensor(b, pre, dg_params_get(ps, i), &off);
  }
  hdr_meta(b, c);
  while (!b->oom && b->n % 8) sb_put(b, " ", 1);
  return b->oom ? DG_ENOMEM : DG_OK;
}

static int write_all(int fd, const void *p, size_t n) {
  const char *s = p;
  while (n) {
    ssize_t w = write(fd, s, n > (1u << 30) ? (1u << 30) : n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return w < 0 ? errno : EIO;
    s += w, n -= (size_t)w;
  }
  return 0;
}

/* n floats, little-endian. Returns an errno value or 0. */
static int write_f32(int fd, const float *p, size_t n) {
  if (host_is_le()) return write_all(fd, p, n * 4);
  float tmp[4096];
  for (size_t i = 0; i < n; i += 4096) {
    size_t k = DG_MIN(n - i, (size_t)4096);
    memcpy(tmp, p + i, k * 4);
    swap32(tmp, k);
    int e = write_all(fd, tmp, k * 4);
    if (e) return e;
  }
  return 0;
}

static int write_body(int fd, const dg_checkpoint *c, const sbuf *hdr) {
  uint8_t len[8];
  for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)hdr->n >> (8 * i));
  int e = write_all(fd, len, 8);
  if (!e) e = write_all(fd, hdr->p, hdr->n);
  dg_params *ps = c->params;
  for (int i = 0; !e && i < dg_params_count(ps); i++) {
    dg_tensor *t = dg_params_get(ps, i);
    e = write_f32(fd, dg_tensor_data(t), (size_t)dg_tensor_numel(t));
  }
  for (int i = 0; !e && i < dg_params_buffer_count(ps); i++) {
    dg_tensor *t = dg_params_buffer_get(ps, i);
    e = write_f32(fd, dg_tensor_data(t), (size_t)dg_tensor_numel(t));
  }
  int ns = c->optim ? dg_optim_state_count(c->optim) : 0;
  for (int k = 0; !e && k < ns; k++) {
    const char *name;
    float *buf;
    size_t n;
    if (dg_optim_state_get(c->optim, k, &name, &buf, &n)) return EINVAL;
    for (int i = 0; !e && i < dg_params_count(ps); i++)
      e = write_f32(fd, buf + dg_params_offset(ps, i),
                    (size_t)dg_tensor_numel(dg_params_get(ps, i)));
  }
  return e;
}

static int fsync_dir_of(const char *path) {
  char dir[4096];
  const char *slash = strrchr(path, '/');
  if (!slash) snprintf(dir, sizeof dir, ".");
  else if (slash == path) snprintf(dir, sizeof dir, "/");
  else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  if (fd < 0) return errno;
  int e = fsync(fd) ? errno : 0;
  close(fd);
  return e == EINVAL ? 0 : e; /* some file systems cannot sync a directory */
}

static int check_save_args(const char *path, const dg_checkpoint *c, char *err, size_t cap) {
  if (!path || !*path || !c || !c->params)
    return dg__fail_msg(err, cap, DG_EINVAL, "checkpoint save: path and params are required");
  if (c->nextra < 0 || (c->nextra && (!c->extra_keys || !c->extra_vals)))
    return dg__fail_msg(err, cap, DG_EINVAL, "checkpoint save: bad extra metadata");
  for (int i = 0; i < c->nextra; i++)
    if (!c->extra_keys[i] || !c->extra_vals[i] || !strncmp(c->extra_keys[i], "__", 2))
      return dg__fail_msg(err, cap, DG_EINVAL, "checkpoint save: bad extra metadata key %d", i);
  return DG_OK;
}

int dg_checkpoint_save(const char *path, const dg_checkpoint *c, char *err, size_t errcap) {
  int rc = check_save_args(path, c, err, errcap);
  if (rc) return rc;
  sbuf hdr = {0};
  if ((rc = build_header(c, &hdr))) {
    dg__free(hdr.p);
    return dg__fail_msg(err, errcap, rc, "%s: cannot build the header (%s)", path, dg_strerror(rc));
  }
  size_t plen = strlen(path);
  char *tmp = dg__malloc(plen + 16);
  if (!tmp) {
    dg__free(hdr.p);
    return dg__fail_msg(err, errcap, DG_ENOMEM, "%s: out of memory", path);
  }
  snprintf(tmp, plen + 16, "%s.tmp.XXXXXX", path);
  int fd = mkstemp(tmp), e = 0;
  const char *what = "create a temporary file for";
  if (fd < 0) e = errno;
  if (!e) fchmod(fd, 0644);
  if (!e && (e = write_body(fd, c, &hdr))) what = "write";
  if (!e && fsync(fd)) e = errno, what = "fsync";
  if (fd >= 0 && close(fd) && !e) e = errno, what = "close";
  if (!e && rename(tmp, path)) e = errno, what = "rename the temporary file over";
  if (!e && (e = fsync_dir_of(path))) what = "fsync the directory of";
  if (e && fd >= 0 && strcmp(what, "fsync the directory of")) unlink(tmp);
  dg__free(hdr.p);
  dg__free(tmp);
  if (e)
    return dg__fail_msg(err, errcap, DG_EIO, "%s: cannot %s it: %s (the previous checkpoint, if "
                  "any, is intact)", path, what, strerror(e));
  return DG_OK;
}

/* ---- header parsing ---- */

typedef struct {
  char *name;
  char *dtype;
  int ndim;
  int64_t shape[CK_MAX_DIMS];
  uint64_t begin, end;
  /* resolved target: dst (NULL: skip), numel */
  float *dst;
  int64_t numel;
} ck_entry;

typedef struct {
  char *s; /* header text, decoded in place */
  size_t n, i;
  ck_entry *ents;
  int nents, capents;
  char **meta; /* key, value, key, value, ... */
  int nmeta, capmeta;
  char msg[160];
} ck_parser;

static int perr(ck_parser *p, const char *what) {
  snprintf(p->msg, sizeof p->msg, "header JSON: %s at byte %zu", what, p->i);
  return DG_EFORMAT;
}

static void ws(ck_parser *p) {
  while (p->i < p->n && strchr(" \t\r\n", p->s[p->i]) && p->s[p->i]) p->i++;
}

static int expect(ck_parser *p, char c) {
  ws(p);
  if (p->i >= p->n || p->s[p->i] != c) {
    char what[32];
    snprintf(what, sizeof what, "expected '%c'", c);
    return perr(p, what);
  }
  p->i++;
  return DG_OK;
}

static int peek(ck_parser *p, char c) {
  ws(p);
  return p->i < p->n && p->s[p->i] == c;
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* \uXXXX at p->s + p->i (after the 'u'); writes UTF-8 at *w. */
static int unescape_u(ck_parser *p, char **w) {
  unsigned cp = 0;
  for (int k = 0; k < 4; k++) {
    int h = p->i < p->n ? hexval(p->s[p->i]) : -1;
    if (h < 0) return perr(p, "bad \\u escape");
    cp = cp * 16 + (unsigned)h, p->i++;
  }
  if (cp == 0) return perr(p, "\\u0000 in a string");
  if (cp < 0x80) *(*w)++ = (char)cp;
  else if (cp < 0x800) *(*w)++ = (char)(0xC0 | (cp >> 6)), *(*w)++ = (char)(0x80 | (cp & 63));
  else {
    *(*w)++ = (char)(0xE0 | (cp >> 12));
    *(*w)++ = (char)(0x80 | ((cp >> 6) & 63));
    *(*w)++ = (char)(0x80 | (cp & 63));
  }
  return DG_OK;
}

/* A string, decoded in place (never longer than its source) and terminated. */
static int parse_string(ck_parser *p, char **out) {
  int rc = expect(p, '"');
  if (rc) return rc;
  char *start = p->s + p->i, *w = start;
  while (p->i < p->n && p->s[p->i] != '"') {
    char c = p->s[p->i++];
    if ((unsigned char)c < 0x20) return perr(p, "control character in a string");
    if (c != '\\') {
      *w++ = c;
      continue;
    }
    if (p->i >= p->n) break;
    c = p->s[p->i++];
    const char *esc = strchr("\"\\/bfnrt", c), *rep = "\"\\/\b\f\n\r\t";
    if (c == 'u') {
      if ((rc = unescape_u(p, &w))) return rc;
    } else if (esc && c) {
      *w++ = rep[esc - "\"\\/bfnrt"];
    } else {
      return perr(p, "bad escape");
    }
  }
  if (p->i >= p->n) return perr(p, "unterminated string");
  p->i++; /* closing quote; w <= its position */
  *w = 0;
  *out = start;
  return DG_OK;
}

static int parse_u64(ck_parser *p, uint64_t *v) {
  ws(p);
  if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9') return perr(p, "expected an integer");
  uint64_t x = 0;
  while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
    unsigned d = (unsigned)(p->s[p->i++] - '0');
    if (x > (UINT64_MAX - d) / 10) return perr(p, "integer too large");
    x = x * 10 + d;
  }
  if (p->i < p->n && strchr(".eE-+", p->s[p->i]) && p->s[p->i])
    return perr(p, "expected a non-negative integer");
  *v = x;
  return DG_OK;
}

/* [u64, ...] into v (at most cap); *n receives the count. */
static int parse_u64_array(ck_parser *p, uint64_t *v, int cap, int *n) {
  int rc = expect(p, '[');
  *n = 0;
  if (!rc && peek(p, ']')) return expect(p, ']');
  while (!rc) {
    if (*n == cap) return perr(p, "array too long");
    if ((rc = parse_u64(p, &v[(*n)++]))) return rc;
    if (peek(p, ']')) return expect(p, ']');
    rc = expect(p, ',');
  }
  return rc;
}

static int skip_value(ck_parser *p, int depth);

static int skip_container(ck_parser *p, int depth, char close) {
  p->i++;
  if (peek(p, close)) return expect(p, close);
  for (;;) {
    char *k;
    int rc = close == '}' ? parse_string(p, &k) : DG_OK;
    if (!rc && close == '}') rc = expect(p, ':');
    if (!rc) rc = skip_value(p, depth + 1);
    if (rc) return rc;
    if (peek(p, close)) return expect(p, close);
    if ((rc = expect(p, ','))) return rc;
  }
}

/* Any JSON value (unknown keys in a tensor entry). */
static int skip_value(ck_parser *p, int depth) {
  ws(p);
  if (depth > 32) return perr(p, "nesting too deep");
  if (p->i >= p->n) return perr(p, "unexpected end");
  char c = p->s[p->i], *s;
  if (c == '"') return parse_string(p, &s);
  if (c == '{' || c == '[') return skip_container(p, depth, c == '{' ? '}' : ']');
  const char *words[] = {"true", "false", "null"};
  for (int k = 0; k < 3; k++)
    if (!strncmp(p->s + p->i, words[k], strlen(words[k]))) {
      p->i += strlen(words[k]);
      return DG_OK;
    }
  size_t st = p->i;
  while (p->i < p->n && p->s[p->i] && strchr("0123456789+-.eE", p->s[p->i])) p->i++;
  return p->i > st ? DG_OK : perr(p, "unexpected character");
}

static int parse_entry_field(ck_parser *p, ck_entry *e, const char *key, int *seen) {
  uint64_t v[CK_MAX_DIMS];
  int n, rc;
  if (!strcmp(key, "dtype")) {
    *seen |= 1;
    return parse_string(p, &e->dtype);
  }
  if (!strcmp(key, "shape")) {
    *seen |= 2;
    if ((rc = parse_u64_array(p, v, CK_MAX_DIMS, &n))) return rc;
    e->ndim = n;
    for (int d = 0; d < n; d++) {
      if (v[d] > (uint64_t)INT64_MAX) return perr(p, "dimension too large");
      e->shape[d] = (int64_t)v[d];
    }
    return DG_OK;
  }
  if (!strcmp(key, "data_offsets")) {
    *seen |= 4;
    if ((rc = parse_u64_array(p, v, 2, &n))) return rc;
    if (n != 2) return perr(p, "data_offsets needs 2 integers");
    e->begin = v[0], e->end = v[1];
    return DG_OK;
  }
  return skip_value(p, 1);
}

static int parse_entry(ck_parser *p, char *name) {
  if (p->nents == p->capents) {
    int cap = p->capents ? 2 * p->capents : 64;
    ck_entry *ne = dg__realloc(p->ents, (size_t)cap * sizeof *ne);
    if (!ne) return DG_ENOMEM;
    p->ents = ne, p->capents = cap;
  }
  ck_entry *e = &p->ents[p->nents];
  memset(e, 0, sizeof *e);
  e->name = name;
  int seen = 0, rc = expect(p, '{');
  while (!rc && !peek(p, '}')) {
    char *key;
    if (seen & 8) rc = expect(p, ',');
    if (!rc) rc = parse_string(p, &key);
    if (!rc) rc = expect(p, ':');
    if (!rc) rc = parse_entry_field(p, e, key, &seen);
    seen |= 8;
  }
  if (!rc) rc = expect(p, '}');
  if (!rc && (seen & 7) != 7) {
    snprintf(p->msg, sizeof p->msg, "%s: entry lacks %s", name,
             !(seen & 1) ? "\"dtype\"" : !(seen & 2) ? "\"shape\"" : "\"data_offsets\"");
    return DG_EFORMAT;
  }
  if (!rc) p->nents++;
  return rc;
}

static int parse_metadata(ck_parser *p) {
  int rc = expect(p, '{'), first = 1;
  while (!rc && !peek(p, '}')) {
    char *k, *v;
    if (!first) rc = expect(p, ',');
    first = 0;
    if (!rc) rc = parse_string(p, &k);
    if (!rc) rc = expect(p, ':');
    if (!rc) rc = peek(p, '"') ? parse_string(p, &v) : perr(p, "metadata values must be strings");
    if (rc) return rc;
    if (p->nmeta + 2 > p->capmeta) {
      int cap = p->capmeta ? 2 * p->capmeta : 32;
      char **nm = dg__realloc(p->meta, (size_t)cap * sizeof *nm);
      if (!nm) return DG_ENOMEM;
      p->meta = nm, p->capmeta = cap;
    }
    p->meta[p->nmeta++] = k;
    p->meta[p->nmeta++] = v;
  }
  return rc ? rc : expect(p, '}');
}

static int parse_header(ck_parser *p) {
  int rc = expect(p, '{'), first = 1;
  while (!rc && !peek(p, '}')) {
    char *name;
    if (!first) rc = expect(p, ',');
    first = 0;
    if (!rc) rc = parse_string(p, &name);
    if (!rc) rc = expect(p, ':');
    if (rc) return rc;
    rc = strcmp(name, "__metadata__") ? parse_entry(p, name) : parse_metadata(p);
  }
  if (!rc) rc = expect(p, '}');
  ws(p);
  if (!rc && p->i != p->n) rc = perr(p, "trailing characters after the header object");
  return rc;
}

static const char *meta_get(const ck_parser *p, const char *key) {
  for (int i = 0; i + 1 < p->nmeta; i += 2)
    if (!strcmp(p->meta[i], key)) return p->meta[i + 1];
  return NULL;
}

static void parser_free(ck_parser *p) {
  dg__free(p->s);
  dg__free(p->ents);
  dg__free(p->meta);
}

/* Opens path, reads and parses the header. *f stays open on success;
 * *data_bytes receives the size of the data section. */
static int read_header(const char *path, FILE **f, ck_parser *p, uint64_t *data_bytes,
                       char *err, size_t cap) {
  memset(p, 0, sizeof *p);
  *f = fopen(path, "rb");
  if (!*f) return dg__fail_msg(err, cap, DG_EIO, "%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  uint8_t len8[8];
  if (fstat(fileno(*f), &st))
    return dg__fail_msg(err, cap, DG_EIO, "%s: cannot stat: %s", path, strerror(errno));
  uint64_t fsize = (uint64_t)st.st_size, n = 0;
  if (fsize < 8 || fread(len8, 1, 8, *f) != 8)
    return dg__fail_msg(err, cap, DG_EFORMAT, "%s: file is %" PRIu64 " bytes, too short for the "
                  "8-byte header length", path, fsize);
  for (int i = 7; i >= 0; i--) n = (n << 8) | len8[i];
  if (n < 2 || n > CK_MAX_HEADER || n > fsize - 8)
    return dg__fail_msg(err, cap, DG_EFORMAT, "%s: header length %" PRIu64 " is invalid (file is %"
                  PRIu64 " bytes; limit %u)", path, n, fsize, CK_MAX_HEADER);
  p->s = dg__malloc((size_t)n + 1);
  if (!p->s) return dg__fail_msg(err, cap, DG_ENOMEM, "%s: out of memory for the header", path);
  p->n = (size_t)n;
  if (fread(p->s, 1, p->n, *f) != p->n)
    return dg__fail_msg(err, cap, DG_EIO, "%s: cannot read the header", path);
  p->s[p->n] = 0;
  int rc = parse_header(p);
  if (rc == DG_ENOMEM) return dg__fail_msg(err, cap, rc, "%s: out of memory", path);
  if (rc) return dg__fail_msg(err, cap, rc, "%s: %s", path, p->msg);
  *data_bytes = fsize - 8 - n;
  return DG_OK;
}

/* ---- load: resolve, validate, stream ---- */

#define CK_NAME_MAX 512 /* a renamed tensor name, with its NUL */
#define CK_SKIP (-1)       /* slot: not loaded (weights-only load, a dropped name) */
#define CK_UNEXPECTED (-2) /* slot: the model has no such tensor */

typedef struct {
  const char *path;
  char *err;
  size_t cap;
  dg_checkpoint *c;
  char *found; /* params * (1 + nstates) + buffers flags */
  dg_checkpoint_load_opts *o; /* NULL: strict, no renames; counts go back into it */
  int nmissing, nunexpected;
  /* the first name that did not match: the error of a strict load, given
   * once every mismatch is counted and reported */
  int first_code;
  char first[400];
} ck_load;

/* A file tensor the model lacks, or a model tensor the file lacks (`name`;
 * fmt: the strict load's message for it). */
static void mismatch(ck_load *L, dg_ckpt_diff what, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void mismatch(ck_load *L, dg_ckpt_diff what, const char *name, const char *fmt, ...) {
  if (what == DG_CKPT_MISSING) L->nmissing++;
  else L->nunexpected++;
  if (!L->first_code) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(L->first, sizeof L->first, fmt, ap);
    va_end(ap);
    L->first_code = DG_ENOTFOUND;
  }
  if (L->o && L->o->report) L->o->report(L->o->report_user, what, name);
}

/* The model's name for the file's `name` (a parameter or buffer name: for
 * optimizer state, the part after "optim.<state>."): the prefix map, then
 * the rename callback, into buf. *out is name itself when nothing applies,
 * NULL when the callback drops the tensor. */
static int map_name(ck_load *L, const ck_entry *e, const char *name, char *buf, const char **out) {
  const dg_checkpoint_load_opts *o = L->o;
  *out = name;
  if (!o) return DG_OK;
  for (int k = 0; k < o->nrename; k++) {
    size_t fl = strlen(o->rename_from[k]);
    if (strncmp(name, o->rename_from[k], fl)) continue;
    if ((size_t)snprintf(buf, CK_NAME_MAX, "%s%s", o->rename_to[k], name + fl) >= CK_NAME_MAX)
      goto too_long;
    *out = buf;
    break;
  }
  if (o->rename) {
    char tmp[CK_NAME_MAX];
    tmp[0] = '\0';
    int r = o->rename(o->rename_user, *out, tmp, sizeof tmp);
    if (r < 0) *out = NULL;
    if (r > 0 && !memchr(tmp, 0, sizeof tmp)) goto too_long;
    if (r > 0) *out = memcpy(buf, tmp, strlen(tmp) + 1);
  }
  return DG_OK;
too_long:
  return dg__fail_msg(L->err, L->cap, DG_EINVAL, "%s: %s: the renamed name is longer than %d "
                      "bytes", L->path, e->name, CK_NAME_MAX - 1);
}

/* Finds the destination of entry e (parameter, buffer or optimizer state
 * slice, under its renamed name) and its slot in L->found (param + count *
 * (1 + state), buffers after those); slot CK_SKIP: not loaded,
 * CK_UNEXPECTED: the model has no such tensor (counted and reported). */
static int resolve(ck_load *L, ck_entry *e, int *slot) {
  dg_checkpoint *c = L->c;
  int np = dg_params_count(c->params), ns = c->optim ? dg_optim_state_count(c->optim) : 0;
  const char *pname = e->name;
  float *base = NULL;
  int k = -1;
  *slot = CK_SKIP;
  if (!strncmp(e->name, "optim.", 6)) {
    if (!c->optim) return DG_OK; /* weights only */
    for (k = 0; k < ns; k++) {
      const char *sname;
      size_t n, sl;
      dg_optim_state_get(c->optim, k, &sname, &base, &n);
      sl = strlen(sname);
      if (!strncmp(e->name + 6, sname, sl) && e->name[6 + sl] == '.') {
        pname = e->name + 7 + sl;
        break;
      }
    }
    if (k == ns) {
      *slot = CK_UNEXPECTED;
      mismatch(L, DG_CKPT_UNEXPECTED, e->name, "%s: %s: the %s optimizer has no such state",
               L->path, e->name, dg_optim_name(c->optim));
      return DG_OK;
    }
  }
  char buf[CK_NAME_MAX];
  const char *fname = pname;
  int rc = map_name(L, e, fname, buf, &pname);
  if (rc || !pname) return rc; /* dropped by the caller's rename: skipped */
  dg_tensor *t = dg_params_find(c->params, pname);
  for (int bi = 0; !t && k < 0 && bi < dg_params_buffer_count(c->params); bi++) {
    dg_tensor *bt = dg_params_buffer_get(c->params, bi);
    if (strcmp(dg_tensor_name(bt), pname)) continue;
    *slot = np * (1 + ns) + bi; /* buffers' slots follow the parameters' and states' */
    e->numel = dg_tensor_numel(bt);
    e->dst = dg_tensor_data(bt);
    return DG_OK;
  }
  if (!t) {
    *slot = CK_UNEXPECTED;
    mismatch(L, DG_CKPT_UNEXPECTED, e->name, "%s: %s%s%s%s: tensor in file, not in model",
             L->path, e->name, pname != fname ? " (renamed " : "", pname != fname ? pname : "",
             pname != fname ? ")" : "");
    return DG_OK;
  }
  int i = dg_tensor_param_index(t);
  *slot = i + np * (k + 1);
  e->numel = dg_tensor_numel(t);
  e->dst = base ? base + dg_params_offset(c->params, i) : dg_tensor_data(t);
  return DG_OK;
}

static int check_entry(ck_load *L, ck_entry *e, const dg_tensor *t) {
  char fs[96], ms[96];
  if (strcmp(e->dtype, "F32"))
    return dg__fail_msg(L->err, L->cap, DG_EDTYPE, "%s: %s: dtype %s in file, F32 in model",
                  L->path, e->name, e->dtype);
  int same = e->ndim == dg_tensor_ndim(t);
  for (int d = 0; same && d < e->ndim; d++) same = e->shape[d] == dg_tensor_dim(t, d);
  if (!same) {
    shape_str(fs, sizeof fs, e->ndim, e->shape);
    shape_str(ms, sizeof ms, dg_tensor_ndim(t), dg_tensor_shape(t));
    return dg__fail_msg(L->err, L->cap, DG_ESHAPE, "%s: %s: shape %s in file, %s in model", L->path,
                  e->name, fs, ms);
  }
  if (e->end < e->begin || e->end - e->begin != (uint64_t)e->numel * 4)
    return dg__fail_msg(L->err, L->cap, DG_EFORMAT, "%s: %s: data_offsets [%" PRIu64 ", %" PRIu64
                  "] hold %" PRId64 " bytes, shape needs %" PRId64, L->path, e->name, e->begin,
                  e->end, (int64_t)(e->end - e->begin), e->numel * 4);
  return DG_OK;
}

static int cmp_begin(const void *a, const void *b) {
  const ck_entry *x = a, *y = b;
  return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* The offsets must tile [0, data_bytes) exactly (as safetensors requires). */
static int check_tiling(ck_load *L, ck_parser *p, uint64_t data_bytes) {
  qsort(p->ents, (size_t)p->nents, sizeof *p->ents, cmp_begin);
  uint64_t at = 0;
  for (int j = 0; j < p->nents; j++) {
    ck_entry *e = &p->ents[j];
    if (e->end < e->begin)
      return dg__fail_msg(L->err, L->cap, DG_EFORMAT, "%s: %s: data_offsets end before begin",
                    L->path, e->name);
    if (e->begin != at)
      return dg__fail_msg(L->err, L->cap, DG_EFORMAT, "%s: %s: data_offsets begin at %" PRIu64
                    ", expected %" PRIu64 " (gap or overlap)", L->path, e->name, e->begin, at);
    at = e->end;
  }
  if (at != data_bytes)
    return dg__fail_msg(L->err, L->cap, DG_EFORMAT, "%s: %s: tensors need %" PRIu64 " data bytes, the "
                  "file holds %" PRIu64, L->path, at > data_bytes ? "truncated" : "trailing data",
                  at, data_bytes);
  return DG_OK;
}

static int check_optim_kind(ck_load *L, const ck_parser *p) {
  if (!L->c->optim) return DG_OK;
  const char *kind = meta_get(p, "optim"), *want = dg_optim_name(L->c->optim);
  if (!kind || strcmp(kind, want))
    return dg__fail_msg(L->err, L->cap, DG_EMISMATCH, "%s: optimizer %s in file, %s in the program",
                  L->path, kind ? kind : "(none)", want);
  return DG_OK;
}

/* Counts and reports what the model has and the file lacks: buffers, then
 * parameters, then optimizer state slices. */
static void note_missing(ck_load *L) {
  dg_checkpoint *c = L->c;
  int np = dg_params_count(c->params), ns = c->optim ? dg_optim_state_count(c->optim) : 0;
  char name[CK_NAME_MAX];
  for (int bi = 0; bi < dg_params_buffer_count(c->params); bi++) {
    if (L->found[np * (1 + ns) + bi]) continue;
    const char *bn = dg_tensor_name(dg_params_buffer_get(c->params, bi));
    mismatch(L, DG_CKPT_MISSING, bn, "%s: %s: buffer in model, missing from file", L->path, bn);
  }
  for (int s = 0; s < np * (1 + ns); s++) {
    if (L->found[s]) continue;
    const char *sname = "";
    float *b;
    size_t n;
    if (s >= np) dg_optim_state_get(c->optim, s / np - 1, &sname, &b, &n);
    snprintf(name, sizeof name, "%s%s%s%s", s >= np ? "optim." : "", sname, s >= np ? "." : "",
             dg_tensor_name(dg_params_get(c->params, s % np)));
    mismatch(L, DG_CKPT_MISSING, name, "%s: %s: in model, missing from file", L->path, name);
  }
}

static int validate(ck_load *L, ck_parser *p, uint64_t data_bytes) {
  dg_checkpoint *c = L->c;
  int rc0 = check_optim_kind(L, p);
  if (rc0) return rc0;
  int np = dg_params_count(c->params), ns = c->optim ? dg_optim_state_count(c->optim) : 0;
  for (int j = 0; j < p->nents; j++) {
    ck_entry *e = &p->ents[j];
    int slot, rc = resolve(L, e, &slot);
    if (rc) return rc;
    if (slot < 0) continue;
    if (L->found[slot])
      return dg__fail_msg(L->err, L->cap, DG_EFORMAT, "%s: %s: duplicate tensor%s", L->path,
                          e->name, L->o && (L->o->nrename || L->o->rename) ? " (after renaming)"
                                                                            : "");
    L->found[slot] = 1;
    if ((rc = check_entry(L, e, slot < np * (1 + ns) ? dg_params_get(c->params, slot % np)
                               : dg_params_buffer_get(c->params, slot - np * (1 + ns)))))
      return rc;
  }
  note_missing(L);
  if (L->o) {
    L->o->nmissing = L->nmissing;
    L->o->nunexpected = L->nunexpected;
  }
  if (L->first_code && !(L->o && L->o->non_strict))
    return dg__fail_msg(L->err, L->cap, L->first_code, "%s (%d unexpected and %d missing in "
                        "all; a non_strict load skips them)", L->first, L->nunexpected,
                        L->nmissing);
  return check_tiling(L, p, data_bytes);
}

static int parse_meta_i64(ck_load *L, const ck_parser *p, const char *key, int64_t *v) {
  const char *s = meta_get(p, key);
  if (!s) return dg__fail_msg(L->err, L->cap, DG_ENOTFOUND, "%s: metadata \"%s\" missing", L->path, key);
  char *end;
  errno = 0;
  long long x = strtoll(s, &end, 10);
  if (errno || end == s || *end)
    return dg__fail_msg(L->err, L->cap, DG_EFORMAT, "%s: metadata \"%s\" = \"%s\" is not an integer",
                  L->path, key, s);
  *v = x;
  return DG_OK;
}

static int parse_meta_u64(ck_load *L, const ck_parser *p, const char *key, uint64_t *v) {
  const char *s = meta_get(p, key);
  if (!s) return dg__fail_msg(L->err, L->cap, DG_ENOTFOUND, "%s: metadata \"%s\" missing", L->path, key);
  char *end;
  errno = 0;
  unsigned long long x = strtoull(s, &end, 10);
  if (errno || end == s || *end || *s == '-')
    return dg__fail_msg(L->err, L->cap, DG_EFORMAT, "%s: metadata \"%s\" = \"%s\" is not a u64",
                  L->path, key, s);
  *v = x;
  return DG_OK;
}

/* Checks the metadata the caller asked to restore; applies nothing. */
typedef struct {
  int64_t step, epoch, batch, ostep;
  int64_t samples; /* data_samples, -1 in files before it */
  uint64_t seed, offset;
  float lr;
} ck_meta;

static int read_meta(ck_load *L, const ck_parser *p, ck_meta *m) {
  dg_checkpoint *c = L->c;
  int rc = DG_OK;
  memset(m, 0, sizeof *m);
  if (meta_get(p, "step")) rc = parse_meta_i64(L, p, "step", &m->step);
  if (!rc && c->ctx) rc = parse_meta_u64(L, p, "rng_seed", &m->seed);
  if (!rc && c->ctx) rc = parse_meta_u64(L, p, "rng_offset", &m->offset);
  if (!rc && c->loader) rc = parse_meta_i64(L, p, "data_epoch", &m->epoch);
  if (!rc && c->loader) rc = parse_meta_i64(L, p, "data_batch", &m->batch);
  m->samples = -1;
  if (!rc && c->loader && meta_get(p, "data_samples"))
    rc = parse_meta_i64(L, p, "data_samples", &m->samples);
  if (rc || !c->optim) return rc;
  const char *lr = meta_get(p, "optim_lr");
  if ((rc = parse_meta_i64(L, p, "optim_step", &m->ostep))) return rc;
  char *end;
  m->lr = lr ? strtof(lr, &end) : 0;
  if (!lr || end == lr || *end)
    return dg__fail_msg(L->err, L->cap, DG_EFORMAT, "%s: metadata \"optim_lr\" missing or invalid",
                  L->path);
  return DG_OK;
}

static int stream_data(ck_load *L, FILE *f, const ck_parser *p, uint64_t data_start) {
  for (int j = 0; j < p->nents; j++) {
    const ck_entry *e = &p->ents[j];
    if (!e->dst) continue;
    if (fseeko(f, (off_t)(data_start + e->begin), SEEK_SET) ||
        fread(e->dst, 4, (size_t)e->numel, f) != (size_t)e->numel)
      return dg__fail_msg(L->err, L->cap, DG_EIO, "%s: %s: cannot read the data (%s)", L->path,
                    e->name, ferror(f) ? strerror(errno) : "unexpected end of file");
    if (!host_is_le()) swap32(e->dst, (size_t)e->numel);
  }
  return DG_OK;
}

static int apply_meta(ck_load *L, const ck_meta *m) {
  dg_checkpoint *c = L->c;
  c->step = m->step;
  if (c->ctx) dg_ctx_set_rng_state(c->ctx, m->seed, m->offset);
  if (c->optim) {
    dg_optim_set_lr(c->optim, m->lr);
    if (dg_optim_set_step(c->optim, m->ostep))
      return dg__fail_msg(L->err, L->cap, DG_EFORMAT, "%s: optim_step %" PRId64 " refused", L->path,
                    m->ostep);
  }
  if (c->loader && m->samples >= 0 && dg_loader_seek_samples(c->loader, m->epoch, m->samples))
    return dg__fail_msg(L->err, L->cap, DG_EFORMAT, "%s: data position (epoch %" PRId64 ", %"
                        PRId64 " samples) is out of range for this loader", L->path, m->epoch,
                        m->samples);
  if (c->loader && m->samples < 0 && dg_loader_seek(c->loader, m->epoch, m->batch))
    return dg__fail_msg(L->err, L->cap, DG_EFORMAT, "%s: data position (epoch %" PRId64 ", batch %"
                  PRId64 ") is out of range for this loader", L->path, m->epoch, m->batch);
  return DG_OK;
}

static int check_load_opts(dg_checkpoint_load_opts *o, char *err, size_t cap) {
  if (!o) return DG_OK;
  o->nmissing = o->nunexpected = 0;
  if (o->nrename < 0 || (o->nrename && (!o->rename_from || !o->rename_to)))
    return dg__fail_msg(err, cap, DG_EINVAL, "checkpoint load: %d renames with rename_from %p, "
                        "rename_to %p", o->nrename, (const void *)o->rename_from,
                        (const void *)o->rename_to);
  for (int k = 0; k < o->nrename; k++)
    if (!o->rename_from[k] || !o->rename_to[k])
      return dg__fail_msg(err, cap, DG_EINVAL, "checkpoint load: rename %d has a NULL prefix", k);
  return DG_OK;
}

int dg_checkpoint_load(const char *path, dg_checkpoint *c, char *err, size_t errcap) {
  return dg_checkpoint_load_with(path, c, NULL, err, errcap);
}

int dg_checkpoint_load_with(const char *path, dg_checkpoint *c, dg_checkpoint_load_opts *opts,
                            char *err, size_t errcap) {
  if (!path || !c || !c->params)
    return dg__fail_msg(err, errcap, DG_EINVAL, "checkpoint load: path and params are required");
  int rc0 = check_load_opts(opts, err, errcap);
  if (rc0) return rc0;
  int np = dg_params_count(c->params), ns = c->optim ? dg_optim_state_count(c->optim) : 0;
  int nb = dg_params_buffer_count(c->params);
  ck_load L = {path, err, errcap, c,
               dg__calloc((size_t)np * (size_t)(1 + ns) + (size_t)nb + 1, 1), opts, 0, 0, 0, ""};
  if (!L.found) return dg__fail_msg(err, errcap, DG_ENOMEM, "%s: out of memory", path);
  FILE *f = NULL;
  ck_parser p;
  uint64_t data_bytes = 0;
  ck_meta m;
  int rc = read_header(path, &f, &p, &data_bytes, err, errcap);
  if (!rc) rc = validate(&L, &p, data_bytes);
  if (!rc) rc = read_meta(&L, &p, &m);
  if (!rc) rc = stream_data(&L, f, &p, 8 + (uint64_t)p.n);
  if (!rc) rc = apply_meta(&L, &m);
  if (f) fclose(f);
  parser_free(&p);
  dg__free(L.found);
  return rc;
}

int dg_checkpoint_verify(const char *path, char *err, size_t errcap) {
  if (!path) return dg__fail_msg(err, errcap, DG_EINVAL, "checkpoint verify: NULL path");
  FILE *f = NULL;
  ck_parser p;
  uint64_t data_bytes = 0;
  ck_load L = {.path = path, .err = err, .cap = errcap};
  int rc = read_header(path, &f, &p, &data_bytes, err, errcap);
  if (!rc) rc = check_tiling(&L, &p, data_bytes);
  if (f) fclose(f);
  parser_free(&p);
  return rc;
}

int dg_checkpoint_meta(const char *path, const char *key, char *val, size_t cap, char *err,
                       size_t errcap) {
  if (!path || !key || !val || !cap)
    return dg__fail_msg(err, errcap, DG_EINVAL, "checkpoint meta: bad arguments");
  FILE *f = NULL;
  ck_parser p;
  uint64_t data_bytes;
  int rc = read_header(path, &f, &p, &data_bytes, err, errcap);
  if (!rc) {
    const char *v = meta_get(&p, key);
    if (!v) rc = dg__fail_msg(err, errcap, DG_ENOTFOUND, "%s: no metadata \"%s\"", path, key);
    else if (strlen(v) >= cap)
      rc = dg__fail_msg(err, errcap, DG_EINVAL, "%s: metadata \"%s\" longer than %zu bytes", path,
                  key, cap - 1);
    else memcpy(val, v, strlen(v) + 1);
  }
  if (f) fclose(f);
  parser_free(&p);
  return rc;
}
