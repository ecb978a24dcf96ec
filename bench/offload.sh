#!/usr/bin/env bash
# Offload to disk (runtime/offload.h), measured side by side in one run: the
# same GPT trained without offload, with the optimizer state on disk, and with
# the parameters on disk too. Per run: the step time (mean of the steps after
# the first), the process's peak resident memory (/usr/bin/time's maximum
# RSS), and the losses, which must be identical.
#   bash bench/offload.sh            (BUILD=build STEPS=6 DIR=/var/tmp)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
STEPS=${STEPS:-6}
DIR=${DIR:-/var/tmp}
BIN="$BUILD/meshflow"
[ -x "$BIN" ] || { echo "build it first: ninja -C $BUILD meshflow" >&2; exit 2; }
work=$(mktemp -d "$DIR/meshflow-offload-bench.XXXXXX")
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
export OMP_WAIT_POLICY=passive

# 8 layers, d=512: 26.4M parameters, 211 MB of AdamW state (f32), small activations.
cat > "$work/model.json" <<'EOF'
{"model_type": "gpt2", "n_layer": 8, "n_embd": 512, "n_head": 8, "n_positions": 64,
 "vocab_size": 256, "tie_word_embeddings": true}
EOF
run() {  # name, offload section (JSON or empty)
  local name=$1 offload=$2 cfg="$work/$1.json"
  {
    echo '{"model": "model.json", "data": {"dataset": "fortunes"},'
    echo ' "train": {"steps": '"$STEPS"', "batch_size": 4, "seq_len": 64, "log_every": 1},'
    echo ' "optimizer": {"type": "adamw", "lr": 1e-3, "grad_clip": 1.0}'
    [ -n "$offload" ] && echo ", \"offload\": $offload"
    echo '}'
  } > "$cfg"
  /usr/bin/time -f "%M" -o "$work/$name.rss" "$BIN" train "$cfg" > "$work/$name.log" 2>&1
  local rss_mib ms losses
  rss_mib=$(awk '{printf "%.0f", $1 / 1024}' "$work/$name.rss")
  # step lines: "step k/N loss L ... tok/s T ..."; mean seconds per step after the first
  ms=$(awk '/^step /{n++; if (n > 1) {s += 4 * 64 / $(8); m++}} END {printf "%.0f", 1000 * s / m}' "$work/$name.log")
  losses=$(awk '/^step /{printf "%s ", $4}' "$work/$name.log")
  printf "%-22s %10s %12s   %s\n" "$name" "$ms" "$rss_mib" "$losses"
}
echo "machine: $(nproc) cores, $(awk '/MemTotal/{printf "%.1f GiB", $2/1048576}' /proc/meminfo); offload dir $DIR"
printf "%-22s %10s %12s   %s\n" "run" "ms/step" "max RSS MiB" "losses"
run none ""
run optimizer-on-disk '{"optimizer": "disk", "dir": "'"$work"'"}'
run optimizer+params '{"optimizer": "disk", "params": "disk", "dir": "'"$work"'"}'
