#!/usr/bin/env bash
# meshflow vs PyTorch on the same ResNet-18 training step (configs/models/resnet18.json:
# ImageNet stem, 32x32 inputs, 10 labels, batch 32, SGD momentum 0.9, float32), same machine,
# same thread count, measured side by side in one run (alternating, best of ROUNDS for each).
# The last column: the share of meshflow's step spent in conv2d and its two gradients, i.e. in
# the kernel library (oneDNN when meshflow was built with it), from the executor's profiler.
#   bash bench/resnet_vs_torch.sh            (STEPS=10 ROUNDS=3 BUILD=build)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
STEPS=${STEPS:-10}
ROUNDS=${ROUNDS:-3}
cmake --build "$BUILD" --target resnet_step meshflow -j2 >/dev/null
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
field() { /usr/bin/python3 -c "import json,sys; print(json.load(sys.stdin)['$1'])"; }
better() { /usr/bin/python3 -c "import sys; sys.exit(0 if $1 > $2 else 1)"; }
printf "%-8s %12s %12s %8s %11s %9s  %s\n" threads meshflow_i/s pytorch_i/s ratio conv_share bn_share \
  "pytorch best setting"
for t in 1 2; do
  best_m=0; best_p=0; line_m=""; how_p=""
  for r in $(seq "$ROUNDS"); do
    m=$(OMP_NUM_THREADS=$t "$BUILD/bench/resnet_step" --threads "$t" --steps "$STEPS")
    tm=$(echo "$m" | field images_per_s)
    if better "$tm" "$best_m"; then best_m=$tm; line_m=$m; fi
    # PyTorch gets its best setting: Debian's torch calls a pthreads OpenBLAS that fights
    # torch's own OpenMP threads, so BLAS threads = 1 and = t; its convolutions go to
    # oneDNN (mkldnn) either way, in NCHW and in channels-last memory.
    for ob in 1 $t; do
      for cl in 0 1; do
        p=$(OMP_NUM_THREADS=$t OPENBLAS_NUM_THREADS=$ob /usr/bin/python3 bench/torch_resnet.py \
          --threads "$t" --steps "$STEPS" --channels_last "$cl")
        tp=$(echo "$p" | field images_per_s)
        if better "$tp" "$best_p"; then
          best_p=$tp
          how_p="OPENBLAS_NUM_THREADS=$ob channels_last=$cl mkldnn=$(echo "$p" | field mkldnn)"
        fi
      done
    done
  done
  /usr/bin/python3 - "$t" "$best_m" "$best_p" "$line_m" "$how_p" <<'PY'
import json, sys
t, m, p, line, how = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), json.loads(sys.argv[4]), sys.argv[5]
print(f"{t:<8} {m:12.1f} {p:12.1f} {m/p:7.2f}x {line['conv_share']:11.0%} "
      f"{line['batch_norm_share']:9.0%}  {how}")
PY
done
