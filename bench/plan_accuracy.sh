#!/usr/bin/env bash
# The planner's accuracy on this machine (issue 6 §6; docs/planner.md): builds
# bench/plan_accuracy and runs a small GPT under a dozen plans on 1-4
# in-process ranks, printing predicted vs measured step time and per-rank peak
# memory and the median errors. Run it while nothing else loads the machine.
#
#   bench/plan_accuracy.sh [BUILD_DIR] [-- plan_accuracy options: --steps 6 --only dp2,tp2 ...]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
[[ $# -gt 0 ]] && shift
[[ "${1:-}" == "--" ]] && shift
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C "$build" plan_accuracy >/dev/null
cd "$root"
# The cluster: --cluster FILE when given, else this machine's calibration
# (plan::load_local_cluster: measured once and cached if the shipped
# configs/clusters/local_cpu.json is another machine's).
exec "$build/bench/plan_accuracy" "$@"
