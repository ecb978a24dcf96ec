#!/usr/bin/env bash
# Installs everything meshflow needs on a fresh Debian 12 machine, from Debian's
# packages only. Idempotent: a second run checks and returns quickly.
set -euo pipefail

PKGS=(
  build-essential cmake ninja-build pkg-config
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenblas-openmp-dev libopenblas-dev libdnnl-dev
  nlohmann-json3-dev libcli11-dev zlib1g-dev
  openmpi-bin libopenmpi-dev
  coinor-libcbc-dev libjemalloc-dev
  python3 python3-numpy python3-torch
  dataset-fashion-mnist fortunes fortunes-min
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
