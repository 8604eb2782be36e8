"""The benchmark tooling (issue 19), without timing anything: bench/run_all.py
--dry-run finds every program and script it needs, its table marks pass /
miss / info / no data and --write-md replaces only the marked block (and
refuses a file without it); bench/host.py's background load starts one
burner per core and leaves none behind, refuses a bad share, and free_port
gives a bindable port below the ephemeral range; run_ddp.py refuses a bad
--load and an unknown --cases name. Exit 77 without Debian's torch (the dry
run checks for it).

    python3 tests/tools/bench_tools.py SOURCE_ROOT BUILD_DIR
"""
import os
import socket
import subprocess
import sys
import tempfile
import time

root, build = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(root, "bench"))
import host  # noqa: E402
import run_all  # noqa: E402

fails = []


def check(ok, what):
    if not ok:
        fails.append(what)
        print("FAIL: " + what)


if subprocess.run(["/usr/bin/python3", "-c", "import torch"], capture_output=True).returncode:
    print("skip: no torch under /usr/bin/python3")
    sys.exit(77)

# dry run: every part listed, exit 0; a missing build directory: exit 1 naming it
p = subprocess.run([sys.executable, os.path.join(root, "bench", "run_all.py"), "--dry-run",
                    "--build-dir", build], capture_output=True, text=True, timeout=60)
check(p.returncode == 0, "dry run exit %d: %s" % (p.returncode, p.stderr))
for part in ("mlp", "gpt", "cnn", "ddp", "ddp_load", "allreduce"):
    check(any(l.startswith(part + " ") for l in p.stdout.splitlines()), "dry run lists " + part)
p = subprocess.run([sys.executable, os.path.join(root, "bench", "run_all.py"), "--dry-run",
                    "--build-dir", "/nonexistent-build"], capture_output=True, text=True, timeout=60)
check(p.returncode == 1 and "/nonexistent-build/bench/mlp" in p.stderr,
      "dry run names a missing program: %d %s" % (p.returncode, p.stderr))

# the table's verdicts
rows = [run_all.row("a", "", "", 91.0, "%", ">=", 90), run_all.row("b", "", "", 1.2, "x", ">=", 1.3),
        run_all.row("c", "", "", 2.0), run_all.row("d", "", "", float("nan"), target=3.5),
        run_all.row("e", "", "", 1.31, "x", "<", 1.3), run_all.row("f", "", "", 0, "", "==", 0)]
check([run_all.verdict(r) for r in rows] == ["pass", "**miss**", "info", "no data", "**miss**",
                                              "pass"], "verdicts")
text = run_all.table(rows, "HEAD")
check("2 of 5 targets met." in text and text.startswith("HEAD"), "table summary line")

# torch's share of dgrad's roofline and the ratio it allows
r = run_all.torch_share_row("M", [{"sgemm_gflops": 100.0, "gemm_gflop_per_step": 0.1},
                                  {"sgemm_gflops": 100.0, "gemm_gflop_per_step": 0.1}],
                            [{"steps_per_s": 700.0}, {"steps_per_s": 900.0}])
check(abs(r["ratio"] - 80.0) < 1e-9 and "ceiling 1.25x" in r["dgrad"] and r["unit"] == "%"
      and run_all.verdict(r) == "info", "torch share row: %s" % r)
r = run_all.torch_share_row("M", [], [{"steps_per_s": 700.0}])
check(r["ratio"] != r["ratio"] and "n/a" in r["dgrad"] and run_all.fmt(r["ratio"], "%") == "—",
      "torch share row without dgrad records: %s" % r)

# dgrad's GEMM against OpenBLAS: a row per gemm_own record, other lines ignored
rs = run_all.gemm_rows(["mlp b64: ta 0 ...", '{"impl":"gemm_own","model":"gpt","batch":16,'
                        '"openblas_gflops":100.0,"own_gflops":104.0,"dgrad_gflops":103.0,'
                        '"speedup":1.03,"dgrad_kernel":"own"}'])
check(len(rs) == 1 and rs[0]["figure"].startswith("char-GPT") and rs[0]["ratio"] == 1.03
      and "own 103 GFLOP/s" in rs[0]["dgrad"] and run_all.verdict(rs[0]) == "info",
      "gemm rows: %s" % rs)

# the CNN's rows: information only (no targets); its allocations count in
# the allocation row, its RSS gets a row without a target
cnn = [{"impl": "dgrad", "setting": "dgrad t1", "threads": 1, "steps_per_s": 30.0,
        "sgemm_gflops": 70.0, "step_gflops": 49.0, "roofline_pct": 70.0,
        "gemm_gflop_per_step": 1.6, "heap_allocs_per_step": 0, "peak_rss_mib": 57.0},
       {"impl": "dgrad", "setting": "dgrad t2", "threads": 2, "steps_per_s": 48.0,
        "sgemm_gflops": 140.0, "step_gflops": 77.0, "roofline_pct": 55.0,
        "gemm_gflop_per_step": 1.6, "heap_allocs_per_step": 1, "peak_rss_mib": 62.0},
       {"impl": "torch", "setting": "torch t1", "threads": 1, "steps_per_s": 20.0,
        "peak_rss_mib": 290.0},
       {"impl": "torch", "setting": "torch t2 intra1 blas2", "threads": 1, "steps_per_s": 24.0,
        "peak_rss_mib": 291.0}]
