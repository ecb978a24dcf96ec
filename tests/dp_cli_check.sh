#!/usr/bin/env bash
# End-to-end data-parallel checks through the CLI (registered by tests/dp.cmake):
#   dp_cli_check.sh MESHFLOW_BIN MPIRUN equal      --ranks 2 and mpirun -np 2: identical losses and weights
#   dp_cli_check.sh MESHFLOW_BIN MPIRUN local-throw  a rank that throws stops every rank, non-zero, names it
#   dp_cli_check.sh MESHFLOW_BIN MPIRUN mpi-kill     a SIGKILLed process ends the job non-zero within 30 s
#   dp_cli_check.sh MESHFLOW_BIN MPIRUN mpi-throw    a rank that throws ends the job non-zero, names it
#   dp_cli_check.sh MESHFLOW_BIN MPIRUN mpi-resume   checkpoints of mpirun's processes resume exactly
#                                                    (mpirun and in-process); a kill mid-save keeps the last
#   dp_cli_check.sh MESHFLOW_BIN MPIRUN mpi-launch   `meshflow launch` restarts a failed mpirun job from
#                                                    its latest checkpoint (--elastic: on fewer
#                                                    processes); user errors are not restarted
set -uo pipefail
BIN=$1 MPIRUN=$2 MODE=$3
MPI="$MPIRUN --allow-run-as-root --oversubscribe --mca btl self,vader --mca mpi_yield_when_idle 1"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat > "$dir/run.json" <<'JSON'
{"model": {"model_type": "gpt2", "n_layer": 2, "n_embd": 32, "n_head": 2, "n_positions": 16, "vocab_size": 256},
 "data": {"dataset": "fortunes"},
 "train": {"steps": 4, "batch_size": 8, "seq_len": 16, "threads": 2, "log_every": 1, "eval_batches": 2,
           "bucket_mib": 0.02},
 "optimizer": {"type": "adamw", "lr": 1e-3}}
JSON
fail() { echo "FAIL: $*"; exit 1; }
losses() { grep -v '"eval"' "$1" | sed 's/.*"loss":\([^,]*\),.*/\1/'; }

