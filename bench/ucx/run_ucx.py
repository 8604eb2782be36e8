#!/usr/bin/env python3
"""UCX allreduce benchmark: dgrad over UCX with shared memory (default
UCX_TLS), over UCX with UCX_TLS=tcp, over its own TCP transport, and torch
gloo, interleaved round by round in one run (this VM's idle CPUs wake
slowly, and other work shares it: only same-run ratios mean anything); plus
single-thread memcpy and raw ucx_perftest tag bandwidth/latency (sm, tcp;
with and without peer-failure handling) as the ceiling. One JSON line per
measurement: median of all samples pooled over the rounds, bus bandwidth =
bytes / t * 2 (W - 1) / W; then ratio lines.

  python3 bench/ucx/run_ucx.py --build build [--rounds 5] [--iters 5] [--no-perftest]

Rank program: bench/dist/bench_allreduce.c (built here as
bench_allreduce_ucx), the backend taken from DG_BACKEND. Its "auto" is what a
user gets: among ranks on one host, dgrad's shared-memory segment
(coll_shm.c: no transport messages at all, whichever backend); "cma" is the
earlier cross-memory-attach path (the transport carries three small
synchronisation rounds); "direct" and "ring" move every byte through the
transport (UCX's own shared-memory lanes for dgrad-ucx-sm).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = [4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
TORCH = os.path.join(HERE, "..", "dist", "bench_allreduce_torch.py")
sys.path.insert(0, os.path.dirname(HERE))
from host import free_port  # noqa: E402  (below the ephemeral range)
PYTHON = "/usr/bin/python3"

# name: (extra environment, algorithms); None = torch gloo
CONFIGS = {
    "dgrad-ucx-sm": ({"DG_BACKEND": "ucx"}, "auto,cma,direct,ring"),
    "dgrad-ucx-tcp": ({"DG_BACKEND": "ucx", "UCX_TLS": "tcp"}, "auto,direct,ring"),
    "dgrad-tcp": ({"DG_BACKEND": "tcp"}, "auto,cma,direct,ring"),
    "torch-gloo": None,
}


def launch(world, argv, extra):
    port = free_port()
    procs = []
    for r in range(world):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r),
                   WORLD_SIZE=str(world), LOCAL_RANK=str(r), GLOO_SOCKET_IFNAME="lo", **extra)
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True))
    out = procs[0].communicate(timeout=900)[0]
    for p in procs[1:]:
        p.wait(timeout=120)
    if any(p.returncode for p in procs):
        sys.exit(f"benchmark ranks failed on 127.0.0.1:{port}: {argv} {extra}")
    return [json.loads(l) for l in out.splitlines() if l.startswith("{")]


def perftest(test, size, tls, err, iters):
    """One ucx_perftest run (server + client on this host); returns the
    'Final' line's fields: typical latency (us), average bandwidth (MB/s)."""
    port = str(free_port())
    env = dict(os.environ, UCX_TLS=tls, UCX_MM_ERROR_HANDLING="y" if err else "n")
    args = ["-t", test, "-s", str(size), "-n", str(iters), "-w", str(max(iters // 10, 10))]
    if err:
        args.append("-e")
    srv = subprocess.Popen(["ucx_perftest", "-p", port] + args, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    out = subprocess.run(["ucx_perftest", "127.0.0.1", "-p", port] + args, env=env,
                         capture_output=True, text=True, timeout=300).stdout
    srv.wait(timeout=30)
    final = [l for l in out.splitlines() if l.startswith("Final:")]
    if not final:
        return None
    f = re.split(r"\s+", final[0].strip())
    # Final: iters typical_lat avg_lat overall_lat avg_bw overall_bw msgrate...
    return {"typical_lat_us": float(f[2]), "avg_bw_MBps": float(f[5])}


def run_perftest(a):
    for tls in ["sm", "tcp"]:
        for err in [False, True]:
            bw = perftest("tag_bw", 64 << 20 if tls == "sm" else 16 << 20, tls, err, 50)
            lat = perftest("tag_lat", 8, tls, err, 20000)
            if bw and lat:
                print(json.dumps({"bench": "ucx_perftest", "tls": tls, "peer_err_handling": err,
                                  "tag_bw_GBps": round(bw["avg_bw_MBps"] * 1.048576e-3, 3),
                                  "tag_bw_msg_bytes": 64 << 20 if tls == "sm" else 16 << 20,
                                  "tag_lat_us_one_way": lat["typical_lat_us"]}), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--no-perftest", action="store_true")
    a = ap.parse_args()
    exe = os.path.join(a.build, "bench", "ucx", "bench_allreduce_ucx")
    mc = subprocess.run([os.path.join(a.build, "bench", "ucx", "memcpy_bw"), str(64 << 20), "21"],
                        capture_output=True, text=True).stdout
    memcpy = json.loads(mc)
    print(mc.strip(), flush=True)
    samples = {}
    for rnd in range(a.rounds):
        order = list(CONFIGS.items())
        order = order[rnd % len(order):] + order[:rnd % len(order)]
        for name, cfg in order:
            if cfg is None:
                lines = launch(a.world, [PYTHON, TORCH, str(a.iters), a.sizes], {})
            else:
                lines = launch(a.world, [exe, str(a.iters), cfg[1], a.sizes], cfg[0])
            for d in lines:
                algo = "gloo" if cfg is None else d["algo"]
                samples.setdefault((name, algo, d["bytes"]), []).extend(d["us"])
    med = {}
    for (name, algo, nbytes), us in sorted(samples.items()):
        t = statistics.median(us)
        med[(name, algo, nbytes)] = t
        bus = nbytes / (t * 1e-6) * 2 * (a.world - 1) / a.world / 1e9
        print(json.dumps({"bench": "allreduce", "impl": name, "algo": algo, "world": a.world,
                          "bytes": nbytes, "median_us": round(t, 1), "busbw_GBps": round(bus, 3),
                          "samples": len(us)}), flush=True)
    for (name, algo, nbytes), t in sorted(med.items()):
        ref = med.get(("torch-gloo", "gloo", nbytes))
        if name.startswith("dgrad") and ref:
            bus = nbytes / (t * 1e-6) * 2 * (a.world - 1) / a.world / 1e9
            print(json.dumps({"bench": "allreduce_vs", "impl": name, "algo": algo,
                              "bytes": nbytes, "busbw_vs_gloo": round(ref / t, 2),
                              "busbw_vs_memcpy": round(bus / memcpy["GBps"], 2)}))
    if not a.no_perftest:
        run_perftest(a)


if __name__ == "__main__":
    main()
