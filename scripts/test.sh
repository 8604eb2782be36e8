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

# ThreadSanitizer over the tests that run one store from several threads
# (forwards on two contexts at once): only those targets are built.
tsan_tests=(test_tape_ctx)
meson setup build-tsan --buildtype=debugoptimized -Db_sanitize=thread -Db_lundef=false \
  -Dbench=false -Dexamples=false --wipe >/dev/null 2>&1 ||
  meson setup build-tsan --buildtype=debugoptimized -Db_sanitize=thread -Db_lundef=false \
    -Dbench=false -Dexamples=false
ninja -C build-tsan "${tsan_tests[@]/#/tests/unit/}"
TSAN_OPTIONS=halt_on_error=1 meson test -C build-tsan --no-rebuild --print-errorlogs \
  "${tsan_tests[@]}" || status=1

python3 scripts/summary.py build-test/meson-logs/testlog.json \
  build-asan/meson-logs/testlog.json build-tsan/meson-logs/testlog.json || status=1
exit $status
