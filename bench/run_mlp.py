#!/usr/bin/python3
"""Runs the MLP benchmark for dgrad (bench/mlp.c) and PyTorch (bench/mlp_torch.py)
interleaved in one window, and checks the figures against issue 19's targets
(1 thread: >= 85% of the GEMM roofline at batch 256, 75% at 64; 2 threads >=
1.8x 1 thread at batch 256; >= 1.3x torch's best setting for the same cores).

    /usr/bin/python3 bench/run_mlp.py [--build-dir build-bench] [--runs 5] [--out FILE]
                                      [--max-seconds 2]

Every round runs each setting once, alternating dgrad and torch, so that a
slow patch of a shared machine hits both sides alike; the summary uses the
median of the rounds. Settings, for batch 64, 256 and 1:
  dgrad   1 thread, 2 threads
  torch   1 thread; 2 threads with the default OpenMP wait policy and with
          OMP_WAIT_POLICY=PASSIVE (OpenBLAS capped at the same thread count;
          see mlp_torch.py); 1 intra-op thread with OpenBLAS on 2 threads
          (often torch's best use of 2 cores for this MLP: its GEMMs are
          nearly all the work); and, for information, 1 torch thread with
          OpenBLAS at its default (one thread per core: what a plain
          `import torch` gets on Debian)
"torch best t2" is the fastest of the three 2-core torch settings, chosen
per batch from the medians of this run.
The roofline: every dgrad run times OpenBLAS sgemm on the step's own GEMM
shapes first (bench/roofline.h) and reports roofline_pct, the step's GEMM
FLOP rate as a share of sgemm's; torch's share is its step rate against the
same measurement (dgrad's, same batch and thread count, same round).
Every record carries steal_s, the machine's CPU steal time during the run
(/proc/stat).
Each run times at most --max-seconds of steps (after its warmup), so a run
on a loaded machine stays bounded. Prints every JSON line as it arrives, then
the medians and the ratios, with the date and the load average (a timing
from a busy machine says so).
Needs only the standard library; torch is only needed by mlp_torch.py, which
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

# steps and warmup per batch: each run times about 0.5-2 s of steps
STEPS = {64: (300, 30), 256: (100, 10), 1: (2000, 200)}

# torch_setup.STEP_SETTINGS, and for information torch on 1 thread with
# OpenBLAS at its default (one thread per core: a plain `import torch`)
SETTINGS = STEP_SETTINGS + [("torch t1 blas=default", "torch", 1, {}, ["--blas-threads", "0"])]


def run_one(mlp, impl, batch, threads, env_extra, args_extra, max_s):
    steps, warmup = STEPS[batch]
    common = ["--batch", str(batch), "--threads", str(threads),
              "--steps", str(steps), "--warmup", str(warmup), "--max-seconds", str(max_s)]
    if impl == "dgrad":
        cmd = [mlp] + common
    else:
        cmd = [TORCH_PY, os.path.join(HERE, "mlp_torch.py")] + common + args_extra
    env = dict(os.environ)
    for k in ("OMP_WAIT_POLICY", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
              "DG_NUM_THREADS", "MLP_TRACE_ALLOCS"):
        env.pop(k, None)
    env.update(env_extra)
    s0 = steal_s()
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=300)
    if p.returncode != 0:
        sys.stderr.write("run_mlp: %s failed (%d):\n%s" % (" ".join(cmd), p.returncode, p.stderr))
        return None
    line = [l for l in p.stdout.splitlines() if l.startswith("{")][-1]
    rec = json.loads(line)
    rec["steal_s"] = round(steal_s() - s0, 2)
    return rec


def verdict(ok):
    return "PASS" if ok else "MISS"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build-bench"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--batches", default="64,256,1")
    ap.add_argument("--out", help="also write the JSON lines to this file")
    ap.add_argument("--max-seconds", type=int, default=2,
                    help="cap on the timed part of each run")
    a = ap.parse_args()
    mlp = os.path.join(a.build_dir, "bench", "mlp")
    if not os.access(mlp, os.X_OK):
        sys.exit("run_mlp: %s not built (meson setup build-bench && ninja -C build-bench)" % mlp)
    if not os.access(TORCH_PY, os.X_OK):
        sys.exit("run_mlp: %s not found" % TORCH_PY)
    batches = [int(b) for b in a.batches.split(",")]
    out = open(a.out, "w") if a.out else None

    res = {}  # (label, batch) -> [records]
    t_start = time.time()
    load0 = os.getloadavg()
    steal0 = steal_s()
    for r in range(a.runs):
        for b in batches:
            for label, impl, th, env, extra in SETTINGS:
                rec = run_one(mlp, impl, b, th, env, extra, a.max_seconds)
                if rec is None:
                    continue
                rec["setting"] = label
                rec["round"] = r
                line = json.dumps(rec)
                print(line, flush=True)
                if out:
                    out.write(line + "\n")
                    out.flush()
                res.setdefault((label, b), []).append(rec)
    elapsed = time.time() - t_start

    def med(label, b):
        rs = res.get((label, b), [])
        return statistics.median([x["steps_per_s"] for x in rs]) if rs else float("nan")

    def best_t2(b):
        return max(TORCH_T2, key=lambda lab: med(lab, b) if res.get((lab, b)) else -1)

    load1 = os.getloadavg()
    print("\n# %s; %s; load average %.1f at start, %.1f at end (%d CPUs)" % (
        time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t_start)), os.uname().nodename,
        load0[0], load1[0], os.cpu_count()))
    print("# medians of %d rounds (steps/s), %.0f s in all, CPU steal %.1f s" % (
        a.runs, elapsed, steal_s() - steal0))
    print("%-24s" % "setting" + "".join("%12s" % ("batch %d" % b) for b in batches))
    for label, *_ in SETTINGS:
        print("%-24s" % label + "".join("%12.1f" % med(label, b) for b in batches))

    def med_cpu(label, b):
        rs = [x["cpu_ms_per_step"] for x in res.get((label, b), []) if "cpu_ms_per_step" in x]
        return statistics.median(rs) if rs else float("nan")

    print("\n# medians of CPU time per step (ms, all threads of the process)")
    for label, *_ in SETTINGS:
        print("%-24s" % label + "".join("%12.3f" % med_cpu(label, b) for b in batches))
    print("# 1 thread by CPU time (torch t1 / dgrad t1; moves less with machine load): " +
          ", ".join("batch %d %.2fx" % (b, med_cpu("torch t1", b) / med_cpu("dgrad t1", b))
                    for b in batches))

    def med_key(label, b, key):
        rs = [x[key] for x in res.get((label, b), []) if x.get(key) is not None]
        return statistics.median(rs) if rs else float("nan")

    print("\n# roofline: OpenBLAS sgemm on the step's GEMM shapes, same threads (medians)")
    for th in (1, 2):
        for b in batches:
            sg = med_key("dgrad t%d" % th, b, "sgemm_gflops")
            flop = med_key("dgrad t%d" % th, b, "gemm_gflop_per_step")
            tl = "torch t1" if th == 1 else best_t2(b)
            print("batch %-4d %d thread%s: sgemm %6.1f GFLOP/s; dgrad %5.1f%%, %s %5.1f%%" % (
                b, th, " " if th == 1 else "s", sg, med_key("dgrad t%d" % th, b, "roofline_pct"),
                tl, 100 * flop * med(tl, b) / sg))

    print("\n# targets (issue 19; ratios of medians, dgrad / torch, same window)")
    checks = []

    def ratio(label, b, num, den, want):
        if b not in batches:
            return
        v = num / den if den else float("nan")
        checks.append(v >= want)
        print("%-58s %6.2fx  (want >= %.1fx)  %s" % (label, v, want, verdict(v >= want)))

    def pct(label, b, v, want):
        if b not in batches:
            return
        checks.append(v >= want)
        print("%-58s %6.1f%%  (want >= %d%%)   %s" % (label, v, want, verdict(v >= want)))

    for b, want in ((256, 85), (64, 75)):
        pct("batch %d, 1 thread: step / sgemm roofline" % b, b,
            med_key("dgrad t1", b, "roofline_pct"), want)
    ratio("batch 256, 2 threads: dgrad t2 / dgrad t1", 256, med("dgrad t2", 256),
          med("dgrad t1", 256), 1.8)
    for b in batches:
        ratio("batch %d, 1 thread: dgrad t1 / torch t1" % b, b, med("dgrad t1", b),
              med("torch t1", b), 1.3)
        ratio("batch %d, 2 threads: dgrad t2 / %s" % (b, best_t2(b)), b, med("dgrad t2", b),
              med(best_t2(b), b), 1.3)
    dg = [x for (lab, _), rs in res.items() if lab.startswith("dgrad") for x in rs]
    allocs = max((x["heap_allocs_per_step"] for x in dg), default=float("nan"))
    allocs_by = sorted({(x["batch"], x["threads"], x["heap_allocs_per_step"]) for x in dg})
    ok = allocs == 0
    checks.append(ok)
    print("%-58s %7s  (want 0)        %s" % ("heap allocations per steady-state step (max)",
                                            "%g" % allocs, verdict(ok)))
    if not ok:
        print("    per (batch, threads): " + ", ".join(
            "(%d, %d): %g" % t for t in allocs_by if t[2]))
    rss = max((x["peak_rss_mib"] for x in dg), default=float("nan"))
    trss = max((x["peak_rss_mib"] for (lab, _), rs in res.items() if lab.startswith("torch")
                for x in rs), default=float("nan"))
    ok = rss < 32
    checks.append(ok)
    print("%-58s %6.1f   (want < 32; torch %.0f)  %s" % ("peak RSS MiB, dgrad (max)", rss, trss,
                                                         verdict(ok)))
    print("\n# %d of %d targets met" % (sum(checks), len(checks)))
    if out:
        out.close()


if __name__ == "__main__":
    main()
