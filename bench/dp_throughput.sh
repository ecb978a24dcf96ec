#!/usr/bin/env bash
# Data-parallel training throughput of the benchmark GPT (configs/bench_gpt.json)
# at 1 and 2 ranks, local (threads) and mpi (processes), with gradient all-reduce
# overlapped with the backward pass or not, and the share of step time spent
# blocked on communication. The machine's threads are split among the ranks.
#   bash bench/dp_throughput.sh          (STEPS=20 BUILD=build)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
STEPS=${STEPS:-20}
BIN="$BUILD/meshflow"
CFG=configs/bench_gpt.json
MPIRUN="mpirun --allow-run-as-root --oversubscribe --mca btl self,vader"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
summ() {  # metrics file -> "tokens/s comm_wait" averaged over logged windows after the first
  /usr/bin/python3 - "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"eval"' not in l]
rows = rows[2:] or rows
tps = sum(r["tokens_per_s"] for r in rows) / len(rows)
w = [r.get("comm_wait_fraction", 0.0) for r in rows]
print(f"{tps:10.0f} {100*sum(w)/len(w):9.1f}%")
PY
}
printf "%-34s %10s %10s\n" run tokens/s comm_wait
for overlap in true false; do
  for r in 1 2; do
    "$BIN" train $CFG --steps "$STEPS" --ranks $r --set train.overlap_comm=$overlap --quiet --metrics "$out/l$r.jsonl"
    printf "%-34s %s\n" "local ranks=$r overlap=$overlap" "$(summ "$out/l$r.jsonl")"
  done
  $MPIRUN -np 2 "$BIN" train $CFG --steps "$STEPS" --set train.overlap_comm=$overlap --quiet --metrics "$out/m2.jsonl"
  printf "%-34s %s\n" "mpi ranks=2 overlap=$overlap" "$(summ "$out/m2.jsonl")"
done
