/* Pipeline planning: the exact min-max partition, the schedule tables of
 * GPipe and 1F1B, and the validator that runs a table before the pipe does
 * (see pipe_plan.h). Everything here is a pure function of its arguments,
 * so every rank computes the same plan from the same inputs. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/common_impl.h"
#include "dist/pipe_plan.h"

/* ---- partition ---- */

int dg__pipe_balance_check(const int *balance, int k, int n, char *err, size_t cap) {
  if (!balance || k < 1 || k > DG__PIPE_MAX_STAGES)
    return dg__fail_msg(err, cap, DG_EINVAL, "pipe balance: %d stages (want 1 to %d)", k,
                        DG__PIPE_MAX_STAGES);
  long sum = 0;
  for (int s = 0; s < k; s++) {
    if (balance[s] < 1)
      return dg__fail_msg(err, cap, DG_EINVAL, "pipe balance: stage %d has %d layers (every "
                          "stage needs at least one)", s, balance[s]);
    sum += balance[s];
  }
  if (sum != n)
    return dg__fail_msg(err, cap, DG_EINVAL, "pipe balance: the stages hold %ld layers, the "
                        "model has %d", sum, n);
  return DG_OK;
}

static int partition_args(const double *cost, const double *cut, const double *mem, int n,
                          int k, double mem_cap, char *err, size_t cap) {
  if (!cost || k < 1 || k > DG__PIPE_MAX_STAGES || k > n)
    return dg__fail_msg(err, cap, DG_EINVAL, "pipe partition: %d layers into %d stages (want "
                        "1 <= stages <= min(layers, %d))", n, k, DG__PIPE_MAX_STAGES);
  for (int i = 0; i < n; i++) {
    if (!(cost[i] >= 0) || isinf(cost[i]))
      return dg__fail_msg(err, cap, DG_EINVAL, "pipe partition: layer %d costs %g", i, cost[i]);
    if (cut && i < n - 1 && (!(cut[i] >= 0) || isinf(cut[i])))
      return dg__fail_msg(err, cap, DG_EINVAL, "pipe partition: the cut after layer %d costs "
                          "%g", i, cut[i]);
    if (mem && mem_cap > 0 && !(mem[i] <= mem_cap))
      return dg__fail_msg(err, cap, DG_EINVAL, "pipe partition: layer %d alone needs %g bytes, "
                          "over the per-stage cap of %g", i, mem[i], mem_cap);
  }
  return DG_OK;
}

/* best[j * (n + 1) + i]: the least largest stage cost of layers [0, i) in
 * j stages; from[..]: where its last stage starts. */
int dg__pipe_partition(const double *cost, const double *mem, int n, int k, double mem_cap,
                       int *first, double *max_cost, char *err, size_t cap) {
  return dg__pipe_partition_cut(cost, NULL, mem, n, k, mem_cap, first, max_cost, err, cap);
}

