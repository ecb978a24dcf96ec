#!/usr/bin/env bash
# Training throughput of the benchmark GPT (configs/bench_gpt.json) under the
# SPMD partitioner's plans on 2 in-process ranks, next to one rank and the
# runtime data-parallel path (mode "data": bucketed all-reduce overlapped with
# the backward), measured side by side in one run. The machine's threads are
# split among the ranks (2 cores: 1 thread per rank at 2 ranks).
#   bash bench/partition_throughput.sh          (STEPS=20 BUILD=build)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
STEPS=${STEPS:-20}
BIN="$BUILD/meshflow"
CFG=configs/bench_gpt.json
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
summ() {  # metrics file -> tokens/s averaged over logged windows after the first two
  /usr/bin/python3 - "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"eval"' not in l]
rows = rows[2:] or rows
print(f"{sum(r['tokens_per_s'] for r in rows) / len(rows):10.0f}")
PY
}
run() {  # name ranks [--set ...]
  local name=$1 ranks=$2; shift 2
  "$BIN" train $CFG --steps "$STEPS" --ranks "$ranks" --quiet --metrics "$out/m.jsonl" "$@"
  printf "%-44s %s\n" "$name" "$(summ "$out/m.jsonl")"
}
printf "%-44s %10s\n" plan tokens/s
run "1 rank" 1
run "mode data, 2 ranks (buckets, overlap)" 2
run "semi dp=2 (partitioner)" 2 --set parallel.mode=semi --set parallel.mesh=dp=2 --set parallel.preset=dp
run "semi dp=2 zero=1" 2 --set parallel.mode=semi --set parallel.mesh=dp=2 --set parallel.preset=dp --set parallel.zero=1
run "semi dp=2 zero=3" 2 --set parallel.mode=semi --set parallel.mesh=dp=2 --set parallel.preset=dp --set parallel.zero=3
run "semi tp=2 megatron" 2 --set parallel.mode=semi --set parallel.mesh=tp=2 --set parallel.preset=megatron
run "semi tp=2 megatron-sp" 2 --set parallel.mode=semi --set parallel.mesh=tp=2 --set parallel.preset=megatron-sp
