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

# The install target and pkg-config file: build an outside program against a
# staged install, statically and against the shared library.
stage=$(mktemp -d)
meson install -C build-test --destdir "$stage" >/dev/null
pc=$(dirname "$(find "$stage" -name dgrad.pc | head -n 1)")
libdir=$(dirname "$(find "$stage" -name libdgrad.so | head -n 1)")
pkg() { PKG_CONFIG_PATH=$pc PKG_CONFIG_SYSROOT_DIR=$stage pkg-config "$@" dgrad; }
cc -std=c11 -Wall -Werror tests/install/consumer.c -o "$stage/consumer_shared" \
  $(pkg --cflags --libs) && LD_LIBRARY_PATH=$libdir "$stage/consumer_shared" ||
  { echo "install check (shared) FAILED"; status=1; }
cc -std=c11 -Wall -Werror tests/install/consumer.c -o "$stage/consumer_static" \
  $(pkg --cflags) "$libdir/libdgrad.a" $(pkg --static --libs | sed 's/-ldgrad//') &&
  "$stage/consumer_static" || { echo "install check (static) FAILED"; status=1; }
rm -rf "$stage"

# Sanitizers: a debug-optimised build so the reports carry line numbers.
meson setup build-asan --buildtype=debugoptimized -Db_sanitize=address,undefined \
  -Db_lundef=false -Dbench=false --wipe >/dev/null 2>&1 ||
  meson setup build-asan --buildtype=debugoptimized -Db_sanitize=address,undefined \
    -Db_lundef=false -Dbench=false
ninja -C build-asan
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
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
