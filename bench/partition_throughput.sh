#!/usr/bin/env bash
# Training throughput of the benchmark GPT (configs/bench_gpt.json) under the
# SPMD partitioner's plans on 2 in-process ranks, next to one rank, measured
# side by side in one run. Mode "data" is the plan "batch on dp"; every plan's
# gradient all_reduces run in buckets overlapped with the backward, and
# "blocked" is the share of step time spent waiting for them after the
# backward (comm_wait_fraction). The machine's threads are
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
summ() {  # metrics file -> "tokens/s blocked" averaged over logged windows after the first two
  /usr/bin/python3 - "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"eval"' not in l]
rows = rows[2:] or rows
w = [r.get("comm_wait_fraction", 0.0) for r in rows]
print(f"{sum(r['tokens_per_s'] for r in rows) / len(rows):10.0f} {100*sum(w)/len(w):9.1f}%")
PY
}
run() {  # name ranks [--set ...]
  local name=$1 ranks=$2; shift 2
  "$BIN" train $CFG --steps "$STEPS" --ranks "$ranks" --quiet --metrics "$out/m.jsonl" "$@"
  printf "%-44s %s\n" "$name" "$(summ "$out/m.jsonl")"
}
printf "%-44s %10s %10s\n" plan tokens/s blocked
run "1 rank" 1
run "mode data, 2 ranks (plan dp, buckets overlap)" 2
run "mode data, 2 ranks, overlap off" 2 --set train.overlap_comm=false
run "semi dp=2 (partitioner)" 2 --set parallel.mode=semi --set parallel.mesh=dp=2 --set parallel.preset=dp
run "semi dp=2 zero=1" 2 --set parallel.mode=semi --set parallel.mesh=dp=2 --set parallel.preset=dp --set parallel.zero=1
run "semi dp=2 zero=3" 2 --set parallel.mode=semi --set parallel.mesh=dp=2 --set parallel.preset=dp --set parallel.zero=3
run "semi tp=2 megatron" 2 --set parallel.mode=semi --set parallel.mesh=tp=2 --set parallel.preset=megatron
run "semi tp=2 megatron-sp" 2 --set parallel.mode=semi --set parallel.mesh=tp=2 --set parallel.preset=megatron-sp
