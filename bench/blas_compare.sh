#!/usr/bin/env bash
# Compares SGEMM throughput of the BLAS libraries Debian ships, at 1 and 2 threads,
# in one run. Needs: libopenblas0-openmp (installed by scripts/install-deps.sh) and,
# for the comparison only, libblis4-openmp and libdnnl2 (installed here if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
for p in libblis4-openmp libdnnl2; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || \
    (apt-get install -y -qq "$p" >/dev/null)
done
cmake --build "$BUILD" --target blas_compare -j2 >/dev/null
L=/usr/lib/x86_64-linux-gnu
for t in 1 2; do
  echo "== threads=$t"
  for spec in "OpenBLAS(openmp) $L/openblas-openmp/libopenblas.so.0 cblas" \
              "OpenBLAS(pthread) $L/openblas-pthread/libopenblas.so.0 cblas" \
              "BLIS(openmp) $L/blis-openmp/libblis.so.4 cblas" \
              "oneDNN $L/libdnnl.so.2 dnnl"; do
    set -- $spec
    echo "-- $1"
    OMP_NUM_THREADS=$t "$BUILD/bench/blas_compare" "$2" "$3" "$t" || true
  done
done