int dg__pipe_partition_cut(const double *cost, const double *cut, const double *mem, int n,
                           int k, double mem_cap, int *first, double *max_cost, char *err,
                           size_t cap) {
  int rc = partition_args(cost, cut, mem, n, k, mem_cap, err, cap);
  if (rc) return rc;
  const int capped = mem && mem_cap > 0;
  const size_t w = (size_t)n + 1;
  double *pc = dg__malloc(2 * w * sizeof *pc), *pm = pc + w;
  double *best = dg__malloc((size_t)(k + 1) * w * sizeof *best);
  int *from = dg__malloc((size_t)(k + 1) * w * sizeof *from);
  if (!pc || !best || !from) {
    dg__free(pc), dg__free(best), dg__free(from);
    return dg__fail_msg(err, cap, DG_ENOMEM, "pipe partition: out of memory");
  }
  pc[0] = pm[0] = 0;
  for (int i = 0; i < n; i++) pc[i + 1] = pc[i] + cost[i], pm[i + 1] = pm[i] + (mem ? mem[i] : 0);
  for (size_t x = 0; x < (size_t)(k + 1) * w; x++) best[x] = INFINITY, from[x] = -1;
  best[0] = 0; /* no layers in no stages */
  for (int j = 1; j <= k; j++)
    for (int i = j; i <= n - (k - j); i++) /* leave a layer for each later stage */
      for (int p = j - 1; p < i; p++) {    /* last stage is [p, i) */
        const double prev = best[(size_t)(j - 1) * w + p];
        if (prev == INFINITY || (capped && pm[i] - pm[p] > mem_cap)) continue;
        const double edges = cut ? (p > 0 ? cut[p - 1] : 0) + (i < n ? cut[i - 1] : 0) : 0;
        const double c = fmax(prev, pc[i] - pc[p] + edges);
        if (c < best[(size_t)j * w + i]) best[(size_t)j * w + i] = c, from[(size_t)j * w + i] = p;
      }
  const double top = best[(size_t)k * w + n];
  if (top == INFINITY) {
    dg__free(pc), dg__free(best), dg__free(from);
    return dg__fail_msg(err, cap, DG_EINVAL, "pipe partition: no split of %d layers into %d "
                        "stages keeps every stage under the memory cap of %g", n, k, mem_cap);
  }
  first[k] = n;
  for (int j = k, i = n; j >= 1; j--) i = first[j - 1] = from[(size_t)j * w + i];
  if (max_cost) *max_cost = top;
  dg__free(pc), dg__free(best), dg__free(from);
  return DG_OK;
}

/* ---- schedules ---- */

const char *dg__pipe_op_name(int op) {
  static const char *const names[] = {"forward", "backward", "send activation",
                                      "receive activation", "send gradient", "receive gradient"};
  return op >= 0 && op <= DG__PIPE_RECV_GRAD ? names[op] : "?";
}

const char *dg__pipe_kind_name(int kind) {
  return kind == DG__PIPE_GPIPE ? "gpipe" : kind == DG__PIPE_1F1B ? "1f1b" : "?";
}

typedef struct {
  dg__pipe_table *t;
  int s, n; /* stage being written, actions so far */
} writer;

static void put(writer *wr, int op, int mb) {
  wr->t->act[wr->n].op = (uint8_t)op;
  wr->t->act[wr->n++].mb = mb;
}

static void fwd(writer *wr, int mb) {
  if (wr->s > 0) put(wr, DG__PIPE_RECV_ACT, mb);
  put(wr, DG__PIPE_FWD, mb);
  if (wr->s < wr->t->K - 1) put(wr, DG__PIPE_SEND_ACT, mb);
}

static void bwd(writer *wr, int mb) {
  if (wr->s < wr->t->K - 1) put(wr, DG__PIPE_RECV_GRAD, mb);
  put(wr, DG__PIPE_BWD, mb);
  if (wr->s > 0) put(wr, DG__PIPE_SEND_GRAD, mb);
}

int dg__pipe_schedule(dg__pipe_table *t, int kind, int K, int M, char *err, size_t cap) {
  memset(t, 0, sizeof *t);
  if (K < 1 || K > DG__PIPE_MAX_STAGES || M < 1 || M > (1 << 20) ||
      (kind != DG__PIPE_GPIPE && kind != DG__PIPE_1F1B))
    return dg__fail_msg(err, cap, DG_EINVAL, "pipe schedule: kind %d, %d stages, %d micro-"
                        "batches (want gpipe or 1f1b, 1 to %d stages, 1 to 2^20 micro-batches)",
                        kind, K, M, DG__PIPE_MAX_STAGES);
  t->K = K, t->M = M;
  t->act = dg__malloc((size_t)6 * (size_t)M * (size_t)K * sizeof *t->act);
  if (!t->act) return dg__fail_msg(err, cap, DG_ENOMEM, "pipe schedule: out of memory");
  writer wr = {t, 0, 0};
  for (int s = 0; s < K; s++) {
    wr.s = s;
    t->off[s] = wr.n;
    if (kind == DG__PIPE_GPIPE) {
      for (int m = 0; m < M; m++) fwd(&wr, m);
      for (int m = 0; m < M; m++) bwd(&wr, m);
    } else {
      int warm = K - s - 1 < M ? K - s - 1 : M, f = 0, b = 0;
      while (f < warm) fwd(&wr, f++);
      while (f < M) fwd(&wr, f++), bwd(&wr, b++);
      while (b < M) bwd(&wr, b++);
    }
  }
  t->off[K] = wr.n;
  return DG_OK;
}

