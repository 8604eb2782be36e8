/* Activation-swapping benchmark: the char-GPT of examples/transformer with a
 * deeper stack at a batch where activations dominate memory, one setting per
 * process (so VmHWM is this setting's): warm-up steps, then VmHWM is reset
 * (/proc/self/clear_refs) and N timed steps run. Prints one JSON line:
 * median and mean step time, peak resident set (VmHWM) over the timed
 * steps, the arena's peak, and the swap statistics.
 *
 *   gpt_swap [--swap off|file|bf16|file+bf16] [--lookahead N] [--dir DIR]
 *            [--layers L] [--batch B] [--dim C] [--context T] [--steps N]
 *            [--warmup N] [--threads T]
 *
 * bench/swap/run.sh runs the settings interleaved and takes medians. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <dgrad.h>

#include "gpt_model.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static size_t status_kib(const char *key) {
  char buf[4096];
  int fd = open("/proc/self/status", O_RDONLY);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  const char *p = strstr(buf, key);
  return p ? (size_t)strtoull(p + strlen(key), NULL, 10) : 0;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  const char *swap = "off", *dir = NULL;
  long look = 2, layers = 8, batch = 32, dim = 128, context = 128, steps = 10, warm = 3;
  long threads = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const char *a = argv[i], *v = argv[i + 1];
    if (!strcmp(a, "--swap")) swap = v;
    else if (!strcmp(a, "--dir")) dir = v;
    else if (!strcmp(a, "--lookahead")) look = atol(v);
    else if (!strcmp(a, "--layers")) layers = atol(v);
    else if (!strcmp(a, "--batch")) batch = atol(v);
    else if (!strcmp(a, "--dim")) dim = atol(v);
    else if (!strcmp(a, "--context")) context = atol(v);
    else if (!strcmp(a, "--steps")) steps = atol(v);
    else if (!strcmp(a, "--warmup")) warm = atol(v);
    else if (!strcmp(a, "--threads")) threads = atol(v);
    else {
      fprintf(stderr, "gpt_swap: unknown option %s\n", a);
      return 2;
    }
  }
  if (steps < 1 || steps > 1000) return 2;
  dg_set_num_threads((int)threads);
  gpt_model m;
  gpt_config cfg = {65, (int)layers, 4, (int)dim, (int)context, 0};
  if (gpt_new(&m, &cfg, 1)) return 1;
  int64_t n = batch * context;
  int64_t *idx = malloc((size_t)n * sizeof *idx), *tgt = malloc((size_t)n * sizeof *tgt);
  for (int64_t i = 0; i < n; i++) idx[i] = (i * 31 + i / 7) % 65, tgt[i] = (i * 31 + 1) % 65;
  dg_ctx *ctx = NULL;
  if (dg_ctx_new(&ctx, NULL)) return 1;
  dg_swap_opts so;
  dg_swap_opts_init(&so);
  so.target = !strcmp(swap, "file") ? DG_SWAP_FILE : !strcmp(swap, "bf16") ? DG_SWAP_BF16
              : !strcmp(swap, "file+bf16") ? DG_SWAP_FILE | DG_SWAP_BF16 : 0;
  so.lookahead = (int)look;
  so.dir = dir;
  if (so.target && dg_ctx_set_swap(ctx, &so)) {
    fprintf(stderr, "gpt_swap: %s\n", dg_ctx_errmsg(ctx));
    return 1;
  }
  double t[1000];
  for (long s = 0; s < warm + steps; s++) {
    if (s == warm) { /* the timed part: peak resident set from here */
      if (so.target) dg_ctx_swap_stats_reset(ctx); /* also resets VmHWM */
      int fd = open("/proc/self/clear_refs", O_WRONLY);
      if (fd >= 0 && write(fd, "5", 1) != 1) fprintf(stderr, "gpt_swap: no VmHWM reset\n");
      if (fd >= 0) close(fd);
    }
    double t0 = now_s();
    dg_params_zero_grad(m.ps);
    dg_tensor *l = gpt_loss(&m, ctx, idx, tgt, batch, context);
    if (!l || dg_backward(ctx, l)) {
      fprintf(stderr, "gpt_swap: %s\n", dg_ctx_errmsg(ctx));
      return 1;
    }
    dg_ctx_reset(ctx);
    if (s >= warm) t[s - warm] = now_s() - t0;
    if (s == 0) dg_mem_empty_cache(DG_CPU); /* the first step's chunks, merged at reset */
  }
  double mean = 0;
  for (long s = 0; s < steps; s++) mean += t[s] / (double)steps;
  qsort(t, (size_t)steps, sizeof *t, cmp_double);
  dg_swap_stats st;
  memset(&st, 0, sizeof st);
  if (so.target) dg_ctx_swap_stats(ctx, &st);
  printf("{\"bench\":\"gpt_swap\",\"swap\":\"%s\",\"lookahead\":%ld,\"layers\":%ld,\"batch\":%ld,"
         "\"dim\":%ld,\"context\":%ld,\"threads\":%ld,\"steps\":%ld,\"step_ms_median\":%.2f,"
         "\"step_ms_mean\":%.2f,\"peak_rss_mib\":%.1f,\"arena_peak_mib\":%.1f,"
         "\"params\":%lld,\"swap_out_mib_per_step\":%.1f,\"swap_peak_out_mib\":%.1f,"
         "\"backward_wait_ms_per_step\":%.2f,\"forward_wait_ms_per_step\":%.2f,"
         "\"forward_reads\":%llu}\n",
         swap, so.target ? look : 0, layers, batch, dim, context, threads, steps,
         1e3 * t[steps / 2], 1e3 * mean, (double)status_kib("VmHWM:") / 1024.0,
         (double)dg_ctx_arena_peak(ctx) / 1048576.0, (long long)gpt_num_params(&m),
         (double)st.bytes_out / 1048576.0 / (double)steps, (double)st.peak_out_bytes / 1048576.0,
         1e3 * st.backward_wait_s / (double)steps, 1e3 * st.forward_wait_s / (double)steps,
         (unsigned long long)st.forward_reads);
  dg_ctx_free(ctx);
  gpt_free(&m);
  free(idx);
  free(tgt);
  return 0;
}
