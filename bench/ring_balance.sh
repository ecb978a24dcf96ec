#!/usr/bin/env bash
# Ring attention's causal load balance (parallel/seq_balance.h), measured side
# by side in one run: the same long-sequence GPT trained on cp ranks with the
# sequence in contiguous blocks (the last rank computes every block it meets,
# the first almost none) and in zigzag order (every rank holds chunks r and
# 2cp-1-r and computes the same half of each block). Per run: tokens per
# second (mean of the steps after the first) and the losses, which must agree.
# A step waits on the slowest rank: at cp=2 it computes 2T^2 (query, key)
# scores in contiguous blocks (T the local rows; the diagonal block as a whole
# square, masked) against 1.25T^2 in zigzag order (half of the other block,
# three of the diagonal's four quarter squares), so the attention is up to
# 1.6x faster; the rest of the step is the same. Last, the same model under
# Ulysses (all_to_all to heads, the one-rank attention kernel on whole
# sequences): the ring's kernels against the blocked kernel, side by side.
#   bash bench/ring_balance.sh        (BUILD=build STEPS=5 SEQ=2048 CP=2)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
STEPS=${STEPS:-5}
SEQ=${SEQ:-2048}
CP=${CP:-2}
BIN="$BUILD/meshflow"
[ -x "$BIN" ] || { echo "build it first: ninja -C $BUILD meshflow" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_WAIT_POLICY=passive

# 2 layers, d=64, 4 heads: the attention's T^2 work dominates at long sequences.
cat > "$work/model.json" <<JSON
{"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": $SEQ,
 "vocab_size": 256, "tie_word_embeddings": true}
JSON
run() {  # name, ring_order, preset
  local name=$1 order=$2 preset=${3:-ring} cfg="$work/$1.json"
  cat > "$cfg" <<JSON
{"model": "model.json", "data": {"dataset": "fortunes"},
 "train": {"steps": $STEPS, "batch_size": 2, "seq_len": $SEQ, "log_every": 1, "threads": $(nproc)},
 "optimizer": {"type": "adamw", "lr": 1e-3},
 "parallel": {"mode": "semi", "mesh": "cp=$CP", "preset": "$preset", "ring_order": "$order"}}
JSON
  "$BIN" train "$cfg" --ranks "$CP" > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; exit 1; }
  # step lines: "step k/N loss L lr X tok/s T ..."; mean tok/s after the first step
  local tps losses
  tps=$(awk '/^step /{n++; if (n > 1) {s += $8; m++}} END {printf "%.0f", s / m}' "$work/$name.log")
  losses=$(awk '/^step /{printf "%s ", $4}' "$work/$name.log")
  printf "%-12s %10s   %s\n" "$name" "$tps" "$losses"
  echo "$tps" > "$work/$name.tps"
}
echo "machine: $(nproc) cores; GPT 2x64, seq $SEQ, batch 2, ring attention over cp=$CP ranks"
printf "%-12s %10s   %s\n" "order" "tok/s" "losses"
run contiguous contiguous
run zigzag zigzag
run ulysses contiguous ulysses
awk -v a="$(cat "$work/zigzag.tps")" -v b="$(cat "$work/contiguous.tps")" \
  'BEGIN {printf "zigzag / contiguous: %.2fx tokens per second\n", a / b}'
awk -v a="$(cat "$work/zigzag.tps")" -v b="$(cat "$work/ulysses.tps")" \
  'BEGIN {printf "ring (zigzag) / ulysses: %.2fx tokens per second\n", a / b}'
