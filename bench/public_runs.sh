#!/usr/bin/env bash
# The cost model against published runs (docs/planner.md "Accuracy against
# published runs"): builds bench/public_runs and prices every run of
# ../shared/reference/public_runs.json with its published degrees, printing
# predicted vs published iteration time, the error by group and GPU count, the
# Kendall tau per model shape + GPU and the 10 worst runs. Pure arithmetic:
# nothing is run on a GPU and no constant is fitted.
#
#   bench/public_runs.sh [BUILD_DIR] [-- public_runs options: --only llm_foundry --verbose ...]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
[[ $# -gt 0 ]] && shift
[[ "${1:-}" == "--" ]] && shift
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C "$build" public_runs >/dev/null
cd "$root"
exec "$build/bench/public_runs" --clusters configs/clusters "$@"
