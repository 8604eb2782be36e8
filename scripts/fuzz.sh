#!/usr/bin/env bash
# Builds the libFuzzer harnesses of fuzz/ (clang, ASan + UBSan) and runs each
# for a time or a number of executions, then prints one line per harness:
# executions, seconds, executions/s, the hours 10 million would take, and
# what it found. Exit status 1 when any harness crashed, leaked, hung or hit
# a sanitizer report (the input is kept under build-fuzz/artifacts/).
#   scripts/fuzz.sh [SECONDS]            each harness for SECONDS (default 60)
#   scripts/fuzz.sh --runs N [SECONDS]   each for N executions (at most SECONDS, default 86400)
#   FUZZ_ONLY="fuzz_store fuzz_idx" scripts/fuzz.sh 30    some harnesses only
#   FUZZ_JOBS=K                          K processes per harness (libFuzzer -fork)
#   FUZZ_SEED=S                          libFuzzer's -seed (CI: a fixed one, so that its
#                                        short runs try the same inputs every time)
# New inputs go to build-fuzz/corpus/<harness>/ (not the repository's seed
# corpus, fuzz/corpus/<harness>/, which is read): copy the ones worth keeping.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=-1
if [[ "${1:-}" == "--runs" ]]; then runs=$2; shift 2; secs=${1:-86400}; else secs=${1:-60}; fi
dir=build-fuzz
if ! command -v clang >/dev/null; then
  echo "fuzz.sh: clang is missing (bash scripts/setup.sh --tests installs clang and libclang-rt-14-dev)" >&2
  exit 2
fi
if [[ ! -f $dir/build.ninja ]]; then
  CC=clang meson setup $dir --buildtype=debugoptimized -Dfuzz=true \
    -Db_sanitize=address,undefined -Db_lundef=false -Dtests=false -Dexamples=false -Dbench=false
fi
ninja -C $dir -j "${NINJA_JOBS:-2}" >/dev/null
names=${FUZZ_ONLY:-"fuzz_store fuzz_gloo fuzz_ctrl fuzz_safetensors fuzz_idx fuzz_text"}
mkdir -p $dir/artifacts
status=0
printf "%-18s %12s %8s %10s %12s  %s\n" harness execs seconds "execs/s" "h for 10M" result
for n in $names; do
  mkdir -p $dir/corpus/$n
  log=$dir/artifacts/$n.log
  t0=$(date +%s.%N)
  rc=0
  # halt_on_error: a UBSan report is a failure like an ASan one.
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    $dir/fuzz/$n $dir/corpus/$n fuzz/corpus/$n -max_total_time="$secs" -runs="$runs" \
    -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix=$dir/artifacts/$n- \
    ${FUZZ_JOBS:+-fork=$FUZZ_JOBS -ignore_crashes=0} ${FUZZ_SEED:+-seed=$FUZZ_SEED} \
    >"$log" 2>&1 || rc=$?
  t1=$(date +%s.%N)
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  execs=${execs:-0}
  el=$(python3 -c "print(f'{$t1-$t0:.0f}')")
  rate=$(python3 -c "print(int($execs/max($t1-$t0,1e-9)))")
  hours=$(python3 -c "print(f'{1e7/max($rate,1)/3600:.1f}')")
  if ((rc == 0)) && ! grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:' "$log"; then
    res="0 crashes, 0 sanitizer reports"
  else
    res="FAILED (rc $rc): see $log"
    status=1
  fi
  printf "%-18s %12s %8s %10s %12s  %s\n" "$n" "$execs" "$el" "$rate" "$hours" "$res"
done
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
exit $status
