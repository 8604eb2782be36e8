/* Fused multi-head self-attention kernels of the CPU backend (the op:
 * ops/attention.c).
 *
 * dg_attention(qkv (B, T, 3C), heads, causal, scale) -> y (B, T, C): for every
 * (batch b, head h), with hd = C / heads and q, k, v the (T, hd) column blocks
 * of qkv at offsets h*hd, C + h*hd, 2C + h*hd (row stride 3C):
 *
 *   S = scale * q k^T                       (T, T)
 *   P = softmax(S) over j (j <= i if causal) (T, T), zero above the diagonal
 *   y[:, h*hd : (h+1)*hd] = P v             (T, hd), row stride C
 *
 * The GEMMs run on strided views of qkv and write y in place: no split, no
 * head permute, no contiguous copies. Mask, scale and softmax are one pass
 * over j <= i. Backward, from the saved qkv and P:
 *
 *   dv = P^T dy,  dP = dy v^T,  dS = scale * P * (dP - rowsum(dP * P)),
 *   dq = dS k,    dk = dS^T q
 *
 * written straight into the (B, T, 3C) gradient of qkv (the first writer
 * overwrites). With a causal mask the GEMMs go by blocks of ATT_BLK rows and
 * skip the blocks above the diagonal. Where dg__sgemm_small_on (AMD CPUs
 * with AVX2, or DG_GEMM=own) the products run on dgrad's unpacked
 * small-product kernel (gemm_own.c) by tiles of 8 rows (fwd_pair_own,
 * bwd_pair_own): OpenBLAS's small-matrix paths ran these 32 x 32 x 32
 * products at half the core's FMA rate (Zen 4), 64 x 64 x 32 at 0.6 of
 * the kernel's (Zen 3). (b, h) pairs run on the compute
 * pool; each task calls the single-threaded GEMM. Nothing is allocated
 * outside the arena: P (B, H, T, T) is saved, k^T or v^T and the
 * backward's dP/dS are per-task scratch (the op takes it from its arena). */
#include <math.h>
#include <string.h>

#include "backends/cpu/cpu_impl.h"
#include "backends/kern_attention.h"

#define ATT_BLK 32 /* causal GEMM block (rows of S): 32 skips a quarter of T = 64's work */

/* exp(x) for x <= 0, branch-free so row loops vectorise: cpu_impl.h's
 * Cephes kernel (~1 ulp), flushed to 0 below -87.3 (and for -inf) where
 * that saturates at FLT_MIN. */
DG_INLINE float att_exp(float x) {
  int32_t keep = -(int32_t)(x >= -87.3365447504f);
  return dg__bits_to_f(dg__f_to_bits(dg__exp_nonpos(x)) & keep);
}

/* Float bits -> an int32 in the same order (negatives flipped); f_key_inv
 * undoes it. */
DG_INLINE int32_t f_key(float x) {
  int32_t b = dg__f_to_bits(x);
  return b ^ ((b >> 31) & INT32_MAX);
}
DG_INLINE int32_t f_key_inv(int32_t k) { return k ^ ((k >> 31) & INT32_MAX); }
/* f_key of 8 lanes (a macro: vectors are never parameters, cpu_impl.h). */
typedef int32_t dg__v8i __attribute__((vector_size(32)));
#define v8_key(v)                          \
  __extension__({                          \
    dg__v8i b_ = (dg__v8i)(v);             \
    b_ ^ ((b_ >> 31) & INT32_MAX);         \
  })

/* Horizontal max of 16 lanes as a tree (vector halves), not a chain of 16
 * dependent scalar ops; sums use DG_V8X2_SUM. */
DG_INLINE int32_t lanes_max(int32_t *a) {
  for (int k = 0; k < 8; k++) a[k] = a[k + 8] > a[k] ? a[k + 8] : a[k];
  for (int k = 0; k < 4; k++) a[k] = a[k + 4] > a[k] ? a[k + 4] : a[k];
  for (int k = 0; k < 2; k++) a[k] = a[k + 2] > a[k] ? a[k + 2] : a[k];
  return a[1] > a[0] ? a[1] : a[0];
}

/* Valid length of row i (n) and its length padded to whole 16-float chunks
 * inside the row (nv); loops below go by chunks of 16 (one vector each, no
 * vector epilogue for these short rows) and finish [n16, nv) scalar, which
 * only happens when T % 16 != 0. */
#define ROW_LENS(i, T, causal, n, nv, n16)                                          \
  int64_t n = (causal) ? (i) + 1 : (T);                                             \
  int64_t nv = (causal) ? DG_MIN((n + 15) & ~(int64_t)15, (T)) : (T);               \
  int64_t n16 = nv & ~(int64_t)15

