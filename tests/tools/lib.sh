# Shared helpers for the dgrun tests (sourced). Usage: test.sh path/to/dgrun.
# Every dgrun run is bounded by `timeout`, and every failed check prints what
# was expected and what dgrun wrote; the exit status is the verdict.
DGRUN=$1
if [ ! -x "$DGRUN" ]; then echo "usage: $0 path/to/dgrun" >&2; exit 1; fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

# run NAME [dgrun args...]: stdout to $TMP/NAME.out, stderr to $TMP/NAME.err,
# exit status in $rc, wall time in $ms.
run() {
  name=$1; shift
  t0=$(now_ms)
  timeout 30 "$DGRUN" "$@" >"$TMP/$name.out" 2>"$TMP/$name.err"
  rc=$?
  ms=$(( $(now_ms) - t0 ))
  if [ $rc = 124 ]; then fail "$name: dgrun did not finish within 30 s"; fi
}

# show FILE: print a run's output (both streams) after a failed check
show() {
  for f in "$TMP/${1%.*}.out" "$TMP/${1%.*}.err"; do
    echo "  --- ${f##*/}:" >&2
    sed 's/^/  | /' "$f" >&2
  done
}

# has FILE REGEX / hasnt FILE REGEX (extended regex, any line)
has() { grep -qE -- "$2" "$TMP/$1" || { fail "$1 should match /$2/"; show "$1"; }; }
hasnt() { ! grep -qE -- "$2" "$TMP/$1" || { fail "$1 should not match /$2/"; show "$1"; }; }

# count FILE REGEX N: exactly N lines match
count() {
  c=$(grep -cE -- "$2" "$TMP/$1")
  [ "$c" = "$3" ] || { fail "$1: $c line(s) match /$2/, expected $3"; show "$1"; }
}

expect_rc() { [ "$rc" = "$1" ] || fail "$2: exit status $rc, expected $1"; }

# faster_than MS WHAT: the last run took less than MS milliseconds
faster_than() { [ "$ms" -lt "$1" ] || fail "$2: took $ms ms, expected under $1 ms"; }

finish() {
  if [ $fails = 0 ]; then echo ok; exit 0; fi
  echo "$fails check(s) failed" >&2
  exit 1
}
