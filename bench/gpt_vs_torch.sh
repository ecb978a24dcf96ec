#!/usr/bin/env bash
# meshflow vs PyTorch on the same GPT training step (4 layers, d=256, 4 heads,
# seq 128, batch 16, byte vocabulary, AdamW), same machine, same thread count,
# measured side by side in one run (alternating, best of ROUNDS for each).
#   bash bench/gpt_vs_torch.sh            (STEPS=20 ROUNDS=3 BUILD=build)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
STEPS=${STEPS:-20}
ROUNDS=${ROUNDS:-3}
cmake --build "$BUILD" --target gpt_step meshflow -j2 >/dev/null
/usr/bin/python3 -c "import torch" 2>/dev/null || { echo "PyTorch missing: run scripts/install-deps.sh"; exit 2; }
# PyTorch gets the OpenBLAS kernels meshflow runs: where OpenBLAS falls back
# to its generic ones, meshflow restarts itself with OPENBLAS_CORETYPE
# (src/meshflow/kernels/cpu/blas_core.h); export the same for torch.
if [ -z "${OPENBLAS_CORETYPE:-}" ] && [ -x "$BUILD/meshflow" ]; then
  core=$("$BUILD/meshflow" bench --calibrate --quick 2>/dev/null |
    sed -n 's/.*OpenBLAS \([A-Za-z0-9]*\) kernels.*/\1/p' | head -1)
  if [ -n "$core" ]; then export OPENBLAS_CORETYPE="$core"; fi
fi
echo "OpenBLAS kernels: ${OPENBLAS_CORETYPE:-as detected}"
printf "%-8s %14s %14s %8s %14s %12s\n" threads meshflow_tok/s pytorch_tok/s ratio "GFLOP/s(mf)" "of GEMM peak"
for t in 1 2; do
  best_m=0; best_p=0; line_m=""
  for r in $(seq "$ROUNDS"); do
    m=$(OMP_NUM_THREADS=$t "$BUILD/bench/gpt_step" --threads "$t" --steps "$STEPS")
    tm=$(echo "$m" | /usr/bin/python3 -c "import json,sys; print(json.load(sys.stdin)['tokens_per_s'])")
    if /usr/bin/python3 -c "import sys; sys.exit(0 if $tm > $best_m else 1)"; then best_m=$tm; line_m=$m; fi
    # PyTorch gets its best setting: Debian's torch calls a pthreads OpenBLAS that
    # fights torch's own OpenMP threads, so try BLAS threads = 1 and = t.
    for ob in 1 $t; do
      p=$(OMP_NUM_THREADS=$t OPENBLAS_NUM_THREADS=$ob /usr/bin/python3 bench/torch_gpt.py --threads "$t" --steps "$STEPS")
      tp=$(echo "$p" | /usr/bin/python3 -c "import json,sys; print(json.load(sys.stdin)['tokens_per_s'])")
      if /usr/bin/python3 -c "import sys; sys.exit(0 if $tp > $best_p else 1)"; then best_p=$tp; fi
    done
  done
  /usr/bin/python3 - "$t" "$best_m" "$best_p" "$line_m" <<'PY'
import json, sys
t, m, p, line = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), json.loads(sys.argv[4])
print(f"{t:<8} {m:14.0f} {p:14.0f} {m/p:7.2f}x {line['gflops']:14.1f} {line['fraction_of_gemm_peak']:11.0%}")
PY
done