case $MODE in
  equal)
    "$BIN" train "$dir/run.json" --ranks 2 --quiet --metrics "$dir/local.jsonl" --checkpoint "$dir/local.safetensors" \
      || fail "local run failed"
    timeout 120 $MPI -np 2 "$BIN" train "$dir/run.json" --quiet --metrics "$dir/mpi.jsonl" \
      --checkpoint "$dir/mpi.safetensors" || fail "mpi run failed"
    losses "$dir/local.jsonl" > "$dir/l.txt"; losses "$dir/mpi.jsonl" > "$dir/m.txt"
    [ "$(wc -l < "$dir/l.txt")" -eq 4 ] || fail "expected 4 step records, got: $(cat "$dir/l.txt")"
    diff "$dir/l.txt" "$dir/m.txt" || fail "losses differ between --ranks 2 and mpirun -np 2"
    cmp "$dir/local.safetensors" "$dir/mpi.safetensors" || fail "weights differ between --ranks 2 and mpirun -np 2"
    echo "identical losses: $(tr '\n' ' ' < "$dir/l.txt")and identical weights" ;;
  local-throw)
    start=$(date +%s)
    out=$(MESHFLOW_INJECT_FAULT=1:1:throw timeout 60 "$BIN" train "$dir/run.json" --ranks 4 --quiet 2>&1); rc=$?
    el=$(( $(date +%s) - start ))
    echo "$out"
    [ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "exit code $rc"
    [ $el -lt 30 ] || fail "took ${el}s"
    grep -q "rank 1" <<<"$out" || fail "message does not name rank 1"
    grep -q "injected fault" <<<"$out" || fail "message does not say what failed" ;;
  mpi-kill|mpi-throw)
    kind=${MODE#mpi-}
    start=$(date +%s)
    out=$(MESHFLOW_INJECT_FAULT=1:1:$kind timeout 60 $MPI -np 2 "$BIN" train "$dir/run.json" --quiet 2>&1); rc=$?
    el=$(( $(date +%s) - start ))
    echo "$out" | tail -20
    [ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "exit code $rc (124 = hung until timeout)"
    [ $el -lt 30 ] || fail "took ${el}s"
    grep -qiE "rank 1|rank: 1" <<<"$out" || fail "output does not name rank 1"
    [ "$kind" = kill ] || grep -q "injected fault" <<<"$out" || fail "output does not say what failed" ;;
  mpi-launch)
    # Rank 1 throws before step 3: launch reruns mpirun, whose ranks resume
    # from the step-2 checkpoint; the metrics (appended) are the
    # uninterrupted run's losses.
    "$BIN" train "$dir/run.json" --ranks 2 --quiet --metrics "$dir/ref.jsonl" || fail "reference run failed"
    margs="--allow-run-as-root --oversubscribe --mca btl self,vader --mca mpi_yield_when_idle 1"
    out=$(MESHFLOW_INJECT_FAULT=1:2:throw timeout 120 "$BIN" launch --np 2 --max-restarts 1 \
      --mpirun "$MPIRUN" --mpirun-args "$margs" train "$dir/run.json" --quiet \
      --set train.save_every=2 --checkpoint "$dir/ck" --metrics "$dir/launch.jsonl" 2>&1); rc=$?
    echo "$out" | grep -E "restart|error" | head -5
    [ $rc -eq 0 ] || fail "launch with one restart: exit code $rc"
    grep -q "meshflow launch: mpirun exited with 1; restart 1 of 1" <<<"$out" || fail "no restart message"
    grep -q "restart 1 continues from its latest checkpoint" <<<"$out" || fail "did not resume"
    losses "$dir/ref.jsonl" > "$dir/r.txt"; losses "$dir/launch.jsonl" > "$dir/l.txt"
    diff "$dir/r.txt" "$dir/l.txt" || fail "launch: losses differ from the uninterrupted run"
    # --elastic: the restart runs on the most processes the config fits (data
    # parallel: one), from the same checkpoint.
    rm -rf "$dir/ck"
    out=$(MESHFLOW_INJECT_FAULT=1:2:throw timeout 120 "$BIN" launch --np 2 --max-restarts 1 --elastic \
      --mpirun "$MPIRUN" --mpirun-args "$margs" train "$dir/run.json" --quiet \
      --set train.save_every=2 --checkpoint "$dir/ck" 2>&1); rc=$?
    [ $rc -eq 0 ] || fail "elastic launch: exit code $rc"
    grep -q "restart 1 of 1 from .* on 1 processes" <<<"$out" || fail "elastic launch did not shrink: $out"
    [ -f "$dir/ck/step-00000004/manifest.json" ] || fail "the elastic restart did not finish"
    # No restarts left: the failure's exit code. A user error: never restarted.
    out=$(MESHFLOW_INJECT_FAULT=1:1:throw timeout 120 "$BIN" launch --np 2 --mpirun "$MPIRUN" \
      --mpirun-args "$margs" train "$dir/run.json" --quiet 2>&1); rc=$?
    [ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "failed job without restarts: exit code $rc"
    out=$(timeout 60 "$BIN" launch --np 2 --max-restarts 3 --mpirun "$MPIRUN" --mpirun-args "$margs" \
      train "$dir/missing.json" 2>&1); rc=$?
    [ $rc -eq 2 ] || fail "a missing config under launch: exit code $rc"
    grep -q "restart" <<<"$out" && fail "a user error was restarted"
    out=$("$BIN" launch --np 2 graph "$dir/run.json" 2>&1); rc=$?
    [ $rc -eq 2 ] && grep -q "give \`train CONFIG ...\`" <<<"$out" || fail "launch without train: $rc $out"
    out=$("$BIN" launch --np 2 train "$dir/run.json" --ranks 2 2>&1); rc=$?
    [ $rc -eq 2 ] && grep -q "drop --ranks" <<<"$out" || fail "train --ranks under launch: $rc $out"
    out=$("$BIN" launch --np 2 --mpirun /nonexistent/mpirun train "$dir/run.json" 2>&1); rc=$?
    [ $rc -eq 2 ] && grep -q "cannot run '/nonexistent/mpirun'" <<<"$out" || fail "missing mpirun: $rc $out"
    echo "launch restarted the job; losses equal the uninterrupted run's: $(tr '\n' ' ' < "$dir/l.txt")" ;;
  mpi-resume)
    # Full-state checkpoints written by mpirun's processes: resumed under mpirun
    # and in-process, the losses are the uninterrupted run's; a process killed
    # while saving ends the job and leaves the previous checkpoint the latest.
    # The job saves every 2 steps and rank 1 throws before step 3 (train.steps
    # stays 4: the learning-rate schedule is the uninterrupted run's).
    "$BIN" train "$dir/run.json" --ranks 2 --quiet --metrics "$dir/ref.jsonl" || fail "reference run failed"
    MESHFLOW_INJECT_FAULT=1:2:throw timeout 120 $MPI -np 2 "$BIN" train "$dir/run.json" --quiet \
      --set train.save_every=2 --checkpoint "$dir/ck" >/dev/null 2>&1 && fail "the interrupted run succeeded"
    [ -f "$dir/ck/step-00000002/manifest.json" ] || fail "no checkpoint of step 2 from the interrupted run"
    timeout 120 $MPI -np 2 "$BIN" train "$dir/run.json" --quiet --checkpoint "$dir/ck" --resume latest \
      --metrics "$dir/mpi.jsonl" || fail "mpi resume failed"
    "$BIN" train "$dir/run.json" --ranks 2 --quiet --resume "$dir/ck/step-00000002" \
      --metrics "$dir/local.jsonl" || fail "in-process resume of the mpi checkpoint failed"
    losses "$dir/ref.jsonl" | tail -2 > "$dir/r.txt"
    losses "$dir/mpi.jsonl" > "$dir/m.txt"; losses "$dir/local.jsonl" > "$dir/l.txt"
    diff "$dir/r.txt" "$dir/m.txt" || fail "mpi resume: losses differ from the uninterrupted run"
    diff "$dir/r.txt" "$dir/l.txt" || fail "in-process resume of the mpi checkpoint: losses differ"
    start=$(date +%s)
    out=$(MESHFLOW_INJECT_FAULT=1:6:save timeout 60 $MPI -np 2 "$BIN" train "$dir/run.json" --steps 8 \
      --set train.save_every=2 --quiet --checkpoint "$dir/ck" --resume latest 2>&1); rc=$?
    el=$(( $(date +%s) - start ))
    [ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "killed during a save: exit code $rc"
    [ $el -lt 30 ] || fail "killed during a save: took ${el}s"
    [ -f "$dir/ck/step-00000004/manifest.json" ] || fail "the checkpoint of step 4 is not there"
    [ ! -e "$dir/ck/step-00000006" ] || fail "a checkpoint of step 6 was committed"
    "$BIN" checkpoint inspect "$dir/ck" --verify > "$dir/insp.txt" 2>&1; grep -q ": step 4$" "$dir/insp.txt" || fail "latest is not step 4: $(cat "$dir/insp.txt")"
    out=$(timeout 60 $MPI -np 2 "$BIN" train "$dir/run.json" --quiet --max-restarts 1 2>&1); rc=$?
    [ $rc -eq 2 ] || fail "--max-restarts under mpirun: exit code $rc"
    grep -qF 'run it under `meshflow launch --np N --max-restarts K train ...`' <<<"$out" || fail "--max-restarts under mpirun: $out"
    echo "resumed equal: $(tr '\n' ' ' < "$dir/r.txt")" ;;
  *) fail "unknown mode $MODE" ;;
esac
echo "PASS $MODE"
