/* Pipeline planning, pure functions (no group, no tensors): the exact
 * min-max partition of a layer sequence into stages, and the global action
 * table of a schedule with its validator. The pipe runtime (issue #13)
 * computes both identically on every rank and runs its own stage's row.
 * Not API. */
#ifndef DG_PIPE_PLAN_H
#define DG_PIPE_PLAN_H

#include <stddef.h>
#include <stdint.h>

#define DG__PIPE_MAX_STAGES 64

/* Splits layers 0..n-1 (cost[i] >= 0, e.g. measured forward + backward
 * seconds) into k contiguous non-empty stages minimising the largest stage
 * cost, exactly (dynamic programming, O(k n^2)). With mem (may be NULL) and
 * mem_cap > 0, every stage's sum of mem must stay <= mem_cap. Ties go to the
 * split whose stages end earliest. first[0..k] receives the stage bounds
 * (stage s is layers [first[s], first[s+1]); first[0] = 0, first[k] = n),
 * *max_cost the largest stage cost. DG_EINVAL with err naming the reason
 * for k < 1, k > n, k > DG__PIPE_MAX_STAGES, a negative or NaN cost, or no
 * split under the cap (naming the layer that cannot fit when alone);
 * DG_ENOMEM. */
int dg__pipe_partition(const double *cost, const double *mem, int n, int k, double mem_cap,
                       int *first, double *max_cost, char *err, size_t cap);
/* The same with the cost of each cut: cut[i] (n - 1 entries, >= 0; NULL:
 * none) is what a boundary after layer i adds to both stages it joins (the
 * sender's and the receiver's share of moving the activation forward and
 * its gradient back), so stage [p, e) costs sum(cost[p..e)) + cut[p - 1]
 * (p > 0) + cut[e - 1] (e < n). Still exact. */
int dg__pipe_partition_cut(const double *cost, const double *cut, const double *mem, int n,
                           int k, double mem_cap, int *first, double *max_cost, char *err,
                           size_t cap);

/* Checks an explicit balance (layers per stage): k entries, each >= 1,
 * summing to n. DG_OK, or DG_EINVAL with err naming the problem. */
int dg__pipe_balance_check(const int *balance, int k, int n, char *err, size_t cap);

typedef enum {
  DG__PIPE_FWD = 0,       /* forward of micro-batch mb on this stage */
  DG__PIPE_BWD = 1,       /* backward of mb */
  DG__PIPE_SEND_ACT = 2,  /* activation of mb to stage + 1 */
  DG__PIPE_RECV_ACT = 3,  /* activation of mb from stage - 1 */
  DG__PIPE_SEND_GRAD = 4, /* input gradient of mb to stage - 1 */
  DG__PIPE_RECV_GRAD = 5  /* output gradient of mb from stage + 1 */
} dg__pipe_op;

typedef enum { DG__PIPE_GPIPE = 0, DG__PIPE_1F1B = 1 } dg__pipe_kind;

typedef struct {
  uint8_t op;  /* dg__pipe_op */
  int32_t mb;  /* micro-batch */
} dg__pipe_action;

/* The global table: stage s runs act[off[s] .. off[s + 1]) in order. */
typedef struct {
  int K, M;
  int off[DG__PIPE_MAX_STAGES + 1];
  dg__pipe_action *act; /* 6 M K at most; owned */
} dg__pipe_table;

const char *dg__pipe_op_name(int op);
const char *dg__pipe_kind_name(int kind);

/* Builds the table of `kind` for K stages and M micro-batches (any K >= 1,
 * M >= 1, M < K included). GPipe: every forward, then every backward.
 * 1F1B: stage s runs min(K - s - 1, M) forwards, then alternates one
 * forward and one backward, then the remaining backwards, so at most
 * min(M, K - s) activations are alive on stage s. Each forward is preceded
 * by its receive and followed by its send, likewise each backward.
 * DG_EINVAL (err) on bad K, M or kind; DG_ENOMEM. */
int dg__pipe_schedule(dg__pipe_table *t, int kind, int K, int M, char *err, size_t cap);
void dg__pipe_table_free(dg__pipe_table *t);

/* What dg__pipe_validate measured by running the table with unit costs. */
typedef struct {
  int max_alive[DG__PIPE_MAX_STAGES]; /* most forwards not yet backwarded */
  int64_t makespan;  /* time units with forward 1, backward 2, messages 0 */
  double idle;       /* idle fraction of the stages over the makespan */
} dg__pipe_stats;

/* Validates a table before it runs: each stage holds exactly one forward
 * and one backward per micro-batch, forward before backward; every stage
 * but the first receives each activation before its forward, every stage
 * but the last sends it after; likewise gradients in the other direction;
 * every send is matched by the peer's receive of the same micro-batch in
 * the same order (per direction and channel); and running the table with
 * non-blocking sends and blocking receives reaches the end (no deadlock).
 * DG_OK (stats filled, may be NULL), or DG_EINVAL with err naming the
 * stage, the action index, the operation and the micro-batch. */
int dg__pipe_validate(const dg__pipe_table *t, dg__pipe_stats *stats, char *err, size_t cap);

#endif /* DG_PIPE_PLAN_H */