/* Rows [r0, r1) of S (T, T), in place: row i (its first n_i = i + 1 entries
 * when causal, else all T, already scaled) -> softmax, zeros beyond n_i.
 * A causal row is padded with -inf to nv, whose exp is 0. */
DG_INLINE void softmax_rows_body(float *restrict S, int64_t r0, int64_t r1, int64_t T,
                                 int causal) {
  for (int64_t i = r0; i < r1; i++) {
    float *restrict s = S + i * T;
    ROW_LENS(i, T, causal, n, nv, n16);
    int64_t j;
    for (j = n; j < nv; j++) s[j] = -INFINITY;
    /* max on order-preserving integer keys: gcc vectorises an integer
     * max, not a float one (NaN semantics) */
    dg__v8i mx0 = {0}, mx1 = {0}; /* keys of lanes 0-7 and 8-15, in registers */
    mx0 += INT32_MIN, mx1 += INT32_MIN;
    for (j = 0; j < n16; j += 16) {
      dg__v8i k0 = v8_key(DG_V8_LOAD(s + j)), k1 = v8_key(DG_V8_LOAD(s + j + 8));
      dg__v8i g0 = k0 > mx0, g1 = k1 > mx1; /* -1 where greater */
      mx0 = (k0 & g0) | (mx0 & ~g0), mx1 = (k1 & g1) | (mx1 & ~g1);
    }
    int32_t mx[16];
    memcpy(mx, &mx0, sizeof mx0), memcpy(mx + 8, &mx1, sizeof mx1);
    for (; j < nv; j++) mx[0] = f_key(s[j]) > mx[0] ? f_key(s[j]) : mx[0];
    float m = dg__bits_to_f(f_key_inv(lanes_max(mx)));
    dg__v8 a0 = {0}, a1 = {0}; /* sums of lanes 0-7 and 8-15 */
    /* exp, then the sums in a pass of their own: in one loop the exp's
     * constants left no register for a1, spilled and reloaded every chunk
     * (the row took 3x its exps' time on a Zen 3); same sums, same bits */
    for (j = 0; j < n16; j += 16)
      for (int k = 0; k < 16; k++) s[j + k] = att_exp(s[j + k] - m);
    for (j = 0; j < n16; j += 16) a0 += DG_V8_LOAD(s + j), a1 += DG_V8_LOAD(s + j + 8);
    for (; j < nv; j++) {
      s[j] = att_exp(s[j] - m);
      a0[0] += s[j];
    }
    float inv = 1.0f / DG_V8X2_SUM(a0, a1);
    for (j = 0; j < n16; j += 16)
      for (int k = 0; k < 16; k++) s[j + k] *= inv;
    for (; j < nv; j++) s[j] *= inv;
    for (j = nv; j + 16 <= T; j += 16)
      for (int k = 0; k < 16; k++) s[j + k] = 0.0f;
    for (; j < T; j++) s[j] = 0.0f;
  }
}
DG_SIMD_FN(softmax_rows, (float *S, int64_t r0, int64_t r1, int64_t T, int causal),
           (S, r0, r1, T, causal))

/* Rows [r0, r1) of dS (T, T) from dP (in place) and P (T, T):
 * dS = scale * P * (dP - sum_j(dP * P)). P is 0 beyond n_i (and over the
 * padding), so a causal row runs to nv and is zeroed beyond. */
DG_INLINE void softmax_grad_rows_body(float *restrict D, const float *restrict P, int64_t r0,
                                      int64_t r1, int64_t T, int causal, float scale) {
  for (int64_t i = r0; i < r1; i++) {
    float *restrict d = D + i * T;
    const float *restrict p = P + i * T;
    if (i + 2 < r1) /* P was saved in forward: far by now */
      for (int64_t k = 0; k < T; k += 16) __builtin_prefetch(p + 2 * T + k);
    ROW_LENS(i, T, causal, n, nv, n16);
    (void)n;
    int64_t j;
    dg__v8 a0 = {0}, a1 = {0}; /* lanes 0-7 and 8-15 */
    for (j = 0; j < n16; j += 16) {
      a0 += DG_V8_LOAD(d + j) * DG_V8_LOAD(p + j);
      a1 += DG_V8_LOAD(d + j + 8) * DG_V8_LOAD(p + j + 8);
    }
    for (; j < nv; j++) a0[0] += d[j] * p[j];
    float s = DG_V8X2_SUM(a0, a1);
    for (j = 0; j < n16; j += 16)
      for (int k = 0; k < 16; k++) d[j + k] = scale * p[j + k] * (d[j + k] - s);
    for (; j < nv; j++) d[j] = scale * p[j] * (d[j] - s);
    for (j = nv; j + 16 <= T; j += 16)
      for (int k = 0; k < 16; k++) d[j + k] = 0.0f;
    for (; j < T; j++) d[j] = 0.0f;
  }
}
DG_SIMD_FN(softmax_grad_rows,
           (float *D, const float *P, int64_t r0, int64_t r1, int64_t T, int causal, float scale),
           (D, P, r0, r1, T, causal, scale))

