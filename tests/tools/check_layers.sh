#!/bin/sh
# The layer check passes on the tree, and fails (naming the file and both
# layers) on a copy with one wrong-way include and on one with a backend
# kernel header included from outside its backend.
# Usage: check_layers.sh REPO_ROOT PYTHON
root=$1
py=${2:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
"$py" "$root/scripts/check_layers.py" "$root" || { echo "FAIL: the tree breaks its layers"; fails=1; }
for case in up private; do
  rm -rf "$tmp/t" && mkdir "$tmp/t"
  for d in base backends core autograd ops nn optim ckpt data dist include; do cp -r "$root/$d" "$tmp/t/"; done
  if [ $case = up ]; then
    printf '#include "dgrad/ddp.h"\n' >>"$tmp/t/core/ctx.c"
    want='core/ctx.c (core) includes dgrad/ddp.h (dist.ddp)'
  else
    printf '#include "backends/cpu/cpu_impl.h"\n' >>"$tmp/t/nn/module.c"
    want='nn/module.c includes backends/cpu/cpu_impl.h'
  fi
  if "$py" "$root/scripts/check_layers.py" "$tmp/t" >"$tmp/out"; then
    echo "FAIL ($case): the check passed a wrong-way include"; fails=1
  elif ! grep -qF "$want" "$tmp/out"; then
    echo "FAIL ($case): expected '$want' in:"; cat "$tmp/out"; fails=1
  fi
done
[ $fails = 0 ] && echo ok
exit $fails
