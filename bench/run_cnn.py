#!/usr/bin/python3
"""Runs the CNN step benchmark for dgrad (bench/cnn.c) and PyTorch
(bench/cnn_torch.py) interleaved in one window; prints every JSON line, the
medians, the GEMM roofline shares and the dgrad / torch ratios.

    /usr/bin/python3 bench/run_cnn.py [--build-dir build-bench] [--runs 5] [--batch 64]
                                      [--steps 30] [--max-seconds 3] [--out FILE]

Every round runs each setting once, alternating dgrad and torch, so that a
slow patch of a shared machine hits both sides alike; the summary uses the
median of the rounds. Settings:
  dgrad   1 thread, 2 threads
  torch   1 thread; 2 threads with the default OpenMP wait policy and with
          OMP_WAIT_POLICY=PASSIVE (OpenBLAS capped at the same thread count;
          see cnn_torch.py); 1 intra-op thread with OpenBLAS on 2 threads
"torch best t2" is the fastest of the three 2-core torch settings. The
roofline: every dgrad run times OpenBLAS sgemm on the step's own GEMMs first
(bench/roofline.h, roofline_pct); torch's share is its step rate (1 thread,
and its best 2-core setting) against the same measurement. --max-seconds
caps dgrad's runs only (torch's run their --steps). Every record carries
steal_s, the machine's CPU steal time during the run (/proc/stat). No
targets: the CNN is reported for information (bench/run_all.py's CNN rows).
Needs only the standard library; torch is only needed by cnn_torch.py, which
runs under /usr/bin/python3 (Debian's python3-torch).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TORCH_PY = "/usr/bin/python3"
sys.path.insert(0, HERE)
from host import steal_s  # noqa: E402
from torch_setup import STEP_SETTINGS, TORCH_T2  # noqa: E402

SETTINGS = STEP_SETTINGS


def run_one(exe, impl, batch, threads, steps, env_extra, args_extra, max_s):
    common = ["--batch", str(batch), "--threads", str(threads),
              "--steps", str(steps), "--warmup", str(max(2, steps // 6))]
    if impl == "dgrad":
        cmd = [exe] + common + ["--max-seconds", str(max_s)]
    else:
        cmd = [TORCH_PY, os.path.join(HERE, "cnn_torch.py")] + common + args_extra
    env = dict(os.environ)
    for k in ("OMP_WAIT_POLICY", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
              "DG_NUM_THREADS", "CNN_TRACE_ALLOCS"):
        env.pop(k, None)
    env.update(env_extra)
    s0 = steal_s()
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=600)
    if p.returncode != 0:
        sys.stderr.write("run_cnn: %s failed (%d):\n%s" % (" ".join(cmd), p.returncode, p.stderr))
        return None
    rec = json.loads([l for l in p.stdout.splitlines() if l.startswith("{")][-1])
    rec["steal_s"] = round(steal_s() - s0, 2)
    return rec


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build-bench"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--max-seconds", type=int, default=3,
                    help="cap on the timed part of each dgrad run")
    ap.add_argument("--out", help="also write the JSON lines to this file")
    a = ap.parse_args()
    exe = os.path.join(a.build_dir, "bench", "cnn")
    if not os.access(exe, os.X_OK):
        sys.exit("run_cnn: %s not built (meson setup %s && ninja -C %s)" %
                 (exe, a.build_dir, a.build_dir))
    out = open(a.out, "w") if a.out else None
    res = {}
    t_start, steal0 = time.time(), steal_s()
    for r in range(a.runs):
        for label, impl, th, env, extra in SETTINGS:
            rec = run_one(exe, impl, a.batch, th, a.steps, env, extra, a.max_seconds)
            if rec is None:
                continue
            rec["setting"], rec["round"] = label, r
            line = json.dumps(rec)
            print(line, flush=True)
            if out:
                out.write(line + "\n")
                out.flush()
            res.setdefault(label, []).append(rec)
    if out:
        out.close()

    def med(label, key="steps_per_s"):
        rs = [x[key] for x in res.get(label, []) if x.get(key) is not None]
        return statistics.median(rs) if rs else float("nan")

    print("\n# batch %d: medians of %d rounds (steps/s), %.0f s in all, CPU steal %.1f s" %
          (a.batch, a.runs, time.time() - t_start, steal_s() - steal0))
    for label, *_ in SETTINGS:
        print("%-24s %8.2f" % (label, med(label)))
    best_lab = max(TORCH_T2, key=lambda lab: med(lab) if res.get(lab) else -1)
    best2 = med(best_lab)
    print("\n# roofline: OpenBLAS sgemm on the step's GEMM shapes, same threads (medians)")
    for th in (1, 2):
        lab = "dgrad t%d" % th
        sg, flop = med(lab, "sgemm_gflops"), med(lab, "gemm_gflop_per_step")
        tl = "torch t1" if th == 1 else best_lab
        print("%d thread%s: sgemm %6.1f GFLOP/s; dgrad %5.1f%%, %s %5.1f%%" % (
            th, " " if th == 1 else "s", sg, med(lab, "roofline_pct"), tl,
            100 * flop * med(tl) / sg))
    print("\n# ratios of medians (dgrad / torch), same window")
    print("1 thread:  dgrad t1 / torch t1       %.2fx" % (med("dgrad t1") / med("torch t1")))
    print("2 threads: dgrad t2 / %s  %.2fx" % (best_lab, med("dgrad t2") / best2))
    print("2 threads: dgrad t2 / dgrad t1       %.2fx" % (med("dgrad t2") / med("dgrad t1")))
    dg = [x for lab, rs in res.items() if lab.startswith("dgrad") for x in rs]
    print("dgrad heap allocations per step: " + ", ".join(
        "t%d %g" % (x["threads"], x["heap_allocs_per_step"]) for x in dg if x["round"] == 0))
    print("peak RSS MiB: dgrad %.0f, torch %.0f" % (
        max(x["peak_rss_mib"] for x in dg),
        max(x["peak_rss_mib"] for lab, rs in res.items() if lab.startswith("torch") for x in rs)))


if __name__ == "__main__":
    main()
