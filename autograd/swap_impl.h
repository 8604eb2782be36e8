/* Activation swapping, inside (autograd/swap.c: policy, hooks, API;
 * autograd/swap_io.c: the I/O thread, the file, bf16 packing). Not API. */
#ifndef DG_SWAP_IMPL_H
#define DG_SWAP_IMPL_H

#include <pthread.h>
#include <stdint.h>

#include "core/core_impl.h"
#include "dgrad/swap.h"

/* What the tape tells swapping during a backward. Backward is about to run
 * tape node `index` (descending): saved tensors of nodes already passed are
 * released, those of the next `lookahead` nodes prefetched. Nonzero with
 * the error recorded on the context. */
int dg__swap_backward_node(struct dg__swap *s, int index);
/* The walk ended (normally or not): prefetches no node will use are
 * cancelled. */
void dg__swap_backward_end(struct dg__swap *s);

/* A record's life. Only the I/O thread moves QUEUED -> STORING -> STORED and
 * LOADQ -> LOADING -> IN; only the main thread releases pages (STORED or IN
 * -> OUT: madvise) and loads on demand (OUT -> LOADING -> IN), so no page
 * is released while anything reads it. */
enum {
  DG_SW_NEW,     /* saved by the running op: it may still write the data */
  DG_SW_QUEUED,  /* the op returned: for the I/O thread to store */
  DG_SW_STORING,
  DG_SW_STORED,  /* the copy is complete; pages still resident */
  DG_SW_OUT,     /* pages released; the copy is the data */
  DG_SW_LOADQ,   /* queued for prefetch */
  DG_SW_LOADING,
  DG_SW_IN,      /* resident again; the copy stays valid until the reset */
  DG_SW_KEEP,    /* resident for the step (a store failed, or cancelled) */
};

typedef struct {
  dg_tensor *t;      /* the saved header: what unpack returns */
  char *lo;          /* page-aligned interior of its data (len bytes) */
  size_t len, slen;  /* bytes released / stored (len / 2 packed to bf16) */
  uint64_t off;      /* file offset (DG_SWAP_FILE) */
  char *z;           /* the bf16 copy (DG_SWAP_BF16 alone) */
  const char *op;    /* the op that saved it first, in node node_first */
  int node_first, node_last, slot;
  int state, bf16, pinned, ahead, failed;
  int64_t seen;      /* op count when it was last read or committed */
} dg__swrec;

/* One store or load, copied out of the record under the lock. */
typedef struct {
  char *lo;
  size_t len;
  uint64_t off;
  char *z;
  int bf16, file;
} dg__swio;

typedef struct dg__swap {
  dg_ctx *ctx;
  dg_swap_opts o;
  char dir[256], path[300]; /* path: the swap file's name, for messages */
  int fd;                   /* -1 without DG_SWAP_FILE */
  uint64_t fcap, fuse;      /* bytes allocated in the file / used this step */
  struct {
    char *p;
    size_t cap;
  } slab[24];               /* bf16 copies (DG_SWAP_BF16 alone): kept across steps */
  int nslab, slab_cur;
  size_t slab_used;
  char *stage[2];           /* bf16 + file conversion: [0] I/O thread, [1] main */
  dg__swrec *r;
  int nr, rcap, ncommit, store_next;
  struct {
    int node, rec;
  } *sv;                    /* every save in tape order: the unpack order reversed */
  int nsv, svcap;
  int *lq;                  /* ring of records to prefetch (capacity rcap) */
  int lq_head, lq_n;
  pthread_t th;
  int th_started;
  pthread_mutex_t mu;
  pthread_cond_t cv_io, cv_main;
  int stop, io_busy, io_exited;
  int err, err_told;        /* first failure of the I/O thread, and whether reported */
  char errmsg[448];
  size_t backlog, ahead_bytes, out_now;
  int in_bwd, pf, drop;     /* backward: prefetch and release cursors */
  int rec_base, sv_base;    /* records of earlier backwards of this step end here */
  int broken;               /* the I/O thread missed a reset's deadline: no more swapping */
  int active;               /* dg_ctx_swap_scope */
  int64_t opseq;
  struct dg__swap *reg_next; /* the registry of swapping contexts (any number) */
  struct {
    uintptr_t lo, hi;
  } pins[16];               /* raw reads of tensors not (yet) saved: never released */
  int npins;
  dg_swap_stats st;
} dg__swap;

/* swap_io.c */
#define DG_SWAP_STAGE ((size_t)1 << 20) /* bf16 + file conversion buffer, each */
int dg__swap_open_file(dg__swap *s, char *err, size_t cap);
/* Makes room for `bytes` more in the file; errno on failure. */
int dg__swap_file_reserve(dg__swap *s, uint64_t bytes);
/* `bytes` of bf16 slab (NULL when no memory). */
char *dg__swap_slab_take(dg__swap *s, size_t bytes);
/* One store / load; 0 or an errno value (EIO for a short read). */
int dg__swap_store(dg__swap *s, const dg__swio *io, char *stage);
int dg__swap_load(dg__swap *s, const dg__swio *io, char *stage);
void *dg__swap_thread(void *arg);
/* VmRSS and VmHWM of this process in bytes (0 when unreadable); no heap. */
void dg__swap_rss(size_t *rss, size_t *hwm);
double dg__swap_now(void);
/* An absolute CLOCK_MONOTONIC deadline ms from now (the condvars use it). */
struct timespec dg__swap_deadline(int ms);
/* Records the I/O thread's first failure on record i (lock held). */
void dg__swap_fail(dg__swap *s, int i, const char *what, int e);
/* "saved tensor 1 of node 12 (matmul), f32 (64, 384)" */
const char *dg__swap_rec_name(const dg__swap *s, int i, char *buf, size_t cap);

#endif
