#!/usr/bin/env bash
# Installs what dgrad needs on Debian 12 (run as root). Idempotent: skips apt
# when everything is already there.
set -euo pipefail
pkgs=(gcc g++ pkg-config meson ninja-build libopenblas-dev zlib1g-dev
      libucx-dev ucx-utils libgloo-dev python3 python3-torch
      dataset-fashion-mnist fortunes iproute2 procps)
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
