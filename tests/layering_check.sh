#!/usr/bin/env bash
# The build's layer check (cmake/check_layers.cmake, run before any layer
# compiles) on the real tree and on small trees that break it
# (tests/CMakeLists.txt: layering_check):
#   layering_check.sh CMAKE SOURCE_DIR LAYER_TABLE
# The real tree passes; an include of a higher layer, and a directory that is
# no layer, each fail naming the file, the include and what would be valid.
set -euo pipefail
CMAKE=$1 SRC=$2 TABLE=$3
CHECK="$SRC/cmake/check_layers.cmake"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

"$CMAKE" -DROOT="$SRC/src" -DTABLE="$TABLE" -P "$CHECK"

# core includes ir (core may include only core): the check must fail.
mkdir -p "$dir/up/meshflow/core" "$dir/up/meshflow/ir"
printf '#include "meshflow/ir/graph.h"\n' > "$dir/up/meshflow/core/bad.h"
printf '#include "meshflow/core/status.h"\n' > "$dir/up/meshflow/ir/graph.h"
if "$CMAKE" -DROOT="$dir/up" -DTABLE="$TABLE" -P "$CHECK" > "$dir/up.log" 2>&1; then
  echo "layering_check: an include of ir from core passed the check"; exit 1
fi
out=$(cat "$dir/up.log")
grep -q "meshflow/core/bad.h: includes ir/graph.h, but layer 'core' may include only: core" <<< "$out" \
  || { echo "layering_check: unexpected message:"; echo "$out"; exit 1; }
# The file that follows the layers is not reported.
if grep -q "meshflow/ir/graph.h:" <<< "$out"; then echo "layering_check: reported ir/graph.h"; exit 1; fi

# A directory that is no layer.
mkdir -p "$dir/new/meshflow/extras"
printf '#include "meshflow/core/status.h"\n' > "$dir/new/meshflow/extras/x.cc"
if "$CMAKE" -DROOT="$dir/new" -DTABLE="$TABLE" -P "$CHECK" > "$dir/new.log" 2>&1; then
  echo "layering_check: a directory that is no layer passed the check"; exit 1
fi
grep -q "'extras' is not a layer" < "$dir/new.log" \
  || { echo "layering_check: unexpected message:"; cat "$dir/new.log"; exit 1; }
echo "layering_check: ok"
