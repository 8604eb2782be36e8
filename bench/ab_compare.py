#!/usr/bin/env python3
"""A/B of two dgrad builds on the same machine: the MLP and GPT step
benchmarks, DDP scaling (2 ranks) and the all-reduce, each case run once per
round from build A then from build B (B first on odd rounds), so a slow patch
of a shared machine hits both alike. Prints per case the median of the rounds
for A and B and B/A as throughput (> 1: B faster), and the worst ratio.

  python3 bench/ab_compare.py --a BUILD_OLD --b BUILD_NEW [--rounds 5] [--out F.jsonl]

Both builds need -Dbench=true (the default). Record the CPU with the figures.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from host import free_port  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def last_json(out):
    lines = [l for l in out.splitlines() if l.startswith("{")]
    return [json.loads(l) for l in lines]


def run(argv, env=None):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, **(env or {})))
    if p.returncode:
        sys.exit(f"failed ({p.returncode}): {' '.join(argv)}\n{p.stderr[-2000:]}")
    return last_json(p.stdout)


def allreduce_once(build, size, port):
    exe = os.path.join(build, "bench", "dist", "bench_allreduce")
    procs = []
    for r in range(2):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(r),
                   WORLD_SIZE="2", LOCAL_RANK=str(r), GLOO_SOCKET_IFNAME="lo",
                   DG_TIMEOUT_MS="20000")
        procs.append(subprocess.Popen([exe, "20", "auto", str(size)], env=env,
                                      stdout=subprocess.PIPE, text=True))
    try:
        out = procs[0].communicate(timeout=300)[0]
        procs[1].wait(timeout=60)
    except subprocess.TimeoutExpired:
        out = ""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    d = last_json(out)
    return 1e6 / statistics.median(d[-1]["us"]) if procs[0].returncode == 0 and d else None


def allreduce(build, size):
    """All-reduces per second of `size` bytes over 2 local ranks (median of
    iters); a port free now below the ephemeral range (bench/host.py), and
    again on another should another program take it first."""
    for _ in range(3):
        v = allreduce_once(build, size, str(free_port()))
        if v is not None:
            return v
    sys.exit(f"allreduce {size} B failed three times ({build})")


CASES = {
    # name: (function(build) -> throughput)
    "mlp_b64_t1": lambda b: run([os.path.join(b, "bench", "mlp"), "--batch", "64", "--threads",
                                 "1", "--max-seconds", "2"])[-1]["steps_per_s"],
    "mlp_b256_t1": lambda b: run([os.path.join(b, "bench", "mlp"), "--batch", "256",
                                  "--threads", "1", "--max-seconds", "2"])[-1]["steps_per_s"],
    "mlp_b64_t2": lambda b: run([os.path.join(b, "bench", "mlp"), "--batch", "64", "--threads",
                                 "2", "--max-seconds", "2"])[-1]["steps_per_s"],
    "mlp_b256_t2": lambda b: run([os.path.join(b, "bench", "mlp"), "--batch", "256",
                                  "--threads", "2", "--max-seconds", "2"])[-1]["steps_per_s"],
    "gpt_t1": lambda b: run([os.path.join(b, "bench", "gpt"), "--threads", "1", "--steps",
                             "20"])[-1]["steps_per_s"],
    "gpt_t2": lambda b: run([os.path.join(b, "bench", "gpt"), "--threads", "2", "--steps",
                             "20"])[-1]["steps_per_s"],
    "ddp_1rank": lambda b: run([os.path.join(b, "bench", "ddp", "ddp_mlp"), "--nproc", "1",
                                "--steps", "300"])[-1]["samples_per_s"],
    "ddp_2ranks": lambda b: run([os.path.join(b, "bench", "ddp", "ddp_mlp"), "--nproc", "2",
                                 "--steps", "300"])[-1]["samples_per_s"],
    "allreduce_64k": lambda b: allreduce(b, 64 << 10),
    "allreduce_4m": lambda b: allreduce(b, 4 << 20),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True, help="build dir of the old code")
    ap.add_argument("--b", required=True, help="build dir of the new code")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--out")
    args = ap.parse_args()
    names = args.cases.split(",")
    res = {n: {"a": [], "b": []} for n in names}
    for r in range(args.rounds):
        for n in names:
            order = [("a", args.a), ("b", args.b)] if r % 2 == 0 else [("b", args.b), ("a", args.a)]
            for tag, build in order:
                res[n][tag].append(CASES[n](build))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    worst = None
    lines = []
    for n in names:
        a, b = statistics.median(res[n]["a"]), statistics.median(res[n]["b"])
        d = {"bench": "ab", "case": n, "a": round(a, 2), "b": round(b, 2),
             "b_over_a": round(b / a, 4), "a_runs": res[n]["a"], "b_runs": res[n]["b"]}
        lines.append(d)
        print(json.dumps(d))
        worst = d if worst is None or d["b_over_a"] < worst["b_over_a"] else worst
    print(json.dumps({"bench": "ab_worst", "case": worst["case"], "b_over_a": worst["b_over_a"]}))
    if args.out:
        with open(args.out, "a") as f:
            for d in lines:
                f.write(json.dumps(d) + "\n")


if __name__ == "__main__":
    main()
