#!/usr/bin/env bash
# End-to-end checks of the SPMD partitioner through the CLI (tests/partition.cmake):
#   partition_cli_check.sh BIN MPIRUN mpi-equal   --ranks 4 and mpirun -np 4 with a Megatron TP+SP
#                                                 + ZeRO-1 plan: identical losses and weights
#   partition_cli_check.sh BIN MPIRUN explain     `meshflow explain` lists the collectives and totals
#   partition_cli_check.sh BIN MPIRUN errors      wrong rank count, unknown preset: exit 2, named
#   partition_cli_check.sh BIN MPIRUN auto        mode auto + search full plans for --ranks 4 and trains
set -uo pipefail
BIN=$1 MPIRUN=$2 MODE=$3
MPI="$MPIRUN --allow-run-as-root --oversubscribe --mca btl self,vader --mca mpi_yield_when_idle 1"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat > "$dir/run.json" <<'JSON'
{"model": {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 64, "vocab_size": 256, "max_position_embeddings": 16},
 "data": {"dataset": "fortunes"},
 "train": {"steps": 3, "batch_size": 8, "seq_len": 16, "threads": 2, "log_every": 1, "eval_batches": 2},
 "optimizer": {"type": "adamw", "lr": 1e-3},
 "parallel": {"mode": "semi", "mesh": "dp=2,tp=2", "preset": "megatron-sp", "zero": 1}}
JSON
fail() { echo "FAIL: $*"; exit 1; }
losses() { grep -v '"eval"' "$1" | sed 's/.*"loss":\([^,]*\),.*/\1/'; }

case $MODE in
  mpi-equal)
    "$BIN" train "$dir/run.json" --ranks 4 --quiet --metrics "$dir/local.jsonl" \
      --checkpoint "$dir/local.safetensors" || fail "local run failed"
    timeout 120 $MPI -np 4 "$BIN" train "$dir/run.json" --quiet --metrics "$dir/mpi.jsonl" \
      --checkpoint "$dir/mpi.safetensors" || fail "mpi run failed"
    losses "$dir/local.jsonl" > "$dir/l.txt"; losses "$dir/mpi.jsonl" > "$dir/m.txt"
    [ "$(wc -l < "$dir/l.txt")" -eq 3 ] || fail "expected 3 step records, got: $(cat "$dir/l.txt")"
    diff "$dir/l.txt" "$dir/m.txt" || fail "losses differ between --ranks 4 and mpirun -np 4"
    cmp "$dir/local.safetensors" "$dir/mpi.safetensors" || fail "weights differ"
    echo "identical losses: $(tr '\n' ' ' < "$dir/l.txt")and identical weights" ;;
  explain)
    out=$("$BIN" explain "$dir/run.json" --no-nodes) || fail "explain failed"
    echo "$out" | tail -12
    grep -q "all_gather *over tp" <<<"$out" || fail "no all_gather over tp listed"
    grep -q "reduce_scatter *over tp" <<<"$out" || fail "no reduce_scatter over tp listed"
    grep -q "total sent per rank per step" <<<"$out" || fail "no totals"
    all=$("$BIN" explain "$dir/run.json") || fail "explain with nodes failed"
    grep -q "rms_norm" <<<"$all" || fail "node layouts not listed" ;;
  errors)
    out=$("$BIN" train "$dir/run.json" --ranks 2 --quiet 2>&1); rc=$?
    echo "$out"
    [ $rc -eq 2 ] || fail "exit $rc for a mesh of 4 on 2 ranks"
    grep -q "has 4 ranks but the job has 2" <<<"$out" || fail "message does not name the sizes"
    out=$("$BIN" train "$dir/run.json" --ranks 4 --set parallel.preset=fsdp --quiet 2>&1); rc=$?
    echo "$out"
    [ $rc -eq 2 ] || fail "exit $rc for an unknown preset"
    grep -q "megatron-sp" <<<"$out" || fail "message does not list the presets"
    out=$("$BIN" train "$dir/run.json" --ranks 4 --set 'parallel.strategies={"*.mlp.up_proj": "((dp, 1, 1), (3, tp))"}' --quiet 2>&1); rc=$?
    echo "$out"
    [ $rc -eq 2 ] || fail "exit $rc for a split of 3"
    grep -q "split 3 ways" <<<"$out" || fail "message does not say the split"
    out=$("$BIN" explain "$dir/run.json" --rank 9 2>&1); rc=$?
    echo "$out"
    [ $rc -eq 2 ] || fail "exit $rc for explain --rank 9"
    grep -q "0..3" <<<"$out" || fail "message does not give the valid ranks"
    out=$("$BIN" train "$dir/run.json" --ranks 4 --set train.recompute=ops --quiet 2>&1); rc=$?
    echo "$out"
    [ $rc -eq 2 ] || fail "exit $rc for recompute ops without a list"
    grep -q "recompute_ops" <<<"$out" || fail "message does not name recompute_ops"
    out=$("$BIN" train "$dir/run.json" --ranks 4 --set train.recompute=full --set 'train.recompute_layers=[7]' --quiet 2>&1); rc=$?
    echo "$out"
    [ $rc -eq 2 ] || fail "exit $rc for a layer that does not exist"
    grep -q "valid layers are 0..1" <<<"$out" || fail "message does not give the valid layers"
    out=$("$BIN" train "$dir/run.json" --ranks 4 --init "$dir/missing.safetensors" --quiet 2>&1); rc=$?
    echo "$out"
    [ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "exit $rc for a missing checkpoint"
    grep -q "missing.safetensors" <<<"$out" || fail "message does not name the file" ;;
  auto)
    out=$("$BIN" train "$dir/run.json" --ranks 4 --set 'parallel={"mode": "auto", "search": "full"}' 2>&1); rc=$?
    echo "$out" | tail -4
    [ $rc -eq 0 ] || fail "exit $rc"
    grep -q "planned by search" <<<"$out" || fail "the chosen plan is not reported"
    grep -q "eval @ step 3" <<<"$out" || fail "did not train to the end" ;;
  *) fail "unknown mode $MODE" ;;
esac
echo "PASS $MODE"
