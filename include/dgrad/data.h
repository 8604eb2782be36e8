/* dgrad/data.h — datasets (IDX / MNIST-style images, character-level text)
 * and a seeded, shardable, resumable batch loader.
 *
 * Errors. Functions that read files return DG_OK or a negative DG_E* code
 * (DG_EIO: cannot open/read, DG_EFORMAT: truncated, corrupt or inconsistent
 * contents, DG_EUNSUPPORTED: gzip file in a build without zlib, DG_ENOMEM) and
 * write a message naming the file and what is wrong into err (errcap bytes,
 * always terminated; err may be NULL). They never abort on bad input.
 *
 * Ownership. dg_idx_read fills a caller-owned dg_idx_array whose data it
 * allocates; release with dg_idx_free. Datasets (dg_mnist, dg_text) own their
 * samples until *_free. A dg_dataset descriptor borrows the dataset it came
 * from. A loader borrows its dg_dataset (the dataset must outlive it) and owns
 * one set of batch buffers allocated at creation; dg_loader_next never
 * allocates. Every *_free(NULL) is a no-op.
 *
 * Threads. Datasets are read-only after opening and may be read from any
 * number of threads. A loader is used by one thread at a time; different
 * loaders over the same dataset may run concurrently. */
#ifndef DGRAD_DATA_H
#define DGRAD_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "dgrad/common.h"
#include "dgrad/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- IDX files (the MNIST format) ---- */

#define DG_IDX_MAX_DIMS 8

/* The IDX type byte. */
typedef enum {
  DG_IDX_U8 = 0x08,
  DG_IDX_I8 = 0x09,
  DG_IDX_I16 = 0x0B,
  DG_IDX_I32 = 0x0C,
  DG_IDX_F32 = 0x0D,
  DG_IDX_F64 = 0x0E
} dg_idx_type;

typedef struct {
  dg_idx_type type;
  int ndim;
  int64_t dims[DG_IDX_MAX_DIMS];
  size_t count;     /* elements: product of dims */
  size_t elem_size; /* bytes per element */
  void *data;       /* count elements, host byte order (decoded from big-endian) */
} dg_idx_array;

/* Reads an IDX file; gzip-compressed when the name ends in ".gz" or the file
 * starts with the gzip magic, raw otherwise. The whole file must be exactly
 * header + data. On failure *out is zeroed. */
DG_API int dg_idx_read(dg_idx_array *out, const char *path, char *err, size_t errcap);
/* Frees a->data and zeroes *a; NULL is a no-op. */
DG_API void dg_idx_free(dg_idx_array *a);
/* "u8", "i8", "i16", "i32", "f32", "f64", or "?". */
DG_API const char *dg_idx_type_name(int type);

/* ---- dataset interface used by the loader ---- */

#define DG_DATA_MAX_FIELDS 4

/* One field of a sample (e.g. image, label): dtype and per-sample shape. */
typedef struct {
  dg_dtype dtype;
  int ndim; /* 0 for a scalar */
  int64_t shape[DG_MAX_DIMS];
  size_t numel; /* elements per sample */
} dg_data_field;

/* Writes sample `index` (0 <= index < size) field by field: dst[f] points at
 * field[f].numel elements of field[f].dtype. Returns DG_OK or a DG_E* code. */
typedef int (*dg_dataset_get_fn)(void *self, int64_t index, void *const *dst);

typedef struct {
  int64_t size; /* samples */
  int nfields;
  dg_data_field field[DG_DATA_MAX_FIELDS];
  dg_dataset_get_fn get;
  void *self;
} dg_dataset;

/* ---- MNIST-style image datasets ---- */

/* Debian's dataset-fashion-mnist package. */
#define DG_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"
#define DG_FASHION_MNIST_MEAN 0.2860f
#define DG_FASHION_MNIST_STD 0.3530f

typedef struct dg_mnist dg_mnist;

typedef enum {
  DG_MNIST_NORM_FASHION = 0, /* (x/255 - 0.2860) / 0.3530 */
  DG_MNIST_NORM_UNIT = 1,    /* x/255 in [0, 1] */
  DG_MNIST_NORM_CUSTOM = 2   /* (x/255 - mean) / std */
} dg_mnist_norm;