typedef struct {
  int64_t B, T, C, H, hd;
  int causal, ntasks;
  int64_t stride;   /* scratch floats per task (task_floats) */
  float scale;
  const float *qkv; /* (B, T, 3C) */
  float *y;         /* (B, T, C) */
  float *P;         /* (B, H, T, T) saved (NULL with P_scratch) */
  int P_scratch;
  /* backward */
  const float *dy;  /* (B, T, C) */
  float *dqkv;      /* (B, T, 3C) */
  float *scratch;   /* per task: (hd, T) for k^T or v^T, then (T, T) for P or dS */
  float beta;       /* 0: first write into dqkv */
  int own;          /* dgrad's own small-product kernel (dg__sgemm_small_on) */
} att_job;

/* Scratch floats per task: (hd, T) for k^T or v^T, then (T, T) for P or
 * dS where with_tt (forward with P not kept, backward); whole 64-byte lines.
 * And the rows per tile on the own kernel's path (its micro-tile height). */
static int64_t task_floats(int64_t T, int64_t hd, int with_tt) {
  return (hd * T + (with_tt ? T * T : 0) + 15) & ~(int64_t)15;
}
#define OWN_ROWS 8

/* [lo, hi) of the B*H pairs for task t */
static void task_range(const att_job *j, int t, int64_t *lo, int64_t *hi) {
  int64_t n = j->B * j->H;
  *lo = n * t / j->ntasks;
  *hi = n * (t + 1) / j->ntasks;
}

static void fwd_pair(const att_job *j, int64_t bh, float *P /* (T, T) */) {
  int64_t b = bh / j->H, h = bh % j->H, T = j->T, C = j->C, hd = j->hd, ld = 3 * C;
  const float *q = j->qkv + b * T * ld + h * hd, *k = q + C, *v = q + 2 * C; /* (T, hd), ld 3C */
  float *y = j->y + b * T * C + h * hd;                                       /* (T, hd), ld C */
  for (int64_t r0 = 0; r0 < T; r0 += ATT_BLK) {
    int64_t r1 = DG_MIN(r0 + ATT_BLK, T), nc = j->causal ? r1 : T;
    /* S[r0:r1, 0:nc] = scale * q[r0:r1] k[0:nc]^T */
    dg__sgemm(0, 1, r1 - r0, nc, hd, j->scale, q + r0 * ld, ld, k, ld, 0.0f, P + r0 * T, T);
    softmax_rows(P, r0, r1, T, j->causal);
    /* y[r0:r1] = P[r0:r1, 0:nc] v[0:nc] */
    dg__sgemm(0, 0, r1 - r0, hd, nc, 1.0f, P + r0 * T, T, v, ld, 0.0f, y + r0 * C, C);
  }
}

/* With dgrad's own kernel (gemm_own.c): by tiles of OWN_ROWS rows, the
 * causal ones cut to the columns their 16-lane vectors reach (5/8 of T x T
 * at T = 64 against 3/4 by ATT_BLK), k^T turned once into kT (hd, T) and
 * every operand read in place by dg__sgemm_small. */
static void fwd_pair_own(const att_job *j, int64_t bh, float *P /* (T, T) */,
                         float *kT /* (hd, T) */) {
  int64_t b = bh / j->H, h = bh % j->H, T = j->T, C = j->C, hd = j->hd, ld = 3 * C;
  const float *q = j->qkv + b * T * ld + h * hd, *k = q + C, *v = q + 2 * C; /* (T, hd), ld 3C */
  float *y = j->y + b * T * C + h * hd;                                       /* (T, hd), ld C */
  dg__transpose(k, ld, T, hd, kT, T);
  for (int64_t r0 = 0; r0 < T; r0 += OWN_ROWS) {
    int64_t r1 = DG_MIN(r0 + OWN_ROWS, T), m = r1 - r0;
    int64_t nc = j->causal ? DG_MIN((r1 + 15) & ~(int64_t)15, T) : T; /* softmax reads to nv */
    /* S[r0:r1, 0:nc] = scale * q[r0:r1] kT[:, 0:nc] */
    dg__sgemm_small(m, nc, hd, j->scale, q + r0 * ld, ld, 1, kT, T, 0.0f, P + r0 * T, T);
    softmax_rows(P, r0, r1, T, j->causal);
    /* y[r0:r1] = P[r0:r1, 0:n] v[0:n] */
    dg__sgemm_small(m, hd, j->causal ? r1 : T, 1.0f, P + r0 * T, T, 1, v, ld, 0.0f, y + r0 * C,
                    C);
  }
}

