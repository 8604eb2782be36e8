#!/bin/sh
# libdgrad.so must not link UCX (issue #16 item 9): the UCX transport
# dlopen()s libucp.so.0 when a UCX group is created, so no UCX library may
# appear in the dynamic section's NEEDED entries.
# Usage: test_needed.sh path/to/libdgrad.so
set -eu
lib=$1
if command -v readelf >/dev/null 2>&1; then
  needed=$(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
elif command -v objdump >/dev/null 2>&1; then
  needed=$(objdump -p "$lib" | awk '$1 == "NEEDED" {print $2}')
else
  echo "SKIP: neither readelf nor objdump found"; exit 77
fi
[ -n "$needed" ] || { echo "FAIL: no NEEDED entries read from $lib"; exit 1; }
echo "NEEDED of $lib:" $needed
bad=$(printf '%s\n' "$needed" | grep -E '^libuc[pstm](_[a-z]+)?\.so' || true)
if [ -n "$bad" ]; then
  echo "FAIL: $lib links UCX ($bad): it must dlopen it (dist/transport/ucx/ucx_dl.c)"
  exit 1
fi
echo ok
