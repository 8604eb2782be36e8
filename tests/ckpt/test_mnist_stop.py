#!/usr/bin/env python3
"""examples/mnist as a service (dgrad/run.h), under dgrun on a small
synthetic MNIST-format directory:

  1. 4 ranks, SIGTERM to one rank: every rank stops after the same step,
     saves to --checkpoint-dir and exits 0; started again with the same
     command it resumes by itself, losing no step, and every rank's losses
     equal the uninterrupted run's bit for bit.
  2. 2 ranks, SIGTERM to dgrun (forwarded to the ranks): the same; and
     with gradient accumulation (--accum 2) on 1 process and on 2 ranks.
  3. 4 -> 2 and 2 -> 4 ranks (--rescale accum): the resumed run keeps the
     global batch (2 micro-batches per step, or half the per-rank batch);
     the mean loss over ranks of each step follows the uninterrupted run's
     to float rounding (the same samples make each global step).
  4. --rescale linear from 2 to 4 ranks runs and scales the rate by 2.
  5. A rank SIGKILLed under dgrun --max-restarts 1: the group restarts,
     resumes from the latest periodic checkpoint, and the losses (the last
     of each step) equal the uninterrupted run's.

    python3 test_mnist_stop.py path/to/mnist path/to/dgrun
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_mnist_resume import make_data  # noqa: E402

N = 60  # steps of every run
fails = 0


def fail(msg):
    global fails
    fails += 1
    print("FAIL " + msg)


def common(tmp, batch=8):
    return ["--data", tmp, "--model", "mlp", "--optim", "adamw", "--batch", str(batch),
            "--epochs", "40", "--threads", "1", "--seed", "4", "--log-every", "0",
            "--max-steps", str(N)]


def dgrun_cmd(dgrun, exe, w, args, restarts=0):
    return [dgrun, "--nproc-per-node", str(w), "--grace-seconds", "20", "--max-restarts",
            str(restarts), "--", exe] + args


def run(cmd, env=None):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=240, env=dict(os.environ, **(env or {})))
    return p.returncode, p.stdout


def lines(path):
    try:
        with open(path) as f:
            return [x for x in f.read().split("\n") if x]
    except FileNotFoundError:
        return []


def rank_pids(pid):
    with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
        return [int(x) for x in f.read().split()]


def stop_run(cmd, log0, after, target, env=None):
    """Starts cmd, waits until log0 holds `after` steps, sends SIGTERM to
    `target` ("dgrun" or a local rank index); returns (rc, output, ms from
    the signal to dgrun's exit)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=dict(os.environ, **(env or {})))
    t_end = time.time() + 120
    while len(lines(log0)) < after and p.poll() is None and time.time() < t_end:
        time.sleep(0.01)
    if p.poll() is not None:
        return p.returncode, p.stdout.read() + "\n(finished before the signal)", 0
    pid = p.pid if target == "dgrun" else sorted(rank_pids(p.pid))[target]
    t0 = time.time()
    os.kill(pid, signal.SIGTERM)
    out, _ = p.communicate(timeout=120)
    return p.returncode, out, (time.time() - t0) * 1e3


def env_tag(env):
    return "".join("_%s%s" % kv for kv in sorted((env or {}).items()))


def uninterrupted(exe, dgrun, tmp, w, batch=8, extra=(), env=None):
    log = os.path.join(tmp, "full_w%d_b%d%s%s.log" % (w, batch, "".join(extra), env_tag(env)))
    if not lines(rank_log(log, w, 0)):
        rc, out = run(dgrun_cmd(dgrun, exe, w, common(tmp, batch) + list(extra) +
                                ["--loss-log", log]), env)
        if rc:
            fail("uninterrupted W=%d: exit %d\n%s" % (w, rc, out))
    return log


def stop_and_resume(exe, dgrun, tmp, w, target, extra=(), env=None):
    ref = uninterrupted(exe, dgrun, tmp, w, extra=extra, env=env)
    tag = "stop_w%d_%s%s%s" % (w, target, "".join(extra), env_tag(env))
    d, log = os.path.join(tmp, tag), os.path.join(tmp, tag + ".log")
    args = common(tmp) + list(extra) + ["--checkpoint-dir", d, "--loss-log", log]
    rc, out, ms = stop_run(dgrun_cmd(dgrun, exe, w, args + ["--throttle-ms", "25"]),
                           rank_log(log, w, 0), 15, target, env)
    want_rc = 143 if target == "dgrun" else 0
    stopped = [int(x.split()[-5]) for x in out.split("\n") if "stopped by signal 15" in x]
    if rc != want_rc or len(stopped) != w or len(set(stopped)) != 1:
        fail("%s: exit %d (want %d), stop lines %s\n%s" % (tag, rc, want_rc, stopped, out))
        return
    print("ok %s: all %d ranks stopped after step %d and exited 0, %.0f ms after SIGTERM "
          "(dgrun %d)" % (tag, w, stopped[0], ms, rc))
    rc, out = run(dgrun_cmd(dgrun, exe, w, args), env)
    if rc or "resumed from %s/ckpt-%012d.safetensors: step %d" % (d, stopped[0], stopped[0]) \
            not in out:
        fail("%s: the restart did not resume from step %d (exit %d)\n%s"
             % (tag, stopped[0], rc, out))
        return
    for r in range(w):
        a, b = lines(rank_log(ref, w, r)), lines(rank_log(log, w, r))
        if len(a) != N or a != b:
            fail("%s rank %d: losses differ from the uninterrupted run\n%s\nvs\n%s"
                 % (tag, r, a, b))
        else:
            print("ok %s rank %d: %d = %d + %d losses identical" % (tag, r, N, stopped[0],
                                                                   N - stopped[0]))


def rank_log(log, w, r):
    """The loss log of rank r: FILE.rank<r>, or FILE itself for one rank."""
    return "%s.rank%d" % (log, r) if w > 1 else log


def mean_losses(log, w):
    per = [[float.fromhex(x.split()[1]) for x in lines("%s.rank%d" % (log, r))]
           for r in range(w)]
    return [sum(v) / w for v in zip(*per)]


def reshard(exe, dgrun, tmp, w1, w2, rule="accum"):
    ref = uninterrupted(exe, dgrun, tmp, w1)
    tag = "reshard_%d_%d_%s" % (w1, w2, rule)
    d, log = os.path.join(tmp, tag), os.path.join(tmp, tag)
    args = common(tmp) + ["--checkpoint-dir", d, "--rescale", rule]
    rc, out, _ = stop_run(dgrun_cmd(dgrun, exe, w1, args + ["--loss-log", log + ".a",
                                                            "--throttle-ms", "25"]),
                          log + ".a.rank0", 12, 1)
    if rc:
        fail("%s: stop on %d ranks: exit %d\n%s" % (tag, w1, rc, out))
        return
    k = len(lines(log + ".a.rank0"))
    rc, out = run(dgrun_cmd(dgrun, exe, w2, args + ["--loss-log", log + ".b"]))
    if rc:
        fail("%s: resume on %d ranks: exit %d\n%s" % (tag, w2, rc, out))
        return
    if rule == "linear":
        if "linear scaling rule, per-rank batch 8 x 1 accumulated, learning rate x %g" \
                % (w2 / w1) not in out:
            fail("%s: no linear scaling line\n%s" % (tag, out))
        else:
            print("ok %s: resumed on %d ranks at step %d with the rate x %g"
                  % (tag, w2, k, w2 / w1))
        return
    want = "global batch kept, per-rank batch %d x %d" % ((8, 2) if w2 < w1 else (4, 1))
    got = mean_losses(log + ".a", w1) + mean_losses(log + ".b", w2)
    full = mean_losses(ref, w1)
    worst = max(abs(a - b) / abs(b) for a, b in zip(got, full)) if len(got) == N else 1
    if want not in out or len(got) != N or got[:k] != full[:k] or worst > 1e-3:
        fail("%s: %d steps, worst relative difference %g (want line %r)\n%s\n%s\nvs\n%s"
             % (tag, len(got), worst, want, out, got, full))
    else:
        print("ok %s: %d steps on %d ranks + %d on %d; mean losses within %.1e of the "
              "uninterrupted run's" % (tag, k, w1, N - k, w2, worst))


def killed_rank(exe, dgrun, tmp):
    ref = uninterrupted(exe, dgrun, tmp, 2)
    d, log = os.path.join(tmp, "killed"), os.path.join(tmp, "killed.log")
    args = common(tmp) + ["--checkpoint-dir", d, "--save-every", "5", "--loss-log", log]
    p = subprocess.Popen(dgrun_cmd(dgrun, exe, 2, args + ["--throttle-ms", "25"], restarts=1),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    while len(lines(log + ".rank0")) < 17 and p.poll() is None:
        time.sleep(0.01)
    if p.poll() is None:
        os.kill(sorted(rank_pids(p.pid))[1], signal.SIGKILL)
    out, _ = p.communicate(timeout=240)
    for r in range(2):
        last = {}
        for x in lines("%s.rank%d" % (log, r)):
            last[int(x.split()[0])] = x
        got = [last[s] for s in sorted(last)]
        if p.returncode or "restart 1 of 1" not in out or got != lines("%s.rank%d" % (ref, r)):
            fail("killed rank: exit %d, rank %d losses\n%s\nvs\n%s\n%s"
                 % (p.returncode, r, got, lines("%s.rank%d" % (ref, r)), out))
            return
    redone = len(lines(log + ".rank0")) - N
    print("ok killed rank: dgrun restarted the group, it resumed from its latest checkpoint "
          "(%d step(s) redone) and the losses equal the uninterrupted run's" % redone)


def main():
    exe, dgrun = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as tmp:
        make_data(tmp)
        stop_and_resume(exe, dgrun, tmp, 4, 2)
        stop_and_resume(exe, dgrun, tmp, 2, "dgrun")
        # 3 ranks over TCP (as between hosts): each element's summation order
        # follows the bucket layout, so a resumed first step must use the
        # layout the uninterrupted run had at that step
        stop_and_resume(exe, dgrun, tmp, 3, 1, env={"DG_SHM": "0"})
        # gradient accumulation (2 micro-batches of 4 rows per step), on one
        # process and on 2 ranks: the micro-batch position resumes exactly
        stop_and_resume(exe, dgrun, tmp, 1, 0, ["--accum", "2"])
        stop_and_resume(exe, dgrun, tmp, 2, 1, ["--accum", "2"])
        reshard(exe, dgrun, tmp, 4, 2)
        reshard(exe, dgrun, tmp, 2, 4)
        reshard(exe, dgrun, tmp, 2, 4, "linear")
        killed_rank(exe, dgrun, tmp)
    print("%d failure(s)" % fails if fails else "ok")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
