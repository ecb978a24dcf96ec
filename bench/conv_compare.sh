#!/usr/bin/env bash
# conv2d kernels, meshflow (im2col + SGEMM) against oneDNN's convolution
# primitives, at 1 and 2 threads, in one run (bench/conv_compare.cc).
# Needs libdnnl-dev (scripts/install-deps.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
cmake --build "$BUILD" --target conv_compare -j2 >/dev/null
for t in 1 2; do
  OMP_NUM_THREADS=$t "$BUILD/bench/conv_compare" "$t"
done
