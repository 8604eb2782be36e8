/* dgrun --trace: the per-rank trace path and the merge (dgrun_trace.c). */
#ifndef DGRUN_TRACE_H
#define DGRUN_TRACE_H

#include <stddef.h>

/* FILE.rank<R>: what rank R's DG_TRACE names. */
void dgrun_trace_path(char *out, size_t cap, const char *file, int rank);
/* Merges FILE.rank<first_rank> .. FILE.rank<first_rank + nranks - 1> into
 * FILE (one pid per rank; written to FILE.tmp, then renamed). Returns the
 * ranks merged (the rank files are removed when all were), with why naming
 * each rank's missing or torn file; -1 when FILE cannot be written. */
int dgrun_trace_merge(const char *file, int first_rank, int nranks, char *why, size_t cap);

#endif
