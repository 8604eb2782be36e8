/* concat/split kernels of the CPU backend (the op: ops/concat.c): block
 * copies and gradient routing, `outer` contiguous blocks of a part at a row
 * stride. */
#include <string.h>

#include "backends/cpu/cpu_impl.h"
#include "backends/kern_concat.h"

/* dst[o * dst_row + j] += src[o * src_row + j] for o < outer, j < len
 * (= when store). */
static void add_blocks(int store, float *restrict dst, int64_t dst_row, const float *restrict src,
                       int64_t src_row, int64_t outer, int64_t len) {
  for (int64_t o = 0; o < outer; o++) {
    float *restrict d = dst + o * dst_row;
    const float *restrict s = src + o * src_row;
    if (store) memcpy(d, s, (size_t)len * sizeof *d);
    else for (int64_t j = 0; j < len; j++) d[j] += s[j];
  }
}

static void cpu_copy_blocks(const dg__blocks_args *a) {
  for (int64_t o = 0; o < a->outer; o++)
    memcpy(a->dst + o * a->dst_row, a->src + o * a->src_row, (size_t)a->len * sizeof(float));
}

static void cpu_add_blocks(const dg__blocks_args *a) {
  add_blocks(a->store, a->dst, a->dst_row, a->src, a->src_row, a->outer, a->len);
}

static void cpu_split_bwd(const dg__split_bwd_args *a) {
  const int64_t S = a->S, off = a->off, sk = a->sk, inner = a->inner;
  if (a->store) /* fresh: zero the other parts' columns, store this one's */
    for (int64_t o = 0; o < a->outer; o++) {
      float *row = a->dx + o * S * inner;
      memset(row, 0, (size_t)(off * inner) * sizeof *row);
      memset(row + (off + sk) * inner, 0, (size_t)((S - off - sk) * inner) * sizeof *row);
    }
  add_blocks(a->store, a->dx + off * inner, S * inner, a->dy, sk * inner, a->outer, sk * inner);
}

const struct dg__kern_concat dg__cpu_kern_concat = {cpu_copy_blocks, cpu_add_blocks,
                                                    cpu_split_bwd};
