#!/usr/bin/env python3
"""Activation-swapping benchmark driver (issue 15): runs bench/swap/gpt_swap
for every setting, interleaved round by round (a slow patch of a shared
machine hits all settings alike), and prints the medians over the rounds and
the targets: peak RSS at least 50% below no swapping at a step-time cost of
at most 10% with prefetch (lookahead >= 1).

  python3 bench/swap/run.py [-b BUILD_DIR] [-r RUNS] [-s STEPS] [-o OUT.jsonl]
                            [--layers L] [--batch B] [--dir DIR] [--threads T]

Settings: off; file, bf16 at lookahead 0, 1, 2. Every run is its own process
(VmHWM is that setting's). Each run's JSON line and the summary lines
({"bench":"gpt_swap_summary",...}) go to stdout and to OUT.jsonl.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(os.path.dirname(here))

ap = argparse.ArgumentParser()
ap.add_argument("-b", "--build", default=os.path.join(root, "build"))
ap.add_argument("-r", "--runs", type=int, default=5)
ap.add_argument("-s", "--steps", type=int, default=6)
ap.add_argument("-o", "--out", default="")
ap.add_argument("--layers", type=int, default=8)
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--dir", default="/var/tmp")
ap.add_argument("--note", default="", help="stored in every summary line (e.g. 'busy machine')")
a = ap.parse_args()

exe = os.path.join(a.build, "bench", "swap", "gpt_swap")
settings = [("off", 0)] + [(t, k) for t in ("file", "bf16") for k in (0, 1, 2)]
out = open(a.out, "a") if a.out else None
res = {s: [] for s in settings}


def emit(line):
    print(line, flush=True)
    if out:
        out.write(line + "\n")
        out.flush()


for r in range(a.runs):
    for sw, k in settings:
        cmd = [exe, "--swap", sw, "--lookahead", str(k), "--layers", str(a.layers),
               "--batch", str(a.batch), "--steps", str(a.steps), "--warmup", "2",
               "--threads", str(a.threads), "--dir", a.dir]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode:
            sys.exit(f"{' '.join(cmd)} failed: {p.stderr}")
        line = p.stdout.strip().splitlines()[-1]
        emit(line)
        res[(sw, k)].append(json.loads(line))

base = statistics.median(x["step_ms_median"] for x in res[("off", 0)])
base_rss = statistics.median(x["peak_rss_mib"] for x in res[("off", 0)])
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
for (sw, k), xs in res.items():
    ms = statistics.median(x["step_ms_median"] for x in xs)
    rss = statistics.median(x["peak_rss_mib"] for x in xs)
    s = {"bench": "gpt_swap_summary", "swap": sw, "lookahead": k, "layers": a.layers,
         "batch": a.batch, "threads": a.threads, "runs": a.runs, "steps": a.steps,
         "step_ms": round(ms, 1), "peak_rss_mib": round(rss, 1),
         "time_cost_pct": round(100 * (ms / base - 1), 1),
         "rss_saving_pct": round(100 * (1 - rss / base_rss), 1),
         "backward_wait_ms": round(statistics.median(x["backward_wait_ms_per_step"] for x in xs), 1),
         "cpu": cpu, "note": a.note}
    if sw != "off":
        s["target"] = ("PASS" if s["rss_saving_pct"] >= 50 and (k == 0 or s["time_cost_pct"] <= 10)
                       else "MISS")
    emit(json.dumps(s))
