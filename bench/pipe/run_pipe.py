#!/usr/bin/env python3
"""Pipeline benchmark runner (issue #13 item 10; BENCHMARKS.md "Pipeline").

Runs bench/pipe/pipe_mlp in interleaved rounds (every configuration once per
round, --runs rounds) and prints medians:
  - K = 2 stages on 2 ranks x 1 thread, M in {1, 2, 4, 8, 16}, GPipe and 1F1B:
    measured idle fraction (mean of the two stages) against (K-1)/(M+K-1),
    samples/s against one process with 1 and 2 threads and DDP on 2 ranks at
    the same global batch, each stage's arena peak;
  - balance quality on a model with uneven layers: max over mean stage busy
    time, split evenly by layer count against split by measured time;
  - the GEMM bound: OpenBLAS sgemm alone on the model's GEMMs at B rows
    against M micro-batches of B/M rows (1 thread), so the speed-up no
    schedule can pass at that micro-batch size: 2 x (1 - theory idle) x
    sgemm(B rows) / sgemm(M x B/M rows).
PyTorch 1.13 has no multi-process pipeline on CPU: the anchors are the
theory and dgrad's own single-process and DDP runs.

  bench/pipe/run_pipe.py [--build build] [--runs 5] [--steps 20] [--batch 512]
                         [--layers 1024,...,10] [--micro 1,2,4,8,16] [--out FILE]
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

UNEVEN = "256,2048,256,256,256,256,256,256,10"


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "?"


def run(exe, args):
    out = subprocess.run([exe] + args, capture_output=True, text=True, timeout=600)
    if out.returncode:
        sys.exit(f"pipe_mlp {' '.join(args)} failed ({out.returncode}): {out.stderr}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def configs(steps, batch, layers, micros):
    base = ["--steps", str(steps), "--batch", str(batch)]
    model = ["--layers", layers] if layers else []
    cf = {"single_t1": base + model + ["--mode", "single"],
          "single_t2": base + model + ["--mode", "single", "--threads", "2"],
          "ddp": base + model + ["--mode", "ddp"]}
    for m in micros:
        for sched in ("gpipe", "1f1b"):
            cf[f"pipe_{sched}_m{m}"] = base + model + ["--mode", "pipe", "--micro", str(m),
                                                       "--schedule", sched]
        # the same 1F1B with the boundaries through TCP loopback, not the rings
        cf[f"tcp_1f1b_m{m}"] = cf[f"pipe_1f1b_m{m}"] + ["--transport", "1"]
    for m in micros:
        cf[f"gemm_m{m}"] = base + model + ["--mode", "gemm", "--micro", str(m)]
    for bal in ("even", "time"):
        cf[f"uneven_{bal}"] = base + ["--mode", "pipe", "--micro", "8", "--schedule", "1f1b",
                                      "--layers", UNEVEN, "--balance", bal]
    return cf


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--layers", default="", help="pipe_mlp's --layers (default: its own)")
    ap.add_argument("--micro", default="1,2,4,8,16", help="the M to run, comma-separated")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    exe = os.path.join(a.build, "bench", "pipe", "pipe_mlp")
    micros = [int(m) for m in a.micro.split(",")]
    cf = configs(a.steps, a.batch, a.layers, micros)
    res = {k: [] for k in cf}
    for r in range(a.runs):
        for k, args in cf.items():
            res[k].append(run(exe, args))
        print(f"round {r + 1}/{a.runs} done", file=sys.stderr)
    med = statistics.median
    sps = {k: med(max(x["samples_per_s"] for x in rnd) for rnd in v) for k, v in res.items()
           if not k.startswith("gemm")}
    gemm = {m: med(rnd[0]["micro_over_batch"] for rnd in res[f"gemm_m{m}"]) for m in micros}
    cpu = cpu_model()
    date = datetime.datetime.now().isoformat(timespec="minutes")
    rows = []
    print(f"CPU: {cpu}, {os.cpu_count()} cores, {date}, {a.runs} interleaved rounds, median, "
          f"global batch {a.batch}, layers {a.layers or 'pipe_mlp default'}")
    print(f"one process: 1 thread {sps['single_t1']:.0f} samples/s, 2 threads "
          f"{sps['single_t2']:.0f}; DDP 2 ranks {sps['ddp']:.0f}")
    print("| M | schedule | idle (measured) | idle (theory) | samples/s | vs 1 thread | vs 2 threads"
          " | vs DDP | GEMM bound vs 1 thread | stage 0 arena peak MiB | stage 1 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for m in micros:
        for sched in ("gpipe", "1f1b"):
            k = f"pipe_{sched}_m{m}"
            idle = med(statistics.mean(x["idle"] for x in rnd) for rnd in res[k])
            peak = [med(next(x["arena_peak"] for x in rnd if x["rank"] == s) for rnd in res[k])
                    for s in (0, 1)]
            bound = 2 * (1 - 1.0 / (m + 1)) / gemm[m]
            row = {"figure": "pipe", "micro": m, "schedule": sched, "idle": idle, "batch": a.batch,
                   "layers": a.layers or "default",
                   "sgemm_micro_over_batch": gemm[m], "gemm_bound_vs_single_t1": bound,
                   "theory_idle": 1.0 / (m + 1), "samples_per_s": sps[k],
                   "vs_single_t1": sps[k] / sps["single_t1"], "vs_single_t2": sps[k] / sps["single_t2"],
                   "vs_ddp": sps[k] / sps["ddp"], "arena_peak": peak}
            rows.append(row)
            print(f"| {m} | {sched} | {100 * idle:.1f}% | {100 / (m + 1):.1f}% | {sps[k]:.0f} | "
                  f"{row['vs_single_t1']:.2f}x | {row['vs_single_t2']:.2f}x | {row['vs_ddp']:.2f}x | "
                  f"{bound:.2f}x | "
                  f"{peak[0] / 2**20:.1f} | {peak[1] / 2**20:.1f} |")
    print("| M | 1F1B, boundaries written into the neighbour's ring | through TCP loopback | ring / TCP"
          " | idle ring | idle TCP |")
    print("|---|---|---|---|---|---|")
    for m in micros:
        k, t = f"pipe_1f1b_m{m}", f"tcp_1f1b_m{m}"
        idle = [med(statistics.mean(x["idle"] for x in rnd) for rnd in res[j]) for j in (k, t)]
        direct = med(sum(x["bytes_direct"] for x in rnd) for rnd in res[k])
        rows.append({"figure": "boundaries", "micro": m, "schedule": "1f1b", "batch": a.batch,
                     "layers": a.layers or "default", "samples_per_s_ring": sps[k],
                     "samples_per_s_tcp": sps[t], "ring_over_tcp": sps[k] / sps[t],
                     "idle_ring": idle[0], "idle_tcp": idle[1], "bytes_direct_per_step": direct})
        print(f"| {m} | {sps[k]:.0f} | {sps[t]:.0f} | {sps[k] / sps[t]:.3f}x | "
              f"{100 * idle[0]:.1f}% | {100 * idle[1]:.1f}% |")
    for bal in ("even", "time"):
        k = f"uneven_{bal}"
        ratio = med(max(x["busy_s"] for x in rnd) / statistics.mean(x["busy_s"] for x in rnd)
                    for rnd in res[k])
        split = next(x["last"] for x in res[k][-1] if x["rank"] == 0)
        rows.append({"figure": "balance", "balance": bal, "layers": UNEVEN,
                     "max_over_mean_busy": ratio, "split": split, "samples_per_s": sps[k]})
        print(f"uneven model ({UNEVEN}), 1F1B M=8, balance {bal}: stage 0 = layers [0, {split}), "
              f"max/mean stage busy time {ratio:.3f}, {sps[k]:.0f} samples/s")
    if a.out:
        with open(a.out, "a") as f:
            for row in rows:
                row.update({"cpu": cpu, "date": date, "runs": a.runs, "steps": a.steps,
                            "single_t1": sps["single_t1"], "single_t2": sps["single_t2"],
                            "ddp": sps["ddp"]})
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
