#!/bin/bash
# Runs the transformer-step benchmark for dgrad (bench/gpt.c) and PyTorch
# (bench/gpt_torch.py) interleaved, and checks the figures against issue 19's
# targets (1 thread: >= 70% of the GEMM roofline, >= 1.5x torch) and issue 3's
# (>= 1.8x torch's best 2-thread setting).
#
#   bench/run_gpt.sh [-b BUILD_DIR] [-r RUNS] [-s STEPS] [-o OUT.jsonl]
#
# Every round runs each setting once, alternating dgrad and torch, so a slow
# patch of a shared machine hits both alike; the summary uses the median of the
# rounds (RUNS >= 5 recommended). Settings (batch 16, the default model):
#   dgrad t1, torch t1, dgrad t2, torch t2 (default OpenMP wait policy),
#   torch t2 with OMP_WAIT_POLICY=PASSIVE, torch with 1 intra-op thread and
#   OpenBLAS on 2 threads ("torch t2 intra1 blas2"); torch's best 2-core
#   setting is the fastest of the three. The roofline: gpt times OpenBLAS
#   sgemm on the step's GEMM shapes first (bench/roofline.h, roofline_pct);
#   torch's share is its step rate against that same measurement.
# torch runs under /usr/bin/python3 (Debian's python3-torch 1.13). Prints every
# JSON line as it arrives, then medians, ratios and PASS/MISS.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
build="$root/build-gpt"
runs=5
steps=40
out=""
while getopts "b:r:s:o:" opt; do
  case "$opt" in
    b) build="$OPTARG" ;;
    r) runs="$OPTARG" ;;
    s) steps="$OPTARG" ;;
    o) out="$OPTARG" ;;
    *) sed -n '2,20p' "$0"; exit 2 ;;
  esac
done
gpt="$build/bench/gpt"
torch_py=/usr/bin/python3
[ -x "$gpt" ] || { echo "run_gpt.sh: $gpt not built (ninja -C $build)" >&2; exit 1; }
have_torch=1
$torch_py -c 'import torch' 2>/dev/null || { echo "run_gpt.sh: no torch under $torch_py; dgrad only" >&2; have_torch=0; }

lines="$(mktemp)"
trap 'rm -f "$lines"' EXIT
warmup=5
unset OMP_WAIT_POLICY OPENBLAS_NUM_THREADS OMP_NUM_THREADS DG_NUM_THREADS GPT_TRACE_ALLOCS

# label, then the command
run() {
  local label="$1"; shift
  local j
  if ! j="$("$@" | grep '^{' | tail -1)"; then
    echo "run_gpt.sh: $label failed: $*" >&2
    return 0
  fi
  echo "$j"
  printf '%s\t%s\n' "$label" "$j" >>"$lines"
}

echo "# run_gpt.sh: $(date -u '+%Y-%m-%dT%H:%M:%SZ'), $(nproc) cores, runs=$runs steps=$steps" >&2
for ((r = 1; r <= runs; r++)); do
  run "dgrad t1" "$gpt" --threads 1 --steps "$steps" --warmup "$warmup"
  if ((have_torch)); then
    run "torch t1" "$torch_py" "$here/gpt_torch.py" --threads 1 --steps "$steps" --warmup "$warmup"
  fi
  run "dgrad t2" "$gpt" --threads 2 --steps "$steps" --warmup "$warmup"
  if ((have_torch)); then
    run "torch t2 omp=default" "$torch_py" "$here/gpt_torch.py" --threads 2 --steps "$steps" --warmup "$warmup"
    run "torch t2 omp=PASSIVE" env OMP_WAIT_POLICY=PASSIVE "$torch_py" "$here/gpt_torch.py" \
      --threads 2 --steps "$steps" --warmup "$warmup"
    run "torch t2 intra1 blas2" "$torch_py" "$here/gpt_torch.py" --threads 1 --blas-threads 2 \
      --steps "$steps" --warmup "$warmup"
  fi
done
[ -n "$out" ] && cut -f2 "$lines" >"$out"

$torch_py - "$lines" <<'EOF'
import json, statistics, sys
by = {}
for ln in open(sys.argv[1]):
    label, j = ln.rstrip("\n").split("\t", 1)
    by.setdefault(label, []).append(json.loads(j))
med = {k: statistics.median(r["steps_per_s"] for r in v) for k, v in by.items()}
rss = {k: max(r["peak_rss_mib"] for r in v) for k, v in by.items()}
print("\nmedians (steps/s, batch 16) and peak RSS:")
for k, v in by.items():
    print("  %-22s %7.3f steps/s  (n=%d, min %.3f, max %.3f)  cpu %s ms/step  peak RSS %.1f MiB" % (
        k, med[k], len(v), min(r["steps_per_s"] for r in v),
        max(r["steps_per_s"] for r in v),
        "%.1f" % statistics.median(r["cpu_ms_per_step"] for r in v)
        if all(r.get("cpu_ms_per_step") is not None for r in v) else "?", rss[k]))
def verdict(ok): return "PASS" if ok else "MISS"
cpu = {k: statistics.median(r["cpu_ms_per_step"] for r in v) for k, v in by.items()
       if all(r.get("cpu_ms_per_step") is not None for r in v)}
if "torch t1" in med and "dgrad t1" in med:
    r1 = med["dgrad t1"] / med["torch t1"]
    print("1 thread : dgrad / torch = %.2fx (target >= 1.5x) %s" % (r1, verdict(r1 >= 1.5)))
    if "torch t1" in cpu and "dgrad t1" in cpu:
        print("           by CPU time per step (steadier on a loaded machine): "
              "torch %.1f ms / dgrad %.1f ms = %.2fx" % (
                  cpu["torch t1"], cpu["dgrad t1"], cpu["torch t1"] / cpu["dgrad t1"]))
t2 = [k for k in med if k.startswith("torch t2")]
if t2 and "dgrad t2" in med:
    best = max(t2, key=lambda k: med[k])
    r2 = med["dgrad t2"] / med[best]
    print("2 threads: dgrad / best torch (%s) = %.2fx (target >= 1.8x) %s" % (
        best, r2, verdict(r2 >= 1.8)))
def medk(k, key):
    v = [r[key] for r in by.get(k, []) if r.get(key) is not None]
    return statistics.median(v) if v else None
for th in ("1", "2"):
    k = "dgrad t" + th
    pct, sg, fl = medk(k, "roofline_pct"), medk(k, "sgemm_gflops"), medk(k, "gemm_gflop_per_step")
    if pct is None:
        continue
    tk = "torch t1" if th == "1" else (max(t2, key=lambda x: med[x]) if t2 else None)
    tp = ", %s %.1f%%" % (tk, 100 * fl * med[tk] / sg) if tk in med else ""
    print("roofline %s thread%s: sgemm %.1f GFLOP/s on the step's shapes; dgrad %.1f%%%s%s" % (
        th, "s" if th == "2" else "", sg, pct, tp,
        " (target >= 70%%) %s" % verdict(pct >= 70) if th == "1" else ""))
if "dgrad t1" in rss:
    print("dgrad peak RSS %.1f MiB (target < 64 MiB) %s" % (
        max(rss[k] for k in rss if k.startswith("dgrad")),
        verdict(max(rss[k] for k in rss if k.startswith("dgrad")) < 64)))
EOF