typedef struct {
  dg_mnist_norm norm;
  float mean, std;  /* DG_MNIST_NORM_CUSTOM only */
  int num_classes;  /* labels must lie in [0, num_classes); 0 means 10 */
} dg_mnist_opts;

/* Opens <dir>/train-images-idx3-ubyte[.gz] + train-labels-idx1-ubyte[.gz]
 * (train = 1) or the t10k-* pair (train = 0); dir NULL means
 * DG_FASHION_MNIST_DIR. Checks: images are u8 with 3 dims, labels u8 with 1,
 * equal counts, at least one image, every label in range. Pixels are kept as
 * bytes and normalised to f32 when copied out. */
DG_API int dg_mnist_open(dg_mnist **out, const char *dir, int train, char *err, size_t errcap);
DG_API int dg_mnist_open_opts(dg_mnist **out, const char *dir, int train,
                              const dg_mnist_opts *opts, char *err, size_t errcap);
DG_API void dg_mnist_free(dg_mnist *ds);
DG_API int64_t dg_mnist_count(const dg_mnist *ds);
DG_API int dg_mnist_rows(const dg_mnist *ds);
DG_API int dg_mnist_cols(const dg_mnist *ds);
DG_API const uint8_t *dg_mnist_pixels(const dg_mnist *ds); /* (N, rows, cols) raw */
DG_API const int64_t *dg_mnist_labels(const dg_mnist *ds); /* (N) */
/* Image i normalised into out (rows * cols floats). */
DG_API int dg_mnist_image(const dg_mnist *ds, int64_t i, float *out);
/* Descriptor with fields 0: image f32 (rows, cols), 1: label i64 scalar. */
DG_API int dg_mnist_dataset(dg_mnist *ds, dg_dataset *out);

/* ---- character-level text ---- */

/* Debian's fortunes package: its plain-text files (names without a dot, so
 * the .dat and .u8 indices are skipped), concatenated in name order. */
#define DG_FORTUNES_DIR "/usr/share/games/fortunes"

#define DG_SPLIT_TRAIN 0
#define DG_SPLIT_VAL 1

typedef struct dg_text dg_text;

typedef struct {
  double val_fraction; /* last fraction of the text held out; 0 means 0.1,
                          negative means no validation split */
} dg_text_opts;

/* Reads a file, or every plain-text file of a directory (names without a dot,
 * in sorted order); path NULL means DG_FORTUNES_DIR. The vocabulary is the
 * sorted set of distinct bytes; tokens are their indices. DG_EFORMAT for an
 * empty text. */
DG_API int dg_text_open(dg_text **out, const char *path, const dg_text_opts *opts, char *err,
                        size_t errcap);
DG_API void dg_text_free(dg_text *t);
DG_API int dg_text_vocab_size(const dg_text *t);
/* Byte of token id, or -1. */
DG_API int dg_text_byte(const dg_text *t, int id);
/* Token id of a byte, or -1 when the byte is not in the vocabulary. */
DG_API int dg_text_id(const dg_text *t, int byte);
/* Token ids of a split (DG_SPLIT_TRAIN / DG_SPLIT_VAL); *n receives the count. */
DG_API const uint8_t *dg_text_tokens(const dg_text *t, int split, size_t *n);
/* Decodes ids into out (at most cap - 1 bytes, terminated; unknown ids give
 * '?'); returns the bytes written. */
DG_API size_t dg_text_decode(const dg_text *t, const int64_t *ids, size_t n, char *out, size_t cap);
/* Next-character windows over a split: sample i starts at i * stride and has
 * fields 0: x i64 (context) = tokens[s .. s+context), 1: y i64 (context) =
 * tokens[s+1 .. s+context+1). stride 0 means 1. DG_EINVAL when the split holds
 * fewer than context + 1 tokens. The descriptor borrows t; each split has one
 * window setting at a time (a later call for the same split replaces it). */
DG_API int dg_text_dataset(dg_text *t, int split, int context, int64_t stride, dg_dataset *out);