rs = run_all.cnn_rows(cnn)
check(all(run_all.verdict(r) == "info" for r in rs), "cnn rows are info: %s" % rs)
by = {r["figure"]: r for r in rs}
check(abs(by["CNN batch 64, 1 thread vs torch"]["ratio"] - 1.5) < 1e-9 and
      abs(by["CNN batch 64, 2 threads vs torch's best 2-core setting"]["ratio"] - 2.0) < 1e-9 and
      abs(by["CNN batch 64, 2 threads vs 1 thread"]["ratio"] - 1.6) < 1e-9,
      "cnn ratios: %s" % rs)
ms = run_all.memory_rows([], [], cnn)
check(ms[0]["ratio"] == 1 and run_all.verdict(ms[0]) == "**miss**" and "CNN" in ms[0]["figure"]
      and any(r["figure"].startswith("CNN peak RSS") and run_all.verdict(r) == "info"
              for r in ms), "memory rows with the CNN: %s" % ms)
check(not any(r["figure"].startswith("CNN") for r in run_all.memory_rows([], [], [])),
      "no CNN memory row without CNN records")

# --write-md replaces the marked block only; refuses a file without one
with tempfile.TemporaryDirectory() as d:
    md = os.path.join(d, "B.md")
    with open(md, "w") as f:
        f.write("# t\n%s\nold\n%s\nhistory\n" % (run_all.BEGIN, run_all.END))
    run_all.write_md(md, "NEW")
    with open(md) as f:
        doc = f.read()
    check(doc == "# t\n%s\nNEW\n%s\nhistory\n" % (run_all.BEGIN, run_all.END), "write_md: " + doc)
    with open(md, "w") as f:
        f.write("# no markers\n")
    try:
        run_all.write_md(md, "NEW")
        check(False, "write_md accepted a file without markers")
    except SystemExit as e:
        check("no" in str(e.code) and run_all.BEGIN in str(e.code), "write_md message: %s" % e)

# background load: one burner per core, all gone after stop
with host.Load(0.2, burst_ms=5) as ld:
    pids = [p.pid for p in ld.procs]
    check(len(pids) == host.cores(), "one burner per core: %d" % len(pids))
    time.sleep(0.5)
    check(all(os.path.exists("/proc/%d" % pid) for pid in pids), "burners running")
check(not any(os.path.exists("/proc/%d" % pid) for pid in pids), "burners stopped")
check(ld.measured > 0, "burners took some CPU")
with host.Load(0.0) as ld:
    check(ld.procs == [], "share 0 starts nothing")
for bad in (-0.1, 0.95):
    try:
        host.Load(bad)
        check(False, "Load(%g) accepted" % bad)
    except ValueError:
        pass
check(host.steal_s() >= 0, "steal_s")

# the cross-core round trip: a positive number of ns with two CPUs, None on
# one CPU or without the program (corelat prints null there)
rtt = host.core_rtt_ns(build)
if host.cores() >= 2:
    check(isinstance(rtt, (int, float)) and rtt > 0, "core_rtt_ns: %r" % (rtt,))
check(host.core_rtt_ns("/nonexistent-build") is None, "core_rtt_ns without the program")
p = subprocess.run(["taskset", "-c", "0", os.path.join(build, "bench", "corelat")],
                   capture_output=True, text=True, timeout=30)
check(p.returncode == 0 and '"core_rtt_ns":null' in p.stdout, "corelat on one CPU: %s" % p.stdout)
p = subprocess.run([os.path.join(build, "bench", "corelat"), "--reps", "0"],
                   capture_output=True, text=True, timeout=30)
check(p.returncode == 2 and "--reps" in p.stderr, "corelat --reps 0: %s" % p.stderr)
h = run_all.header(type("A", (), {"load": 0.1, "runs": 5, "quick": False})(), 0, {"ddp": 0.1},
                   "cmd", 0.1, 1.0, run_all.rtt_text({"core_rtt_ns": [60, 75, 330]}, {}))
check("quiet 60-330 ns (median 75)" in h, "header names the round trips: " + h)

# free_port: bindable, below the ephemeral range
with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
    lo = int(f.read().split()[0])
port = host.free_port()
s = socket.socket()
s.bind(("127.0.0.1", port))
s.close()
check(port < lo or lo <= 21024, "free_port %d below the ephemeral range (%d)" % (port, lo))

# run_ddp.py refuses a bad load, naming it
p = subprocess.run([sys.executable, os.path.join(root, "bench", "ddp", "run_ddp.py"),
                    "--build-dir", build, "--load", "2"], capture_output=True, text=True,
                   timeout=60)
check(p.returncode != 0 and "--load" in p.stderr, "run_ddp --load 2: %s" % p.stderr)
p = subprocess.run([sys.executable, os.path.join(root, "bench", "ddp", "run_ddp.py"),
                    "--build-dir", build, "--part", "scaling", "--cases", "dgrad_2_dp"],
                   capture_output=True, text=True, timeout=60)
check(p.returncode != 0 and "no case dgrad_2_dp" in p.stderr, "run_ddp --cases: %s" % p.stderr)

print("ok" if not fails else "%d failures" % len(fails))
sys.exit(1 if fails else 0)
