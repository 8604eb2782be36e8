#!/bin/sh
# An outside program built against an installed dgrad with nothing but
# `pkg-config --cflags --libs dgrad` (issue #16 item 9): the build tree is
# installed into a staging directory, pkg-config sees only that directory
# (PKG_CONFIG_LIBDIR), so dgrad.pc may not require the .pc files of
# OpenBLAS, zlib or UCX (their -dev packages), and tests/install/consumer.c
# is compiled, linked against libdgrad.so and run (docs/quickstart.c and
# docs/quickstart_ddp.c too); then linked statically
# against libdgrad.a with `pkg-config --static --libs` and run.
# Usage: test_install.sh MESON BUILD_DIR SOURCE_DIR CC
set -eu
meson=$1 build=$2 src=$3 cc=$4
command -v pkg-config >/dev/null 2>&1 || { echo "SKIP: no pkg-config"; exit 77; }
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
"$meson" install -C "$build" --destdir "$stage" --no-rebuild --quiet >/dev/null
pc=$(find "$stage" -name dgrad.pc | head -n 1)
so=$(find "$stage" -name libdgrad.so | head -n 1)
[ -n "$pc" ] && [ -n "$so" ] || { echo "FAIL: install put no dgrad.pc or libdgrad.so"; exit 1; }
libdir=$(dirname "$so")
# dgrad's prefix moved under the stage; its private flags keep their paths
pcdir=$(dirname "$pc")
prefix=$(PKG_CONFIG_LIBDIR=$pcdir PKG_CONFIG_PATH= pkg-config --variable=prefix dgrad)
pkg() {
  PKG_CONFIG_LIBDIR=$pcdir PKG_CONFIG_PATH= \
    pkg-config --define-variable=prefix="$stage$prefix" "$@" dgrad
}
flags=$(pkg --cflags --libs) || { echo "FAIL: pkg-config --cflags --libs dgrad failed"; exit 1; }
echo "pkg-config --cflags --libs dgrad: $flags"
for f in $flags; do
  case $f in
    -I*|-L*|-ldgrad) ;;
    *) echo "FAIL: a dynamic link needs only -I, -L and -ldgrad, got $f"; exit 1 ;;
  esac
done
# shellcheck disable=SC2086
"$cc" -std=c11 -Wall -Werror "$src/tests/install/consumer.c" -o "$stage/consumer_shared" $flags
LD_LIBRARY_PATH=$libdir "$stage/consumer_shared"
# the docs' programs build as docs/index.md tells a newcomer to build them
for q in quickstart quickstart_ddp; do
  # shellcheck disable=SC2086
  "$cc" -std=c11 -Wall -Werror "$src/docs/$q.c" -o "$stage/$q" $flags
done
if [ -e /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz ]; then
  LD_LIBRARY_PATH=$libdir "$stage/quickstart" "" 50 >/dev/null
fi

static=$(pkg --static --libs | sed 's/-ldgrad//')
echo "pkg-config --static --libs dgrad (less -ldgrad): $static"
# shellcheck disable=SC2086
"$cc" -std=c11 -Wall -Werror "$src/tests/install/consumer.c" -o "$stage/consumer_static" \
  $(pkg --cflags) "$libdir/libdgrad.a" $static
"$stage/consumer_static"
echo ok
