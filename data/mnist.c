/* MNIST-style datasets: an idx3 u8 image file and an idx1 u8 label file. */
#include <string.h>
#include <unistd.h>

#include "data/data_impl.h"

struct dg_mnist {
  dg_idx_array images; /* (N, rows, cols) u8 */
  int64_t *labels;     /* (N) */
  int64_t n;
  int rows, cols;
  float scale, shift;  /* x * scale + shift == (x/255 - mean) / std */
};

/* Picks <dir>/<stem>.gz or <dir>/<stem>, whichever exists (gz first). */
static void find_file(const char *dir, const char *stem, char *path, size_t cap) {
  snprintf(path, cap, "%s/%s.gz", dir, stem);
  if (access(path, R_OK) == 0) return;
  snprintf(path, cap, "%s/%s", dir, stem);
}

static int check_images(const dg_idx_array *im, const char *path, char *err, size_t errcap) {
  if (im->type != DG_IDX_U8 || im->ndim != 3)
    return dg__fail_msg(err, errcap, DG_EFORMAT,
                        "%s: expected u8 images with 3 dims (count, rows, cols), found %s "
                        "with %d dims", path, dg_idx_type_name(im->type), im->ndim);
  if (im->dims[0] == 0 || im->dims[1] == 0 || im->dims[2] == 0)
    return dg__fail_msg(err, errcap, DG_EFORMAT, "%s: no images (dims %lld x %lld x %lld)",
                        path, (long long)im->dims[0], (long long)im->dims[1],
                        (long long)im->dims[2]);
  return DG_OK;
}

static int check_labels(const dg_idx_array *lb, const dg_idx_array *im, int classes,
                        const char *lpath, const char *ipath, char *err, size_t errcap) {
  if (lb->type != DG_IDX_U8 || lb->ndim != 1)
    return dg__fail_msg(err, errcap, DG_EFORMAT,
                        "%s: expected u8 labels with 1 dim, found %s with %d dims", lpath,
                        dg_idx_type_name(lb->type), lb->ndim);
  if (lb->dims[0] != im->dims[0])
    return dg__fail_msg(err, errcap, DG_EFORMAT,
                        "%s: %lld labels, but %s holds %lld images (counts must match)",
                        lpath, (long long)lb->dims[0], ipath, (long long)im->dims[0]);
  const uint8_t *l = lb->data;
  for (size_t i = 0; i < lb->count; i++)
    if (l[i] >= classes)
      return dg__fail_msg(err, errcap, DG_EFORMAT,
                          "%s: label %d at index %zu is outside [0, %d]", lpath, l[i], i,
                          classes - 1);
  return DG_OK;
}

static int set_norm(dg_mnist *ds, const dg_mnist_opts *op, char *err, size_t errcap) {
  float mean = DG_FASHION_MNIST_MEAN, std = DG_FASHION_MNIST_STD;
  if (op->norm == DG_MNIST_NORM_UNIT) {
    mean = 0.0f;
    std = 1.0f;
  } else if (op->norm == DG_MNIST_NORM_CUSTOM) {
    mean = op->mean;
    std = op->std;
  } else if (op->norm != DG_MNIST_NORM_FASHION) {
    return dg__fail_msg(err, errcap, DG_EINVAL, "mnist_open: unknown normalisation %d",
                        (int)op->norm);
  }
  if (!(std > 0))
    return dg__fail_msg(err, errcap, DG_EINVAL, "mnist_open: std must be > 0 (got %g)",
                        (double)std);
  ds->scale = 1.0f / (255.0f * std);
  ds->shift = -mean / std;
  return DG_OK;
}

int dg_mnist_open(dg_mnist **out, const char *dir, int train, char *err, size_t errcap) {
  return dg_mnist_open_opts(out, dir, train, NULL, err, errcap);
}

