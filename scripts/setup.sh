#!/usr/bin/env bash
# Installs what dgrad needs on Debian 12 (run as root). Idempotent: skips apt
# when everything is already there.
#   setup.sh           the main job: compiler, meson, OpenBLAS, zlib and the
#                      Fashion-MNIST package (scripts/train.sh)
#   setup.sh --tests   also what the test suites need: UCX, libgloo, torch
#                      (reference checks and interop peers), fortunes,
#                      iproute2/procps, doxygen, Slurm and munge (a one-node
#                      cluster on loopback: tests/deploy/slurm.sh), python3-yaml and
#                      util-linux (the Kubernetes manifests' pods: tests/deploy/k8s_env.py)
#                      clang and libclang-rt-14-dev (libFuzzer: scripts/fuzz.sh)
#                      (scripts/test.sh)
set -euo pipefail
pkgs=(gcc pkg-config meson ninja-build libopenblas-dev zlib1g-dev dataset-fashion-mnist)
case "${1:-}" in
  "") ;;
  --tests) pkgs+=(g++ libucx-dev ucx-utils libgloo-dev python3 python3-torch fortunes
                  iproute2 procps doxygen slurm-wlm munge python3-yaml util-linux
                  clang libclang-rt-14-dev) ;; # libFuzzer: scripts/fuzz.sh
  *) echo "usage: setup.sh [--tests]" >&2; exit 2 ;;
esac
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi
