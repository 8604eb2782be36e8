#!/usr/bin/env bash
# The main job: build dgrad (library, dgrun, examples; no tests or
# benchmarks) and train the Fashion-MNIST example data-parallel on NPROC
# local ranks (default 2) under dgrun. Extra arguments go to the example
# (e.g. --model cnn --epochs 3 --optim lamb).
set -euo pipefail
cd "$(dirname "$0")/.."
meson setup build-main --buildtype=release -Dtests=false -Dbench=false >/dev/null 2>&1 ||
  meson configure build-main -Dtests=false -Dbench=false
ninja -C build-main
exec build-main/tools/dgrun --nproc-per-node "${NPROC:-2}" \
  build-main/examples/mnist/mnist --epochs 1 "$@"
