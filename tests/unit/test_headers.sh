#!/bin/sh
# Each public header compiles alone, as C11 and as C++ (extern "C"), with
# -pedantic -Werror. Usage: test_headers.sh <include-dir> <cc>
set -u
inc=$1; cc=$2; fail=0; n=0
for h in "$inc"/dgrad.h "$inc"/dgrad/*.h; do
  rel=${h#"$inc"/}
  n=$((n + 1))
  if ! printf '#include "%s"\nint main(void) { return 0; }\n' "$rel" |
      "$cc" -std=c11 -pedantic -Wall -Wextra -Werror -fsyntax-only -I"$inc" -x c - ; then
    echo "FAIL: $rel does not compile alone as C11"; fail=1
  fi
  if command -v g++ >/dev/null &&
     ! printf '#include "%s"\nint main() { return 0; }\n' "$rel" |
      g++ -std=c++11 -pedantic -Wall -Werror -fsyntax-only -I"$inc" -x c++ - ; then
    echo "FAIL: $rel does not compile alone as C++11"; fail=1
  fi
done
[ "$n" -ge 5 ] || { echo "FAIL: only $n headers found in $inc"; fail=1; }
[ $fail = 0 ] && echo "ok: $n headers compile alone"
exit $fail
