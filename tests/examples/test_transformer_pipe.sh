#!/bin/bash
# The char-GPT pipelined under dgrun trains as the unpipelined run (#13 item
# 8): 20 steps of a tiny GPT (2 layers) on one process, then with --pipe 2
# on 2 ranks (GPipe, 4 micro-batches), then DP x PP on 4 ranks (2 stages x
# 2 replicas, 1F1B, re-materialization, balance by measured time), then
# --pipe 2 with activation swapping to a file on every stage (exact, so
# the same curve; each stage reports what it swapped). Every step's printed
# train loss and the final val loss must agree within 2e-4 (the
# micro-batch sums are added in another order).
#   test_transformer_pipe.sh PATH/TO/transformer PATH/TO/dgrun
set -u
exe="${1:?usage: test_transformer_pipe.sh TRANSFORMER DGRUN}"
dgrun="${2:?usage: test_transformer_pipe.sh TRANSFORMER DGRUN}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; for f in "$tmp"/*.out; do echo "---- $f" >&2; cat "$f" >&2; done; exit 1; }

for i in $(seq 1 60); do
  echo "the quick brown fox jumps over the lazy dog. a stitch in time saves nine."
  echo "all that glitters is not gold; fortune favours the bold ($i)."
done >"$tmp/text"
args=(--text "$tmp/text" --steps 20 --layers 2 --heads 2 --dim 32 --context 16 --batch 8
      --lr 1e-2 --warmup 5 --log-every 1 --eval-every 20 --eval-batches 2 --sample-len 0
      --seed 7)

"$exe" "${args[@]}" >"$tmp/one.out" 2>&1 || fail "the unpipelined run exited $?"
timeout 120 "$dgrun" --nproc-per-node 2 "$exe" "${args[@]}" --pipe 2 --micro-batches 4 \
  >"$tmp/pipe2.out" 2>&1 || fail "--pipe 2 on 2 ranks exited $?"
timeout 120 "$dgrun" --nproc-per-node 4 "$exe" "${args[@]}" --pipe 2 --micro-batches 2 \
  --schedule 1f1b --remat --balance time >"$tmp/dpxpp.out" 2>&1 ||
  fail "DP x PP on 4 ranks exited $?"
mkdir "$tmp/swap"
timeout 120 "$dgrun" --nproc-per-node 2 "$exe" "${args[@]}" --pipe 2 --micro-batches 4 \
  --swap file --swap-dir "$tmp/swap" --swap-min-bytes 0 >"$tmp/pipeswap.out" 2>&1 ||
  fail "--pipe 2 --swap file on 2 ranks exited $?"

# "step N train loss X" / "step N val loss X" (dgrun prefixes "[rank 0] ")
losses() { sed 's/^\[rank 0\] //' "$1" | awk '/^step .* (train|val) loss/ {print $2, $3, $5}'; }
losses "$tmp/one.out" >"$tmp/one.l"
[ "$(wc -l <"$tmp/one.l")" -eq 21 ] || fail "the unpipelined run printed $(wc -l <"$tmp/one.l") losses, want 21"
for run in pipe2 dpxpp pipeswap; do
  losses "$tmp/$run.out" >"$tmp/$run.l"
  paste -d' ' "$tmp/one.l" "$tmp/$run.l" | awk -v run="$run" '
    { n++; d = $3 - $6; if (d < 0) d = -d;
      if ($1 != $4 || $2 != $5 || d > 2e-4) { printf "%s: step %s %s loss %s, unpipelined %s\n", run, $4, $5, $6, $3; bad = 1 } }
    END { if (n != 21) { printf "%s: %d losses, want 21\n", run, n; bad = 1 } exit bad }' ||
    fail "$run's loss curve differs from the unpipelined run"
done
grep -q "stage 1 of replica 1" "$tmp/dpxpp.out" || fail "DP x PP did not report rank 3's stage"
for r in 0 1; do # every stage swapped something out
  grep -Eq "^\[rank $r\] rank $r: swap \(file\): [0-9.]*[1-9][0-9.]* MiB out" "$tmp/pipeswap.out" ||
    fail "rank $r did not report swapped activations"
done
# 24 micro-batches (more contexts than a fixed array of 16 held: the
# report read past it and crashed), large enough that a stage reads swapped
# activations back from the file: the same 4 losses as one process
big=(--text "$tmp/text" --steps 3 --layers 2 --heads 2 --dim 64 --context 64 --batch 24
     --lr 1e-2 --warmup 1 --log-every 1 --eval-every 3 --eval-batches 1 --sample-len 0 --seed 7)
"$exe" "${big[@]}" >"$tmp/one24.out" 2>&1 || fail "the unpipelined 24-row run exited $?"
timeout 120 "$dgrun" --nproc-per-node 2 "$exe" "${big[@]}" --pipe 2 --micro-batches 24 \
  --swap file --swap-dir "$tmp/swap" --swap-min-bytes 0 >"$tmp/swap24.out" 2>&1 ||
  fail "--pipe 2 --micro-batches 24 --swap file exited $?"
losses "$tmp/one24.out" >"$tmp/one24.l"
losses "$tmp/swap24.out" >"$tmp/swap24.l"
paste -d' ' "$tmp/one24.l" "$tmp/swap24.l" | awk '
  { n++; d = $3 - $6; if (d < 0) d = -d;
    if ($1 != $4 || $2 != $5 || d > 2e-4) { printf "swap24: step %s %s loss %s, unpipelined %s\n", $4, $5, $6, $3; bad = 1 } }
  END { if (n != 4) { printf "swap24: %d losses, want 4\n", n; bad = 1 } exit bad }' ||
  fail "--pipe 2 --micro-batches 24 --swap file: the loss curve differs"
grep -Eq "swap \(file\): [0-9.]+ MiB out / [0-9.]*[1-9][0-9.]* MiB in over 24 contexts" \
  "$tmp/swap24.out" || fail "no stage read swapped activations back over its 24 contexts"
echo "ok: 21 losses equal across 1 process, --pipe 2, DP x PP 2 x 2 and --pipe 2 --swap file;" \
  "4 with 24 micro-batches swapping"
