#!/bin/sh
# Runs the hello-world group (join, print, dg_pg_free) under dgrun N times;
# every run must succeed and print both ranks' lines (issue #16: rank 0's
# store used to leave while rank 1 was still in its rendezvous).
# usage: hello_loop.sh DGRUN HELLO [RUNS] [NPROC]
set -u
dgrun=$1 hello=$2 runs=${3:-100} nproc=${4:-2}
out=$(mktemp) || exit 1
trap 'rm -f "$out"' EXIT
fails=0 i=0
while [ "$i" -lt "$runs" ]; do
  i=$((i + 1))
  if ! "$dgrun" --nproc-per-node "$nproc" "$hello" >"$out" 2>&1; then
    fails=$((fails + 1))
    echo "run $i failed:"; cat "$out"
    continue
  fi
  r=0
  while [ "$r" -lt "$nproc" ]; do
    if ! grep -q "^\[rank $r\] hello from rank $r of $nproc\$" "$out"; then
      fails=$((fails + 1))
      echo "run $i: no hello from rank $r:"; cat "$out"
      break
    fi
    r=$((r + 1))
  done
done
echo "$fails of $runs runs failed"
[ "$fails" -eq 0 ]
