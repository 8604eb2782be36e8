#!/usr/bin/python3
"""Every benchmark against its PyTorch counterpart, one table (issue 19).

    /usr/bin/python3 bench/run_all.py [--build-dir build-bench] [--runs 5]
        [--quick] [--dry-run] [--write-md [BENCHMARKS.md]] [--out DIR] [--load 0.10]
        [--from DIR]

Runs, one after the other, each runner with its own interleaving of dgrad
and torch round by round (so a slow patch of a shared machine hits both):
  bench/run_mlp.py          MLP batch 64 and 256, 1 and 2 threads, torch's
                            best setting for the same cores, GEMM roofline
  bench/run_gpt.sh          char-GPT step, 1 and 2 threads, roofline
  bench/run_cnn.py          the examples/mnist CNN step (batch 64), 1 and 2
                            threads, torch's best setting, roofline (rows
                            for information: the issue sets no CNN targets)
  bench/ddp/run_ddp.py      DDP 2 ranks x 1 thread: scaling over TCP and
                            UCX, torch DDP (gloo); then again under the
                            benchmark's own background load (--load, 10% of
                            each core: bench/host.py) for dgrad's 1- and
                            2-rank runs
  bench/dist/run_allreduce.py   allreduce, 2 ranks, dgrad against torch gloo
and prints one table: figure, anchor (what dgrad is measured against),
dgrad, ratio, target, pass/miss, under a line with the CPU model, cores,
date, the CPU steal time each part saw and the load. Heap allocations per
step and peak RSS come from the MLP, GPT and CNN runs. Targets are issue 19's
(allreduce and memory: no regression from the figures recorded before).

--quick: 1 round, short runs (a smoke run of a few minutes; its figures are
  not for the record). --dry-run: checks that every program and script the
  run needs exists (and that torch imports), prints the commands, runs
  nothing. --write-md replaces the block between the run_all markers at the
  top of BENCHMARKS.md with the table. --out DIR keeps every runner's output
  (and run.json: start time, steal per part); --from DIR makes the table
  again from such a directory without running anything (with --write-md:
  record a run after reading it).
Medians need --runs 5 or more. Exit status 0 when every part ran (misses
included), 1 when one failed, 2 for bad arguments.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TORCH_PY = "/usr/bin/python3"
sys.path.insert(0, HERE)
from host import cores, cpu_model, steal_s  # noqa: E402

BEGIN, END = "<!-- run_all:begin -->", "<!-- run_all:end -->"
NAN = float("nan")


# ---- the runners ----

def commands(a, tmp):
    """(part, argv) of every runner, in the order they run."""
    q = a.quick
    r = str(a.runs)
    def ddp(steps):
        return [TORCH_PY, os.path.join(HERE, "ddp", "run_ddp.py"), "--build-dir", a.build_dir,
                "--part", "scaling", "--runs", r, "--steps", "60" if q else steps]
    return [
        ("mlp", [TORCH_PY, os.path.join(HERE, "run_mlp.py"), "--build-dir", a.build_dir,
                 "--runs", r, "--batches", "64,256", "--max-seconds", "1" if q else "2",
                 "--out", os.path.join(tmp, "mlp.jsonl")]),
        ("gpt", ["bash", os.path.join(HERE, "run_gpt.sh"), "-b", a.build_dir, "-r", r,
                 "-s", "5" if q else "30", "-o", os.path.join(tmp, "gpt.jsonl")]),
        ("cnn", [TORCH_PY, os.path.join(HERE, "run_cnn.py"), "--build-dir", a.build_dir,
                 "--runs", r, "--steps", "5" if q else "30", "--max-seconds", "1" if q else "3",
                 "--out", os.path.join(tmp, "cnn.jsonl")]),
        # built with OpenBLAS only (it times both); without, no rows
        ("gemm", [os.path.join(a.build_dir, "bench", "gemm_own"), "--rounds", r]
         if os.access(os.path.join(a.build_dir, "bench", "gemm_own"), os.X_OK) else ["true"]),
        # runs of 1000 steps (about 2 s). Under load: a burner's bursts come
        # every 200 ms or so per core, and a 300-step run (0.55 s) sees 2-3
        # per core, so its share of the load swung by half from run to run.
        # Quiet: the host's own hiccups come at about that pace; in 300-step
        # runs the same data path (ranks on one host) read 92% over TCP and
        # 77% over UCX in one table, and 5 alternating 1000-step runs of
        # the two gave the same median (session 32)
        ("ddp", ddp("1000")),
        ("ddp_load", ddp("1000") + ["--load", str(a.load), "--cases",
                                    "dgrad_1_noddp,dgrad_2_ddp,dgrad_2_ddp_fwd"]),
        ("allreduce", [TORCH_PY, os.path.join(HERE, "dist", "run_allreduce.py"), "--build",
                       a.build_dir, "--worlds", "2", "--rounds", r, "--iters", "3" if q else "5",
                       "--algos", "auto", "--sizes", "4096,16777216"]),
    ]


def executables(a):
    b = a.build_dir
    return [os.path.join(b, "bench", p) for p in ("mlp", "gpt", "cnn", "corelat", "ddp/ddp_mlp",
                                                   "dist/bench_allreduce")]


def dry_run(a, cmds):
    """Checks what the run needs; prints the commands. Returns the exit status."""
    bad = [p for p in executables(a) if not os.access(p, os.X_OK)]
    bad += [arg for _, c in cmds if c[0] in (TORCH_PY, "bash") for arg in c[1:2]
            if not os.path.isfile(arg)]  # the script an interpreter runs
    for path in (TORCH_PY, shutil.which("bash") or "bash"):
        if not os.access(path, os.X_OK):
            bad.append(path)
    if os.access(TORCH_PY, os.X_OK) and subprocess.run(
            [TORCH_PY, "-c", "import torch"], capture_output=True).returncode:
        bad.append("torch under %s (apt-get install python3-torch)" % TORCH_PY)
    for part, c in cmds:
        print("%-10s %s" % (part, " ".join(c)))
    for p in bad:
        print("run_all: missing: %s" % p, file=sys.stderr)
    return 1 if bad else 0


def run_part(part, cmd, tmp):
    """Runs one runner, its output teed to tmp/<part>.log. Returns (stdout
    lines, steal seconds during it, ok)."""
    s0, lines = steal_s(), []
    sys.stderr.write("run_all: %s: %s\n" % (part, " ".join(cmd)))
    with open(os.path.join(tmp, part + ".log"), "w") as log:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT)
        for line in p.stdout:
            lines.append(line.rstrip("\n"))
            log.write(line)
        p.wait()
    if p.returncode:
        sys.stderr.write("run_all: %s failed (exit %d); see %s\n" % (
            part, p.returncode, os.path.join(tmp, part + ".log")))
    return lines, steal_s() - s0, p.returncode == 0


def json_lines(lines):
    out = []
    for ln in lines:
        if ln.startswith("{"):
            try:
                out.append(json.loads(ln))
            except ValueError:
                pass
    return out


def read_jsonl(path):
    try:
        with open(path) as f:
            return json_lines(f.read().splitlines())
    except OSError:
        return []


# ---- figures: each row is (figure, anchor, dgrad, ratio, unit, op, target) ----

def med(recs, key="steps_per_s"):
    v = [r[key] for r in recs if r.get(key) is not None]
    return statistics.median(v) if v else NAN


def row(fig, anchor, dg, ratio, unit="x", op=">=", target=None):
    return {"figure": fig, "anchor": anchor, "dgrad": dg, "ratio": ratio, "unit": unit,
            "op": op, "target": target}


def torch_label(r):
    """The setting of a torch record of run_gpt.sh (its JSON has no label)."""
    if r["threads"] == 2:
        return "torch t2 omp=" + r.get("omp_wait_policy", "default")
    return "torch t2 intra1 blas2" if str(r.get("blas_threads")) == "2" else "torch t1"


def best_torch_t2(by):
    """(label, median) of the fastest 2-core torch setting in by."""
    t2 = [(k, med(v)) for k, v in by.items() if k.startswith("torch t2")]
    return max(t2, key=lambda kv: kv[1]) if t2 else ("torch t2", NAN)


def torch_share_row(name, d1, t1):
    """torch's 1-thread step against dgrad's roofline measurement (the same
    GEMMs, timed in dgrad's runs): dgrad at 100% of the roofline would be
    1/share times torch, the most a faster step outside the GEMMs can give."""
    sg, gf = med(d1, "sgemm_gflops"), med(d1, "gemm_gflop_per_step")
    tg = med(t1) * gf
    share = 100.0 * tg / sg if sg > 0 else NAN
    ceil = "ceiling %.2fx" % (100.0 / share) if share > 0 else "ceiling n/a"
    return row("%s, 1 thread: torch's share of the same roofline (dgrad at 100%% would be "
               "1/share times torch)" % name, "sgemm %.0f GFLOP/s" % sg,
               "torch %.0f GFLOP/s; %s" % (tg, ceil), share, "%")


def step_rows(name, by, roof_targets, t1_target, t2_target):
    """Rows of a compute benchmark from records grouped by setting label."""
    rows = []
    d1, d2, t1 = by.get("dgrad t1", []), by.get("dgrad t2", []), by.get("torch t1", [])
    for th, recs, want in ((1, d1, roof_targets[0]), (2, d2, roof_targets[1])):
        sg = med(recs, "sgemm_gflops")
        rows.append(row("%s, %d thread%s: share of the sgemm roofline" % (
            name, th, "s" if th > 1 else ""), "sgemm %.0f GFLOP/s" % sg,
            "%.0f GFLOP/s" % med(recs, "step_gflops"), med(recs, "roofline_pct"), "%", ">=", want))
    rows.append(row("%s, 1 thread vs torch" % name, "torch %.1f/s" % med(t1),
                    "%.1f/s" % med(d1), med(d1) / med(t1), target=t1_target))
    rows.append(torch_share_row(name, d1, t1))
    lab, tv = best_torch_t2(by)
    rows.append(row("%s, 2 threads vs torch's best 2-core setting" % name,
                    "%s %.1f/s" % (lab, tv), "%.1f/s" % med(d2), med(d2) / tv, target=t2_target))
    return rows


def mlp_rows(recs):
    rows = []
    for b, roof1, t2t1 in ((64, 75, None), (256, 85, 1.8)):
        by = {}
        for r in recs:
            if r.get("batch") == b:
                by.setdefault(r["setting"], []).append(r)
        rows += step_rows("MLP batch %d" % b, by, (roof1, None), 1.3, 1.3)
        d1, d2 = by.get("dgrad t1", []), by.get("dgrad t2", [])
        rows.append(row("MLP batch %d, 2 threads vs 1 thread" % b, "dgrad t1 %.1f/s" % med(d1),
                        "%.1f/s" % med(d2), med(d2) / med(d1), target=t2t1))
    return rows


def gpt_rows(recs):
    by = {}
    for r in recs:
        label = "dgrad t%d" % r["threads"] if r["impl"] == "dgrad" else torch_label(r)
        by.setdefault(label, []).append(r)
    return step_rows("char-GPT", by, (70, None), 1.5, 1.8)


def cnn_rows(recs):
    """The examples/mnist CNN at batch 64 (run_cnn.py): for information."""
    by = {}
    for r in recs:
        by.setdefault(r["setting"], []).append(r)
    d1, d2 = by.get("dgrad t1", []), by.get("dgrad t2", [])
    return step_rows("CNN batch 64", by, (None, None), None, None) + [
        row("CNN batch 64, 2 threads vs 1 thread", "dgrad t1 %.1f/s" % med(d1),
            "%.1f/s" % med(d2), med(d2) / med(d1))]


def gemm_rows(lines):
    """dgrad's GEMM (its own kernel where the CPU takes it) against OpenBLAS
    on each step's shapes, one thread (bench/gemm_own.c)."""
    rows = []
    for r in json_lines(lines):
        if r.get("impl") == "gemm_own":
            name = "MLP batch %d" % r["batch"] if r["model"] == "mlp" else "char-GPT"
            rows.append(row("%s, 1 thread: dgrad's GEMM vs OpenBLAS on the step's shapes" % name,
                            "OpenBLAS %.0f GFLOP/s" % r["openblas_gflops"],
                            "%s %.0f GFLOP/s" % (r["dgrad_kernel"], r["dgrad_gflops"]),
                            r["speedup"]))
    return rows


def summary_of(lines, part):
    for r in json_lines(lines):
        if r.get("summary", {}).get("part") == part:
            return r["summary"]
    return {}


def ddp_rows(quiet, loaded, load):
    m = quiet.get("median_samples_per_s", {})
    one = m.get("dgrad_1_noddp", NAN)
    rows = [row("DDP 2 ranks x 1 thread, scaling efficiency (TCP)", "1 rank %.0f samples/s" % one,
                "%.0f samples/s" % m.get("dgrad_2_ddp", NAN),
                100 * quiet.get("dgrad_scaling_eff", NAN), "%", ">=", 90),
            row("same over UCX", "1 rank %.0f samples/s" % one,
                "%.0f samples/s" % m.get("dgrad_2_ddp_ucx", NAN),
                100 * quiet.get("dgrad_scaling_eff_ucx", NAN), "%", ">=", 90),
            row("same, update overlapped and sharded (dg_ddp_overlap_optimizer)",
                "1 rank %.0f samples/s" % one, "%.0f samples/s" % m.get("dgrad_2_ddp_fwd", NAN),
                100 * quiet.get("dgrad_scaling_eff_fwd", NAN), "%"),
            row("two independent 1-rank processes at once: share of 2x one (the ceiling "
                "for scaling)", "1 rank %.0f samples/s" % one,
                "%.0f samples/s" % m.get("dgrad_2_indep", NAN),
                100 * quiet.get("indep_eff", NAN), "%"),
            row("DDP 2 ranks vs torch DDP (gloo)", "torch %.0f samples/s" % m.get("torch_2_ddp", NAN),
                "%.0f samples/s" % m.get("dgrad_2_ddp", NAN), quiet.get("dgrad_over_torch_ddp", NAN),
                target=3.5),
            row("torch DDP scaling efficiency (for reference)", "1 rank %.0f samples/s" % m.get(
                "torch_1_noddp", NAN), "", 100 * quiet.get("torch_scaling_eff", NAN), "%")]
    ml = loaded.get("median_samples_per_s", {})
    rows.append(row("DDP under %d%% load: scaling efficiency (TCP)" % round(100 * load),
                    "1 rank %.0f samples/s" % ml.get("dgrad_1_noddp", NAN),
                    "%.0f samples/s" % ml.get("dgrad_2_ddp", NAN),
                    100 * loaded.get("dgrad_scaling_eff", NAN), "%", ">=", 80))
    rows.append(row("same, update overlapped and sharded (dg_ddp_overlap_optimizer)",
                    "1 rank %.0f samples/s" % ml.get("dgrad_1_noddp", NAN),
                    "%.0f samples/s" % ml.get("dgrad_2_ddp_fwd", NAN),
                    100 * loaded.get("dgrad_scaling_eff_fwd", NAN), "%"))
    rows.append(row("DDP under %d%% load: spread of rounds (max/min)" % round(100 * load), "", "",
                    loaded.get("spread", {}).get("dgrad_2_ddp", NAN), "x", "<", 1.3))
    return rows


def phase_lines(quiet, loaded, load):
    """Per rank, where dgrad's 2-rank DDP step goes (run_ddp.py's medians)."""
    out = ["", "DDP 2 ranks x 1 thread (TCP), ms per step by phase, per rank: forward, backward, "
           "waiting for the gradient averaging (of it: while the peer was still computing), "
           "optimizer; mean and slowest step."]
    for name, summ in (("quiet", quiet), ("%d%% load" % round(100 * load), loaded)):
        for p in summ.get("dgrad_2_ddp_phases", []):
            pw = p.get("peer_wait_ms")
            out.append("- %s, rank %d: %.3f / %.3f / %.3f (%s) / %.3f; step %.3f, slowest %.1f" % (
                name, p["rank"], p["forward_ms"], p["backward_ms"], p["avg_wait_ms"],
                "—" if pw is None else "%.3f" % pw, p["optim_ms"], p["step_ms"],
                p["step_max_ms"]))
    return out if len(out) > 2 else []


def allreduce_rows(lines):
    recs = json_lines(lines)
    rows = []
    # no regression: the last recorded ratios (BENCHMARKS.md history, world 2:
    # 4 KiB 0.058x torch's latency, i.e. 17x; 16 MiB 4.21x-7.35x)
    for nbytes, fig, want in ((4096, "allreduce 4 KiB, 2 ranks: latency vs torch gloo", 17),
                              (16 << 20, "allreduce 16 MiB, 2 ranks: bus bandwidth vs torch gloo",
                               5)):
        t = [r for r in recs if r.get("bench") == "allreduce" and r["bytes"] == nbytes]
        dg = [r for r in t if r["impl"] == "dgrad"]
        tr = [r for r in t if r["impl"] == "torch"]
        if not dg or not tr:
            rows.append(row(fig, "", "", NAN, target=want))
            continue
        rows.append(row(fig, "torch %.0f us" % tr[0]["median_us"], "%.1f us, %.2f GB/s" % (
            dg[0]["median_us"], dg[0]["busbw_GBps"]), tr[0]["median_us"] / dg[0]["median_us"],
            target=want))
    return rows


def memory_rows(mlp, gpt, cnn):
    dg = [r for r in mlp + gpt + cnn if r.get("impl") == "dgrad"]
    allocs = max((r["heap_allocs_per_step"] for r in dg), default=NAN)
    rows = [row("heap allocations per steady-state step (MLP, GPT%s; max)" % (
        ", CNN" if cnn else ""), "", "%g" % allocs, allocs, "", "==", 0)]
    for name, recs, want in (("MLP", mlp, 32), ("char-GPT", gpt, 64), ("CNN", cnn, None)):
        if not recs and want is None:
            continue
        d = max((r["peak_rss_mib"] for r in recs if r.get("impl") == "dgrad"), default=NAN)
        t = max((r["peak_rss_mib"] for r in recs if r.get("impl") == "torch"), default=NAN)
        rows.append(row("%s peak RSS, MiB (max)" % name, "torch %.0f MiB" % t, "%.1f MiB" % d, d,
                        "MiB", "<", want))
    return rows


# ---- the table ----

def verdict(r):
    v, t = r["ratio"], r["target"]
    if t is None:
        return "info"
    if v != v:
        return "no data"
    ok = {">=": v >= t, "<": v < t, "==": v == t}[r["op"]]
    return "pass" if ok else "**miss**"


def fmt(v, unit):
    if v != v:
        return "—"
    if unit == "%":
        return "%.0f%%" % v
    if unit == "x":
        return "%.2fx" % v
    return "%g%s" % (v, " " + unit if unit else "")


def table(rows, head, tail=()):
    out = [head, "", "| figure | anchor | dgrad | ratio | target | pass/miss |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        tgt = "" if r["target"] is None else "%s %s" % (r["op"], fmt(r["target"], r["unit"]))
        out.append("| %s | %s | %s | %s | %s | %s |" % (
            r["figure"], r["anchor"], r["dgrad"], fmt(r["ratio"], r["unit"]), tgt, verdict(r)))
    met = sum(verdict(r) == "pass" for r in rows)
    out += ["", "%d of %d targets met." % (met, sum(r["target"] is not None for r in rows))]
    return "\n".join(out + list(tail))


def rtt_text(quiet, loaded):
    """The cross-core round trips seen before the DDP runs (run_ddp.py)."""
    out = []
    for name, summ in (("quiet", quiet), ("under load", loaded)):
        r = summ.get("core_rtt_ns")
        if r:
            out.append("%s %.0f-%.0f ns (median %.0f)" % (name, r[0], r[2], r[1]))
    return ("; cross-core round trip before the DDP runs (bench/corelat.c; the host's "
            "placement of the virtual CPUs): " + ", ".join(out)) if out else ""


def header(a, t0, steal, cmdline, measured, loadavg, rtt=""):
    parts = ", ".join("%s %.1f s" % kv for kv in steal.items())
    return ("%s, %d cores; %s; CPU steal %.1f s in all (%s)%s; load average %.1f at the end; "
            "background load: none, except %d%% of each core in the DDP-under-load rows "
            "(bench/host.py; the burners took %.1f%%). %d round%s%s. Command: `%s`." % (
                cpu_model(), cores(), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t0)),
                sum(steal.values()), parts, rtt, loadavg, round(100 * a.load),
                100 * measured, a.runs,
                "s" if a.runs > 1 else "", ", --quick (not for the record)" if a.quick else "",
                cmdline))


