#!/usr/bin/env bash
# `cmake --install` and find_package(meshflow), as a C++ user outside the tree
# does them (tests/CMakeLists.txt: install_out_of_tree):
#   install_check.sh CMAKE BUILD_DIR SOURCE_DIR
# installs the build into a fresh prefix, configures and builds
# examples/hybrid_tp_mlp against it (no path into the source or build tree),
# runs it (a hand-written tensor-parallel MLP on 2 ranks equal to one device),
# and checks the installed CLI and configs.
set -euo pipefail
CMAKE=$1 BUILD=$2 SRC=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$CMAKE" --install "$BUILD" --prefix "$dir/prefix" > "$dir/install.log"
test -f "$dir/prefix/lib/cmake/meshflow/meshflowConfig.cmake"
test -f "$dir/prefix/include/meshflow/ir/graph.h"
test -f "$dir/prefix/share/meshflow/configs/clusters/local_cpu.json"
cp -r "$SRC/examples/hybrid_tp_mlp" "$dir/example"
"$CMAKE" -S "$dir/example" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$dir/prefix" > "$dir/configure.log" || { cat "$dir/configure.log"; exit 1; }
"$CMAKE" --build "$dir/build" -j 2 > "$dir/build.log" || { cat "$dir/build.log"; exit 1; }
OMP_NUM_THREADS=1 "$dir/build/hybrid_tp_mlp" | tee "$dir/run.log"
grep -q ": ok$" "$dir/run.log"
"$dir/prefix/bin/meshflow" plan "$dir/prefix/share/meshflow/configs/models/mlp_fashion.json" \
  --cluster "$dir/prefix/share/meshflow/configs/clusters/dgx_a100_80gb.json" --gpus 4 --top 0 \
  | grep -q "best plan"
echo "install_check: ok"