void dg__pipe_table_free(dg__pipe_table *t) {
  if (!t) return;
  dg__free(t->act);
  t->act = NULL;
}

/* ---- validation ---- */

/* Which ops stage s must hold for every micro-batch. */
static int needs(const dg__pipe_table *t, int s, int op) {
  switch (op) {
  case DG__PIPE_RECV_ACT: case DG__PIPE_SEND_GRAD: return s > 0;
  case DG__PIPE_SEND_ACT: case DG__PIPE_RECV_GRAD: return s < t->K - 1;
  default: return 1;
  }
}

/* pos[(s * M + mb) * 6 + op]: index of that action in stage s's row, -1 when
 * absent. Checks ranges, duplicates, presence and the order inside a stage. */
static int structure(const dg__pipe_table *t, int *pos, char *err, size_t cap) {
  const int K = t->K, M = t->M;
  for (size_t x = 0; x < (size_t)K * M * 6; x++) pos[x] = -1;
  for (int s = 0; s < K; s++)
    for (int i = t->off[s]; i < t->off[s + 1]; i++) {
      const int op = t->act[i].op, mb = t->act[i].mb, at = i - t->off[s];
      if (op > DG__PIPE_RECV_GRAD || mb < 0 || mb >= M || !needs(t, s, op))
        return dg__fail_msg(err, cap, DG_EINVAL, "pipe schedule: stage %d action %d: %s of "
                            "micro-batch %d has no place on stage %d of %d (%d micro-batches)",
                            s, at, dg__pipe_op_name(op), mb, s, K, M);
      int *p = &pos[((size_t)s * M + mb) * 6 + op];
      if (*p >= 0)
        return dg__fail_msg(err, cap, DG_EINVAL, "pipe schedule: stage %d actions %d and %d: "
                            "%s of micro-batch %d twice", s, *p, at, dg__pipe_op_name(op), mb);
      *p = at;
    }
  static const int before[][2] = {{DG__PIPE_RECV_ACT, DG__PIPE_FWD},
                                  {DG__PIPE_FWD, DG__PIPE_SEND_ACT},
                                  {DG__PIPE_FWD, DG__PIPE_BWD},
                                  {DG__PIPE_RECV_GRAD, DG__PIPE_BWD},
                                  {DG__PIPE_BWD, DG__PIPE_SEND_GRAD}};
  for (int s = 0; s < K; s++)
    for (int mb = 0; mb < M; mb++) {
      const int *p = &pos[((size_t)s * M + mb) * 6];
      for (int op = 0; op < 6; op++)
        if (needs(t, s, op) && p[op] < 0)
          return dg__fail_msg(err, cap, DG_EINVAL, "pipe schedule: stage %d has no %s of "
                              "micro-batch %d", s, dg__pipe_op_name(op), mb);
      for (int r = 0; r < 5; r++) {
        const int a = before[r][0], b = before[r][1];
        if (needs(t, s, a) && needs(t, s, b) && p[a] > p[b])
          return dg__fail_msg(err, cap, DG_EINVAL, "pipe schedule: stage %d action %d: %s of "
                              "micro-batch %d before its %s (action %d)", s, p[b],
                              dg__pipe_op_name(b), mb, dg__pipe_op_name(a), p[a]);
      }
    }
  return DG_OK;
}

/* Channel c of direction d (0: activations s -> s + 1, 1: gradients
 * s + 1 -> s, both numbered by the lower stage s): FIFO of sent
 * (micro-batch, time). */
typedef struct {
  int32_t *mb;
  int64_t *time;
  int *head, *tail;
  int M;
} chans;

