#!/bin/bash
# Smoke test of examples/transformer: 30 steps of a tiny GPT (1 layer, 2
# heads, d_model 32, context 16, batch 8) on a small generated text. Asserts
# that the program exits 0, prints the unigram baseline, the train loss falls
# (mean of the last 10 steps below the first 10 by a margin), the validation
# loss is finite, the steady-state steps made no system allocation, and a
# sample is printed.
#   test_transformer.sh PATH/TO/transformer
set -u
exe="${1:?usage: test_transformer.sh PATH/TO/transformer}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; echo "---- output ----" >&2; cat "$tmp/out" >&2; exit 1; }

for i in $(seq 1 60); do
  echo "the quick brown fox jumps over the lazy dog. a stitch in time saves nine."
  echo "all that glitters is not gold; fortune favours the bold ($i)."
done >"$tmp/text"

"$exe" --text "$tmp/text" --steps 30 --layers 1 --heads 2 --dim 32 --context 16 --batch 8 \
  --lr 1e-2 --warmup 5 --log-every 10 --eval-every 30 --eval-batches 4 --sample-len 40 \
  --seed 7 >"$tmp/out" 2>&1
rc=$?
[ "$rc" -eq 0 ] || fail "transformer exited $rc"
grep -q '^unigram baseline: ' "$tmp/out" || fail "no unigram baseline line"
first=$(awk '/train loss/ {print $5; exit}' "$tmp/out")
last=$(awk '/train loss/ {v = $5} END {print v}' "$tmp/out")
[ -n "$first" ] && [ -n "$last" ] || fail "no train loss lines"
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.3) }' ||
  fail "train loss did not fall: first 10 steps $first, last 10 steps $last"
val=$(awk '/^step .*val loss/ {v = $5} END {print v}' "$tmp/out")
awk -v v="$val" 'BEGIN { exit !(v + 0 == v && v > 0 && v < 10) }' || fail "bad val loss '$val'"
allocs=$(awk '/^steady state/ {print $5}' "$tmp/out")
[ "$allocs" = "0" ] || fail "steady-state steps made '$allocs' system allocations (want 0)"
grep -q -- '---- end of sample ----' "$tmp/out" || fail "no sample"
echo "ok: train loss $first -> $last, val loss $val, 0 steady-state allocations"
