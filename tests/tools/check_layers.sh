#!/bin/sh
# The layer check passes on the tree, and fails (naming the file and both
# layers) on a copy with one wrong-way include, on one with a backend
# kernel header included from outside its backend, on one where DDP
# includes a transport header, and on one where the group's runtime
# includes its algorithms.
# Usage: check_layers.sh REPO_ROOT PYTHON
root=$1
py=${2:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
"$py" "$root/scripts/check_layers.py" "$root" || { echo "FAIL: the tree breaks its layers"; fails=1; }
for case in up private ddp runtime; do
  rm -rf "$tmp/t" && mkdir "$tmp/t"
  for d in base backends core autograd ops nn optim ckpt data dist include; do cp -r "$root/$d" "$tmp/t/"; done
  if [ $case = up ]; then
    printf '#include "dgrad/ddp.h"\n' >>"$tmp/t/core/ctx.c"
    want='core/ctx.c (core) includes dgrad/ddp.h (dist.ddp)'
  elif [ $case = private ]; then
    printf '#include "backends/cpu/cpu_impl.h"\n' >>"$tmp/t/nn/module.c"
    want='nn/module.c includes backends/cpu/cpu_impl.h'
  elif [ $case = ddp ]; then # allowed by the order (DDP is above), refused by rule
    printf '#include "dist/transport/transport_impl.h"\n' >>"$tmp/t/dist/ddp_overlap.c"
    want='dist/ddp_overlap.c includes dist/transport/transport_impl.h: DDP does not call transports'
  else # the group's runtime knows no algorithm
    printf '#include "dist/coll_impl.h"\n' >>"$tmp/t/dist/pg_work.c"
    want='dist/pg_work.c (dist.work) includes dist/coll_impl.h (dist.coll)'
  fi
  if "$py" "$root/scripts/check_layers.py" "$tmp/t" >"$tmp/out"; then
    echo "FAIL ($case): the check passed a wrong-way include"; fails=1
  elif ! grep -qF "$want" "$tmp/out"; then
    echo "FAIL ($case): expected '$want' in:"; cat "$tmp/out"; fails=1
  fi
done
[ $fails = 0 ] && echo ok
exit $fails
