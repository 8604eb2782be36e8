#!/usr/bin/env python3
"""Allreduce benchmark runner: dgrad (Gloo's ring and its own algorithms) vs
torch.distributed gloo, interleaved round by round in one run so both see
the same machine state (this VM's idle CPUs wake slowly). Prints one JSON
line per (impl, algo, world, size): median of all samples pooled over the
rounds, and bus bandwidth = bytes / t * 2 (W - 1) / W; then ratio lines.

  python3 bench/dist/run_allreduce.py --build build [--worlds 2,4] [--rounds 5]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from host import free_port  # noqa: E402
SIZES = [4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def launch(world, argv):
    # free now and below the ephemeral range (a random port inside it once
    # collided with another connection and the run failed unclearly)
    port = free_port()
    procs = []
    for r in range(world):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r),
                   WORLD_SIZE=str(world), LOCAL_RANK=str(r), GLOO_SOCKET_IFNAME="lo")
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True))
    out = procs[0].communicate(timeout=900)[0]
    for p in procs[1:]:
        p.wait(timeout=120)
    bad = [(r, p.returncode) for r, p in enumerate(procs) if p.returncode]
    if bad:
        sys.exit("run_allreduce: ranks %s failed (exit status %s) on 127.0.0.1:%d: %s" % (
            [r for r, _ in bad], [c for _, c in bad], port, " ".join(argv)))
    return [json.loads(l) for l in out.splitlines() if l.startswith("{")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--algos", default="ring,auto")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    a = ap.parse_args()
    exe = os.path.join(a.build, "bench", "dist", "bench_allreduce")
    samples = {}
    for world in [int(w) for w in a.worlds.split(",")]:
        for _ in range(a.rounds):
            runs = [[exe, str(a.iters), a.algos, a.sizes],
                    ["/usr/bin/python3", os.path.join(HERE, "bench_allreduce_torch.py"),
                     str(a.iters), a.sizes]]
            for argv in runs:
                for d in launch(world, argv):
                    samples.setdefault((d["impl"], d["algo"], d["world"], d["bytes"]),
                                       []).extend(d["us"])
    med = {}
    for (impl, algo, world, nbytes), us in sorted(samples.items()):
        t = statistics.median(us)
        med[(impl, algo, world, nbytes)] = t
        bus = nbytes / (t * 1e-6) * 2 * (world - 1) / world / 1e9
        print(json.dumps({"bench": "allreduce", "impl": impl, "algo": algo, "world": world,
                          "bytes": nbytes, "median_us": round(t, 1),
                          "busbw_GBps": round(bus, 3), "samples": len(us)}))
    for (impl, algo, world, nbytes), t in sorted(med.items()):
        ref = med.get(("torch", "gloo", world, nbytes))
        if impl == "dgrad" and ref:
            print(json.dumps({"bench": "allreduce_vs_torch", "algo": algo, "world": world,
                              "bytes": nbytes, "busbw_ratio": round(ref / t, 2),
                              "latency_ratio": round(t / ref, 3)}))


if __name__ == "__main__":
    main()
