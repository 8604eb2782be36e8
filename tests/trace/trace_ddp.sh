# dgrun --trace: two ranks of a DDP program trace a few steps and dgrun
# merges them into one file (check_trace.py: parses, nests, one pid per rank,
# DDP's events present); then a merge with a good, a torn and a missing rank
# file: the good one merged with its pid set to its rank (a "pid" inside a
# string untouched), the others named, the rank files kept.
# Usage: trace_ddp.sh dgrun trace_ddp_prog check_trace.py python3
set -u
DGRUN=$1 PROG=$2 CHECK=$3 PY=$4
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

timeout 90 "$DGRUN" --nproc-per-node 2 --trace "$T/t.json" "$PROG" 4 >"$T/out" 2>"$T/err"
rc=$?
[ $rc = 0 ] || { fail "dgrun exited $rc"; cat "$T/out" "$T/err" >&2; }
[ -s "$T/t.json" ] || fail "no merged trace $T/t.json"
ls "$T"/t.json.rank* >/dev/null 2>&1 && fail "rank files left after a complete merge"
"$PY" "$CHECK" "$T/t.json" --ranks 2 \
  --expect "forward,backward,optimizer step,bucket ready,allreduce,bucket wait,ddp sync,ddp join" \
  --inside "ddp sync:backward" --inside "bucket wait:ddp sync|ddp join" || fail "check_trace"
grep -q '"bucket":1' "$T/t.json" || fail "one bucket only: the program asks for several"

cat >"$T/good.json" <<'J'
{"traceEvents":[
{"name":"x","ph":"X","ts":1.000,"dur":2.000,"pid":7,"tid":5,"args":{"s":"a]b{\"pid\":9"}} ,
  {"name":"y","ph":"i","ts":2.5,"pid": 7 ,"tid":5,"s":"t"}
],"displayTimeUnit":"ms"}
J
timeout 30 "$DGRUN" --nproc-per-node 3 --trace "$T/m.json" sh -c \
  'case $RANK in 0) cp "$0" "$DG_TRACE";; 1) printf "{\"traceEvents\":[{\"ph\":" >"$DG_TRACE";; esac' \
  "$T/good.json" >"$T/mout" 2>"$T/merr"
rc=$?
[ $rc = 0 ] || fail "dgrun (merge case) exited $rc"
grep -q "merged 1 of 3 rank(s)" "$T/merr" || fail "missing ranks not reported: $(cat "$T/merr")"
grep -q "rank 1: .*m.json.rank1: no complete traceEvents array" "$T/merr" || fail "torn rank 1 not named"
grep -q "rank 2: .*m.json.rank2: No such file" "$T/merr" || fail "missing rank 2 not named"
[ -f "$T/m.json.rank0" ] || fail "rank files removed although the merge was partial"
"$PY" - "$T/m.json" <<'P' || fail "partial merge content"
import json, sys
d = json.load(open(sys.argv[1]))["traceEvents"]
assert [e["pid"] for e in d] == [0, 0], d
assert d[0]["args"]["s"] == 'a]b{"pid":9', d[0]
P
"$DGRUN" --trace "" true 2>"$T/uerr"
[ $? = 2 ] && grep -q "empty file name" "$T/uerr" || fail "--trace '' accepted"
[ $fails = 0 ] && echo ok
exit $fails
