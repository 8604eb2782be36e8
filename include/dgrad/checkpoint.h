/* dgrad/checkpoint.h — training checkpoints in the safetensors format.
 *
 * File layout (https://github.com/huggingface/safetensors):
 *   8 bytes      N, little-endian u64: length of the JSON header
 *   N bytes      JSON: {"<name>": {"dtype": "F32", "shape": [..],
 *                         "data_offsets": [begin, end]}, ...,
 *                        "__metadata__": {"<key>": "<string>", ...}}
 *                padded with spaces to a multiple of 8
 *   rest         raw little-endian tensor data; offsets are relative to it
 * Tensors: every parameter under its store name ("layers.0.weight"), in
 * registration order; then every buffer of the store (dg_params_add_buffer,
 * e.g. "bn1.running_mean"), which a load requires as it does parameters;
 * then, when an optimizer is given, each of its state
 * buffers sliced per parameter as "optim.<state>.<param name>" (e.g.
 * "optim.exp_avg.layers.0.weight"). Metadata (all strings): "format"
 * ("dgrad"), "dgrad_ckpt_version" ("1"), "dgrad_version", "step", and when
 * given "rng_seed"/"rng_offset" (decimal u64), "data_epoch"/"data_batch"
 * (loader position) and "data_samples" (dg_loader_tell: what a load uses,
 * on any world size; files without it seek by data_batch), "optim" (dg_optim_name), "optim_lr", "optim_step", and
 * the caller's extra key/value pairs (hyper-parameters, model kind, ...).
 * Any safetensors reader (Python's safetensors, or 30 lines of json + struct)
 * reads the file.
 *
 * Saving is atomic: the file is written to a temporary file in the same
 * directory, fsync'ed, renamed over `path`, and the directory is fsync'ed,
 * so a crash or a failed write leaves the previous checkpoint intact.
 *
 * Loading streams tensor by tensor into the store's (and optimizer's) own
 * buffers; it never reads the whole file into memory. Before writing any
 * buffer it checks the header length, the JSON syntax, that every name is
 * known and every expected tensor present, dtypes (F32), shapes, byte sizes,
 * and that the offsets tile the data section exactly (so a truncated file is
 * refused); a mismatch gives DG_EFORMAT / DG_ESHAPE / DG_EDTYPE /
 * DG_ENOTFOUND / DG_EMISMATCH with a message naming the file and the tensor,
 * e.g. "layers.3.weight: shape (10, 256) in file, (10, 128) in model". A read
 * error during the data phase (DG_EIO) may leave buffers partly overwritten.
 *
 * Errors. Every function returns DG_OK or a negative DG_E* code and writes a
 * message into err (errcap bytes, always terminated; err may be NULL).
 *
 * Threads. Nothing else may use the store, optimizer, ctx or loader during a
 * save or load. Different checkpoints may be saved concurrently. */
#ifndef DGRAD_CHECKPOINT_H
#define DGRAD_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "dgrad/common.h"
#include "dgrad/data.h"
#include "dgrad/optim.h"
#include "dgrad/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a checkpoint holds. Only params is required; every other handle may
 * be NULL (not saved / not restored). Borrowed: nothing is owned. */
typedef struct {
  dg_params *params;   /* parameters, by name */
  dg_optim *optim;     /* state buffers, kind, lr and step count */
  dg_ctx *ctx;         /* RNG (seed, offset) */
  dg_loader *loader;   /* data position (epoch, next batch) */
  int64_t step;        /* the caller's global step: saved; filled on load */
  /* Extra metadata saved as given (keys must not start with "__" nor clash
   * with the keys above). Ignored by load; read with dg_checkpoint_meta. */
  int nextra;
  const char *const *extra_keys;
  const char *const *extra_vals;
} dg_checkpoint;

/* Writes `c` to `path` atomically (see above). */
DG_API int dg_checkpoint_save(const char *path, const dg_checkpoint *c, char *err, size_t errcap);

