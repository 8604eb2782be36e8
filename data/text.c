/* Character-level text: bytes of a file (or of a directory's plain-text
 * files) to a sorted byte vocabulary, a train/val split, next-char windows. */
#include <dirent.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "data/data_impl.h"

struct dg_text {
  uint8_t *tok; /* (n) token ids */
  size_t n, n_train;
  int vocab;
  int16_t id_of[256];
  uint8_t byte_of[256];
  /* dataset views handed out by dg_text_dataset */
  struct text_view {
    const uint8_t *tok;
    int context;
    int64_t stride;
  } view[2];
};

/* Appends a whole file to *buf (size *n, capacity *cap). */
static int append_file(const char *path, uint8_t **buf, size_t *n, size_t *cap, char *err,
                       size_t errcap) {
  FILE *f = fopen(path, "rb");
  if (!f) return dg__fail_msg(err, errcap, DG_EIO, "%s: cannot open: %s", path, strerror(errno));
  int rc = DG_OK;
  for (;;) {
    if (*cap - *n < 65536) {
      size_t nc = *cap ? *cap * 2 : 1 << 20;
      uint8_t *nb = dg__realloc(*buf, nc);
      if (!nb) {
        rc = dg__fail_msg(err, errcap, DG_ENOMEM, "%s: out of memory", path);
        break;
      }
      *buf = nb;
      *cap = nc;
    }
    size_t got = fread(*buf + *n, 1, *cap - *n, f);
    *n += got;
    if (got == 0) {
      if (ferror(f))
        rc = dg__fail_msg(err, errcap, DG_EIO, "%s: read error: %s", path, strerror(errno));
      break;
    }
  }
  fclose(f);
  return rc;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Plain-text files of a directory: regular files whose names have no dot. */
static int append_dir(const char *dir, uint8_t **buf, size_t *n, size_t *cap, char *err,
                      size_t errcap) {
  DIR *d = opendir(dir);
  if (!d) return dg__fail_msg(err, errcap, DG_EIO, "%s: cannot open: %s", dir, strerror(errno));
  char *names[512];
  int cnt = 0, rc = DG_OK;
  struct dirent *e;
  while ((e = readdir(d)) && cnt < 512)
    if (!strchr(e->d_name, '.') && (names[cnt] = dg__strdup(e->d_name))) cnt++;
  closedir(d);
  qsort(names, (size_t)cnt, sizeof names[0], cmp_str);
  int used = 0;
  for (int i = 0; i < cnt; i++) {
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    if (!rc && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
      rc = append_file(path, buf, n, cap, err, errcap);
      used++;
    }
    dg__free(names[i]);
  }
  if (!rc && !used)
    rc = dg__fail_msg(err, errcap, DG_ENOTFOUND, "%s: no plain-text files (names without a "
                      "dot) in this directory", dir);
  return rc;
}

static void build_vocab(dg_text *t) {
  int seen[256] = {0};
  for (size_t i = 0; i < t->n; i++) seen[t->tok[i]] = 1;
  t->vocab = 0;
  for (int c = 0; c < 256; c++) {
    t->id_of[c] = seen[c] ? (int16_t)t->vocab : -1;
    if (seen[c]) t->byte_of[t->vocab++] = (uint8_t)c;
  }
  for (size_t i = 0; i < t->n; i++) t->tok[i] = (uint8_t)t->id_of[t->tok[i]];
}

int dg_text_open(dg_text **out, const char *path, const dg_text_opts *opts, char *err,
                 size_t errcap) {
  if (err && errcap) err[0] = 0;
  if (!out) return dg__fail_msg(err, errcap, DG_EINVAL, "text_open: NULL output");
  *out = NULL;
  if (!path) path = DG_FORTUNES_DIR;
  double vf = opts && opts->val_fraction != 0 ? opts->val_fraction : 0.1;
  if (vf < 0) vf = 0;
  if (vf >= 1)
    return dg__fail_msg(err, errcap, DG_EINVAL, "text_open: val_fraction %g must be < 1", vf);
  dg_text *t = dg__calloc(1, sizeof *t);
  if (!t) return dg__fail_msg(err, errcap, DG_ENOMEM, "text_open: out of memory");
  struct stat st;
  size_t cap = 0;
  int rc;
  if (stat(path, &st) != 0)
    rc = dg__fail_msg(err, errcap, DG_EIO, "%s: cannot open: %s", path, strerror(errno));
  else if (S_ISDIR(st.st_mode))
    rc = append_dir(path, &t->tok, &t->n, &cap, err, errcap);
  else
    rc = append_file(path, &t->tok, &t->n, &cap, err, errcap);
  if (!rc && t->n < 2)
    rc = dg__fail_msg(err, errcap, DG_EFORMAT, "%s: empty text (%zu bytes)", path, t->n);
  if (rc) {
    dg_text_free(t);
    return rc;
  }
  build_vocab(t);
  t->n_train = t->n - (size_t)((double)t->n * vf);
  *out = t;
  return DG_OK;
}

void dg_text_free(dg_text *t) {
  if (!t) return;
  dg__free(t->tok);
  dg__free(t);
}

int dg_text_vocab_size(const dg_text *t) { return t ? t->vocab : 0; }
int dg_text_byte(const dg_text *t, int id) {
  return t && id >= 0 && id < t->vocab ? t->byte_of[id] : -1;
}
int dg_text_id(const dg_text *t, int byte) {
  return t && byte >= 0 && byte < 256 ? t->id_of[byte] : -1;
}

const uint8_t *dg_text_tokens(const dg_text *t, int split, size_t *n) {
  if (n) *n = 0;
  if (!t || (split != DG_SPLIT_TRAIN && split != DG_SPLIT_VAL)) return NULL;
  if (n) *n = split == DG_SPLIT_TRAIN ? t->n_train : t->n - t->n_train;
  return split == DG_SPLIT_TRAIN ? t->tok : t->tok + t->n_train;
}

size_t dg_text_decode(const dg_text *t, const int64_t *ids, size_t n, char *out, size_t cap) {
  if (!out || !cap) return 0;
  size_t k = 0;
  for (size_t i = 0; t && ids && i < n && k + 1 < cap; i++) {
    int b = dg_text_byte(t, ids[i] >= 0 && ids[i] < 256 ? (int)ids[i] : -1);
    out[k++] = b < 0 ? '?' : (char)b;
  }
  out[k] = 0;
  return k;
}

static int text_get(void *self, int64_t i, void *const *dst) {
  const struct text_view *v = self;
  const uint8_t *p = v->tok + (size_t)(i * v->stride);
  int64_t *x = dst[0], *y = dst[1];
  for (int j = 0; j < v->context; j++) {
    x[j] = p[j];
    y[j] = p[j + 1];
  }
  return DG_OK;
}

int dg_text_dataset(dg_text *t, int split, int context, int64_t stride, dg_dataset *out) {
  size_t n;
  const uint8_t *tok = dg_text_tokens(t, split, &n);
  if (!out) return DG_EINVAL;
  memset(out, 0, sizeof *out);
  if (!tok || context <= 0 || stride < 0 || n < (size_t)context + 1) return DG_EINVAL;
  if (!stride) stride = 1;
  struct text_view *v = &t->view[split];
  v->tok = tok;
  v->context = context;
  v->stride = stride;
  out->size = (int64_t)(n - (size_t)context - 1) / stride + 1;
  out->nfields = 2;
  for (int f = 0; f < 2; f++) {
    out->field[f].dtype = DG_I64;
    out->field[f].ndim = 1;
    out->field[f].shape[0] = context;
    out->field[f].numel = (size_t)context;
  }
  out->get = text_get;
  out->self = v;
  return DG_OK;
}
