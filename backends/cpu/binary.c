/* Element-wise binary kernels of the CPU backend (the op and its
 * broadcast plan: ops/binary.c): add, sub, mul, div and their gradients
 * over a plan, and the sum of a gradient over broadcast dims.
 *
 * The inner loops are specialised for operand strides of 1 (streamed) and
 * 0 (broadcast scalar); other strides (non-contiguous views) are read in
 * place. The loops run through one kernel (run_range) compiled for
 * AVX-512, AVX2 and the baseline (DG_SIMD_FN) and split by output elements
 * over the compute pool when long: element-wise, so any split gives the
 * same bits. A broadcast input's gradient is summed in double precision
 * (the op's scratch), then added or stored. */
#include <string.h>

#include "backends/cpu/cpu_impl.h"
#include "backends/kern_binary.h"

/* o[i] (=|+=) EXPR over one row, specialised on operand strides so the
 * streamed cases vectorise. EXPR reads A, B (the current elements of a and
 * b) and d[i]. */
#define ROW_LOOPS(ASSIGN, EXPR)                                                  \
  do {                                                                           \
    if (sa == 1 && sb == 1) {                                                    \
      for (int64_t i = 0; i < n; i++) { float A = a[i], B = b[i];                \
        (void)A; (void)B; o[i] ASSIGN (EXPR); }                                  \
    } else if (sa == 1 && sb == 0) {                                             \
      const float B = b[0];                                                      \
      for (int64_t i = 0; i < n; i++) { float A = a[i];                          \
        (void)A; (void)B; o[i] ASSIGN (EXPR); }                                  \
    } else if (sa == 0 && sb == 1) {                                             \
      const float A = a[0];                                                      \
      for (int64_t i = 0; i < n; i++) { float B = b[i];                          \
        (void)A; (void)B; o[i] ASSIGN (EXPR); }                                  \
    } else {                                                                     \
      for (int64_t i = 0; i < n; i++) { float A = a[i * sa], B = b[i * sb];      \
        (void)A; (void)B; o[i] ASSIGN (EXPR); }                                  \
    }                                                                            \
  } while (0)

#define ROW_KINDS(ASSIGN)                                    \
  switch (kind) {                                            \
    case DG_BIN_ADD: ROW_LOOPS(ASSIGN, A + B); break;        \
    case DG_BIN_SUB: ROW_LOOPS(ASSIGN, A - B); break;        \
    case DG_BIN_MUL: ROW_LOOPS(ASSIGN, A * B); break;        \
    case DG_BIN_DIV: ROW_LOOPS(ASSIGN, A / B); break;        \
    case DG_BIN_GMUL_A: ROW_LOOPS(ASSIGN, d[i] * B); break;  \
    case DG_BIN_GMUL_B: ROW_LOOPS(ASSIGN, d[i] * A); break;  \
    case DG_BIN_GDIV_A: ROW_LOOPS(ASSIGN, d[i] / B); break;  \
    default: ROW_LOOPS(ASSIGN, -d[i] * A / (B * B)); break;  \
  }

/* One row: a (n, stride sa), b (n, stride sb), d (n) or NULL, o (n). */
DG_INLINE void row(int kind, int acc, int64_t n, const float *a, int64_t sa, const float *b,
                   int64_t sb, const float *restrict d, float *restrict o) {
  if (acc) ROW_KINDS(+=)
  else ROW_KINDS(=)
}

typedef dg__binary_args run_job;

/* Output elements [lo, hi) of the plan: o [+]= f(a, b, d), with o and d
 * contiguous in the output's shape. Rows may be cut at lo and hi. */
DG_INLINE void run_range_body(const run_job *j, int64_t lo, int64_t hi) {
  const dg__bplan *p = j->p;
  const int64_t n3 = p->n[3], n2 = p->n[2], n1 = p->n[1];
  const int64_t sa3 = p->s[0][3], sb3 = p->s[1][3];
  int64_t r = lo / n3, c = lo - r * n3;
  for (int64_t off = lo; off < hi; r++, c = 0) {
    int64_t i2 = r % n2, i1 = (r / n2) % n1, i0 = r / (n2 * n1);
    int64_t oa = i0 * p->s[0][0] + i1 * p->s[0][1] + i2 * p->s[0][2] + c * sa3;
    int64_t ob = i0 * p->s[1][0] + i1 * p->s[1][1] + i2 * p->s[1][2] + c * sb3;
    int64_t len = DG_MIN(n3 - c, hi - off);
    row(j->kind, j->acc, len, j->a + oa, sa3, j->b + ob, sb3, j->d ? j->d + off : NULL,
        j->o + off);
    off += len;
  }
}
DG_SIMD_FN(run_range, (const run_job *j, int64_t lo, int64_t hi), (j, lo, hi))

static void run_task(void *arg, int64_t lo, int64_t hi) { run_range(arg, lo, hi); }

/* Runs the kind over the plan, split over the pool when long. */
static void cpu_binary_run(const dg__binary_args *a) {
  dg__parallel_range(a->p->total, DG_GRAIN_MEM, run_task, (void *)a);
}

/* gx (nx) (+)= scale * g summed over the dims along which x was broadcast;
 * sums in double. */
static void cpu_binary_reduce(const dg__bsum_args *a) {
  const dg__bplan p = *a->p;
  const float *g = a->g;
  double *acc = a->work;
  int64_t nx = a->nx;
  memset(acc, 0, (size_t)nx * sizeof *acc);
  int64_t off = 0, n3 = p.n[3], s3 = p.s[0][3];
  for (int64_t i0 = 0; i0 < p.n[0]; i0++)
    for (int64_t i1 = 0; i1 < p.n[1]; i1++)
      for (int64_t i2 = 0; i2 < p.n[2]; i2++, off += n3) {
        double *restrict ar = acc + i0 * p.s[0][0] + i1 * p.s[0][1] + i2 * p.s[0][2];
        const float *restrict gr = g + off;
        if (s3) { /* x keeps this dim: elementwise; x's inner stride is 1 */
          for (int64_t i = 0; i < n3; i++) ar[i] += gr[i];
        } else { /* x broadcast along the row: sum it */
          double s = 0;
          for (int64_t i = 0; i < n3; i++) s += gr[i];
          ar[0] += s;
        }
      }
  float *gx = a->gx;
  float scale = a->scale;
  if (a->acc) for (int64_t i = 0; i < nx; i++) gx[i] += (float)(scale * acc[i]);
  else for (int64_t i = 0; i < nx; i++) gx[i] = (float)(scale * acc[i]);
}

const struct dg__kern_binary dg__cpu_kern_binary = {cpu_binary_run, cpu_binary_reduce};
