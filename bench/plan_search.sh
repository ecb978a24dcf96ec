#!/usr/bin/env bash
# The planner's search time on the issue's cases ("Speed"), on all cores and on
# one, side by side in one run: GPT-3 175B on 1024 A100s at batch 1536 and
# LLaMA-3 405B on 16384 H100s at seq 8192 (`meshflow plan`: the whole search,
# per-operator variants of the leaders and memory-aware stage splits
# included), then the strategy search alone on a graph with no repeated
# layers (bench/op_search_bench: GPT-3 1.3B with 8 untied blocks, ~336 forward
# nodes). Per case: the best of REPEAT runs' wall time as the search reports
# it, the plans priced, and the plan found (the same on any thread count).
#   bash bench/plan_search.sh        (BUILD=build REPEAT=3)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
REPEAT=${REPEAT:-3}
BIN="$BUILD/meshflow"
[ -x "$BIN" ] || { echo "build it first: ninja -C $BUILD meshflow op_search_bench" >&2; exit 2; }

# best_of THREADS ARGS...: "<seconds> <plans priced> <best plan>" of the fastest run.
best_of() {
  local threads=$1
  shift
  local best="" line t
  for _ in $(seq "$REPEAT"); do
    line=$("$BIN" plan "$@" --top 3 --threads "$threads" --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
print("%.3f %d %s" % (d["search_time_s"], d["plans_evaluated"], d["plans"][0]["label"]))')
    t=${line%% *}
    if [ -z "$best" ] || python3 -c "import sys; sys.exit(0 if $t < ${best%% *} else 1)"; then
      best=$line
    fi
  done
  echo "$best"
}

printf '%-34s %8s %8s %10s  %s\n' case "all s" "1-core s" plans "best plan"
run() {
  local name=$1
  shift
  local all one
  all=$(best_of 0 "$@")
  one=$(best_of 1 "$@")
  read -r t_all n plan <<<"$all"
  read -r t_one _ plan1 <<<"$one"
  [ "$plan" = "$plan1" ] || echo "MISMATCH: $plan vs $plan1 on one thread" >&2
  printf '%-34s %8s %8s %10s  %s\n' "$name" "$t_all" "$t_one" "$n" "$plan"
}
run "GPT-3 175B, 1024 A100, batch 1536" configs/models/gpt3_175b.json \
  --cluster configs/clusters/dgx_a100_80gb.json --gpus 1024 --global-batch 1536
run "LLaMA-3 405B, 16384 H100, seq 8192" configs/models/llama3_405b.json \
  --cluster configs/clusters/h100_sxm.json --gpus 16384 --seq 8192
echo "cores: $(nproc)"
echo
echo "the strategy search alone (bench/op_search_bench):"
"$BUILD/bench/op_search_bench" --repeat "$REPEAT" | grep -E "case|untied"
