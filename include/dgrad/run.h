/* dgrad/run.h — training as a service: a graceful stop that every rank
 * agrees on, and a directory of checkpoints a restarted job resumes from.
 *
 * A job run by Slurm, Kubernetes or dgrun is stopped with SIGTERM (a
 * preemption, `scancel`, a drained node, a spot VM's notice) and killed a
 * grace period later; it is started again by a requeue, a new pod or
 * `dgrun --max-restarts`. The loop that survives both:
 *
 *   dg_stop_install(NULL, 0, err, sizeof err);          // SIGTERM, SIGINT
 *   dg_checkpoint c = {ps, opt, ctx, loader};
 *   dg_checkpoint_dir_resume(dir, &c, &resumed, NULL, 0, err, sizeof err);
 *   for (step = c.step; step < steps; step++) {
 *     ... forward, backward, optimizer step ...
 *     int sig;
 *     if (dg_stop_agree(pg, &sig, err, sizeof err)) break;    // collective
 *     if (sig) break;                  // every rank, after the same step
 *   }
 *   c.step = step;                     // rank 0 saves, the others wait:
 *   if (rank == 0) dg_checkpoint_dir_save(dir, &c, 3, NULL, 0, err, sizeof err);
 *   dg_pg_barrier_sync(pg);
 *   return 0;                          // the program exits, not the library
 *
 * Layer: this module sits above the process group and the checkpoints it
 * composes (docs/ARCHITECTURE.md, "run"); nothing below includes it.
 *
 * Signals. The library never exits the process: a handled signal only
 * sets a flag that dg_stop_signal reads and dg_stop_agree shares. The one
 * exception is a repeat: the same or another handled signal arriving 1 s or
 * more after the first (a user pressing Ctrl-C twice, a supervisor that
 * lost patience) runs the signal's default action, so a process stuck
 * outside the loop still dies; repeats within 1 s (a signal sent both to
 * the process and its group) are ignored.
 *
 * Errors. Functions return DG_OK or a negative DG_E* code and write a
 * message into err (errcap bytes, always terminated; err may be NULL).
 * Threads. The stop state is process-wide; install and uninstall from one
 * thread. dg_stop_signal and dg_stop_request may be called from any
 * thread, dg_stop_request from a signal handler too. */
#ifndef DGRAD_RUN_H
#define DGRAD_RUN_H

#include <stddef.h>
#include <stdint.h>

#include "dgrad/checkpoint.h"
#include "dgrad/common.h"
#include "dgrad/dist.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- graceful stop ---- */

/* Handles signals[0..n) (NULL, 0: SIGTERM and SIGINT; SIGUSR1 is common
 * for Slurm's `--signal=USR1@120` notice) by recording a stop request. A
 * signal ignored when this is called (nohup, a background job) stays
 * ignored. SIGKILL, SIGSTOP and signals the library cannot catch are
 * DG_EINVAL; a second install without dg_stop_uninstall is DG_ESTATE.
 * Clears any earlier request. */
DG_API int dg_stop_install(const int *signals, int n, char *err, size_t errcap);
/* Restores the handlers found by dg_stop_install. No-op when none. */
DG_API void dg_stop_uninstall(void);
/* This process's first stop request: its signal number, or 0. */
DG_API int dg_stop_signal(void);
/* Records a stop request as if signal sig (> 0) had arrived: a program's
 * own notice (a spot VM's metadata endpoint, a deadline) and tests. Does
 * not need dg_stop_install. */
DG_API void dg_stop_request(int sig);

/* Collective over pg (NULL: this process alone): every rank calls it once
 * per step at the same point; *sig receives the largest signal number any
 * rank has recorded (0: go on). So when one rank of many is signalled, all
 * stop after the same step. One 4-byte all-reduce (MAX) per call; a group
 * failure is its code, with the group's message in err. */
DG_API int dg_stop_agree(dg_pg *pg, int *sig, char *err, size_t errcap);

/* ---- a directory of checkpoints ---- */

/* Checkpoints in a directory are named ckpt-<step>.safetensors (step in
 * 12 digits, so names sort by step). Anything else in it is left alone:
 * a save in progress or killed leaves only "<name>.tmp.XXXXXX"
 * (dg_checkpoint_save is atomic), which is never taken for a checkpoint. */

/* Saves c as <dir>/ckpt-<c->step>.safetensors (creating dir, one level,
 * when missing), then, with keep > 0, removes the oldest checkpoints of dir
 * until keep remain. path (cap bytes, may be NULL) receives the file name. */
DG_API int dg_checkpoint_dir_save(const char *dir, const dg_checkpoint *c, int keep, char *path,
                                  size_t cap, char *err, size_t errcap);
/* Finds the latest complete checkpoint of dir: the highest step whose file
 * passes dg_checkpoint_verify (one that does not is skipped, and logged at
 * WARN naming it and why). path (cap bytes) receives its name, *step (may
 * be NULL) its step. DG_ENOTFOUND when dir has no checkpoint or does not
 * exist (a first start); DG_EFORMAT when it has some but none is complete
 * (not a first start: resuming must not silently start over). */
DG_API int dg_checkpoint_dir_latest(const char *dir, char *path, size_t cap, int64_t *step,
                                    char *err, size_t errcap);
/* dg_checkpoint_dir_latest then dg_checkpoint_load into c (model,
 * optimizer, RNG, data position as c names them; c->step). *resumed = 1
 * when a checkpoint was loaded, 0 when dir holds none (DG_OK: start
 * fresh). path (may be NULL) receives the file loaded. */
DG_API int dg_checkpoint_dir_resume(const char *dir, dg_checkpoint *c, int *resumed, char *path,
                                    size_t cap, char *err, size_t errcap);

/* Collective over pg, for runs whose ranks hold different state (a
 * pipeline's stages, each saving its own directory): every rank resumes
 * from its dir at the newest step that every rank has complete. A rank
 * killed while saving step s leaves the others' step s unused: all resume
 * from the step before, so each directory must keep >= 2 checkpoints.
 * *resumed = 0 with DG_OK when no rank has a checkpoint; DG_EFORMAT, on
 * every rank, when some ranks have one and others none, or when the
 * common step is missing somewhere; a failed load on one rank fails all. */
DG_API int dg_checkpoint_dir_resume_group(const char *dir, dg_checkpoint *c, dg_pg *pg,
                                          int *resumed, char *path, size_t cap, char *err,
                                          size_t errcap);

#ifdef __cplusplus
}
#endif
#endif /* DGRAD_RUN_H */
