#!/usr/bin/env bash
# Builds dgrad and runs every test suite, then the whole suite again under
# AddressSanitizer + UndefinedBehaviorSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

meson setup build-test --buildtype=release --wipe >/dev/null 2>&1 ||
  meson setup build-test --buildtype=release
ninja -C build-test
status=0
meson test -C build-test --print-errorlogs --num-processes "$jobs" || status=1

# The API reference (docs/index.md): doxygen over the public headers.
if command -v doxygen >/dev/null; then
  ninja -C build-test doxygen >/dev/null || { echo "doxygen FAILED"; status=1; }
fi

# The install target and dgrad.pc (an outside program built with only
# `pkg-config --cflags --libs dgrad`, and statically) are the meson test
# install_pkgconfig (tests/install/test_install.sh), run above.

# Sanitizers: a debug-optimised build so the reports carry line numbers.
meson setup build-asan --buildtype=debugoptimized -Db_sanitize=address,undefined \
  -Db_lundef=false -Dbench=false --wipe >/dev/null 2>&1 ||
  meson setup build-asan --buildtype=debugoptimized -Db_sanitize=address,undefined \
    -Db_lundef=false -Dbench=false
ninja -C build-asan
# UCX_MEM_EVENTS=no: UCX's memory hooks (UCM) patch the allocator next to
# ASan's and crash LeakSanitizer's tracer at exit in about 3 runs of 100 of
# the UCX tests (0 of 100 without them); the transport needs no
# registration cache over tcp on loopback.
UCX_MEM_EVENTS=no ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  meson test -C build-asan --print-errorlogs --num-processes "$jobs" \
  --no-suite interop --timeout-multiplier 3 || status=1

# ThreadSanitizer over the test that runs one store from several threads
# (forwards on two contexts at once) and the dist (DDP included) and pipe
# suites, UCX's left out (its threads are not instrumented): only their
# targets are built. halt_on_error: a rank with a report exits 66, which
# fails its test. No suppressions (#17 item 7: 0 reports).
tsan_suites=(dist pipe)
meson setup build-tsan --buildtype=debugoptimized -Db_sanitize=thread -Db_lundef=false \
  -Dbench=false --wipe >/dev/null 2>&1 ||
  meson setup build-tsan --buildtype=debugoptimized -Db_sanitize=thread -Db_lundef=false \
    -Dbench=false
tsan_targets=$(python3 -c '
import json, os, subprocess, sys
b, suites = sys.argv[1], set(sys.argv[2:])
intro = lambda what: json.loads(subprocess.check_output(["meson", "introspect", b, what]))
files = {t["id"]: t["filename"] for t in intro("--targets")}
print(" ".join(sorted({os.path.relpath(f, os.path.abspath(b)) for t in intro("--tests")
                       if {s.split(":")[-1] for s in t["suite"]} & suites
                       and not {s.split(":")[-1] for s in t["suite"]} & {"ucx", "interop"}
                       for d in t["depends"] for f in files.get(d, [])})))' \
  build-tsan "${tsan_suites[@]}")
ninja -C build-tsan tests/unit/test_tape_ctx $tsan_targets
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"
meson test -C build-tsan --no-rebuild --print-errorlogs test_tape_ctx || status=1
meson test -C build-tsan --no-rebuild --print-errorlogs --num-processes "$jobs" \
  --timeout-multiplier 3 --logbase tsan-suites $(printf -- '--suite %s ' "${tsan_suites[@]}") \
  --no-suite ucx --no-suite interop || status=1

# Fuzzing (fuzz/, RELIABILITY.md "Fuzzing"): each libFuzzer harness for 30 s
# under ASan + UBSan (clang and libclang-rt-14-dev: setup.sh --tests); the
# corpora are also replayed by the suites above (suite 'fuzz').
if command -v clang >/dev/null; then
  # a fixed seed: CI tries the same inputs every run (a new finding there is a
  # change's doing, not chance); the long runs explore (RELIABILITY.md)
  FUZZ_SEED=${FUZZ_SEED:-1} bash scripts/fuzz.sh "${DG_FUZZ_SECONDS:-30}" || status=1
else
  echo "fuzz: clang is missing (bash scripts/setup.sh --tests)"; status=1
fi

python3 scripts/summary.py build-test/meson-logs/testlog.json \
  build-asan/meson-logs/testlog.json build-tsan/meson-logs/testlog.json \
  build-tsan/meson-logs/tsan-suites.json || status=1
exit $status