/* ---- loader: seeded shuffling, batching, sharding, resumable ---- */

typedef struct dg_loader dg_loader;

typedef struct {
  int64_t batch_size;
  int shuffle;       /* reshuffle every epoch from (seed, epoch) */
  uint64_t seed;
  int drop_last;     /* drop each rank's final partial batch */
  int rank;          /* this process's shard; 0 .. world_size - 1 */
  int world_size;    /* 0 means 1; every rank must pass the same seed, so
                        all ranks shard the same per-epoch order */
  int shard_drop;    /* 0: pad every rank to ceil(size / world) samples by
                        wrapping around the epoch's order (torch
                        DistributedSampler); 1: drop the tail so every rank
                        gets floor(size / world) */
} dg_loader_opts;

/* On failure *out is NULL and err (cap bytes, may be NULL) names the
 * invalid option. */
DG_API int dg_loader_new(dg_loader **out, const dg_dataset *ds, const dg_loader_opts *opts,
                         char *err, size_t cap);
DG_API void dg_loader_free(dg_loader *l);
/* Fills the next batch into dst[f] (caller buffers, each batch_size *
 * field[f].numel elements), or into the loader's own buffers when dst is
 * NULL (see dg_loader_buffer); *rows receives the batch's sample count
 * (< batch_size only for a final partial batch). At the end of each epoch it
 * returns DG_OK with *rows == 0 once, and the position moves to the start of
 * the next epoch. A failure is the dataset's code, with dg_loader_errmsg
 * naming the sample. */
DG_API int dg_loader_next(dg_loader *l, void *const *dst, int64_t *rows);
/* Detail of the last dg_loader_next failure ("" when none). */
DG_API const char *dg_loader_errmsg(const dg_loader *l);
/* The loader's own buffer for field f (batch_size * numel elements), or NULL. */
DG_API void *dg_loader_buffer(dg_loader *l, int f);
DG_API int64_t dg_loader_batches_per_epoch(const dg_loader *l);
/* Samples this rank sees per epoch (every rank the same). */
DG_API int64_t dg_loader_samples_per_rank(const dg_loader *l);
/* Position: the epoch and the index of the next batch within it. */
DG_API void dg_loader_position(const dg_loader *l, int64_t *epoch, int64_t *batch);
/* Restores a position saved by dg_loader_position (checkpoint resume). */
DG_API int dg_loader_seek(dg_loader *l, int64_t epoch, int64_t batch);
/* The position as a count that does not depend on the world or batch size:
 * the epoch and how many positions of its shuffled order the ranks have
 * consumed together (batch * batch_size * world_size; the dataset size once
 * this rank's batches of the epoch are over). */
DG_API void dg_loader_tell(const dg_loader *l, int64_t *epoch, int64_t *samples);
/* Restores a position saved by dg_loader_tell, with any world or batch size
 * (0 <= samples <= dataset size, else DG_EINVAL). When samples falls on one
 * of this loader's batch boundaries it is dg_loader_seek; otherwise (a run
 * checkpointed on another number of ranks or batch size) the rest of the
 * epoch, positions [samples, size), is dealt rank-strided over this
 * loader's ranks, so across the two runs every sample of the epoch comes
 * once (the tail padded or dropped as shard_drop and drop_last say, as for
 * a whole epoch); later epochs are dealt whole. */
DG_API int dg_loader_seek_samples(dg_loader *l, int64_t epoch, int64_t samples);
/* Batches still to come in the current epoch (dg_loader_batches_per_epoch
 * less those taken, or fewer in an epoch resumed by dg_loader_seek_samples). */
DG_API int64_t dg_loader_batches_left(const dg_loader *l);
/* Dataset index of this rank's k-th sample in `epoch` (-1 when out of range):
 * the order the loader follows (for the current epoch, of its deal after
 * dg_loader_seek_samples). */
DG_API int64_t dg_loader_sample_index(const dg_loader *l, int64_t epoch, int64_t k);

#ifdef __cplusplus
}
#endif
#endif /* DGRAD_DATA_H */