def write_md(path, text):
    """Replaces the block between BEGIN and END in path (loud when absent)."""
    with open(path) as f:
        doc = f.read()
    i, j = doc.find(BEGIN), doc.find(END)
    if i < 0 or j < i:
        sys.exit("run_all: %s has no %s ... %s block to replace" % (path, BEGIN, END))
    with open(path, "w") as f:
        f.write(doc[:i + len(BEGIN)] + "\n" + text + "\n" + doc[j:])
    sys.stderr.write("run_all: table written to %s\n" % path)


def load_run(d, cmds):
    """What main's loop returns, read back from a kept --out directory."""
    try:
        with open(os.path.join(d, "run.json")) as f:
            run = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit("run_all: --from %s: no run.json (%s)" % (d, e))
    out = {}
    for part, _ in cmds:
        try:
            with open(os.path.join(d, part + ".log")) as f:
                out[part] = f.read().splitlines()
        except OSError:
            out[part] = []
    return run, out


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build-bench"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--write-md", nargs="?", const=os.path.join(ROOT, "BENCHMARKS.md"))
    ap.add_argument("--out", help="keep every runner's output in this directory")
    ap.add_argument("--load", type=float, default=0.10)
    ap.add_argument("--from", dest="from_dir", help="table from a kept --out directory")
    a = ap.parse_args()
    if a.quick:
        a.runs = 1
    if a.runs < 1 or not 0 < a.load <= 0.9:
        ap.error("--runs must be >= 1 and --load in (0, 0.9]")
    a.build_dir = os.path.abspath(a.build_dir)
    return a


