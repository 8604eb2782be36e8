#!/usr/bin/python3
"""Runs the DDP benchmarks (bench/ddp/ddp_mlp.c and ddp_mlp_torch.py)
interleaved, round after round, and prints every JSON line, then medians and
ratios as JSON lines ("summary": ...).

    /usr/bin/python3 bench/ddp/run_ddp.py [--build-dir build-ddp] [--runs 5]
        [--part scaling|sweep|overlap|all] [--steps 200]

scaling: per round, dgrad 1 rank without DDP, two such processes at once
         (independent: the machine's ceiling for 2 ranks), dgrad DDP on 1 rank, dgrad DDP
         on 2 ranks (1 thread each; also without the Join count, over UCX
         (DG_BACKEND=ucx) and without the shared-memory segment (DG_SHM=0:
         private gradients, CMA all-reduce)), torch 1 rank without DDP, torch DDP
         (gloo) on 2 ranks; scaling efficiency = samples/s(2 ranks) /
         (2 * samples/s(1 rank, no DDP)), same implementation.
sweep:   dgrad DDP on 2 ranks with bucket caps 1, 2, 5, 10, 25, 50, 100 MiB
         (first bucket min(1 MiB, cap)).
overlap: DDP on 2 ranks overlapping the all-reduce with backward and the
         next forward (overlap_fwd: dg_ddp_overlap_optimizer), with backward
         only (overlap), and without overlap, plus compute, forward, backward
         and communication alone (--parts), for the MLP, a deeper MLP
         (784-1024x5-10) and a deep narrow one (784-512x16-10) whose
         gradients become ready layer by layer, over a slow link:
         --link sim (default): the shared-memory path with a simulated link
         of rate R (DG_SIM_LINK_GBIT): a NIC with DMA and a priority queue,
         whose transfers cost no CPU and need no thread to wake up (see
         bench/ddp/simlink.c, which ddp_mlp installs as dg_pg_opts.link;
         comm alone sleeps for the same bytes / R);
         --link tc: Gloo's ring over loopback slowed by
         `tc qdisc ... tbf rate R` in a private network namespace (unshare -n;
         needs root) -- there the kernel's copies cost as much CPU as the
         transfer takes, and this 2-core machine has no core to spare.

--load S runs every part on a noisy host: bench/host.py's background load,
started here before the first run and stopped after the last, takes share S
of each core in bursts of --load-burst-ms at random times (S = 0.10: 10%).
Scaling efficiency under load is against the single-rank runs under the same
load. Every JSON line carries "load" (S) and "steal_s", the machine's CPU
steal time during that run (/proc/stat), so a contended run shows; the
scaling summary adds the total steal, the load the burners really took,
the round-to-round spread (max / min samples/s) and, per rank, the median
phases of dgrad's 2-rank runs (forward, backward, waiting for the gradient
averaging, the part of that wait spent on a late peer, optimizer: see
ddp_mlp.c).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TORCH_PY = "/usr/bin/python3"
sys.path.insert(0, os.path.dirname(HERE))
from host import Load, core_rtt_ns, steal_s  # noqa: E402

LOAD = {"share": 0.0}  # the background load of this invocation (--load)
BUILD = {"dir": "build-ddp"}  # where bench/corelat is (--build-dir)


def run(cmd, env=None):
    e = dict(os.environ)
    e["OPENBLAS_NUM_THREADS"] = "1"
    e.update(env or {})
    s0, rtt = steal_s(), core_rtt_ns(BUILD["dir"])
    p = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=600)
    if p.returncode != 0:
        sys.stderr.write("failed (%d): %s\n%s\n" % (p.returncode, " ".join(cmd), p.stderr[-2000:]))
        return None
    rec = json.loads([l for l in p.stdout.splitlines() if l.startswith("{")][-1])
    rec["load"] = LOAD["share"]
    rec["steal_s"] = round(steal_s() - s0, 2)
    rec["core_rtt_ns"] = rtt
    print(json.dumps(rec), flush=True)
    return rec


def rtt_range(res):
    """min, median and max of the cross-core round trips seen before the
    runs (ns), or None."""
    v = [r["core_rtt_ns"] for rows in res.values() for r in rows
         if r and r.get("core_rtt_ns") is not None]
    return [min(v), statistics.median(v), max(v)] if v else None


def run_pair(cmd):
    """Two copies of one single-rank run at once, each on its own: what two
    processes get from this machine's 2 cores with nothing between them (the
    ceiling of a 2-rank scaling efficiency). samples/s summed, step_ms the
    mean."""
    e = dict(os.environ)
    e["OPENBLAS_NUM_THREADS"] = "1"
    s0 = steal_s()
    ps = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)
          for _ in range(2)]
    recs = []
    for p in ps:
        out, err = p.communicate(timeout=600)
        if p.returncode != 0:
            sys.stderr.write("failed (%d): %s\n%s\n" % (p.returncode, " ".join(cmd), err[-2000:]))
            return None
        recs.append(json.loads([l for l in out.splitlines() if l.startswith("{")][-1]))
    rec = dict(recs[0])
    rec["label"] = "two independent processes"
    rec["samples_per_s"] = sum(r["samples_per_s"] for r in recs)
    rec["step_ms"] = sum(r["step_ms"] for r in recs) / 2
    rec["load"] = LOAD["share"]
    rec["steal_s"] = round(steal_s() - s0, 2)
    print(json.dumps(rec), flush=True)
    return rec


def med(rows, key):
    vals = [r[key] for r in rows if r]
    return statistics.median(vals) if vals else float("nan")


def spread(rows, key="samples_per_s"):
    vals = [r[key] for r in rows if r]
    return max(vals) / min(vals) if vals and min(vals) > 0 else float("nan")


def phases(rows):
    """Per rank, the median over runs of each phase (ms per step)."""
    out = []
    for r in range(max((len(x.get("ranks", [])) for x in rows if x), default=0)):
        ph = [x["ranks"][r] for x in rows if x and len(x.get("ranks", [])) > r]
        out.append({k: med(ph, k) if all(p.get(k) is not None for p in ph) else None
                    for k in ph[0] if k != "rank"})
        out[-1]["rank"] = r
    return out


def summary(obj):
    print(json.dumps({"summary": obj}), flush=True)


def scaling(a, exe):
    st = ["--steps", str(a.steps), "--warmup", "20"]
    cases = {
        "dgrad_1_noddp": [exe, "--ddp", "0"] + st,
        "dgrad_1_ddp": [exe, "--ddp", "1"] + st,
        "dgrad_2_indep": ("pair", [exe, "--ddp", "0"] + st),
        "dgrad_2_ddp": [exe, "--nproc", "2"] + st,
        # the update overlapped with the next forward and sharded over the
        # ranks (dg_ddp_overlap_optimizer; see ddp.h "The sharded update")
        "dgrad_2_ddp_fwd": [exe, "--nproc", "2", "--overlap-fwd"] + st,
        "dgrad_2_ddp_nojoin": [exe, "--nproc", "2", "--no-join"] + st,
        "dgrad_2_ddp_ucx": ([exe, "--nproc", "2"] + st, {"DG_BACKEND": "ucx"}),
        "dgrad_2_ddp_noshm": ([exe, "--nproc", "2"] + st, {"DG_SHM": "0"}),
        "torch_1_noddp": [TORCH_PY, os.path.join(HERE, "ddp_mlp_torch.py"), "--ddp", "0"] + st,
        "torch_2_ddp": [TORCH_PY, os.path.join(HERE, "ddp_mlp_torch.py"), "--nproc", "2"] + st,
    }
    res = {k: [] for k in cases}
    unknown = set(a.cases.split(",")) - set(cases) if a.cases else set()
    if unknown:
        sys.exit("run_ddp: --cases: no case %s (cases: %s)" % (
            ", ".join(sorted(unknown)), ", ".join(cases)))
    s0 = steal_s()
    for _ in range(a.runs):
        for k, c in cases.items():
            if a.cases and k not in a.cases.split(","):
                continue  # left out: its figures read nan
            if isinstance(c, tuple) and c[0] == "pair":
                res[k].append(run_pair(c[1]))
            else:
                res[k].append(run(*c) if isinstance(c, tuple) else run(c))
    m = {k: med(v, "samples_per_s") for k, v in res.items()}
    ms = {k: med(v, "step_ms") for k, v in res.items()}
    summary({"part": "scaling", "runs": a.runs, "median_samples_per_s": m, "median_step_ms": ms,
             "dgrad_scaling_eff": m["dgrad_2_ddp"] / (2 * m["dgrad_1_noddp"]),
             "indep_eff": m["dgrad_2_indep"] / (2 * m["dgrad_1_noddp"]),
             "dgrad_scaling_eff_fwd": m["dgrad_2_ddp_fwd"] / (2 * m["dgrad_1_noddp"]),
             "dgrad_scaling_eff_nojoin": m["dgrad_2_ddp_nojoin"] / (2 * m["dgrad_1_noddp"]),
             "dgrad_scaling_eff_ucx": m["dgrad_2_ddp_ucx"] / (2 * m["dgrad_1_noddp"]),
             "dgrad_scaling_eff_noshm": m["dgrad_2_ddp_noshm"] / (2 * m["dgrad_1_noddp"]),
             "torch_scaling_eff": m["torch_2_ddp"] / (2 * m["torch_1_noddp"]),
             "dgrad_over_torch_ddp": m["dgrad_2_ddp"] / m["torch_2_ddp"],
             "ddp_1rank_overhead": ms["dgrad_1_ddp"] / ms["dgrad_1_noddp"] - 1,
             "load": LOAD["share"], "steal_s": round(steal_s() - s0, 2),
             "spread": {k: spread(v) for k, v in res.items()},
             "core_rtt_ns": rtt_range(res),
             "dgrad_2_ddp_phases": phases(res["dgrad_2_ddp"]),
             "dgrad_2_ddp_ucx_phases": phases(res["dgrad_2_ddp_ucx"])})


def sweep(a, exe):
    caps = [1, 2, 5, 10, 25, 50, 100]
    res = {c: [] for c in caps}
    for _ in range(a.runs):
        for c in caps:
            res[c].append(run([exe, "--nproc", "2", "--steps", str(a.steps), "--bucket-mib",
                               str(c), "--first-mib", str(min(1, c)), "--label", "sweep"]))
    summary({"part": "sweep", "runs": a.runs,
             "median_samples_per_s": {str(c): med(res[c], "samples_per_s") for c in caps},
             "nbuckets": {str(c): med(res[c], "nbuckets") for c in caps}})


def netns(rate, cmd):
    # tbf, not netem: sch_netem is often not built; burst must exceed lo's MTU
    sh = ("ip link set lo up && tc qdisc add dev lo root tbf rate %s burst 512kb latency 50ms"
          " && exec %s" % (rate, " ".join(cmd)))
    return ["unshare", "-n", "sh", "-c", sh]


def overlap(a, exe):
    models = [("mlp", "784,512,256,10", "1", a.rate_mlp),
              ("deep", "784,1024,1024,1024,1024,1024,10", "1", a.rate_deep),
              ("deep16", "784," + "512," * 16 + "10", "1", a.rate_deep16)]
    for name, layers, cap, rate in models:
        if a.models and name not in a.models.split(","):
            continue
        res = {"overlap_fwd": [], "overlap": [], "no_overlap": []}
        for _ in range(a.runs):
            for k in res:
                c = [exe, "--nproc", "2", "--steps", str(a.steps // 2), "--layers", layers,
                     "--bucket-mib", cap, "--first-mib", cap, "--parts", "--label",
                     "%s@%s/%s" % (name, rate, a.link)]
                if k == "no_overlap":
                    c.append("--no-overlap")
                if k == "overlap_fwd":
                    c.append("--overlap-fwd")
                if a.link == "tc":
                    res[k].append(run(netns(rate, c + ["--ring"])))
                else:  # the shared-memory path with a simulated link
                    gbit = rate[:-4] if rate.endswith("gbit") else rate
                    res[k].append(run(c, {"DG_SIM_LINK_GBIT": gbit}))
        f, o, n = res["overlap_fwd"], res["overlap"], res["no_overlap"]
        summary({"part": "overlap", "model": name, "layers": layers, "rate": rate,
                 "runs": a.runs, "compute_ms": med(f + o + n, "compute_ms"),
                 "comm_ms": med(f + o + n, "comm_ms"),
                 "step_ms_overlap_fwd": med(f, "step_ms"),
                 "overlap_fwd_step_over_max": med(f, "step_over_max"),
                 "wait_ms_overlap_fwd": med(f, "wait_ms"),
                 "step_ms_overlap": med(o, "step_ms"), "step_ms_no_overlap": med(n, "step_ms"),
                 "wait_ms_overlap": med(o, "wait_ms"), "wait_ms_no_overlap": med(n, "wait_ms"),
                 "forward_ms": med(f + o + n, "forward_ms"),
                 "overlap_step_over_max": med(o, "step_over_max"),
                 "overlap_step_over_fwd_plus_max": med(o, "step_over_fwd_plus_max"),
                 "link": a.link, "backward_ms": med(f + o + n, "backward_ms"),
                 "backward_ddp_ms_overlap": med(o, "backward_ddp_ms"),
                 "backward_ddp_ms_no_overlap": med(n, "backward_ddp_ms"),
                 "overlap_backward_ddp_over_max": med(o, "backward_ddp_over_max"),
                 "no_overlap_step_over_sum": med(n, "step_over_sum")})


def trace_overhead(a, exe):
    """2-rank DDP with the timeline recorder on and off, runs interleaved."""
    tmp = tempfile.mkdtemp(prefix="dg_trace_bench_")
    st = ["--nproc", "2", "--steps", str(a.steps), "--warmup", "20"]
    on, off = [], []
    for _ in range(a.runs):
        off.append(run([exe] + st + ["--label", "trace_off"]))
        on.append(run([exe] + st + ["--label", "trace_on", "--trace", os.path.join(tmp, "t.json")]))
    shutil.rmtree(tmp, ignore_errors=True)
    summary({"part": "trace", "runs": a.runs, "median_step_ms_off": med(off, "step_ms"),
             "median_step_ms_on": med(on, "step_ms"),
             "trace_overhead": med(on, "step_ms") / med(off, "step_ms") - 1})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", default="build-ddp")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--part", default="all")
    ap.add_argument("--rate-mlp", default="11gbit")
    ap.add_argument("--rate-deep", default="6.5gbit")
    ap.add_argument("--rate-deep16", default="6.5gbit")
    ap.add_argument("--models", default="", help="overlap: comma-separated subset")
    ap.add_argument("--link", default="sim", choices=["sim", "tc"])
    ap.add_argument("--cases", default="",
                    help="scaling: comma-separated subset (e.g. dgrad_1_noddp,dgrad_2_ddp)")
    ap.add_argument("--load", type=float, default=0.0,
                    help="background load: share of each core, e.g. 0.10 (host.py)")
    ap.add_argument("--load-burst-ms", type=float, default=20.0)
    ap.add_argument("--load-seed", type=int, default=1)
    ap.add_argument("--trace", action="store_true",
                    help="only measure the timeline recorder's overhead (on vs off, 2 ranks)")
    a = ap.parse_args()
    exe = os.path.join(ROOT, a.build_dir, "bench", "ddp", "ddp_mlp")
    if not os.path.exists(exe):
        sys.exit("build first: ninja -C %s bench/ddp/ddp_mlp" % a.build_dir)
    try:
        load = Load(a.load, a.load_burst_ms, a.load_seed)
    except ValueError as e:
        sys.exit("run_ddp: --load: %s" % e)
    LOAD["share"] = a.load
    BUILD["dir"] = os.path.join(ROOT, a.build_dir)
    with load:
        if a.trace:
            return trace_overhead(a, exe)
        if a.part in ("scaling", "all"):
            scaling(a, exe)
        if a.part in ("sweep", "all"):
            sweep(a, exe)
        if a.part in ("overlap", "all"):
            overlap(a, exe)
    if a.load > 0:
        summary({"part": "load", "load": a.load, "burst_ms": a.load_burst_ms,
                 "measured": round(load.measured, 4)})


if __name__ == "__main__":
    main()
