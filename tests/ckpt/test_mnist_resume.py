#!/usr/bin/env python3
"""examples/mnist resumes exactly: for each setting, N steps uninterrupted
must give the same losses, bit for bit, as N/2 steps + checkpoint + resume
for the rest. Runs on a small synthetic MNIST-format directory written here
(320 training images: 10 steps per epoch at batch 32, so the runs cross an
epoch end), 1 thread. Also: the steady-state steps allocate nothing, and a
checkpoint of another model is refused with a clear message.

    python3 test_mnist_resume.py path/to/mnist [path/to/dgrun]

With dgrun, also two data-parallel ranks (DDP) stop and resume exactly,
and so do they with --overlap (DDP applying each update during the next
forward), whose losses must also be those of the plain loop.
"""
import os
import random
import struct
import subprocess
import sys
import tempfile

# (model, optimizer, lr schedule, total steps, stop-and-resume step)
SETTINGS = [("cnn", "adamw", "cosine", 16, 8), ("mlp", "sgd", "cosine", 16, 10),
            ("mlp", "lars", "constant", 16, 13), ("mlp", "lamb", "cosine", 14, 5)]


def write_idx(path, dims, data):
    with open(path, "wb") as f:
        f.write(struct.pack(">BBBB", 0, 0, 0x08, len(dims)))
        for d in dims:
            f.write(struct.pack(">I", d))
        f.write(bytes(data))


def make_data(d, ntrain=320, ntest=100):
    rng = random.Random(5)
    for prefix, n in (("train", ntrain), ("t10k", ntest)):
        labels = [rng.randrange(10) for _ in range(n)]
        pix = []
        for y in labels:  # a bright row per class plus noise: learnable
            img = [rng.randrange(64) for _ in range(784)]
            for c in range(28):
                img[(2 + 2 * y) * 28 + c] = 200 + rng.randrange(56)
            pix += img
        write_idx(os.path.join(d, prefix + "-images-idx3-ubyte"), [n, 28, 28], pix)
        write_idx(os.path.join(d, prefix + "-labels-idx1-ubyte"), [n], labels)


def run(exe, args):
    p = subprocess.run([exe] + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=240)
    return p.returncode, p.stdout


def ddp_resume(exe, dgrun, tmp, extra=(), ref=None):
    """Two ranks under dgrun (DDP, sharded loader): 12 steps uninterrupted vs
    7 + checkpoint + resume; every rank's losses identical (and equal to
    `ref`'s uninterrupted ones when given). Returns (failures, log prefix)."""
    n, k = 12, 7
    common = ["--data", tmp, "--model", "mlp", "--optim", "adamw", "--batch", "16",
              "--epochs", "2", "--threads", "1", "--seed", "4", "--log-every", "0",
              "--max-steps", str(n)] + list(extra)
    tag = "".join(extra).strip("-") or "plain"
    ck = os.path.join(tmp, "ddp_%s.safetensors" % tag)
    logs = {x: os.path.join(tmp, "ddp_%s_%s.log" % (tag, x)) for x in "ab"}
    launch = [dgrun, "--nproc-per-node", "2", "--", exe]
    runs = [launch + common + ["--loss-log", logs["a"]],
            launch + common + ["--loss-log", logs["b"], "--stop-at", str(k), "--checkpoint", ck],
            launch + common + ["--loss-log", logs["b"], "--resume", ck]]
    for cmd in runs:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=240)
        if p.returncode:
            print("FAIL ddp %s: %s exited %d\n%s" % (tag, " ".join(cmd), p.returncode, p.stdout))
            return 1, logs["a"]
    fails = 0
    for r in (0, 1):
        a = open("%s.rank%d" % (logs["a"], r)).read().split("\n")
        b = open("%s.rank%d" % (logs["b"], r)).read().split("\n")
        if len(a) != n + 1 or a != b:
            print("FAIL ddp %s rank %d: losses differ\n%s\nvs\n%s" % (tag, r, a, b))
            fails += 1
        else:
            print("ok ddp %s W=2 rank %d: %d = %d + %d identical losses" % (tag, r, n, k, n - k))
        if ref:
            c = open("%s.rank%d" % (ref, r)).read().split("\n")
            if a != c:
                print("FAIL ddp %s rank %d: losses differ from the plain loop's\n%s\nvs\n%s"
                      % (tag, r, a, c))
                fails += 1
            else:
                print("ok ddp %s rank %d: the plain loop's losses" % (tag, r))
    return fails, logs["a"]


def main():
    exe = sys.argv[1]
    fails = 0
    with tempfile.TemporaryDirectory() as tmp:
        make_data(tmp)
        for model, optim, sched, n, k in SETTINGS:
            common = ["--data", tmp, "--model", model, "--optim", optim, "--batch", "32",
                      "--schedule", sched,
                      "--epochs", "3", "--threads", "1", "--seed", "3", "--log-every", "4"]
            a_log, b_log = os.path.join(tmp, "a.log"), os.path.join(tmp, "b.log")
            ck = os.path.join(tmp, "ck.safetensors")
            for f in (a_log, b_log, ck):
                if os.path.exists(f):
                    os.unlink(f)
            rc, out_a = run(exe, common + ["--max-steps", str(n), "--loss-log", a_log])
            rc2, out_b = run(exe, common + ["--max-steps", str(n), "--stop-at", str(k),
                                            "--loss-log", b_log,
                                            "--checkpoint", ck])
            rc3, out_c = run(exe, common + ["--max-steps", str(n), "--loss-log", b_log,
                                            "--resume", ck])
            name = "%s/%s/%s %d = %d + %d" % (model, optim, sched, n, k, n - k)
            if rc or rc2 or rc3:
                print("FAIL %s: exit codes %d %d %d\n%s\n%s\n%s" % (name, rc, rc2, rc3,
                                                                     out_a, out_b, out_c))
                fails += 1
                continue
            a = open(a_log).read().split("\n")
            b = open(b_log).read().split("\n")
            if len(a) != n + 1 or a != b:
                print("FAIL %s: losses differ\nuninterrupted:\n%s\nresumed:\n%s\n%s" %
                      (name, "\n".join(a), "\n".join(b), out_c))
                fails += 1
            else:
                print("ok %s: %d identical losses (last %s)" % (name, n, a[-2]))
            if "steady-state steps: 0\n" not in out_a:
                print("FAIL %s: steady-state steps allocate:\n%s" % (name, out_a))
                fails += 1
        # a checkpoint of another model is refused, naming what differs
        rc, out = run(exe, ["--data", tmp, "--model", "cnn", "--optim", "lamb", "--batch", "32",
                            "--seed", "3", "--threads", "1", "--resume", ck])
        if rc == 0 or "model is mlp in the checkpoint, cnn on the command line" not in out:
            print("FAIL: resuming a cnn from an mlp checkpoint:\n%s" % out)
            fails += 1
        else:
            print("ok: mismatched resume refused:", out.strip().splitlines()[-1])
        if len(sys.argv) > 2:
            f, plain = ddp_resume(exe, sys.argv[2], tmp)
            fails += f
            fails += ddp_resume(exe, sys.argv[2], tmp, ["--overlap"], plain)[0]
    print("%d failure(s)" % fails if fails else "ok")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