static void fwd_task(void *arg, int t) {
  const att_job *j = arg;
  int64_t lo, hi, TT = j->T * j->T;
  float *mine = j->scratch + t * j->stride; /* kT, then P's scratch */
  task_range(j, t, &lo, &hi);
  for (int64_t bh = lo; bh < hi; bh++) {
    float *P = j->P_scratch ? mine + j->hd * j->T : j->P + bh * TT;
    if (j->own) fwd_pair_own(j, bh, P, mine);
    else fwd_pair(j, bh, P);
  }
}

/* Pair bh's operands in backward: q, k, v and dq, dk, dv (T, hd) at row
 * stride 3C, dy (T, hd) at C, P (T, T). */
typedef struct {
  const float *q, *k, *v, *dy, *P;
  float *dq, *dk, *dv;
} bwd_ptrs;

static bwd_ptrs bwd_at(const att_job *j, int64_t bh) {
  int64_t b = bh / j->H, h = bh % j->H, T = j->T, C = j->C;
  int64_t off = b * T * 3 * C + h * j->hd;
  const float *q = j->qkv + off;
  float *dq = j->dqkv + off;
  return (bwd_ptrs){q, q + C, q + 2 * C, j->dy + b * T * C + h * j->hd, j->P + bh * T * T,
                    dq, dq + C, dq + 2 * C};
}

static void bwd_pair(const att_job *j, int64_t bh, float *dS /* (T, T) */) {
  int64_t T = j->T, C = j->C, hd = j->hd, ld = 3 * C;
  bwd_ptrs p = bwd_at(j, bh);
  float beta = j->beta;
  for (int64_t r0 = 0; r0 < T; r0 += ATT_BLK) {
    int64_t r1 = DG_MIN(r0 + ATT_BLK, T), nc = j->causal ? r1 : T;
    /* dP[r0:r1, 0:nc] = dy[r0:r1] v[0:nc]^T, then dS in place */
    dg__sgemm(0, 1, r1 - r0, nc, hd, 1.0f, p.dy + r0 * C, C, p.v, ld, 0.0f, dS + r0 * T, T);
    softmax_grad_rows(dS, p.P, r0, r1, T, j->causal, j->scale);
    /* dq[r0:r1] = dS[r0:r1, 0:nc] k[0:nc] */
    dg__sgemm(0, 0, r1 - r0, hd, nc, 1.0f, dS + r0 * T, T, p.k, ld, beta, p.dq + r0 * ld, ld);
  }
  /* column blocks: rows c0.. of dk/dv see query rows i >= c0 when causal */
  for (int64_t c0 = 0; c0 < T; c0 += ATT_BLK) {
    int64_t c1 = DG_MIN(c0 + ATT_BLK, T), i0 = j->causal ? c0 : 0;
    /* dv[c0:c1] = P[i0:T, c0:c1]^T dy[i0:T];  dk[c0:c1] = dS[i0:T, c0:c1]^T q[i0:T] */
    dg__sgemm(1, 0, c1 - c0, hd, T - i0, 1.0f, p.P + i0 * T + c0, T, p.dy + i0 * C, C, beta,
              p.dv + c0 * ld, ld);
    dg__sgemm(1, 0, c1 - c0, hd, T - i0, 1.0f, dS + i0 * T + c0, T, p.q + i0 * ld, ld, beta,
              p.dk + c0 * ld, ld);
  }
}

/* bwd_pair with dgrad's own kernel, tiles as fwd_pair_own; dv and dk by
 * tiles of their rows, each over the query rows that see it. */