static int step_stage(const dg__pipe_table *t, int s, int *pc, int64_t *now, int *alive,
                      dg__pipe_stats *st, chans *ch, char *err, size_t cap) {
  const dg__pipe_action *a = &t->act[t->off[s] + *pc];
  const int recv = a->op == DG__PIPE_RECV_ACT || a->op == DG__PIPE_RECV_GRAD;
  const int send = a->op == DG__PIPE_SEND_ACT || a->op == DG__PIPE_SEND_GRAD;
  if (recv || send) {
    const int d = a->op == DG__PIPE_RECV_GRAD || a->op == DG__PIPE_SEND_GRAD;
    const int c = d * t->K + (a->op == DG__PIPE_RECV_ACT || a->op == DG__PIPE_SEND_GRAD ? s - 1 : s);
    const size_t q = (size_t)c * ch->M;
    if (send) {
      ch->mb[q + ch->tail[c]] = a->mb, ch->time[q + ch->tail[c]++] = *now;
    } else {
      if (ch->head[c] == ch->tail[c]) return 0; /* blocks */
      const int got = ch->mb[q + ch->head[c]];
      if (got != a->mb)
        return dg__fail_msg(err, cap, DG_EINVAL, "pipe schedule: stage %d action %d: %s of "
                            "micro-batch %d, but stage %d sent micro-batch %d first (sends and "
                            "receives in different orders)", s, *pc, dg__pipe_op_name(a->op),
                            a->mb, d ? s + 1 : s - 1, got);
      const int64_t sent = ch->time[q + ch->head[c]++];
      if (sent > *now) *now = sent;
    }
  } else {
    *now += a->op == DG__PIPE_FWD ? 1 : 2;
    *alive += a->op == DG__PIPE_FWD ? 1 : -1;
    if (*alive > st->max_alive[s]) st->max_alive[s] = *alive;
  }
  (*pc)++;
  return 1;
}

int dg__pipe_validate(const dg__pipe_table *t, dg__pipe_stats *stats, char *err, size_t cap) {
  if (!t || !t->act || t->K < 1 || t->K > DG__PIPE_MAX_STAGES || t->M < 1)
    return dg__fail_msg(err, cap, DG_EINVAL, "pipe schedule: no table");
  const int K = t->K, M = t->M;
  const size_t nch = 2 * (size_t)K;
  int *pos = dg__malloc((size_t)K * M * 6 * sizeof *pos);
  chans ch = {dg__malloc(nch * M * sizeof *ch.mb), dg__malloc(nch * M * sizeof *ch.time),
              dg__calloc(nch, sizeof *ch.head), dg__calloc(nch, sizeof *ch.tail), M};
  int pc[DG__PIPE_MAX_STAGES] = {0}, alive[DG__PIPE_MAX_STAGES] = {0};
  int64_t now[DG__PIPE_MAX_STAGES] = {0};
  dg__pipe_stats st;
  memset(&st, 0, sizeof st);
  int rc = !pos || !ch.mb || !ch.time || !ch.head || !ch.tail
               ? dg__fail_msg(err, cap, DG_ENOMEM, "pipe schedule: out of memory")
               : structure(t, pos, err, cap);
  for (int moved = 1; !rc && moved;) { /* run every stage as far as it can go */
    moved = 0;
    for (int s = 0; s < K && !rc; s++)
      while (!rc && t->off[s] + pc[s] < t->off[s + 1]) {
        int r = step_stage(t, s, &pc[s], &now[s], &alive[s], &st, &ch, err, cap);
        if (r < 0) rc = r;
        else if (!r) break;
        moved = 1;
      }
  }
  for (int s = 0; s < K && !rc; s++)
    if (t->off[s] + pc[s] < t->off[s + 1]) {
      const dg__pipe_action *a = &t->act[t->off[s] + pc[s]];
      rc = dg__fail_msg(err, cap, DG_EINVAL, "pipe schedule: deadlock: stage %d waits at action "
                        "%d (%s of micro-batch %d) for a send that never comes", s, pc[s],
                        dg__pipe_op_name(a->op), a->mb);
    }
  if (!rc) {
    for (int s = 0; s < K; s++) st.makespan = now[s] > st.makespan ? now[s] : st.makespan;
    st.idle = st.makespan ? 1.0 - 3.0 * M * K / ((double)K * (double)st.makespan) : 0;
    if (stats) *stats = st;
  }
  dg__free(pos), dg__free(ch.mb), dg__free(ch.time), dg__free(ch.head), dg__free(ch.tail);
  return rc;
}