int dg_mnist_open_opts(dg_mnist **out, const char *dir, int train, const dg_mnist_opts *opts,
                       char *err, size_t errcap) {
  static const dg_mnist_opts defaults = {DG_MNIST_NORM_FASHION, 0.0f, 0.0f, 10};
  const dg_mnist_opts *op = opts ? opts : &defaults;
  int classes = op->num_classes > 0 ? op->num_classes : 10;
  if (err && errcap) err[0] = 0;
  if (!out) return dg__fail_msg(err, errcap, DG_EINVAL, "mnist_open: NULL output");
  *out = NULL;
  if (!dir) dir = DG_FASHION_MNIST_DIR;
  if (classes > 256) classes = 256;
  char ipath[1024], lpath[1024];
  const char *pre = train ? "train" : "t10k";
  char stem[64];
  snprintf(stem, sizeof stem, "%s-images-idx3-ubyte", pre);
  find_file(dir, stem, ipath, sizeof ipath);
  snprintf(stem, sizeof stem, "%s-labels-idx1-ubyte", pre);
  find_file(dir, stem, lpath, sizeof lpath);
  dg_mnist *ds = dg__calloc(1, sizeof *ds);
  if (!ds) return dg__fail_msg(err, errcap, DG_ENOMEM, "mnist_open: out of memory");
  dg_idx_array lb;
  memset(&lb, 0, sizeof lb);
  int rc = set_norm(ds, op, err, errcap);
  if (!rc) rc = dg_idx_read(&ds->images, ipath, err, errcap);
  if (!rc) rc = check_images(&ds->images, ipath, err, errcap);
  if (!rc) rc = dg_idx_read(&lb, lpath, err, errcap);
  if (!rc) rc = check_labels(&lb, &ds->images, classes, lpath, ipath, err, errcap);
  if (!rc && !(ds->labels = dg__malloc(lb.count * sizeof(int64_t))))
    rc = dg__fail_msg(err, errcap, DG_ENOMEM, "%s: out of memory", lpath);
  if (rc) {
    dg_idx_free(&lb);
    dg_mnist_free(ds);
    return rc;
  }
  for (size_t i = 0; i < lb.count; i++) ds->labels[i] = ((const uint8_t *)lb.data)[i];
  dg_idx_free(&lb);
  ds->n = ds->images.dims[0];
  ds->rows = (int)ds->images.dims[1];
  ds->cols = (int)ds->images.dims[2];
  *out = ds;
  return DG_OK;
}

void dg_mnist_free(dg_mnist *ds) {
  if (!ds) return;
  dg_idx_free(&ds->images);
  dg__free(ds->labels);
  dg__free(ds);
}

int64_t dg_mnist_count(const dg_mnist *ds) { return ds ? ds->n : 0; }
int dg_mnist_rows(const dg_mnist *ds) { return ds ? ds->rows : 0; }
int dg_mnist_cols(const dg_mnist *ds) { return ds ? ds->cols : 0; }
const uint8_t *dg_mnist_pixels(const dg_mnist *ds) { return ds ? ds->images.data : NULL; }
const int64_t *dg_mnist_labels(const dg_mnist *ds) { return ds ? ds->labels : NULL; }

int dg_mnist_image(const dg_mnist *ds, int64_t i, float *out) {
  if (!ds || !out || i < 0 || i >= ds->n) return DG_EINVAL;
  size_t np = (size_t)ds->rows * (size_t)ds->cols;
  const uint8_t *px = (const uint8_t *)ds->images.data + (size_t)i * np;
  for (size_t j = 0; j < np; j++) out[j] = (float)px[j] * ds->scale + ds->shift;
  return DG_OK;
}

static int mnist_get(void *self, int64_t i, void *const *dst) {
  const dg_mnist *ds = self;
  int rc = dg_mnist_image(ds, i, dst[0]);
  if (!rc) *(int64_t *)dst[1] = ds->labels[i];
  return rc;
}

int dg_mnist_dataset(dg_mnist *ds, dg_dataset *out) {
  if (!ds || !out) return DG_EINVAL;
  memset(out, 0, sizeof *out);
  out->size = ds->n;
  out->nfields = 2;
  out->field[0].dtype = DG_F32;
  out->field[0].ndim = 2;
  out->field[0].shape[0] = ds->rows;
  out->field[0].shape[1] = ds->cols;
  out->field[0].numel = (size_t)ds->rows * (size_t)ds->cols;
  out->field[1].dtype = DG_I64;
  out->field[1].ndim = 0;
  out->field[1].numel = 1;
  out->get = mnist_get;
  out->self = ds;
  return DG_OK;
}