static void bwd_pair_own(const att_job *j, int64_t bh, float *dS /* (T, T) */,
                         float *vT /* (hd, T) */) {
  int64_t T = j->T, C = j->C, hd = j->hd, ld = 3 * C;
  bwd_ptrs p = bwd_at(j, bh);
  float beta = j->beta;
  dg__transpose(p.v, ld, T, hd, vT, T);
  for (int64_t r0 = 0; r0 < T; r0 += OWN_ROWS) {
    int64_t r1 = DG_MIN(r0 + OWN_ROWS, T), m = r1 - r0;
    int64_t nc = j->causal ? DG_MIN((r1 + 15) & ~(int64_t)15, T) : T;
    /* dP[r0:r1, 0:nc] = dy[r0:r1] vT[:, 0:nc], then dS in place */
    dg__sgemm_small(m, nc, hd, 1.0f, p.dy + r0 * C, C, 1, vT, T, 0.0f, dS + r0 * T, T);
    softmax_grad_rows(dS, p.P, r0, r1, T, j->causal, j->scale);
    /* dq[r0:r1] = dS[r0:r1, 0:n] k[0:n] */
    dg__sgemm_small(m, hd, j->causal ? r1 : T, 1.0f, dS + r0 * T, T, 1, p.k, ld, beta,
                    p.dq + r0 * ld, ld);
  }
  for (int64_t c0 = 0; c0 < T; c0 += OWN_ROWS) {
    int64_t c1 = DG_MIN(c0 + OWN_ROWS, T), i0 = j->causal ? c0 : 0;
    /* dv[c0:c1] = P[i0:T, c0:c1]^T dy[i0:T];  dk[c0:c1] = dS[i0:T, c0:c1]^T q[i0:T] */
    dg__sgemm_small(c1 - c0, hd, T - i0, 1.0f, p.P + i0 * T + c0, 1, T, p.dy + i0 * C, C, beta,
                    p.dv + c0 * ld, ld);
    dg__sgemm_small(c1 - c0, hd, T - i0, 1.0f, dS + i0 * T + c0, 1, T, p.q + i0 * ld, ld, beta,
                    p.dk + c0 * ld, ld);
  }
}

static void bwd_task(void *arg, int t) {
  const att_job *j = arg;
  int64_t lo, hi;
  float *mine = j->scratch + t * j->stride; /* vT, then dS */
  task_range(j, t, &lo, &hi);
  for (int64_t bh = lo; bh < hi; bh++) {
    if (j->own) bwd_pair_own(j, bh, mine + j->hd * j->T, mine);
    else bwd_pair(j, bh, mine + j->hd * j->T);
  }
}

/* Enough tasks to balance the pool, few enough that scratch stays small. */
static int att_ntasks(int64_t pairs) {
  int64_t n = 4 * (int64_t)dg_get_num_threads();
  return (int)DG_MAX(1, DG_MIN(pairs, n));
}

/* Tasks for `pairs` (b, h) pairs, at most one task's scratch (stride
 * floats) each of the caller's. */
static int scratch_tasks(const dg__att_args *a, int64_t pairs, int64_t stride) {
  int nt = att_ntasks(pairs);
  if (stride > 0 && a->nscratch / stride < nt) nt = (int)DG_MAX((int64_t)1, a->nscratch / stride);
  return nt;
}

static int64_t cpu_att_scratch(int64_t B, int64_t H, int64_t T, int64_t hd, int with_tt) {
  if (B * H * T == 0) return 0;
  return (int64_t)att_ntasks(B * H) * task_floats(T, hd, with_tt);
}

static void cpu_att_forward(const dg__att_args *a) {
  att_job j = {.B = a->B, .T = a->T, .C = a->C, .H = a->H, .causal = a->causal,
               .scale = a->scale, .qkv = a->qkv, .y = a->y, .scratch = a->scratch,
               .own = dg__sgemm_small_on()};
  j.hd = j.C / j.H;
  if (j.B * j.H * j.T == 0) return;
  j.P = a->P;
  j.P_scratch = !a->P;
  j.stride = task_floats(j.T, j.hd, j.P_scratch);
  j.ntasks = scratch_tasks(a, j.B * j.H, j.stride);
  dg__parallel_for(j.ntasks, fwd_task, &j);
}

static void cpu_att_backward(const dg__att_args *a) {
  att_job j = {.B = a->B, .T = a->T, .C = a->C, .H = a->H, .causal = a->causal,
               .scale = a->scale, .qkv = a->qkv, .P = a->P, .dy = a->dy, .dqkv = a->dqkv,
               .beta = a->acc ? 1.0f : 0.0f, .scratch = a->scratch,
               .own = dg__sgemm_small_on()};
  j.hd = j.C / j.H;
  if (j.B * j.H * j.T == 0) return;
  j.stride = task_floats(j.T, j.hd, 1);
  j.ntasks = scratch_tasks(a, j.B * j.H, j.stride);
  dg__parallel_for(j.ntasks, bwd_task, &j);
}

const struct dg__kern_attention dg__cpu_kern_attention = {cpu_att_scratch, cpu_att_forward,
                                                          cpu_att_backward};
