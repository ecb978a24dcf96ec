#!/usr/bin/env bash
# Megatron tensor parallelism on a real-sized vocabulary, measured side by
# side in one run: a GPT of 4 blocks, width 256, with a 32,768-token
# vocabulary (the table is 8.4M of its 11.6M parameters) trained on one rank
# and on tp=2 in-process ranks (preset "megatron": vocab-parallel embedding,
# head and cross-entropy). Per run: tokens per second (mean of the steps
# after the first), the losses (which must agree), and the bytes each rank
# sends per step in the backward (`meshflow explain`). With BASE=<another
# build directory> the tp=2 run is repeated on that build's binary, so a
# change to the partitioner is timed against the one before it. MESH and
# PRESET run another layout in place of tp=2 megatron (MESH=dp=2,tp=2
# PRESET=megatron-sp: the embedding gradient's dp axis, 2026-11-27).
#   bash bench/vocab_parallel.sh       (BUILD=build BASE= STEPS=6 VOCAB=32768 MESH=tp=2 PRESET=megatron)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BASE=${BASE:-}
STEPS=${STEPS:-6}
VOCAB=${VOCAB:-32768}
MESH=${MESH:-tp=2}
PRESET=${PRESET:-megatron}
BIN="$BUILD/meshflow"
[ -x "$BIN" ] || { echo "build it first: ninja -C $BUILD meshflow" >&2; exit 2; }
[ -z "$BASE" ] || [ -x "$BASE/meshflow" ] || { echo "no $BASE/meshflow" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_WAIT_POLICY=passive
cat > "$work/model.json" <<JSON
{"model_type": "gpt2", "n_layer": 4, "n_embd": 256, "n_head": 4, "n_positions": 128,
 "vocab_size": $VOCAB, "tie_word_embeddings": true, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
 "attn_pdrop": 0.0}
JSON
config() {  # file [parallel section]
  cat > "$1" <<JSON
{"model": "model.json", "data": {"dataset": "fortunes"},
 "train": {"steps": $STEPS, "batch_size": 16, "seq_len": 128, "log_every": 1},
 "optimizer": {"type": "adamw", "lr": 1e-3}${2:+, \"parallel\": $2}}
JSON
}
config "$work/one.json"
config "$work/tp2.json" "{\"mode\": \"semi\", \"mesh\": \"$MESH\", \"preset\": \"$PRESET\"}"
ranks=$(echo "$MESH" | tr ',' '\n' | awk -F= '{n = (NR == 1 ? $2 : n * $2)} END {print n}')
run() {  # name binary config ranks
  local name=$1 bin=$2 cfg=$3 ranks=$4
  "$bin" train "$cfg" --ranks "$ranks" > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; exit 1; }
  local tps losses sent=""
  tps=$(awk '/^step /{n++; if (n > 1) {s += $8; m++}} END {printf "%.0f", s / m}' "$work/$name.log")
  losses=$(awk '/^step /{printf "%s ", $4}' "$work/$name.log")
  if [ "$ranks" -gt 1 ]; then
    sent=$("$bin" explain "$cfg" --ranks "$ranks" --no-nodes 2>/dev/null |
      awk '/^  bwd +[a-z_]+ +[0-9]+ x/{print $(NF-1), $NF}' | tr '\n' ' ')
  fi
  printf "%-16s %8s   %-40s %s\n" "$name" "$tps" "$losses" "$sent"
  echo "$tps" > "$work/$name.tps"
}
echo "machine: $(nproc) cores; GPT 4x256, vocab $VOCAB, batch 16 x seq 128; $MESH $PRESET"
printf "%-16s %8s   %-40s %s\n" "run" "tok/s" "losses" "backward bytes/rank/step"
run one "$BIN" "$work/one.json" 1
run "$MESH" "$BIN" "$work/tp2.json" "$ranks"
cp "$work/$MESH.tps" "$work/tp2.tps"
if [ -n "$BASE" ]; then
  run "$MESH-base" "$BASE/meshflow" "$work/tp2.json" "$ranks"
  cp "$work/$MESH-base.tps" "$work/tp2-base.tps"
  awk -v a="$(cat "$work/tp2.tps")" -v b="$(cat "$work/tp2-base.tps")" \
    -v m="$MESH" 'BEGIN {printf "%s / %s-base: %.2fx tokens per second\n", m, m, a / b}'
fi
awk -v a="$(cat "$work/tp2.tps")" -v b="$(cat "$work/one.tps")" \
  -v m="$MESH" 'BEGIN {printf "%s / one rank: %.2fx tokens per second\n", m, a / b}'