/* Restores what `c` names from `path`: parameter values; optimizer state,
 * lr and step count when c->optim is set (the file's "optim" must equal
 * dg_optim_name, else DG_EMISMATCH); the ctx RNG state and loader position
 * when set (DG_ENOTFOUND when the file lacks them); c->step. Optimizer
 * tensors in the file are ignored when c->optim is NULL (weights only);
 * any other tensor the model lacks is refused. Parameter groups
 * (dg_optim_set_group) are configuration, not in the file: set them on the
 * optimizer as when it was saved. Strict: dg_checkpoint_load_with with
 * NULL options. */
DG_API int dg_checkpoint_load(const char *path, dg_checkpoint *c, char *err, size_t errcap);

/* ---- partial and renamed loads (torch's load_state_dict(strict=False)
 * and a key map): a backbone into a bigger model, "model.layers.0.weight"
 * into "layers.0.weight" ---- */

typedef enum {
  DG_CKPT_MISSING = 1,   /* in the model, not in the file */
  DG_CKPT_UNEXPECTED = 2 /* in the file, not in the model */
} dg_ckpt_diff;

/* Options of dg_checkpoint_load_with; zeroed (or NULL) means
 * dg_checkpoint_load. */
typedef struct {
  /* 0 (strict): a tensor of the model (parameter, buffer, optimizer state
   * slice) the file lacks, or a tensor of the file the model lacks, is
   * DG_ENOTFOUND naming the first one and the totals, and nothing is
   * written. 1: those are skipped: missing tensors keep their values (and
   * missing optimizer state its values), unexpected ones are not read.
   * Either way a dtype or shape mismatch is refused (DG_EDTYPE, DG_ESHAPE)
   * and the rest of the file is checked as by dg_checkpoint_load. */
  int non_strict;
  /* Renames each tensor name of the file before it is looked up in the
   * model (for optimizer state, the parameter name after "optim.<state>.").
   * First the prefix map: the first k whose rename_from[k] starts the name
   * replaces that prefix with rename_to[k] ("model." -> "" strips a prefix,
   * "" -> "backbone." adds one). Then rename, when set: it writes the
   * model's name into out (cap bytes, terminated) and returns 1, returns 0
   * to keep the name, or -1 to drop the tensor (not loaded, not reported).
   * Names longer than 511 bytes after renaming are DG_EINVAL. */
  int nrename;
  const char *const *rename_from;
  const char *const *rename_to;
  int (*rename)(void *user, const char *name, char *out, size_t cap);
  void *rename_user;
  /* Called, before anything is written, for each missing tensor (its model
   * name, "optim.<state>.<param>" for state) and each unexpected one (its
   * name in the file); in strict loads too. May be NULL. */
  void (*report)(void *user, dg_ckpt_diff what, const char *name);
  void *report_user;
  /* Out: how many tensors were missing and unexpected (set by every call
   * that gets past the header). */
  int nmissing, nunexpected;
} dg_checkpoint_load_opts;

/* dg_checkpoint_load with options (NULL: strict, no renames). The
 * metadata rules (optimizer kind, RNG, loader position) are unchanged. */
DG_API int dg_checkpoint_load_with(const char *path, dg_checkpoint *c,
                                   dg_checkpoint_load_opts *opts, char *err, size_t errcap);

/* Checks that path is a whole checkpoint without reading its tensors: the
 * header parses and the data section is exactly what its offsets tile (a
 * file cut short by a copy or a full disk is DG_EFORMAT naming the tensor
 * and the sizes). dg_checkpoint_load checks the same before writing. */
DG_API int dg_checkpoint_verify(const char *path, char *err, size_t errcap);

/* Reads one metadata value of the file into val (cap bytes, terminated;
 * DG_EINVAL when it does not fit). DG_ENOTFOUND when the key is absent.
 * Reads only the header. */
DG_API int dg_checkpoint_meta(const char *path, const char *key, char *val, size_t cap,
                              char *err, size_t errcap);

#ifdef __cplusplus
}
#endif
#endif /* DGRAD_CHECKPOINT_H */
