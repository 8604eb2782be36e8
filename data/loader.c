/* Batch loader: a seeded permutation per epoch, sharded across ranks, filled
 * into fixed buffers. The permutation is a keyed Feistel network over the
 * next power of four >= size (cycle-walking back into [0, size)), with round
 * keys drawn from the counter-based RNG (dg_rng_uniform) at offsets built
 * from (epoch, round, input): O(1) memory, any position computable directly,
 * so seeking costs nothing and no per-epoch state needs saving.
 * Ranks deal the epoch's order rank-strided, so after b batches of B on W
 * ranks exactly its first b*B*W positions are consumed, whatever W was:
 * a run resumed on another world size deals the rest of that epoch from
 * there (`off`, dg_loader_seek_samples) and every later epoch from 0. */
#include <string.h>

#include "data/data_impl.h"

#define FEISTEL_ROUNDS 6
#define LOADER_SEED_MIX 0x6c6f616465720000ull /* loader draws apart from init */

struct dg_loader {
  dg_dataset ds;
  dg_loader_opts op;
  int half_bits;       /* Feistel half width; domain 4^half_bits >= size */
  int64_t per_rank;    /* samples per rank per epoch */
  int64_t nbatches;
  int64_t epoch, batch; /* position: next batch */
  int64_t off;          /* this epoch's deal starts at this position (0 but
                           after dg_loader_seek_samples mid-epoch) */
  int64_t cur_per_rank, cur_nbatches; /* of this epoch's deal */
  void *buf[DG_DATA_MAX_FIELDS];    /* (batch_size, numel) each */
  size_t fbytes[DG_DATA_MAX_FIELDS]; /* bytes per sample per field */
  char errmsg[256];                  /* last failure of dg_loader_next */
};

static uint32_t round_fn(const dg_loader *l, int64_t epoch, int r, uint32_t x) {
  float u;
  uint64_t off = ((uint64_t)epoch << 27) | ((uint64_t)r << 24) | x;
  dg_rng_uniform(l->op.seed ^ LOADER_SEED_MIX, off, &u, 1);
  return (uint32_t)(u * 16777216.0f); /* the 24 bits of the draw */
}

static uint64_t feistel(const dg_loader *l, int64_t epoch, uint64_t x) {
  const int h = l->half_bits;
  const uint32_t mask = (uint32_t)((1ull << h) - 1);
  uint32_t left = (uint32_t)(x >> h) & mask, right = (uint32_t)x & mask;
  for (int r = 0; r < FEISTEL_ROUNDS; r++) {
    uint32_t nl = right;
    right = left ^ (round_fn(l, epoch, r, right) & mask);
    left = nl;
  }
  return ((uint64_t)left << h) | right;
}

/* Position t of the epoch's order over the whole dataset. */
static int64_t permute(const dg_loader *l, int64_t epoch, int64_t t) {
  if (!l->op.shuffle) return t;
  uint64_t x = (uint64_t)t;
  do x = feistel(l, epoch, x);
  while (x >= (uint64_t)l->ds.size);
  return (int64_t)x;
}

int64_t dg_loader_sample_index(const dg_loader *l, int64_t epoch, int64_t k) {
  if (!l || epoch < 0 || k < 0) return -1;
  int cur = epoch == l->epoch;
  if (k >= (cur ? l->cur_per_rank : l->per_rank)) return -1;
  /* rank-strided, as DistributedSampler, from this epoch's first position */
  int64_t t = (cur ? l->off : 0) + l->op.rank + k * l->op.world_size;
  return permute(l, epoch, t % l->ds.size);
}

/* Deals the current epoch's positions [off, size) over the ranks. */
static void deal(dg_loader *l, int64_t off) {
  const int64_t W = l->op.world_size, B = l->op.batch_size, rest = l->ds.size - off;
  l->off = off;
  l->cur_per_rank = off == 0 ? l->per_rank : l->op.shard_drop ? rest / W : (rest + W - 1) / W;
  l->cur_nbatches = l->op.drop_last ? l->cur_per_rank / B : (l->cur_per_rank + B - 1) / B;
}

static int check_opts(const dg_dataset *ds, const dg_loader_opts *op, char *err, size_t cap) {
  if (!ds || !ds->get || ds->nfields <= 0 || ds->nfields > DG_DATA_MAX_FIELDS)
    return dg__fail_msg(err, cap, DG_EINVAL,
                        "loader_new: the dataset needs a get function and 1..%d fields",
                        DG_DATA_MAX_FIELDS);
  if (ds->size <= 0 || ds->size >= ((int64_t)1 << 48))
    return dg__fail_msg(err, cap, DG_EINVAL, "loader_new: dataset size %lld outside [1, 2^48)",
                        (long long)ds->size);
  if (op->batch_size <= 0)
    return dg__fail_msg(err, cap, DG_EINVAL, "loader_new: batch_size %lld must be positive",
                        (long long)op->batch_size);
  if (op->world_size <= 0 || op->rank < 0 || op->rank >= op->world_size)
    return dg__fail_msg(err, cap, DG_EINVAL, "loader_new: rank %d of world_size %d",
                        op->rank, op->world_size);
  if (op->shard_drop && ds->size < op->world_size)
    return dg__fail_msg(err, cap, DG_EINVAL,
                        "loader_new: shard_drop with %lld samples for %d ranks leaves a "
                        "rank none", (long long)ds->size, op->world_size);
  for (int f = 0; f < ds->nfields; f++)
    if (dg_dtype_size(ds->field[f].dtype) == 0)
      return dg__fail_msg(err, cap, DG_EINVAL, "loader_new: field %d has an invalid dtype", f);
  return DG_OK;
}