def main():
    a = parse()
    if a.dry_run:
        return dry_run(a, commands(a, a.out or "TMPDIR"))
    if a.from_dir:
        a.out = a.from_dir
    tmp = a.out or tempfile.mkdtemp(prefix="dg_run_all_")
    os.makedirs(tmp, exist_ok=True)
    cmds = commands(a, tmp)
    if not a.from_dir and dry_run(a, []):
        return 1
    if a.from_dir:
        run, out = load_run(a.from_dir, cmds)
        t0, steal, ok, cmdline = run["t0"], run["steal"], run["ok"], run["command"]
        a.runs, a.quick, a.load, loadavg = run["runs"], run["quick"], run["load"], run["loadavg"]
    else:
        t0, out, steal, ok = time.time(), {}, {}, True
        for part, c in cmds:
            out[part], steal[part], good = run_part(part, c, tmp)
            ok &= good
        cmdline = "/usr/bin/python3 bench/run_all.py " + " ".join(sys.argv[1:])
        loadavg = os.getloadavg()[0]
        with open(os.path.join(tmp, "run.json"), "w") as f:
            json.dump({"t0": t0, "steal": steal, "ok": ok, "command": cmdline, "runs": a.runs,
                       "quick": a.quick, "load": a.load, "loadavg": os.getloadavg()[0]}, f)
    mlp, gpt = read_jsonl(os.path.join(tmp, "mlp.jsonl")), read_jsonl(os.path.join(tmp, "gpt.jsonl"))
    cnn = read_jsonl(os.path.join(tmp, "cnn.jsonl"))
    quiet, loaded = summary_of(out["ddp"], "scaling"), summary_of(out["ddp_load"], "scaling")
    rows = (mlp_rows(mlp) + gpt_rows(gpt) + (cnn_rows(cnn) if cnn else []) +
            gemm_rows(out["gemm"]) + ddp_rows(quiet, loaded, a.load) +
            allreduce_rows(out["allreduce"]) + memory_rows(mlp, gpt, cnn))
    measured = summary_of(out["ddp_load"], "load").get("measured", NAN)
    tail = phase_lines(quiet, loaded, a.load)
    rtt = rtt_text(quiet, loaded)
    text = table(rows, header(a, t0, steal, cmdline, measured, loadavg, rtt), tail)
    print("\n" + text)
    if a.write_md:
        write_md(a.write_md, text)
    if not a.out:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
