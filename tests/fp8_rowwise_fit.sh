#!/usr/bin/env bash
# The fit of CostConstants::fp8_rowwise_gemm_efficiency (docs/planner.md, FP8):
# priced on torchao's own measurement (bench/fits/torchao_float8_readme.json),
# rowwise over tensorwise must stay the measured 7689.5 / 6768 = 1.136 within
# 1%. A cost-model change that moves it asks for the constant to be refitted.
#   fp8_rowwise_fit.sh PUBLIC_RUNS_BINARY SOURCE_DIR
set -euo pipefail
bin=$1
src=$2
out=$("$bin" --file "$src/bench/fits/torchao_float8_readme.json" --clusters "$src/configs/clusters")
# A row: id group params gpus plan... published predicted error% notes.
pred() {
  awk -v id="$1" '$1 == id { for (i = 2; i <= NF; ++i) if ($i ~ /%$/) { print $(i - 1); exit } }' \
    <<<"$out"
}
tensorwise=$(pred 901)
rowwise=$(pred 902)
[ -n "$tensorwise" ] && [ -n "$rowwise" ] || { echo "rows 901/902 not priced:"; echo "$out"; exit 1; }
awk -v t="$tensorwise" -v r="$rowwise" 'BEGIN {
  ratio = r / t; want = 7689.5 / 6768
  printf "rowwise %.3f s / tensorwise %.3f s = %.3f, measured %.3f\n", r, t, ratio, want
  if (ratio / want - 1 > 0.01 || want / ratio - 1 > 0.01) {
    print "the priced ratio left the fit: refit CostConstants::fp8_rowwise_gemm_efficiency"
    exit 1
  }
}'