int dg_loader_new(dg_loader **out, const dg_dataset *ds, const dg_loader_opts *opts, char *err,
                  size_t cap) {
  if (err && cap) err[0] = 0;
  if (!out || !opts) return dg__fail_msg(err, cap, DG_EINVAL, "loader_new: NULL out or opts");
  *out = NULL;
  dg_loader_opts op = *opts;
  if (op.world_size == 0) op.world_size = 1;
  int rc = check_opts(ds, &op, err, cap);
  if (rc) return rc;
  dg_loader *l = dg__calloc(1, sizeof *l);
  if (!l) return dg__fail_msg(err, cap, DG_ENOMEM, "loader_new: out of memory");
  l->ds = *ds;
  l->op = op;
  int bits = 1;
  while (((int64_t)1 << bits) < ds->size) bits++;
  l->half_bits = (bits + 1) / 2;
  int64_t W = op.world_size;
  l->per_rank = op.shard_drop ? ds->size / W : (ds->size + W - 1) / W;
  l->nbatches = op.drop_last ? l->per_rank / op.batch_size
                             : (l->per_rank + op.batch_size - 1) / op.batch_size;
  deal(l, 0);
  for (int f = 0; f < ds->nfields; f++) {
    l->fbytes[f] = ds->field[f].numel * dg_dtype_size(ds->field[f].dtype);
    l->buf[f] = dg__malloc(l->fbytes[f] * (size_t)op.batch_size + 1);
    if (!l->buf[f]) {
      dg_loader_free(l);
      return dg__fail_msg(err, cap, DG_ENOMEM, "loader_new: out of memory for field %d's "
                          "batch buffer", f);
    }
  }
  *out = l;
  return DG_OK;
}

void dg_loader_free(dg_loader *l) {
  if (!l) return;
  for (int f = 0; f < DG_DATA_MAX_FIELDS; f++) dg__free(l->buf[f]);
  dg__free(l);
}

int dg_loader_next(dg_loader *l, void *const *dst, int64_t *rows) {
  if (rows) *rows = 0;
  if (!l) return DG_EINVAL;
  l->errmsg[0] = 0;
  if (!rows) {
    snprintf(l->errmsg, sizeof l->errmsg, "loader_next: rows is NULL (0 rows marks the end "
             "of an epoch)");
    return DG_EINVAL;
  }
  if (l->batch >= l->cur_nbatches) {
    l->epoch++;
    l->batch = 0;
    deal(l, 0);
    return DG_OK; /* *rows == 0: the epoch is over */
  }
  void *const *out = dst ? dst : l->buf;
  const int64_t B = l->op.batch_size, k0 = l->batch * B;
  const int64_t nrow = DG_MIN(B, l->cur_per_rank - k0);
  void *slot[DG_DATA_MAX_FIELDS];
  for (int64_t r = 0; r < nrow; r++) {
    for (int f = 0; f < l->ds.nfields; f++)
      slot[f] = (char *)out[f] + (size_t)r * l->fbytes[f];
    int64_t idx = dg_loader_sample_index(l, l->epoch, k0 + r);
    int rc = l->ds.get(l->ds.self, idx, slot);
    if (rc) {
      snprintf(l->errmsg, sizeof l->errmsg, "loader_next: epoch %lld batch %lld: the "
               "dataset failed on sample %lld: %s", (long long)l->epoch, (long long)l->batch,
               (long long)idx, dg_err_name(rc));
      return rc;
    }
  }
  l->batch++;
  if (rows) *rows = nrow;
  return DG_OK;
}

const char *dg_loader_errmsg(const dg_loader *l) { return l ? l->errmsg : "no loader"; }

void *dg_loader_buffer(dg_loader *l, int f) {
  return l && f >= 0 && f < l->ds.nfields ? l->buf[f] : NULL;
}
int64_t dg_loader_batches_per_epoch(const dg_loader *l) { return l ? l->nbatches : 0; }
int64_t dg_loader_samples_per_rank(const dg_loader *l) { return l ? l->per_rank : 0; }

void dg_loader_position(const dg_loader *l, int64_t *epoch, int64_t *batch) {
  if (epoch) *epoch = l ? l->epoch : 0;
  if (batch) *batch = l ? l->batch : 0;
}

int dg_loader_seek(dg_loader *l, int64_t epoch, int64_t batch) {
  if (!l || epoch < 0 || epoch >= ((int64_t)1 << 37) || batch < 0 || batch > l->nbatches)
    return DG_EINVAL;
  deal(l, 0);
  l->epoch = epoch;
  l->batch = batch;
  return DG_OK;
}

int64_t dg_loader_batches_left(const dg_loader *l) {
  return l ? l->cur_nbatches - l->batch : 0;
}

void dg_loader_tell(const dg_loader *l, int64_t *epoch, int64_t *samples) {
  if (epoch) *epoch = l ? l->epoch : 0;
  if (!samples) return;
  if (!l) *samples = 0;
  else if (l->batch >= l->cur_nbatches) *samples = l->ds.size; /* dealt, or dropped */
  else *samples = l->off + l->batch * l->op.batch_size * l->op.world_size;
}

int dg_loader_seek_samples(dg_loader *l, int64_t epoch, int64_t samples) {
  if (!l || epoch < 0 || epoch >= ((int64_t)1 << 37) || samples < 0 || samples > l->ds.size)
    return DG_EINVAL;
  const int64_t q = l->op.batch_size * l->op.world_size;
  l->epoch = epoch;
  deal(l, 0);
  if (samples == l->ds.size) l->batch = l->nbatches; /* the epoch is over */
  else if (samples % q == 0 && samples / q <= l->nbatches) l->batch = samples / q;
  else { /* another world or batch size left it between two of our batches */
    deal(l, samples);
    l->batch = 0;
  }
  return DG_OK;
}
