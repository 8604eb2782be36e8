#!/usr/bin/env bash
# Long differential-test campaign: dgrad against PyTorch 1.13 (tests/diff).
# Runs N random programs (default 20000) split over five modes: single ops
# (50%), several steps on one context (15%), optimizers (15%), and both of
# those again with DG_NUM_THREADS=2 (10% each); writes a summary with every
# failing seed, its reproduce line and (for the first few per mode) the
# minimised program.
#
#   bash scripts/diff_campaign.sh [-n N] [-j JOBS] [-b BUILD_DIR] [-s BASE_SEED] [-o SUMMARY]
#
# BUILD_DIR (default build-diff) is set up when missing and rebuilt. The base
# seed is random unless given; every mode uses seeds BASE.. so a run is
# repeatable from its summary. Exit status 1 when any program failed.
set -euo pipefail
cd "$(dirname "$0")/.."

n=20000 jobs=$(nproc) build=build-diff base="" out=""
while getopts "n:j:b:s:o:h" opt; do
  case $opt in
    n) n=$OPTARG ;;
    j) jobs=$OPTARG ;;
    b) build=$OPTARG ;;
    s) base=$OPTARG ;;
    o) out=$OPTARG ;;
    *) sed -n '2,14p' "$0"; exit 2 ;;
  esac
done
py=/usr/bin/python3
if ! "$py" -c 'import torch' 2>/dev/null; then
  echo "diff_campaign: $py cannot import torch (bash scripts/setup.sh installs python3-torch)" >&2
  exit 77
fi
[ -d "$build" ] || meson setup "$build" --buildtype=debugoptimized
ninja -C "$build" tests/diff/dg_prog
prog=$build/tests/diff/dg_prog
base=${base:-$(( (RANDOM << 15 | RANDOM) + 1000000 ))}
out=${out:-$build/diff-campaign-$base.txt}
log=${out%.txt}.log

# mode name, share in percent, difftest flags
modes=("ops 50 " "steps 15 --steps 3" "optim 15 --optim" "steps-2t 10 --steps 3 --threads 2"
       "optim-2t 10 --optim --threads 2")
status=0
start=$(date +%s)
: >"$log"
{
  echo "dgrad differential campaign: $n programs, base seed $base, $jobs jobs, $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  for m in "${modes[@]}"; do
    read -r name share flags <<<"$m"
    count=$(( n * share / 100 ))
    t0=$(date +%s)
    echo "== $name: $count programs (flags: ${flags:-none})" | tee -a "$log" >&2
    # shellcheck disable=SC2086
    if "$py" tests/diff/difftest.py --prog "$prog" --seed "$base" --count "$count" $flags \
        --jobs "$jobs" --minimise-limit 3 --minimise-seconds 120 --quiet >>"$log" 2>&1; then
      r=ok
    else
      r=FAILED status=1
    fi
    line=$(grep -aE '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -n 1)
    skipped=$(grep -aE '^[0-9]+ skipped' "$log" | tail -n 1 | cut -d' ' -f1)
    res="$name: $line, ${skipped:-0} skipped (fragile), $(( $(date +%s) - t0 ))s: $r"
    echo "$res"
    echo "$res" >&2
  done
  echo "total $(( $(date +%s) - start ))s"
  echo
  echo "failures (full output in $log):"
  grep -aE '^(FAIL|  reproduce|minimised)' "$log" || echo "none"
} >"$out"
cat "$out"
echo "summary: $out, log: $log" >&2
exit $status
