/* A directory of checkpoints named by step: save (then prune), find the
 * latest complete one, resume from it. A save is dg_checkpoint_save's
 * atomic write-and-rename, so a name of the form ckpt-<step>.safetensors
 * appears whole or not at all; the temporaries of a killed save never
 * match that form. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/common_impl.h"
#include "dgrad/run.h"

#define CKPT_PREFIX "ckpt-"
#define CKPT_SUFFIX ".safetensors"

/* The step of a checkpoint's file name, or -1 for any other name. */
static int64_t name_step(const char *name) {
  size_t pl = strlen(CKPT_PREFIX), sl = strlen(CKPT_SUFFIX), n = strlen(name);
  if (n <= pl + sl || strncmp(name, CKPT_PREFIX, pl) || strcmp(name + n - sl, CKPT_SUFFIX))
    return -1;
  int64_t v = 0;
  for (size_t i = pl; i < n - sl; i++) {
    if (name[i] < '0' || name[i] > '9' || v > (INT64_MAX - 9) / 10) return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

static int cmp_desc(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? 1 : x > y ? -1 : 0;
}

/* The steps of dir's checkpoints, highest first (*steps: dg__malloc'ed,
 * NULL when none). DG_ENOTFOUND when dir does not exist. */
static int list_steps(const char *dir, int64_t **steps, int *n, char *err, size_t errcap) {
  *steps = NULL, *n = 0;
  DIR *d = opendir(dir);
  if (!d)
    return dg__fail_msg(err, errcap, errno == ENOENT ? DG_ENOTFOUND : DG_EIO,
                        "checkpoint dir %s: cannot open: %s", dir, strerror(errno));
  int cap = 0, rc = DG_OK;
  for (struct dirent *e; (e = readdir(d));) {
    int64_t s = name_step(e->d_name);
    if (s < 0) continue;
    if (*n == cap) {
      cap = cap ? 2 * cap : 16;
      int64_t *p = dg__realloc(*steps, (size_t)cap * sizeof *p);
      if (!p) {
        rc = dg__fail_msg(err, errcap, DG_ENOMEM, "checkpoint dir %s: out of memory", dir);
        break;
      }
      *steps = p;
    }
    (*steps)[(*n)++] = s;
  }
  closedir(d);
  if (*n) qsort(*steps, (size_t)*n, sizeof **steps, cmp_desc);
  return rc;
}

static int step_path(const char *dir, int64_t step, char *path, size_t cap) {
  int k = snprintf(path, cap, "%s/" CKPT_PREFIX "%012" PRId64 CKPT_SUFFIX, dir, step);
  return k < 0 || (size_t)k >= cap ? DG_EINVAL : DG_OK;
}

/* Removes the oldest checkpoints of dir until keep remain. */
static int prune(const char *dir, int keep, char *err, size_t errcap) {
  int64_t *steps;
  int n, rc = list_steps(dir, &steps, &n, err, errcap);
  char p[4096];
  for (int k = keep; !rc && k < n; k++) {
    if (step_path(dir, steps[k], p, sizeof p)) continue;
    if (unlink(p) && errno != ENOENT)
      rc = dg__fail_msg(err, errcap, DG_EIO, "checkpoint dir: cannot remove %s: %s", p,
                        strerror(errno));
  }
  dg__free(steps);
  return rc;
}

int dg_checkpoint_dir_save(const char *dir, const dg_checkpoint *c, int keep, char *path,
                           size_t cap, char *err, size_t errcap) {
  if (err && errcap) err[0] = 0;
  if (path && cap) path[0] = 0;
  if (!dir || !*dir || !c || c->step < 0 || keep < 0)
    return dg__fail_msg(err, errcap, DG_EINVAL, "checkpoint dir save: dir %s, checkpoint %p, "
                        "step %" PRId64 ", keep %d", dir ? dir : "(null)", (const void *)c,
                        c ? c->step : 0, keep);
  if (mkdir(dir, 0777) && errno != EEXIST)
    return dg__fail_msg(err, errcap, DG_EIO, "checkpoint dir %s: cannot create: %s", dir,
                        strerror(errno));
  char p[4096];
  if (step_path(dir, c->step, p, sizeof p))
    return dg__fail_msg(err, errcap, DG_EINVAL, "checkpoint dir %s: path too long", dir);
  int rc = dg_checkpoint_save(p, c, err, errcap);
  if (!rc && keep > 0) rc = prune(dir, keep, err, errcap);
  if (!rc && path && cap && (size_t)snprintf(path, cap, "%s", p) >= cap)
    rc = dg__fail_msg(err, errcap, DG_EINVAL, "checkpoint dir save: %s saved, but its name "
                      "does not fit %zu bytes", p, cap);
  return rc;
}

/* The newest complete checkpoint of dir at or below step limit: *step, or
 * -1 when none (each file skipped is logged); *nfiles: the checkpoint
 * names dir holds. DG_ENOTFOUND (err set) when dir does not exist. */
static int newest_complete(const char *dir, int64_t limit, int64_t *step, int *nfiles, char *err,
                           size_t errcap) {
  int64_t *steps;
  int n, rc = list_steps(dir, &steps, &n, err, errcap);
  *step = -1, *nfiles = n;
  char p[4096], why[512];
  for (int k = 0; !rc && k < n && *step < 0; k++) {
    if (steps[k] > limit || step_path(dir, steps[k], p, sizeof p)) continue;
    if (dg_checkpoint_verify(p, why, sizeof why)) /* why names the file */
      DG_LOGW("checkpoint dir %s: skipping %s", dir, why);
    else *step = steps[k];
  }
  dg__free(steps);
  return rc;
}

/* v (n values) reduced with MIN over pg; a group failure is its message. */
static int group_min(dg_pg *pg, int64_t *v, size_t n, char *err, size_t errcap) {
  int rc = dg_pg_allreduce_sync(pg, v, n, DG_I64, DG_RED_MIN);
  if (rc) dg__fail_msg(err, errcap, rc, "checkpoint dir resume: group: %s", dg_pg_errmsg(pg));
  return rc;
}

/* Phase 1: the newest step every rank has, or -1 for a first start. */
static int common_step(const char *dir, dg_pg *pg, int64_t *m, char *err, size_t errcap) {
  int nfiles, rc = newest_complete(dir, INT64_MAX, m, &nfiles, err, errcap);
  if (rc == DG_ENOTFOUND) { /* no directory: no checkpoint here */
    rc = DG_OK;
    if (err && errcap) err[0] = 0;
  }
  int64_t v[3] = {rc ? -2 : *m, rc ? 0 : -*m, rc ? -1 : -(nfiles > 0)}; /* min, -max, -any */
  int g = group_min(pg, v, 3, err, errcap);
  if (g) return g;
  if (v[0] == -2)
    return rc ? rc : dg__fail_msg(err, errcap, DG_EIO, "checkpoint dir %s: another rank "
                                  "could not read its directory", dir);
  if (-v[1] == -1 && v[2] == 0) return DG_OK; /* no rank has any: a first start */
  if (-v[1] == -1)
    return dg__fail_msg(err, errcap, DG_EFORMAT, "checkpoint dir %s: no rank of %d has a "
                        "complete checkpoint, but some have broken ones (each skipped is "
                        "logged): not a first start", dir, dg_pg_size(pg));
  if (v[0] < 0 && *m < 0)
    return dg__fail_msg(err, errcap, DG_EFORMAT, "checkpoint dir %s: this rank has no "
                        "complete checkpoint, but another rank of %d has (up to step %" PRId64
                        "): not a first start; restore this rank's directory", dir,
                        dg_pg_size(pg), -v[1]);
  if (v[0] < 0)
    return dg__fail_msg(err, errcap, DG_EFORMAT, "checkpoint dir %s: this rank's newest "
                        "complete checkpoint is step %" PRId64 ", but another rank of %d has "
                        "none: the ranks' directories do not belong to one run", dir, *m,
                        dg_pg_size(pg));
  *m = v[0];
  return DG_OK;
}

int dg_checkpoint_dir_resume_group(const char *dir, dg_checkpoint *c, dg_pg *pg, int *resumed,
                                   char *path, size_t cap, char *err, size_t errcap) {
  if (err && errcap) err[0] = 0;
  if (resumed) *resumed = 0;
  if (path && cap) path[0] = 0;
  if (!dir || !c || !pg || !resumed)
    return dg__fail_msg(err, errcap, DG_EINVAL, "checkpoint dir resume group: NULL dir, "
                        "checkpoint, group or resumed");
  int64_t m, have;
  int nfiles, rc = common_step(dir, pg, &m, err, errcap);
  if (rc || m < 0) return rc;
  /* Phase 2: every rank holds step m complete (a rank killed while saving
   * the newest has an older one; the others must still keep it). */
  if (newest_complete(dir, m, &have, &nfiles, err, errcap)) have = -1;
  int64_t ok = have == m;
  if ((rc = group_min(pg, &ok, 1, err, errcap))) return rc;
  if (!ok)
    return dg__fail_msg(err, errcap, DG_EFORMAT, "checkpoint dir %s: step %" PRId64 ", the "
                        "newest every rank reached, is %s; keep more checkpoints per "
                        "directory (keep >= 2)", dir, m, have == m ? "missing on another "
                        "rank" : "not complete here");
  char p[4096];
  if (step_path(dir, m, p, sizeof p))
    return dg__fail_msg(err, errcap, DG_EINVAL, "checkpoint dir %s: path too long", dir);
  rc = dg_checkpoint_load(p, c, err, errcap);
  ok = rc == DG_OK; /* one rank's failed load fails every rank */
  int g = group_min(pg, &ok, 1, rc ? NULL : err, rc ? 0 : errcap);
  if (!rc && (g || !ok))
    return g ? g : dg__fail_msg(err, errcap, DG_EFORMAT, "checkpoint dir %s: another rank "
                                "failed to load step %" PRId64, dir, m);
  if (rc) return rc;
  *resumed = 1;
  if (path && cap && (size_t)snprintf(path, cap, "%s", p) >= cap) path[0] = 0;
  return DG_OK;
}

int dg_checkpoint_dir_latest(const char *dir, char *path, size_t cap, int64_t *step, char *err,
                             size_t errcap) {
  if (err && errcap) err[0] = 0;
  if (!dir || !path || !cap)
    return dg__fail_msg(err, errcap, DG_EINVAL, "checkpoint dir latest: NULL dir or path");
  path[0] = 0;
  int64_t s;
  int n, rc = newest_complete(dir, INT64_MAX, &s, &n, err, errcap);
  if (rc) return rc;
  if (s < 0) /* none at all is a first start; only broken ones is not */
    return dg__fail_msg(err, errcap, n ? DG_EFORMAT : DG_ENOTFOUND, "checkpoint dir %s: no "
                        "complete checkpoint among %d ckpt-<step>%s file(s)%s", dir, n,
                        CKPT_SUFFIX, n ? " (each skipped is logged)" : "");
  char p[4096];
  step_path(dir, s, p, sizeof p); /* it fitted when verified */
  if ((size_t)snprintf(path, cap, "%s", p) >= cap) {
    path[0] = 0;
    return dg__fail_msg(err, errcap, DG_EINVAL, "checkpoint dir: %s does not fit %zu bytes", p,
                        cap);
  }
  if (step) *step = s;
  return DG_OK;
}

int dg_checkpoint_dir_resume(const char *dir, dg_checkpoint *c, int *resumed, char *path,
                             size_t cap, char *err, size_t errcap) {
  if (resumed) *resumed = 0;
  if (!c || !resumed)
    return dg__fail_msg(err, errcap, DG_EINVAL, "checkpoint dir resume: NULL checkpoint or "
                        "resumed");
  char p[4096];
  int rc = dg_checkpoint_dir_latest(dir, p, sizeof p, NULL, err, errcap);
  if (rc == DG_ENOTFOUND) {
    if (err && errcap) err[0] = 0;
    return DG_OK; /* a first start */
  }
  if (!rc) rc = dg_checkpoint_load(p, c, err, errcap);
  if (rc) return rc;
  *resumed = 1;
  if (path && cap && (size_t)snprintf(path, cap, "%s", p) >= cap) path[0] = 0;
  return DG_OK;
}
