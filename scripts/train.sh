#!/usr/bin/env bash
# The main job: build dgrad and train on Fashion-MNIST, data-parallel on the
# local ranks when the DDP example and dgrun are built (NPROC, default 2),
# otherwise on one process. Extra arguments go to the example.
set -euo pipefail
cd "$(dirname "$0")/.."
meson setup build-main --buildtype=release >/dev/null 2>&1 || true
ninja -C build-main
nproc_per_node=${NPROC:-2}
mnist=build-main/examples/mnist/mnist
if [ -x build-main/tools/dgrun ] && [ -f include/dgrad/ddp.h ] && grep -q ddp examples/mnist/*.c 2>/dev/null; then
  exec build-main/tools/dgrun --nproc-per-node "$nproc_per_node" "$mnist" --epochs 1 "$@"
fi
exec "$mnist" --epochs 1 "$@"
