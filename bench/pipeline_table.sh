#!/usr/bin/env bash
# Pipeline schedules measured on in-process ranks: schedule x recompute ->
# step time, per-rank peak memory by kind, measured bubble fraction next to
# the formulas (bench/pipeline_bench.cc). One compute thread per rank; on a
# small machine the timings are indicative only.
#   bash bench/pipeline_table.sh          (BUILD=build STEPS=3)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
STEPS=${STEPS:-3}
BIN="$BUILD/bench/pipeline_bench"
[ -x "$BIN" ] || { echo "build it first: ninja -C $BUILD pipeline_bench" >&2; exit 2; }
echo "machine: $(nproc) cores; OMP_WAIT_POLICY=passive"
export OMP_WAIT_POLICY=passive
"$BIN" --model gpt --stages 2 --micro-batches 8 --steps "$STEPS"
"$BIN" --model gpt --stages 4 --micro-batches 8 --steps "$STEPS"
"$BIN" --model llama --stages 2 --micro-batches 8 --steps "$STEPS"
