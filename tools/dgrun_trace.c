/* dgrun --trace FILE: each rank writes FILE.rank<R> (its DG_TRACE), and
 * dgrun merges them into FILE, one process track per rank: the ranks'
 * "traceEvents" arrays joined, every "pid" set to the rank (whatever the
 * program passed), each rank's file removed once merged. Plain C, no JSON
 * library: a scanner that knows strings and brackets is enough to find the
 * array and the pid keys. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/dgrun_trace.h"

void dgrun_trace_path(char *out, size_t cap, const char *file, int rank) {
  snprintf(out, cap, "%s.rank%d", file, rank);
}

static char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 1 << 16, len = 0;
  char *b = malloc(cap + 1);
  while (b) {
    size_t r = fread(b + len, 1, cap - len, f);
    len += r;
    if (len < cap) break;
    char *nb = realloc(b, 2 * cap + 1);
    if (!nb) free(b);
    b = nb, cap *= 2;
  }
  int bad = ferror(f);
  fclose(f);
  if (!b || bad) {
    free(b);
    errno = bad ? EIO : ENOMEM;
    return NULL;
  }
  b[len] = 0;
  *n = len;
  return b;
}

/* Copies the elements of the array whose '[' is at b[i] to out, with every
 * "pid": N of an element replaced by rank; returns the elements copied, or
 * -1 when the array does not end. *first: nothing written before. */
static long copy_array(const char *b, size_t n, size_t i, FILE *out, int rank, int *first) {
  if (i >= n) return -1;
  int depth = 1;
  long events = 0;
  for (i++; i < n; i++) {
    char c = b[i];
    if (depth == 1) { /* between elements: skip commas and blanks */
      if (c == ']') return events;
      if (c != '{' && c != '[') continue;
      if (!*first) fputs(",\n", out);
      *first = 0;
      events++;
    }
    if (c == '"') {
      size_t s = i + 1, e = s;
      while (e < n && b[e] != '"') e += b[e] == '\\' ? 2 : 1;
      if (e >= n) return -1;
      fwrite(b + i, 1, e + 1 - i, out);
      i = e;
      size_t j = e + 1;
      while (j < n && strchr(" \t\r\n", b[j])) j++;
      if (depth == 2 && e - s == 3 && !memcmp(b + s, "pid", 3) && j < n && b[j] == ':') {
        fprintf(out, ":%d", rank);
        for (j++; j < n && strchr(" \t\r\n-+.0123456789", b[j]); j++) {}
        i = j - 1;
      }
      continue;
    }
    if (c == '{' || c == '[') depth++;
    else if (c == '}' || c == ']') depth--;
    fputc(c, out);
  }
  return -1;
}

/* The '[' of the "traceEvents" array, or n. */
static size_t find_events(const char *b, size_t n) {
  const char *k = strstr(b, "\"traceEvents\"");
  if (!k) return n;
  const char *p = strchr(k + 13, '[');
  return p ? (size_t)(p - b) : n;
}

int dgrun_trace_merge(const char *file, int first_rank, int nranks, char *why, size_t cap) {
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp", file);
  FILE *out = fopen(tmp, "w");
  if (!out) {
    snprintf(why, cap, "cannot write %s: %s", tmp, strerror(errno));
    return -1;
  }
  fputs("{\"traceEvents\":[\n", out);
  int first = 1, merged = 0;
  why[0] = 0;
  for (int r = first_rank; r < first_rank + nranks; r++) {
    char path[4200];
    dgrun_trace_path(path, sizeof path, file, r);
    size_t n = 0, mlen = 0;
    char *b = slurp(path, &n), *mem = NULL;
    FILE *m = b ? open_memstream(&mem, &mlen) : NULL;
    int was_first = first;
    long ev = m ? copy_array(b, n, find_events(b, n), m, r, &first) : -1;
    if (m) fclose(m);
    if (ev >= 0) fwrite(mem, 1, mlen, out);
    else first = was_first; /* a torn file adds nothing */
    free(mem);
    if (ev < 0) {
      size_t used = strlen(why);
      snprintf(why + used, cap - used, "%srank %d: %s: %s", used ? "; " : "", r, path,
               b ? "no complete traceEvents array" : strerror(errno));
    } else {
      merged++;
    }
    free(b);
  }
  fputs("\n],\"displayTimeUnit\":\"ms\"}\n", out);
  int bad = ferror(out);
  if (fclose(out) || bad || rename(tmp, file)) {
    snprintf(why, cap, "cannot write %s: %s", file, strerror(errno ? errno : EIO));
    remove(tmp);
    return -1;
  }
  for (int r = first_rank; r < first_rank + nranks && merged == nranks; r++) {
    char path[4200];
    dgrun_trace_path(path, sizeof path, file, r);
    remove(path);
  }
  return merged;
}
