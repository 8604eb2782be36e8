/* Command-line options of examples/mnist. */
#ifndef MNIST_OPTS_H
#define MNIST_OPTS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dgrad/data.h>

typedef struct {
  const char *data, *model, *optim, *checkpoint, *resume, *loss_log;
  const char *checkpoint_dir; /* save there, resume from its latest */
  int keep;                   /* checkpoints kept in checkpoint_dir */
  int linear;                 /* another world size: 1 linear scaling rule,
                                 0 keep the global batch (accumulation) */
  int throttle_ms;            /* tests: sleep after each step */
  int batch, epochs, threads, log_every;
  int cosine; /* 1: cosine decay to 0 over the run's steps */
  float lr; /* 0: the optimizer's default for this example */
  uint64_t seed;
  int64_t save_every, max_steps;
  int64_t stop_at; /* tests: stop (and save) at this global step, as if the
                      run were interrupted there; the schedule is unchanged */
  int overlap; /* DDP steps the optimizer, overlapping the next forward */
  int accum;   /* micro-batches per step: --batch rows split in accum parts */
  const char *trace; /* --trace FILE: this rank's timeline (else $DG_TRACE, set by dgrun --trace) */
} mnist_opts;

static const char mnist_usage[] =
    "usage: mnist [--data DIR] [--model mlp|cnn] [--optim sgd|adamw|lamb|lars]\n"
    "             [--batch 64] [--lr LR] [--epochs 3] [--threads 1] [--seed 1]\n"
    "             [--checkpoint PATH] [--save-every STEPS] [--resume PATH]\n"
    "             [--max-steps N] [--log-every 100] [--loss-log FILE]\n"
    "             [--schedule cosine|constant] [--stop-at STEP] [--overlap]\n"
    "             [--checkpoint-dir DIR] [--keep 3] [--rescale accum|linear]\n"
    "             [--throttle-ms MS] [--accum K] [--trace FILE]\n";

static float mnist_default_lr(const char *optim) {
  if (!strcmp(optim, "sgd")) return 0.05f;
  if (!strcmp(optim, "lamb")) return 4e-3f;
  if (!strcmp(optim, "lars")) return 2.0f;
  return 1e-3f;
}

static int mnist_one_of(const char *v, const char *a, const char *b, const char *c,
                        const char *d) {
  return !strcmp(v, a) || !strcmp(v, b) || (c && !strcmp(v, c)) || (d && !strcmp(v, d));
}

/* Returns 0, 1 after --help, or -1 on a bad option (message printed). */
static int mnist_parse_opts(int argc, char **argv, mnist_opts *o) {
  *o = (mnist_opts){DG_FASHION_MNIST_DIR, "mlp", "adamw", NULL, NULL, NULL, NULL, 3, 0, 0,
                    64, 3, 1, 100, 1, 0, 1, 0, 0, 0, 0, 1, NULL};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      fputs(mnist_usage, stdout);
      return 1;
    }
    if (!strcmp(a, "--overlap")) {
      o->overlap = 1;
      continue;
    }
    if (!v || strncmp(a, "--", 2)) goto bad;
    i++;
    if (!strcmp(a, "--data")) o->data = v;
    else if (!strcmp(a, "--model")) o->model = v;
    else if (!strcmp(a, "--optim")) o->optim = v;
    else if (!strcmp(a, "--checkpoint")) o->checkpoint = v;
    else if (!strcmp(a, "--resume")) o->resume = v;
    else if (!strcmp(a, "--loss-log")) o->loss_log = v;
    else if (!strcmp(a, "--checkpoint-dir")) o->checkpoint_dir = v;
    else if (!strcmp(a, "--trace")) o->trace = v;
    else if (!strcmp(a, "--keep")) o->keep = atoi(v);
    else if (!strcmp(a, "--throttle-ms")) o->throttle_ms = atoi(v);
    else if (!strcmp(a, "--rescale") && mnist_one_of(v, "accum", "linear", NULL, NULL))
      o->linear = !strcmp(v, "linear");
    else if (!strcmp(a, "--schedule") && mnist_one_of(v, "cosine", "constant", NULL, NULL))
      o->cosine = !strcmp(v, "cosine");
    else if (!strcmp(a, "--batch")) o->batch = atoi(v);
    else if (!strcmp(a, "--accum")) o->accum = atoi(v);
    else if (!strcmp(a, "--epochs")) o->epochs = atoi(v);
    else if (!strcmp(a, "--threads")) o->threads = atoi(v);
    else if (!strcmp(a, "--log-every")) o->log_every = atoi(v);
    else if (!strcmp(a, "--lr")) o->lr = strtof(v, NULL);
    else if (!strcmp(a, "--seed")) o->seed = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--save-every")) o->save_every = strtoll(v, NULL, 10);
    else if (!strcmp(a, "--max-steps")) o->max_steps = strtoll(v, NULL, 10);
    else if (!strcmp(a, "--stop-at")) o->stop_at = strtoll(v, NULL, 10);
    else goto bad;
    continue;
  bad:
    fprintf(stderr, "mnist: bad option %s\n%s", a, mnist_usage);
    return -1;
  }
  if (!mnist_one_of(o->model, "mlp", "cnn", NULL, NULL) ||
      !mnist_one_of(o->optim, "sgd", "adamw", "lamb", "lars") || o->batch < 1 ||
      o->epochs < 1 || o->threads < 1 || o->lr < 0 || o->keep < 0 || o->throttle_ms < 0 ||
      (o->checkpoint_dir && (o->checkpoint || o->resume))) {
    fprintf(stderr, "mnist: invalid value (model %s, optim %s, batch %d, epochs %d, threads "
            "%d, lr %g, keep %d, throttle %d; --checkpoint-dir excludes --checkpoint and "
            "--resume)\n%s", o->model, o->optim, o->batch, o->epochs, o->threads,
            (double)o->lr, o->keep, o->throttle_ms, mnist_usage);
    return -1;
  }
  if (o->accum < 1 || o->batch % o->accum) {
    fprintf(stderr, "mnist: --accum %d must be >= 1 and divide --batch %d (the step's rows "
            "are split into that many micro-batches)\n", o->accum, o->batch);
    return -1;
  }
  if (o->lr == 0) o->lr = mnist_default_lr(o->optim);
  return 0;
}

#endif
