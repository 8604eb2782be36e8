#!/bin/bash
# Runs docs/quickstart.c (300 steps, one process) and docs/quickstart_ddp.c
# (200 steps per rank on 2 ranks under dgrun) on Fashion-MNIST. Asserts: both
# exit 0; the single process learns (test accuracy >= 0.70); the DDP run
# prints from rank 0 only and rank 0 saves a checkpoint. Skips (77) when the
# dataset package is not installed.
# First, before the data check: every line of the README's C block is a line
# of docs/quickstart.c, so what the README shows is what the test compiles.
#   run_quickstart.sh QUICKSTART QUICKSTART_DDP DGRUN README QUICKSTART_C
set -u
qs=$(readlink -f "$1") qsd=$(readlink -f "$2") dgrun=$(readlink -f "$3") readme="$4" qs_c="$5"
n=0
while IFS= read -r line; do
  n=$((n + 1))
  grep -qxF -- "$line" "$qs_c" || { echo "FAIL: README line not in $qs_c: $line" >&2; exit 1; }
done < <(awk '/^```c$/ {on = 1; next} /^```/ {on = 0} on' "$readme")
[ "$n" -ge 10 ] || { echo "FAIL: README shows no C block from the quickstart ($n lines)" >&2; exit 1; }
data=/usr/share/datasets/fashion-mnist
[ -e "$data/train-images-idx3-ubyte.gz" ] || [ -e "$data/train-images-idx3-ubyte" ] ||
  { echo "skip: no Fashion-MNIST in $data (apt-get install dataset-fashion-mnist)"; exit 77; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; echo "---- output ----" >&2; cat "$tmp/out" >&2; exit 1; }

"$qs" "" 300 >"$tmp/out" 2>&1 || fail "quickstart exited $?"
acc=$(awk '/test accuracy/ {print $NF}' "$tmp/out")
[ -n "$acc" ] || fail "no accuracy line"
awk -v a="$acc" 'BEGIN { exit !(a >= 0.70) }' || fail "test accuracy $acc below 0.70"

(cd "$tmp" && "$dgrun" --nproc-per-node 2 "$qsd" "" 200 "$tmp/q.safetensors") >"$tmp/out" 2>&1 ||
  fail "quickstart_ddp under dgrun exited $?"
grep -q '^\[rank 0\] rank 0: last loss' "$tmp/out" || fail "rank 0 did not finish"
! grep -q '^\[rank 1\] step' "$tmp/out" || fail "rank 1 printed progress (only rank 0 should)"
[ -s "$tmp/q.safetensors" ] || fail "no checkpoint written by rank 0"
echo ok
