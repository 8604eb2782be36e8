#!/bin/bash
# A rank stopped (SIGSTOP) in DDP training of 4 ranks under dgrun: the
# others fail at the group timeout (2 s) naming the stopped rank, and dgrun
# names it too (issue #17 item 5; before, the shared-memory gradient path
# named a rank that was itself waiting for it).
#   stop_blame.sh WORKER DGRUN     (DG_SHM=0 in the environment: over TCP)
set -u
worker="${1:?usage: stop_blame.sh WORKER DGRUN}"
dgrun="${2:?usage: stop_blame.sh WORKER DGRUN}"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
fail() { echo "FAIL: $*" >&2; grep -v ' loss ' "$out" >&2; exit 1; }
timeout 60 "$dgrun" --nproc-per-node 4 --grace-seconds 10 -- "$worker" --steps 20 \
  --timeout-ms 2000 --stop-rank 2 --stop-at 5 >"$out" 2>&1
rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "dgrun exited $rc"
grep -q '^dgrun: rank 2 (pid [0-9]*) was stopped by signal 19 (SIGSTOP)' "$out" ||
  fail "dgrun did not say that rank 2 stopped"
grep -q '^dgrun: rank 2 (pid [0-9]*) has been stopped by signal 19 (SIGSTOP) for' "$out" ||
  fail "dgrun did not name the stopped rank when the others failed"
for r in 0 1 3; do
  line=$(grep -m1 "^\[rank $r\] ddp_worker: rank $r: step 5: " "$out") ||
    fail "rank $r printed no failure in step 5"
  echo "${line#*step 5: }" | grep -q 'rank 2\b' || fail "rank $r does not name rank 2: $line"
  echo "$line"
done
echo "ok: ranks 0, 1, 3 and dgrun name the stopped rank 2"
