#!/bin/sh
# libdgrad.so exports only the public API: every dynamic symbol it defines
# starts with dg_ (DG_API in include/dgrad/*.h), none with the internal dg__
# prefix. Usage: test_exports.sh <path/to/libdgrad.so>
set -u
lib=${1:-}
[ -n "$lib" ] && [ -f "$lib" ] || { echo "FAIL: no shared library given or found: '$lib'"; exit 1; }
# nm comes with binutils, which gcc needs: missing it is a broken setup, not a skip.
command -v nm >/dev/null 2>&1 || { echo "FAIL: nm not found (install binutils)"; exit 1; }
syms=$(nm -D --defined-only "$lib") || { echo "FAIL: nm -D --defined-only $lib failed"; exit 1; }
# Symbols some linkers define in every shared object are not dgrad's.
syms=$(printf '%s\n' "$syms" | awk 'NF >= 3 { print $NF }' |
  grep -v -x -e _init -e _fini -e _edata -e _end -e __bss_start | sort -u)
n=$(printf '%s\n' "$syms" | grep -c .)
[ "$n" -gt 0 ] || { echo "FAIL: $lib exports no symbols"; exit 1; }
bad=$(printf '%s\n' "$syms" | grep -v '^dg_' ; printf '%s\n' "$syms" | grep '^dg__')
if [ -n "$bad" ]; then
  nbad=$(printf '%s\n' "$bad" | grep -c .)
  echo "FAIL: $lib exports $nbad symbol(s) outside the public API (dg__ or not dg_):"
  printf '  %s\n' $bad
  echo "(mark public functions DG_API in include/dgrad/*.h; internal ones stay unmarked)"
  exit 1
fi
echo "ok: $lib exports $n public dg_ symbols, no dg__"
